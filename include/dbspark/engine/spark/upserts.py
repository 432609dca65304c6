"""Upsert ingest on Spark: a batch of upserts becomes the delta of the source's state.

The rule is ``core/upsert.py``'s: per key the freshest row wins, a tombstone deletes,
a stale row changes nothing, and two different rows at one watermark (in the batch, or
one of them the stored version) are a conflict. The incremental rule: only the keys in
the batch can change, so the stored state is read for those keys alone (a key-pruned
trace read), and the delta is ``-old + new`` for each key whose version changes.

Two ways to compute it, with one answer:

* **On the driver**, for a batch of at most ``driver_rows`` rows: the batch's rows are
  those its input log was written with from the driver, the stored rows of its keys
  are read by one job (the keys a literal filter, their buckets computed here), and
  ``core.upsert`` itself decides. The delta is a small local relation, and its
  state-trace batch is written by pyarrow. A Spark plan for the same work runs one job
  per shuffle (ties, the conflict check, the freshest-row window, the consolidation)
  and costs seconds however few rows arrive; this costs one job.
* **In Spark**, for larger batches: the set-based kernels of ``engine/kernels.py``
  (the local tier runs the same ones on DuckDB): every check in one job, then the
  delta with a window per key, checkpointed so that its consumers do not recompute it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame

from dbspark.core.columns import WEIGHT
from dbspark.core.settings import int_setting
from dbspark.core.types import Schema
from dbspark.core.upsert import BadUpsertRow, UpsertConflict, UpsertSpec, updates_against
from dbspark.core.zset import ZSet
from dbspark.engine import kernels
from dbspark.engine.local.tier import arrow_table
from dbspark.engine.spark.compile import struct_type
from dbspark.engine.spark.frames import frame_to_zset, from_spark_value, to_spark_value
from dbspark.storage.driver_plans import one_job
from dbspark.storage.warehouse import DEFAULT_BUCKETS, KeySet, known_keys

#: Batches of at most this many rows are decided on the driver (see the module text).
DRIVER_ROWS = 20_000


def default_driver_rows() -> int:
    """``DBSPARK_DRIVER_ROWS`` (0 keeps every batch in Spark), else ``DRIVER_ROWS``."""
    return int_setting("DBSPARK_DRIVER_ROWS", DRIVER_ROWS, minimum=0)


#: Reads the stored state rows (with ``__w``, not consolidated) of the keys in a frame
#: (or a key set the driver holds).
StateReader = Callable[[DataFrame | KeySet], DataFrame]


def state_delta(
    spec: UpsertSpec,
    state_schema: Schema,
    batch: DataFrame,
    read_state: StateReader,
    file: str | None,
    rows: Sequence[Sequence[Any]] | None,
    *,
    buckets: int = DEFAULT_BUCKETS,
    batch_checked: bool = False,
) -> tuple[DataFrame, pa.Table | None]:
    """The state delta (state columns and ``__w``) that ``batch`` causes; raises
    ``BadUpsertRow`` or ``UpsertConflict`` before anything is written. ``rows`` are the
    batch's rows (``spec.columns``) when the driver holds them (a small batch): the
    delta is then decided here and also returned as an Arrow table to write as it is;
    otherwise (None) in Spark, where ``batch_checked`` (its NULL keys and ties were
    looked for when its files were read) spares looking for them again."""
    if rows is not None:
        return _on_driver(spec, state_schema, batch, rows, read_state, file, buckets)
    return _in_spark(spec, state_schema, batch, read_state, file, batch_checked), None


def _on_driver(
    spec: UpsertSpec,
    state_schema: Schema,
    batch: DataFrame,
    rows: Sequence[Sequence[Any]],
    read_state: StateReader,
    file: str | None,
    buckets: int,
) -> tuple[DataFrame, pa.Table]:
    spark = batch.sparkSession
    # Take every value as the reference holds it (Arrow's instants, one NaN, tuples).
    row_types = [state_schema.type_of(c) for c in spec.columns]
    rows = [tuple(from_spark_value(v, t) for v, t in zip(r, row_types, strict=True)) for r in rows]
    positions = {c: i for i, c in enumerate(spec.columns)}
    key_types = [state_schema.type_of(k) for k in spec.key]
    # NULL keys are left to core's check, which names the row; they match no state.
    keys = sorted(
        {
            tuple(r[positions[k]] for k in spec.key)
            for r in rows
            if all(r[positions[k]] is not None for k in spec.key)
        },
        key=repr,
    )
    # The stored rows of those keys, judged by the reference engine's own rule.
    stored = ZSet()
    if keys:
        key_fields = list(zip(spec.key, key_types, strict=True))
        key_frame = spark.createDataFrame(
            [tuple(to_spark_value(v, t) for v, t in zip(k, key_types, strict=True)) for k in keys],
            struct_type(Schema(tuple(key_fields))),
        )
        # Known here: their buckets need no job, and the read filters by them as literals.
        known = known_keys(key_frame, arrow_table(keys, key_fields), (buckets,))
        with one_job(spark):
            stored = frame_to_zset(read_state(known), state_schema)
    delta = [(*row, weight) for row, weight in updates_against(spec, rows, stored, file).items()]
    types = state_schema.types
    spark_rows = [
        (*[to_spark_value(v, t) for v, t in zip(row[:-1], types, strict=True)], row[-1])
        for row in delta
    ]
    frame = spark.createDataFrame(spark_rows, struct_type(state_schema, extra=[(WEIGHT, "bigint")]))
    return frame, arrow_table(delta, [*state_schema.fields, (WEIGHT, "bigint")])


def _in_spark(
    spec: UpsertSpec,
    state_schema: Schema,
    batch: DataFrame,
    read_state: StateReader,
    file: str | None,
    batch_checked: bool,
) -> DataFrame:
    keys = list(spec.key)
    stored = read_state(batch.select(*keys).distinct())
    current = kernels.upsert_current(stored, list(state_schema.names))
    # Every kind of bad input is found by one Spark job, before anything is written.
    problems = kernels.upsert_problems(spec, batch, current, within_batch=not batch_checked)
    problems = problems.limit(60).collect()
    if problems:
        worst = min(r["__problem"] for r in problems)
        offending = [tuple(r[k] for k in keys) for r in problems if r["__problem"] == worst]
        error = BadUpsertRow if worst <= 1 else UpsertConflict  # a row's own problem
        detail = kernels.UPSERT_PROBLEMS[worst]
        raise error(spec.source, file, offending, detail=detail, key_columns=keys)
    delta = kernels.upsert_delta(spec, batch, current, list(state_schema.names))
    return delta.localCheckpoint()
