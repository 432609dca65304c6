"""Ingest: a source's batch checked, turned into a delta, logged, and run through the
linear chain fused onto the source, as one unit.

A Z-set source's batch is its delta. An upsert source's batch is decided against the
source's stored state (``kernels.upsert_delta`` on the local tier, ``upserts.py`` on
Spark; ``core/upsert.py`` states the rule and words every error): ``-stored +winner``
for each key where the batch is fresher. The raw batch also goes to the source's input
log, which full refresh replays, and its fingerprint is committed with the unit, so a
retry with a different batch for a committed epoch is refused.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, Observation
from pyspark.sql import functions as F

from dbspark.circuit.builder import Node
from dbspark.core.columns import WEIGHT, time_fields
from dbspark.core.timestamps import Time
from dbspark.core.types import is_scalar
from dbspark.core.upsert import UpsertError, updates_against
from dbspark.core.zset import ZSet
from dbspark.engine import kernels as ops
from dbspark.engine.api import (
    InputError,
    UnitReport,
    require_sources,
)
from dbspark.engine.batches import (
    CheckedTable,
    arrow_rows,
    fingerprint_text,
    upsert_batch,
    zset_batch,
)
from dbspark.engine.file_batches import FileBatch, check_utf8
from dbspark.engine.kernels import consolidate
from dbspark.engine.local.files import CheckedFiles, checked_table, read_files
from dbspark.engine.local.frame import LocalFrame
from dbspark.engine.local.tier import LocalTier
from dbspark.engine.spark.compile import struct_type
from dbspark.engine.spark.files import CheckedFrame, check_frame, load_files
from dbspark.engine.spark.session import is_connect
from dbspark.engine.spark.tier import spark_struct
from dbspark.engine.spark.unit import Tier, Unit, with_time
from dbspark.engine.spark.upserts import state_delta
from dbspark.storage import collection_names as coll
from dbspark.storage.catalog import BatchRecord
from dbspark.storage.warehouse import KeySet

log = logging.getLogger("dbspark.engine")


class Ingest:
    """Ingest, mixed into ``SparkEngine`` (it uses the engine's circuit, catalog and
    tiers)."""

    def check_batch(self, source: str, batch: Any, file: str | None = None) -> Any:
        """Validate a batch for ``source`` before anything runs: Python rows (rows and
        types), a ``DataFrame`` (column names and types, ``engine/spark/files.py``) or a
        ``FileBatch`` (read, every row checked and materialised, so a bad file is
        rejected before the epoch opens). Returns what ``ingest`` takes."""
        node = self.circuit.node(self.circuit.sources[source])
        weighted = node.op == "zset_source"
        schema = node.schema if weighted else node.params["user_schema"]
        if isinstance(batch, (CheckedFrame, CheckedFiles, CheckedTable)):
            return batch
        if isinstance(batch, FileBatch):
            spec = None if weighted else self._specs[node.id]
            check_utf8(source, batch)  # both tiers' readers would take it mangled
            small = read_files(
                source, schema, batch, weighted=weighted, upsert=spec, max_rows=self.local_rows
            )
            if small is not None:  # read here: an ingest of a small landing starts no JVM
                return small
            return load_files(self.spark, source, schema, batch, weighted=weighted, upsert=spec)
        if isinstance(batch, DataFrame):
            return CheckedFrame(check_frame(source, schema, batch, weighted=weighted))
        if isinstance(batch, pa.Table):
            if batch.num_rows > self.local_rows:  # a Spark epoch: no trip through Python rows
                frame = self.spark.createDataFrame(batch)
                return CheckedFrame(check_frame(source, schema, frame, weighted=weighted))
            typed = None if weighted else checked_table(schema, batch)
            if typed is not None:  # taken as it stands: no trip through Python rows
                return typed
            batch = arrow_rows(source, batch, schema, weighted=weighted)
        if node.op == "zset_source":
            return zset_batch(source, node.schema, batch, file)
        return upsert_batch(source, node.params["user_schema"], batch, file)

    def ingest(
        self, source: str, epoch: int, batch: Any = None, file: str | None = None
    ) -> UnitReport:
        """Ingest one source's batch for ``epoch`` and run the linear chain fused onto it."""
        require_sources(self.circuit.name, self.circuit.sources, [source], epoch=epoch)
        node = self.circuit.node(self.circuit.sources[source])
        stage = self.plan.stage_of(node.id)
        t = (epoch,)
        unit_name = stage.name
        done = self.catalog.stage_done(self.circuit.name, unit_name, t)
        committed = self.catalog.input_fingerprint(self.circuit.name, unit_name, t)
        if done and committed is None:
            return UnitReport(unit_name, t, skipped=True)
        if isinstance(batch, (FileBatch, DataFrame, pa.Table)):
            batch = self.check_batch(source, batch, file)
        from_files = batch if isinstance(batch, (CheckedFrame, CheckedFiles)) else None
        # The local reader always looks for an upsert batch's NULL keys and ties.
        rows_checked = isinstance(batch, CheckedFiles) or (
            isinstance(batch, CheckedFrame) and batch.rows_checked
        )
        if isinstance(batch, CheckedFiles):
            file = file or batch.file_label()
            batch = batch.batch
        rows: int | None = None  # unknown for a Spark frame
        if isinstance(batch, CheckedFrame):
            file = file or batch.file_label()
            unit = self._unit(self._spark_unit_tier())
        else:
            rows = len(batch) if batch is not None else 0
            unit = self._unit(self.tier_for(rows))
        frame = self._input_frame(node, batch, file, unit.tier)
        local = isinstance(unit.tier, LocalTier)
        # A first Spark ingest takes the fingerprint while writing the input log (no job of
        # its own); a check against a committed ingest, or Spark Connect, runs a job for it.
        if local:
            fingerprint = unit.tier.fingerprint(frame)
        else:
            fingerprint = frame_fingerprint(frame) if done or is_connect(self.spark) else None
        if done:
            if fingerprint != committed:
                raise InputError(
                    source,
                    f"epoch {epoch} already ingested a different batch (fingerprint "
                    f"{committed}, this one {fingerprint}); a committed epoch's input cannot "
                    "change: deliver late rows with a later epoch",
                    file,
                )
            return UnitReport(unit_name, t, skipped=True, note="same batch as committed")
        # The raw input log lets full refresh replay every source from scratch.
        logged, observation = frame, None
        if fingerprint is None:
            observation = Observation(f"dbspark_fingerprint_{uuid.uuid4().hex}")
            logged = frame.observe(observation, *_fingerprint_columns(frame))
        user, extra = self._input_log_fields(node)
        input_fields = [*user.fields, *extra]
        logged = with_time(logged, t)
        small = rows is not None and rows <= self.driver_rows
        if not local and (node.op == "upsert_source" or small):
            # Written first, from the driver when the batch is small: an upsert's rows are
            # then the ones it is decided on, with no job of their own (upserts.py). A
            # Z-set batch known to be small is written so as well, with its chain's delta:
            # a Spark write of a few rows costs a job per bucket and the commit protocol.
            unit.driver_rows = self.driver_rows
        log_record = unit.write(logged, coll.input_log(node.id), "trace", t, input_fields)
        if observation is not None:
            fingerprint = (
                frame_fingerprint(frame)
                if _driver_write_fell_back(unit, log_record)
                else _fingerprint_text(frame, observation.get)
            )
        rows_in = log_record.rows if log_record else 0
        if node.op == "zset_source":
            delta = frame
            logged_rows = None
            if not local and log_record is not None:
                logged_rows = self.warehouse.driver_written(log_record)
            if logged_rows is not None:
                # Written from the driver: the delta is those rows, known there, so the
                # chain's writes bring nothing back from Spark.
                fields = [*user.fields, *_weight_field(node)]
                delta = unit.tier.known_frame(logged_rows, fields)
        else:
            try:
                delta = self._upsert_delta(
                    node, frame, t, unit, file, log_record, batch_checked=rows_checked
                )
            except UpsertError as error:
                unit.discard()
                if from_files is None:
                    raise
                # Name only the files that hold the offending keys, and where in them.
                holding = from_files.files_holding(error.key_columns, error.keys)
                where = from_files.where_holding(error.key_columns, error.keys, holding)
                args = (error.source, ", ".join(holding), error.keys, error.detail + where)
                raise type(error)(*args, error.positions, error.key_columns) from None
        frames = {(node.id, t): delta}
        report = UnitReport(unit_name, t, rows_in=rows_in, tier=unit.tier.name)
        self._finish_stage(stage, t, frames, unit, report, start=1, fingerprint=fingerprint)
        return report

    def _user_schema(self, node: Node) -> Any:
        return node.schema if node.op == "zset_source" else node.params["user_schema"]

    def _input_log_fields(self, node: Node) -> tuple[Any, list[tuple[str, str]]]:
        """A source's raw input log: its user columns, and the fields after them (``__w``
        of a Z-set source, the epoch)."""
        return self._user_schema(node), [*_weight_field(node), *time_fields(1)]

    def _input_frame(self, node: Node, batch: Any, file: str | None, tier: Tier) -> Any:
        if isinstance(tier, LocalTier):
            fields = [*self._user_schema(node).fields, *_weight_field(node)]
            if node.op == "zset_source":
                zset = (
                    batch
                    if isinstance(batch, ZSet)
                    else zset_batch(node.label, node.schema, batch or [], file)
                )
                return tier.frame([(*r, w) for r, w in zset.items()], fields)
            if isinstance(batch, CheckedTable):
                return tier.from_arrow(batch.table)
            rows = upsert_batch(node.label, node.params["user_schema"], batch or [], file)
            return tier.frame(rows, fields)
        if isinstance(batch, CheckedFrame):
            rows = batch.rows()
            if node.op == "zset_source":  # as a ZSet would be: duplicates add, zeros vanish
                return consolidate(rows, list(node.schema.names))
            return rows
        if node.op == "zset_source":
            schema = struct_type(node.schema, extra=[(WEIGHT, "bigint")])
            if isinstance(batch, DataFrame):
                return batch
            zset = (
                batch
                if isinstance(batch, ZSet)
                else zset_batch(node.label, node.schema, batch or [], file)
            )
            return self.spark.createDataFrame([(*r, w) for r, w in zset.items()], schema)
        user = node.params["user_schema"]
        schema = struct_type(user)
        if isinstance(batch, DataFrame):
            return batch
        rows = upsert_batch(node.label, user, batch or [], file)
        return self.spark.createDataFrame(rows, schema)

    def _upsert_delta(
        self,
        node: Node,
        batch: Any,
        t: Time,
        unit: Unit,
        file: str | None,
        logged: BatchRecord | None,
        *,
        batch_checked: bool = False,
    ) -> Any:
        """Turn upserts into the state delta by consulting the source's arranged state
        (``upserts.py`` on Spark, ``kernels.upsert_delta`` on the local tier), and write
        the delta to the state trace. ``logged`` is the batch as just written to the
        input log (None: it was empty). ``batch_checked``: a file batch, whose NULL keys
        and ties were looked for when its files were read (``files.check_rows``, the
        local reader), and are not looked for again."""
        spec = self._specs[node.id]
        keys = list(spec.key)
        state_collection = coll.state(node.id)
        state_fields = [*node.schema.fields, (WEIGHT, "bigint"), *time_fields(1)]
        if isinstance(unit.tier, LocalTier):
            delta = self._local_upsert_delta(
                node, batch, unit.tier, state_fields, file, batch_checked
            )
        else:
            state_struct = spark_struct(state_fields)

            def read_state(key_frame: DataFrame | KeySet) -> DataFrame:
                return self.traces.read(
                    state_collection, state_struct, keys=key_frame, bucket_by=keys
                )

            # The batch's rows, when the driver wrote its input log (a small batch).
            rows: list[tuple[Any, ...]] | None = None
            if logged is None:
                rows = []  # an empty batch
            elif all(is_scalar(kind) for kind in spec.types):
                written = self.warehouse.driver_written(logged)
                if written is not None:
                    columns = [written.column(c).to_pylist() for c in spec.columns]
                    rows = list(zip(*columns, strict=True))
            delta, decided = state_delta(
                spec,
                node.schema,
                batch,
                read_state,
                file,
                rows,
                buckets=self.buckets,
                batch_checked=batch_checked,
            )
            if decided is not None:  # small: written here, and so are the writes after it
                unit.write_table(decided, state_collection, "trace", t, bucket_by=keys)
                return delta
            unit.driver_rows = 0
        unit.write_at(delta, state_collection, "trace", t, state_fields, bucket_by=keys)
        return delta

    def _local_upsert_delta(
        self,
        node: Node,
        batch: LocalFrame,
        tier: LocalTier,
        state_fields: Any,
        file: str | None,
        batch_checked: bool,
    ) -> LocalFrame:
        """The state delta, set-based (``kernels.upsert_delta``) against the stored rows of
        the batch's keys (a key-pruned read of the state trace). Bad input is judged again
        by ``core/upsert.py``, whose error names the rows and watermarks."""
        spec = self._specs[node.id]
        keys = list(spec.key)
        state_columns = list(node.schema.names)
        table = batch.toArrow()
        if not table.num_rows:
            return tier.empty([*node.schema.fields, (WEIGHT, "bigint")])
        gathered = tier.gather_keys(tier.from_arrow(table.select(keys)), (self.buckets,))
        records = self.catalog.batches(self.circuit.name, coll.state(node.id), kind="trace")
        stored = tier.read(records, state_fields, keys=gathered, bucket_by=keys)
        current = tier.checkpoint(ops.upsert_current(stored, state_columns))
        batch = tier.from_arrow(table)
        problems = ops.upsert_problems(
            spec, batch, current, within_batch=not batch_checked
        ).collect()
        if problems:
            rows = list(zip(*(table.column(c).to_pylist() for c in spec.columns), strict=True))
            updates_against(spec, rows, tier.zset(stored, node.schema), file)  # raises
            raise RuntimeError(  # an engine bug, not bad input: the two rules disagree
                f"upsert source {spec.source!r}: the set-based check found {problems[:5]}, "
                "which core/upsert.py accepts"
            )
        # Computed once: the state trace's append and the fused chain both read it.
        return tier.checkpoint(ops.upsert_delta(spec, batch, current, state_columns))


