"""Upsert ingest on Spark: a batch of upserts becomes the delta of the source's state.

The rule is ``core/upsert.py``'s: per key the freshest row wins, a tombstone deletes,
a stale row changes nothing, and two different rows at one watermark (in the batch, or
one of them the stored version) are a conflict. The incremental rule: only the keys in
the batch can change, so the stored state is read for those keys alone (a key-pruned
trace read), and the delta is ``-old + new`` for each key whose version changes.

Two ways to compute it, with one answer:

* **On the driver**, for a batch of at most ``driver_rows`` rows: the batch and the
  stored rows of its keys are collected (one job each) and ``core.upsert`` itself
  decides, so the delta is a small local relation. A Spark plan for the same work runs
  one job per shuffle (ties, the conflict check, the freshest-row window, the
  consolidation) and costs seconds however few rows arrive; this costs two jobs.
* **In Spark**, for larger batches: every check in one job, then the delta with a
  window per key, checkpointed so that its consumers do not recompute it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import reduce
from typing import Any

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from dbspark.circuit.types import Schema
from dbspark.core.upsert import (
    TYPES,
    BadUpsertRow,
    UpsertConflict,
    UpsertSpec,
    updates_against,
)
from dbspark.core.zset import ZSet
from dbspark.engine.kernels import consolidate
from dbspark.engine.spark.compile import struct_type
from dbspark.engine.spark.frames import WEIGHT, frame_to_zset, to_spark_value
from dbspark.engine.spark.session import int_setting

#: Batches of at most this many rows are decided on the driver (see the module text).
DRIVER_ROWS = 20_000


def default_driver_rows() -> int:
    """``DBSPARK_DRIVER_ROWS`` (0 keeps every batch in Spark), else ``DRIVER_ROWS``."""
    return int_setting("DBSPARK_DRIVER_ROWS", DRIVER_ROWS, minimum=0)


#: Reads the stored state rows (with ``__w``, not consolidated) of the keys in a frame.
StateReader = Callable[[DataFrame], DataFrame]


def state_delta(
    spec: UpsertSpec,
    state_schema: Schema,
    batch: DataFrame,
    read_state: StateReader,
    file: str | None,
    *,
    driver_rows: int = DRIVER_ROWS,
) -> tuple[DataFrame, bool]:
    """The state delta (state columns and ``__w``) that ``batch`` causes, and whether it
    was decided on the driver; raises ``BadUpsertRow`` or ``UpsertConflict`` before
    anything is written."""
    if driver_rows > 0 and all(t in TYPES for t in spec.types):
        rows = batch.select(*spec.columns).limit(driver_rows + 1).collect()
        if len(rows) <= driver_rows:
            return _on_driver(spec, state_schema, batch, rows, read_state, file), True
    return _in_spark(spec, state_schema, batch, read_state, file), False


def _on_driver(
    spec: UpsertSpec,
    state_schema: Schema,
    batch: DataFrame,
    rows: list[Any],
    read_state: StateReader,
    file: str | None,
) -> DataFrame:
    spark = batch.sparkSession
    key_types = [state_schema.type_of(k) for k in spec.key]
    # NULL keys are left to core's check, which names the row; they match no state.
    keys = sorted(
        {tuple(r[k] for k in spec.key) for r in rows if all(r[k] is not None for k in spec.key)},
        key=repr,
    )
    # The stored rows of those keys, judged by the reference engine's own rule.
    stored = ZSet()
    if keys:
        key_frame = spark.createDataFrame(
            [tuple(to_spark_value(v, t) for v, t in zip(k, key_types, strict=True)) for k in keys],
            struct_type(Schema(tuple(zip(spec.key, key_types, strict=True)))),
        )
        stored = frame_to_zset(read_state(key_frame), state_schema)
    delta = updates_against(spec, [tuple(r) for r in rows], stored, file)
    types = state_schema.types
    return spark.createDataFrame(
        [
            (*[to_spark_value(v, t) for v, t in zip(row, types, strict=True)], weight)
            for row, weight in delta.items()
        ],
        struct_type(state_schema, extra=[(WEIGHT, "bigint")]),
    )


def _in_spark(
    spec: UpsertSpec,
    state_schema: Schema,
    batch: DataFrame,
    read_state: StateReader,
    file: str | None,
) -> DataFrame:
    cols = list(spec.columns)
    keys, marks = list(spec.key), list(spec.watermark)
    null_keys = batch.where(reduce(lambda a, b: a | b, [F.col(k).isNull() for k in keys]))
    ties = (
        batch.dropDuplicates(cols)
        .groupBy(*keys, *marks)
        .count()
        .where(F.col("count") > 1)
        .select(*keys)
    )
    stored = consolidate(read_state(batch.select(*keys).distinct()), list(state_schema.names))
    stored = stored.where(F.col(WEIGHT) == 1).drop(WEIGHT)
    # Conflicts against the stored version: same watermark, different row.
    s = stored.select(*[F.col(c).alias(f"__s_{c}") for c in stored.columns])
    on_key = reduce(lambda a, b: a & b, [F.col(k) == F.col(f"__s_{k}") for k in keys])
    same_mark = reduce(lambda a, b: a & b, [F.col(m).eqNullSafe(F.col(f"__s_{m}")) for m in marks])
    same_row = reduce(lambda a, b: a & b, [F.col(c).eqNullSafe(F.col(f"__s_{c}")) for c in cols])
    clash = batch.join(s, on=on_key, how="inner").where(same_mark & ~same_row)
    # Every kind of bad input is found by one Spark job, before anything is written.
    problems = (
        null_keys.select(*keys, F.lit(0).alias("__problem"))
        .unionByName(ties.select(*keys, F.lit(1).alias("__problem")))
        .unionByName(clash.select(*keys, F.lit(2).alias("__problem")))
        .distinct()
        .limit(60)
        .collect()
    )
    if problems:
        worst = min(r["__problem"] for r in problems)
        offending = [tuple(r[k] for k in keys) for r in problems if r["__problem"] == worst]
        error = BadUpsertRow if worst == 0 else UpsertConflict
        detail = (
            "NULL in a key column",
            "two different rows with the same watermark in one batch",
            "a different row with the same watermark as the stored version",
        )[worst]
        raise error(spec.source, file, offending, detail=detail, key_columns=keys)
    # The freshest row per key wins (NULL watermarks are the smallest).
    order = [F.col(m).desc_nulls_last() for m in marks]
    ranked = batch.withColumn(
        "__rank", F.row_number().over(Window.partitionBy(*keys).orderBy(*order))
    )
    winners = ranked.where(F.col("__rank") == 1).drop("__rank")
    flag = state_schema.names[-1]
    winners = winners.withColumn(flag, _tombstone_condition(spec))
    joined = winners.join(s, on=on_key, how="left")
    fresher = _lexicographic_greater(marks, [f"__s_{m}" for m in marks])
    replace = joined.where(F.col(f"__s_{keys[0]}").isNull() | fresher)
    state_cols = list(state_schema.names)
    inserts = replace.select(*[F.col(c) for c in state_cols], F.lit(1).cast("bigint").alias(WEIGHT))
    retracts = replace.where(F.col(f"__s_{keys[0]}").isNotNull()).select(
        *[F.col(f"__s_{c}").alias(c) for c in state_cols],
        F.lit(-1).cast("bigint").alias(WEIGHT),
    )
    return consolidate(inserts.unionByName(retracts), state_cols).localCheckpoint()


def _tombstone_condition(spec: UpsertSpec) -> Any:
    if spec.tombstone is None:
        return F.lit(False)
    column = F.col(spec.tombstone)
    kind = spec.types[spec.columns.index(spec.tombstone)]
    if kind == "boolean":
        return F.coalesce(column == F.lit(True), F.lit(False))
    if kind == "string":
        return F.coalesce(column == F.lit(spec.tombstone_value), F.lit(False))
    return column.isNotNull()


def _lexicographic_greater(left: Sequence[str], right: Sequence[str]) -> Any:
    """left > right for composite watermarks compared left to right, NULL smallest."""
    result = F.lit(False)
    for a, b in reversed(list(zip(left, right, strict=True))):
        ca, cb = F.col(a), F.col(b)
        greater = (ca.isNotNull() & cb.isNull()) | (ca.isNotNull() & cb.isNotNull() & (ca > cb))
        result = greater | (ca.eqNullSafe(cb) & result)
    return result