def _weight_field(node: Node) -> list[tuple[str, str]]:
    """A Z-set source's raw input carries weights; an upsert source's does not."""
    return [(WEIGHT, "bigint")] if node.op == "zset_source" else []


def _driver_write_fell_back(unit: Unit, record: BatchRecord | None) -> bool:
    """Whether ``unit`` tried to write ``record``'s rows from the driver and found more
    than ``driver_rows`` of them, so Spark wrote the batch after all. The observed
    fingerprint is then the first action's, the collect of at most ``driver_rows + 1``
    rows, which stopped before the batch's end: it must be taken again, by a job."""
    return (
        unit.driver_rows > 0
        and record is not None
        and unit.tier.warehouse.driver_written(record) is None
    )


def _fingerprint_columns(frame: DataFrame) -> list[Any]:
    """The aggregates ``frame_fingerprint`` hashes (also usable as observed metrics)."""
    cols = sorted(frame.columns)
    return [
        F.count(F.lit(1)).alias("n"),
        # xxhash64 skips NULLs, so which columns are NULL is hashed as well.
        F.sum(
            F.xxhash64(
                *[F.col(c) for c in cols],
                F.concat_ws("", *[F.col(c).isNull().cast("int").cast("string") for c in cols]),
            ).cast("decimal(38,0)")
        ).alias("h"),
    ]


def frame_fingerprint(frame: DataFrame) -> str:
    """An order-independent hash of a frame's rows (a multiset hash: the sum of row
    hashes, with the count), computed by one Spark job."""
    row = frame.select(*_fingerprint_columns(frame)).first()
    return _fingerprint_text(frame, row.asDict() if row is not None else {})


def _fingerprint_text(frame: DataFrame, values: Mapping[str, Any]) -> str:
    return fingerprint_text(frame.columns, int(values.get("n") or 0), int(values.get("h") or 0))
