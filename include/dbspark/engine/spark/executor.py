"""The Spark stage executor: run one planned stage (or one loop iteration) for one time.

This is what every caller runs: the conformance replay, the demo, the Airflow
tasks and ``spark_jobs/``. Each *unit of work* is one stage at one root time
(an epoch), or one whole iteration of a loop. A unit reads its inputs from the
warehouse (deltas of upstream stages, key-pruned trace reads), computes with
the kernels of ``engine/kernels.py``, writes every output as fresh Parquet files, and
then registers all of them in ONE catalog transaction together with the
unit's run record. Hence:

* a unit killed at any point leaves only unregistered files (garbage, never
  visible state);
* a retried unit recomputes the same result from the same committed inputs;
* a unit whose run record is already committed does nothing.

An epoch is opened, its sources ingested, its stages run in plan order (loops
iterate until the convergence rule holds), its views published, and then it is
committed. Only then may the next epoch open. Compaction of traces happens
after the commit and changes no answer.
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import reduce
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

from dbspark.circuit.builder import STATEFUL_OPS, Circuit, Node
from dbspark.circuit.planner import LoopPlan, Plan, Stage, plan
from dbspark.core import timestamps
from dbspark.core.columns import EPOCH, WEIGHT, time_columns, time_fields
from dbspark.core.timestamps import Time
from dbspark.core.upsert import UpsertError, updates_against
from dbspark.core.zset import ZSet
from dbspark.engine import kernels as ops
from dbspark.engine.api import (
    EpochOrderError,
    EpochReport,
    EpochResult,
    InputError,
    IterationReport,
    LoopDidNotConverge,
    UnitReport,
    loop_reports,
    unknown_sources,
)
from dbspark.engine.batches import (
    CheckedTable,
    arrow_rows,
    fingerprint_text,
    upsert_batch,
    upsert_spec,
    zset_batch,
)
from dbspark.engine.dialect import dialect_of
from dbspark.engine.file_batches import FileBatch
from dbspark.engine.kernels import consolidate
from dbspark.engine.local.files import CheckedFiles, checked_table, read_files
from dbspark.engine.local.frame import LocalFrame
from dbspark.engine.local.tier import LocalTier
from dbspark.engine.spark.compile import struct_type
from dbspark.engine.spark.files import CheckedFrame, check_frame, load_files
from dbspark.engine.spark.session import int_setting, is_connect, spark_session
from dbspark.engine.spark.tier import SparkTier, spark_struct
from dbspark.engine.spark.upserts import default_driver_rows, state_delta
from dbspark.storage.catalog import BatchRecord, Catalog, LoopIteration
from dbspark.storage.traces import TraceStore, advance_columns
from dbspark.storage.warehouse import KeySet, Warehouse

log = logging.getLogger("dbspark.engine")


#: A delta as a DataFrame, or None when it is known to be empty.
Frame = DataFrame | None

#: Gathered key sets an engine keeps for reuse (``SparkEngine._keys_of``), newest last.
_KEY_SETS_KEPT = 64


def circuit_fingerprint(circuit: Circuit) -> str:
    """A stable hash of a circuit's definition (callables by qualified name)."""

    def normal(value: Any) -> Any:
        if callable(value) and not isinstance(value, type):
            return (
                f"callable:{getattr(value, '__module__', '')}.{getattr(value, '__qualname__', '')}"
            )
        if isinstance(value, dict):
            return {str(k): normal(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
        if isinstance(value, (list, tuple)):
            return [normal(v) for v in value]
        return repr(value)

    payload = [
        (n.op, list(n.inputs), str(n.schema), n.scope, normal(n.params)) for n in circuit.nodes
    ]
    payload.append(sorted(circuit.views.items()))
    text = json.dumps(payload, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


#: Epochs whose input has at most this many rows run every unit on the local tier. On
#: one 2-core machine the local tier is the faster one at any size measured (a 5% TPC-H
#: SF 1 epoch, 324,000 rows: 1.4 s there, 17.7 s on local Spark); the bound is the
#: worker's memory, which holds the delta and the trace slices it touches.
LOCAL_ROWS = 1_000_000


def default_local_rows() -> int:
    """``DBSPARK_LOCAL_ROWS`` (0 runs every unit on Spark), else ``LOCAL_ROWS``."""
    return int_setting("DBSPARK_LOCAL_ROWS", LOCAL_ROWS, minimum=0)


Tier = LocalTier | SparkTier


class _Unit:
    """One unit of work: the tier it runs on and the files it wrote, not yet registered
    in the catalog.

    ``driver_rows`` > 0 says a Spark unit's batches are probably small, so the warehouse
    writes them from the driver (``Warehouse.write``)."""

    def __init__(self, tier: Tier, driver_rows: int = 0) -> None:
        self.tier = tier
        self.records: list[BatchRecord] = []
        self.driver_rows = driver_rows
        # The committed batches this unit may read, by (collection, kind): what units
        # before it committed, which nothing changes while it runs. One catalog query
        # on first use instead of one per read (a loop iteration reads dozens).
        self._committed: dict[tuple[str, str], list[BatchRecord]] | None = None

    def add(self, record: BatchRecord | None) -> None:
        if record is not None:
            self.records.append(record)

    def committed(
        self, catalog: Catalog, circuit: str, collection: str, kind: str
    ) -> list[BatchRecord]:
        if self._committed is None:
            self._committed = {}
            for record in catalog.operator_batches(circuit):
                self._committed.setdefault((record.collection, record.kind), []).append(record)
        return self._committed.get((collection, kind), [])


class SparkEngine:
    """Runs a circuit incrementally on Spark with traces in a warehouse and a SQL catalog."""

    def __init__(
        self,
        circuit: Circuit,
        warehouse: str | Path,
        *,
        spark: SparkSession | Callable[[], SparkSession] | None = None,
        catalog_url: str | None = None,
        buckets: int = 16,
        driver_rows: int | None = None,
        local_rows: int | None = None,
    ) -> None:
        self.circuit = circuit
        #: On the Spark tier, upsert batches of up to this many rows are decided on the
        #: driver, and the units of an epoch with up to this many input rows write from the
        #: driver (0: never; None: ``DBSPARK_DRIVER_ROWS`` or 20,000). See ``upserts.py``.
        self.driver_rows = default_driver_rows() if driver_rows is None else driver_rows
        #: Units of an epoch whose input has at most this many rows run on the local tier,
        #: in this process with no Spark job (0: never; None: ``DBSPARK_LOCAL_ROWS`` or
        #: 1,000,000). Larger ones run on Spark. See ARCHITECTURE.md, "Two tiers".
        self.local_rows = default_local_rows() if local_rows is None else local_rows
        self.plan: Plan = plan(circuit)
        self._spark = spark
        self.root = Path(warehouse)
        self.root.mkdir(parents=True, exist_ok=True)
        self.catalog = Catalog(catalog_url) if catalog_url else Catalog.for_warehouse(self.root)
        self.warehouse = Warehouse(self.root)
        # The views after this engine's last ``step``, to give the next step its change.
        self._step_views: dict[str, ZSet] | None = None
        self.buckets = buckets
        self.traces = TraceStore(
            lambda: self.spark, self.warehouse, self.catalog, circuit.name, buckets=buckets
        )
        self._local: LocalTier | None = None
        self._spark_tier: SparkTier | None = None
        self.catalog.register_circuit(circuit.name, circuit_fingerprint(circuit))
        self._specs = {n.id: upsert_spec(n) for n in circuit.nodes if n.op == "upsert_source"}
        self._stored = _stored_deltas(circuit, self.plan)
        self._key_sets: dict[tuple[Any, ...], KeySet] = {}  # see _keys_of

    # ================================================================================ tiers
    @property
    def spark(self) -> SparkSession:
        """The Spark session, started on first use: an epoch that stays on the local tier
        never starts one. ``spark`` may be given as a function that opens it (a task's
        Spark Connect client, say), which is then called only if a unit needs Spark."""
        if self._spark is None:
            self._spark = spark_session()
        elif callable(self._spark):  # a session object is not callable; its opener is
            self._spark = self._spark()
        return self._spark

    @property
    def spark_started(self) -> bool:
        return self._spark is not None and not callable(self._spark)

    @property
    def local(self) -> LocalTier:
        if self._local is None:
            self._local = LocalTier(self.warehouse, buckets=self.buckets)
        return self._local

    def _spark_unit_tier(self) -> SparkTier:
        if self._spark_tier is None:
            self._spark_tier = SparkTier(self.spark, self.warehouse, buckets=self.buckets)
        return self._spark_tier

    def tier_for(self, rows: int | None) -> Tier:
        """The tier for a unit fed by ``rows`` input rows (None: unknown, too many);
        ``local_rows=0`` sends every unit, even an empty one, to Spark."""
        if rows is not None and self.local_rows > 0 and rows <= self.local_rows:
            return self.local
        return self._spark_unit_tier()

    def _epoch_unit(self, epoch: int) -> _Unit:
        """A new unit of ``epoch``: on the local tier when the epoch's input (its raw input
        logs, from the catalog) is small, else on Spark."""
        rows = self._input_rows(epoch)
        tier = self.tier_for(rows)
        driver_rows = self.driver_rows if rows <= self.driver_rows else 0
        return _Unit(tier, driver_rows if tier.name == "spark" else 0)

    # ================================================================================ epochs
    def last_committed_epoch(self) -> int:
        return self.catalog.last_committed_epoch(self.circuit.name)

    def open_epoch(self, epoch: int, label: str | None = None) -> bool:
        """Open ``epoch``; False if it is already committed (the run is a no-op).

        ``label`` says what the epoch stands for (an Airflow data interval); the catalog
        keeps it and refuses to give one label two epochs."""
        name = self.circuit.name
        if self._local is not None:
            self._local.forget_files()
        state = self.catalog.epoch_state(name, epoch)
        if state == "committed":
            if label is not None:
                self.catalog.open_epoch(name, epoch, label)  # checks the label matches
            log.info("epoch %s of %s is already committed: nothing to do", epoch, name)
            return False
        last = self.last_committed_epoch()
        if epoch != last + 1:
            missing = last + 1
            raise EpochOrderError(
                f"circuit {name!r}: epoch {epoch} cannot run before epoch {missing} commits "
                f"(last committed: {last})"
            )
        if state is None or label is not None:
            self.catalog.open_epoch(name, epoch, label)
        return True

    def run_epoch(self, epoch: int, inputs: Mapping[str, Any] | None = None) -> EpochReport:
        """Open, ingest, run every stage and loop, publish and commit one epoch."""
        report = EpochReport(epoch)
        inputs = dict(inputs or {})
        error = unknown_sources(self.circuit.name, self.circuit.sources, inputs)
        if error is not None:
            raise error
        # Bad rows are rejected before the epoch opens or anything is written.
        checked = {name: self.check_batch(name, batch) for name, batch in inputs.items()}
        if not self.open_epoch(epoch):
            report.skipped = True
            return report
        t = (epoch,)
        for stage in self.plan.stages_in_scope(0):
            anchor = self.circuit.node(stage.anchor)
            if anchor.op in ("zset_source", "upsert_source"):
                report.units.append(self.ingest(anchor.label, epoch, checked.get(anchor.label)))
                continue
            if anchor.op == "leave":
                loop = self.plan.loops[anchor.params["loop"]]
                report.iterations.extend(self.run_loop(loop, t))
            report.units.append(self.run_stage(stage.id, t))
        report.units.append(self.publish(epoch))
        self.close_epoch(epoch)
        return report

    def step(self, inputs: Mapping[str, Any] | None = None) -> EpochResult:
        """Run the next epoch and return every view's contents and change (``Engine``)."""
        epoch = self.last_committed_epoch() + 1
        before = self._step_views if self._step_views is not None else self.views()
        report = self.run_epoch(epoch, inputs)
        after = self.views()
        self._step_views = after
        deltas = {name: after[name] - before.get(name, ZSet()) for name in after}
        return EpochResult(epoch, after, deltas, loop_reports(report.iterations), report)

    @property
    def location(self) -> str:
        catalog = self.catalog.engine.url.render_as_string(hide_password=True)
        return f"warehouse {self.root} (catalog {catalog})"

    def close_epoch(self, epoch: int) -> None:
        """Commit the epoch, then compact traces under the new frontier."""
        self.catalog.commit_epoch(self.circuit.name, epoch)
        self.compact(epoch)
        if self._local is not None:
            self._local.forget_files()

    # ================================================================================ input
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
        if isinstance(batch, CheckedFiles):
            file = file or batch.file_label()
            batch = batch.batch
        if isinstance(batch, CheckedFrame):
            file = file or batch.file_label()
            unit = _Unit(self._spark_unit_tier())
        else:
            rows = len(batch) if batch is not None else 0
            unit = _Unit(self.tier_for(rows))
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
        rows_in = 0
        if node.op == "zset_source":
            delta = frame
        else:
            try:
                delta = self._upsert_delta(node, frame, t, unit, file)
            except UpsertError as error:
                if from_files is None or len(from_files.files) < 2:
                    raise
                # Name only the files that hold the offending keys.
                holding = from_files.files_holding(error.key_columns, error.keys)
                raise error.in_files(holding) from None
        # The raw input log lets full refresh replay every source from scratch.
        logged, observation = frame, None
        if fingerprint is None:
            observation = Observation(f"dbspark_fingerprint_{uuid.uuid4().hex}")
            logged = frame.observe(observation, *_fingerprint_columns(frame))
        input_fields = [*self._user_schema(node).fields, *_weight_field(node), *time_fields(1)]
        logged = _with_time(logged, t)
        unit.add(self._write(unit, logged, f"n{node.id}.input", "trace", t, input_fields))
        if observation is not None:
            fingerprint = _fingerprint_text(frame, observation.get)
        if unit.records:
            rows_in = unit.records[-1].rows
        frames = {(node.id, t): delta}
        report = UnitReport(unit_name, t, rows_in=rows_in, tier=unit.tier.name)
        self._finish_stage(stage, t, frames, unit, report, start=1, fingerprint=fingerprint)
        return report

    def _user_schema(self, node: Node) -> Any:
        return node.schema if node.op == "zset_source" else node.params["user_schema"]

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

    def _upsert_delta(self, node: Node, batch: Any, t: Time, unit: _Unit, file: str | None) -> Any:
        """Turn upserts into the state delta by consulting the source's arranged state
        (``upserts.py``; on the local tier ``core/upsert.py`` decides directly), and write
        the delta to the state trace."""
        spec = self._specs[node.id]
        keys = list(spec.key)
        state_collection = f"n{node.id}.state"
        state_fields = [*node.schema.fields, (WEIGHT, "bigint"), *time_fields(1)]
        if isinstance(unit.tier, LocalTier):
            delta = self._local_upsert_delta(node, batch, unit.tier, state_fields, file)
        else:
            state_struct = spark_struct(state_fields)

            def read_state(key_frame: DataFrame) -> DataFrame:
                return self.traces.read(
                    state_collection, state_struct, keys=key_frame, bucket_by=keys
                )

            delta, on_driver = state_delta(
                spec, node.schema, batch, read_state, file, driver_rows=self.driver_rows
            )
            if on_driver:  # the batch was small: so are the writes that follow from it
                unit.driver_rows = self.driver_rows
        record = self._write(
            unit, _with_time(delta, t), state_collection, "trace", t, state_fields, bucket_by=keys
        )
        unit.add(record)
        return delta

    def _local_upsert_delta(
        self, node: Node, batch: LocalFrame, tier: LocalTier, state_fields: Any, file: str | None
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
        records = self.catalog.batches(self.circuit.name, f"n{node.id}.state", kind="trace")
        stored = tier.read(records, state_fields, keys=gathered, bucket_by=keys)
        current = tier.checkpoint(ops.upsert_current(stored, state_columns))
        batch = tier.from_arrow(table)
        problems = ops.upsert_problems(spec, batch, current).collect()
        if problems:
            rows = list(zip(*(table.column(c).to_pylist() for c in spec.columns), strict=True))
            updates_against(spec, rows, tier.zset(stored, node.schema), file)  # raises
            raise RuntimeError(  # an engine bug, not bad input: the two rules disagree
                f"upsert source {spec.source!r}: the set-based check found {problems[:5]}, "
                "which core/upsert.py accepts"
            )
        return ops.upsert_delta(spec, batch, current, state_columns)

    # ================================================================================ stages
    def run_stage(self, stage_id: int, t: Time) -> UnitReport:
        """Run one root-scope stage at time ``t`` and commit it (a no-op if already done)."""
        stage = self.plan.stages[stage_id]
        if self.catalog.stage_done(self.circuit.name, stage.name, t):
            return UnitReport(stage.name, t, skipped=True)
        unit = self._epoch_unit(t[0])
        report = UnitReport(stage.name, t, tier=unit.tier.name)
        self._finish_stage(stage, t, {}, unit, report, start=0)
        return report

    def _finish_stage(
        self,
        stage: Stage,
        t: Time,
        frames: dict[tuple[int, Time], Frame],
        unit: _Unit,
        report: UnitReport,
        start: int,
        commit: bool = True,
        fingerprint: str | None = None,
    ) -> None:
        for node_id in stage.nodes[start:]:
            frames[(node_id, t)] = self._evaluate(
                self.circuit.node(node_id), t, frames, unit, report
            )
        for node_id in stage.outputs:
            frame = frames[(node_id, t)]
            if node_id not in self._stored:
                continue  # read only by this unit, at this time: it stays a DataFrame
            node = self.circuit.node(node_id)
            record = (
                None
                if frame is None
                else self._write(unit, frame, f"n{node_id}", "delta", t, self._fields(node))
            )
            unit.add(record)
            # Later work in this unit reads the written batch instead of recomputing the
            # stage's whole lineage once per consumer.
            frames[(node_id, t)] = self._read_back(record, node, unit)
            report.rows_out[node.label] = record.rows if record else 0
            if record:
                report.paths.append(record.path)
        if commit:
            self.catalog.commit(
                self.circuit.name, stage.name, t, unit.records, input_fingerprint=fingerprint
            )
            log.info("%s", report.describe())

    # ================================================================================ reading
    def _schema_of(self, node: Node, depth: int = 0) -> Any:
        """``_fields`` as a Spark schema (for Spark's own reads: views, full refresh)."""
        return spark_struct(self._fields(node, depth))

    def _fields(self, node: Node, depth: int = 0) -> list[tuple[str, str]]:
        """A node's collection as ``(name, type)`` pairs: its columns, ``__w`` and the time
        columns of ``depth`` (none for a delta)."""
        return [*node.schema.fields, (WEIGHT, "bigint"), *(time_fields(depth) if depth else [])]

    def _write(
        self,
        unit: _Unit,
        frame: Any,
        collection: str,
        kind: str,
        t: Time,
        fields: Sequence[tuple[str, str]],
        *,
        bucket_by: Sequence[str] | None = None,
    ) -> BatchRecord | None:
        """Write a unit's output with the unit's tier (not yet committed); a Spark unit
        may write from the driver (``driver_rows``), the local tier always writes here."""
        options = {} if isinstance(unit.tier, LocalTier) else {"driver_rows": unit.driver_rows}
        return unit.tier.write(
            frame, self.circuit.name, collection, kind, t, fields, bucket_by=bucket_by, **options
        )

    def _records(
        self, unit: _Unit, collection: str, kind: str, predicate: Callable[[Time], bool]
    ) -> list[BatchRecord]:
        committed = unit.committed(self.catalog, self.circuit.name, collection, kind)
        pending = [r for r in unit.records if r.collection == collection and r.kind == kind]
        return [r for r in [*committed, *pending] if predicate(tuple(r.time))]

    def _delta(
        self, node_id: int, t: Time, unit: _Unit, frames: Mapping[tuple[int, Time], Frame]
    ) -> Frame:
        """The delta of a node at ``t``; None when it is known to be empty (from the
        catalog alone, so an empty input costs no Spark job)."""
        if (node_id, t) in frames:
            return frames[(node_id, t)]
        node = self.circuit.node(node_id)
        records = self._records(unit, f"n{node_id}", "delta", lambda time: time == t)
        if not records:
            return None
        return unit.tier.read(records, self._fields(node))

    def _read_back(
        self, record: BatchRecord | None, node: Node, unit: _Unit, depth: int = 0
    ) -> Frame:
        """A just-written batch as a delta (time columns dropped); None when it was empty."""
        if record is None:
            return None
        frame = unit.tier.read([record], self._fields(node, depth))
        return frame.drop(*time_columns(depth)) if depth else frame

    def _input_rows(self, epoch: int) -> int:
        """How many rows the epoch's sources brought (its raw input logs, from the catalog):
        what decides the tier of its units, and whether a Spark unit writes from the driver
        (a unit fed by a few rows of change rarely writes many)."""
        rows = 0
        for source_id in self.circuit.sources.values():
            for record in self.catalog.batches(
                self.circuit.name, f"n{source_id}.input", epoch=epoch
            ):
                rows += record.rows
        return rows

    def _or_empty(self, frame: Frame, node: Node, unit: _Unit) -> Any:
        return frame if frame is not None else unit.tier.empty(self._fields(node))

    # ================================================================================ operators
    def _evaluate(
        self,
        node: Node,
        t: Time,
        frames: dict[tuple[int, Time], Frame],
        unit: _Unit,
        report: UnitReport,
    ) -> Frame:
        op, params = node.op, node.params

        def inp(port: int = 0, at: Time = t) -> Frame:
            return self._delta(node.inputs[port], at, unit, frames)

        schema_in = self.circuit.node(node.inputs[0]).schema if node.inputs else None
        if op in ("select", "filter", "flat_map", "negate", "upsert_live"):
            delta = inp()
            if delta is None:
                return None
            if op == "select":
                return ops.select(delta, params["columns"], schema_in)
            if op == "filter":
                return ops.filter_(delta, params["predicate"], schema_in)
            if op == "flat_map":
                return ops.flat_map(delta, params["name"], params["array"], schema_in)
            if op == "negate":
                return ops.negate(delta)
            return ops.upsert_live(delta)
        if op in ("index_by", "consolidate", "inspect"):
            return inp()
        if op in ("plus", "minus"):
            left, right = inp(0), inp(1)
            if right is None:
                return left
            if op == "minus":
                right = ops.negate(right)
            return right if left is None else ops.plus(left, right)
        if op == "join_function":
            return self._general_linear(node, t, inp(), unit)
        if op == "delay":
            return inp(0, (*t[:-1], t[-1] - 1)) if t[-1] > 0 else None
        if op == "enter":
            return inp(0, t[:-1]) if t[-1] == 0 else None
        if op == "variable":
            if t[-1] == 0:
                return inp()
            previous = (*t[:-1], t[-1] - 1)
            fed_back = self._delta(params["feedback"], previous, unit, frames)
            initial = inp(0, previous)
            if initial is None:
                return fed_back
            both = ops.minus(self._or_empty(fed_back, node, unit), initial)
            return consolidate(both, list(node.schema.names))
        if op == "leave":
            return self._leave(node, t, unit, report)
        if op in STATEFUL_OPS:
            return self._stateful(node, t, unit, frames)
        raise AssertionError(f"no Spark evaluation for {op}")

    def _general_linear(self, node: Node, t: Time, delta: Frame, unit: _Unit) -> Frame:
        schema_in = self.circuit.node(node.inputs[0]).schema
        names = list(node.schema.names)
        now: Frame = None
        if delta is not None:
            out = unit.tier.checkpoint(
                ops.general_linear(delta, node.params["emits"], schema_in, node.schema, t[0])
            )
            F = dialect_of(out).F
            later = out.where(F.col(EPOCH) > t[0])
            for (due,) in later.select(EPOCH).distinct().collect():
                at = (int(due), *t[1:])
                part = later.where(F.col(EPOCH) == due).drop(EPOCH)
                collection = f"n{node.id}.scheduled"
                unit.add(self._write(unit, part, collection, "delta", at, self._fields(node)))
            now = out.where(F.col(EPOCH) == t[0]).drop(EPOCH)
        scheduled = self._records(unit, f"n{node.id}.scheduled", "delta", lambda time: time == t)
        if scheduled:
            due_now = unit.tier.read(scheduled, self._fields(node))
            now = due_now if now is None else now.unionByName(due_now)
        return None if now is None else consolidate(now, names)

    def _stateful(
        self, node: Node, t: Time, unit: _Unit, frames: dict[tuple[int, Time], Frame]
    ) -> Frame:
        params = node.params
        depth = len(t)
        port_keys = _port_keys(self.circuit, node)
        deltas: list[Frame] = []
        for port, input_id in enumerate(node.inputs):
            delta = self._delta(input_id, t, unit, frames)
            if delta is not None:
                input_node = self.circuit.node(input_id)
                record = self._write(
                    unit,
                    _with_time(delta, t),
                    f"n{node.id}.in{port}",
                    "trace",
                    t,
                    self._fields(input_node, depth),
                    bucket_by=list(port_keys[port]),
                )
                unit.add(record)
                # The input delta is exactly what was just arranged: read it from there.
                delta = self._read_back(record, input_node, unit, depth)
            deltas.append(delta)
        schemas = [self.circuit.node(i).schema for i in node.inputs]
        out_names = list(node.schema.names)
        if depth == 1 and all(d is None for d in deltas):
            return None  # at the root clock, output needs input at this very epoch
        if depth > 1 and not any(
            self._records(
                unit,
                f"n{node.id}.in{port}",
                "trace",
                lambda time: time[0] == t[0] and timestamps.less_equal(time, t),
            )
            for port in range(len(node.inputs))
        ):
            return None  # no key of this node changed in this epoch: nothing can be owed
        present = [d is not None for d in deltas]
        deltas = [
            self._or_empty(d, self.circuit.node(i), unit)
            for d, i in zip(deltas, node.inputs, strict=True)
        ]
        if node.op == "join" and depth == 1:
            left_keys, right_keys = list(params["left_keys"]), list(params["right_keys"])

            def before(port: int, keys: list[str]) -> DataFrame:
                """One side's history before this epoch, for the other side's delta keys
                (no read at all when the other side did not change)."""
                other = 1 - port
                if not present[other]:
                    return self._or_empty(None, self.circuit.node(node.inputs[port]), unit)
                gathered = self._gather(unit, deltas[other].select(*keys))
                rows = self._trace(node, port, unit, keys=gathered, when=lambda x: x[0] < t[0])
                return rows.drop(*time_columns(1))

            return ops.join_delta_root(
                deltas[0],
                deltas[1],
                before(0, right_keys),
                before(1, left_keys),
                left_keys,
                right_keys,
                list(schemas[0].names),
                list(params["right_values"]),
                out_names,
            )
        # Keys touched in this epoch at or before t: the only ones that can change now.
        # A global aggregate (no group columns) is one group: it reads its whole trace.
        global_group = node.op == "aggregate" and not params["keys"]
        touched = None if global_group else self._touched_keys(node, t, unit, port_keys)
        traces = []
        for port in range(len(node.inputs)):
            traces.append(
                self._trace(
                    node, port, unit, keys=touched, when=lambda time: timestamps.less_equal(time, t)
                )
            )
        if node.op == "distinct":
            return ops.distinct_delta(traces[0], out_names, t)
        if node.op == "aggregate":
            return ops.aggregate_delta(
                traces[0], schemas[0], list(params["keys"]), params["aggregations"], node.schema, t
            )
        return ops.join_delta_nested(
            traces[0],
            traces[1],
            list(params["left_keys"]),
            list(params["right_keys"]),
            list(schemas[0].names),
            list(schemas[1].names),
            list(params["right_values"]),
            out_names,
            t,
        )

    def _trace(
        self,
        node: Node,
        port: int,
        unit: _Unit,
        *,
        keys: KeySet | None,
        when: Callable[[Time], bool],
    ) -> DataFrame:
        """Port ``port``'s trace at the times ``when`` accepts, pruned to ``keys`` (given in
        either port's key names: they are renamed to this port's)."""
        input_node = self.circuit.node(node.inputs[port])
        depth = self.circuit.scope(node.scope).depth
        collection = f"n{node.id}.in{port}"
        records = self._records(unit, collection, "trace", when)
        port_keys = list(_port_keys(self.circuit, node)[port])
        return unit.tier.read(
            records,
            self._fields(input_node, depth),
            keys=None if keys is None else keys.renamed(port_keys),
            bucket_by=port_keys,
        )

    def _gather(self, unit: _Unit, keys: Any) -> KeySet:
        return unit.tier.gather_keys(keys, (self.buckets,))

    def _touched_keys(
        self, node: Node, t: Time, unit: _Unit, port_keys: Sequence[Sequence[str]]
    ) -> KeySet:
        """Keys of any port with an update in t's epoch at or before t (named as port 0's keys)."""
        records = [
            self._records(
                unit,
                f"n{node.id}.in{port}",
                "trace",
                lambda time: time[0] == t[0] and timestamps.less_equal(time, t),
            )
            for port in range(len(node.inputs))
        ]
        schemas = [self._fields(self.circuit.node(i), len(t)) for i in node.inputs]
        return self._keys_of(node, records, port_keys, schemas, unit)

    def _keys_of(
        self,
        node: Node,
        records: Sequence[Sequence[BatchRecord]],
        port_keys: Sequence[Sequence[str]],
        schemas: Sequence[Any],
        unit: _Unit,
    ) -> KeySet:
        """The keys in each port's ``records`` (named as port 0's keys), gathered by one
        Spark job (or one local query). Batches never change, so the same batches give the
        same keys: a loop iteration that added no batch for the node reuses the previous
        gathering."""
        paths = tuple(tuple(sorted(r.path for r in rs)) for rs in records)
        memo = (unit.tier.name, node.id, paths)
        if memo in self._key_sets:
            return self._key_sets[memo]
        frames = [
            _renamed(unit.tier.read(rs, schemas[port]), port_keys[port], port_keys[0])
            for port, rs in enumerate(records)
        ]
        keys = self._gather(unit, reduce(ops.plus, frames))
        if keys.buckets is not None:  # gathered to the driver: a local relation to keep
            self._key_sets[memo] = keys
            while len(self._key_sets) > _KEY_SETS_KEPT:
                del self._key_sets[next(iter(self._key_sets))]
        return keys

    # ================================================================================ loops
    def _leave(self, node: Node, t: Time, unit: _Unit, report: UnitReport) -> Frame:
        loop = self.plan.loops[node.params["loop"]]
        if len(t) > 1:
            # A loop nested in a loop runs inside the enclosing iteration's unit of work.
            self._iterate_inline(loop, t, unit)
        level = len(t)
        records = self._records(unit, f"n{loop.result}", "delta", lambda time: time[:level] == t)
        if not records:
            return None
        result_node = self.circuit.node(loop.result)
        total = unit.tier.read(records, self._fields(result_node))
        return consolidate(total, list(node.schema.names))

    def run_loop(self, loop: LoopPlan, prefix: Time) -> list[IterationReport]:
        """Iterate ``loop`` at ``prefix`` until it converges; each iteration commits on its own."""
        reports = []
        while True:
            report = self.run_iteration(loop, prefix)
            reports.append(report)
            if report.converged:
                return reports

    def loop_state(self, loop: LoopPlan, prefix: Time) -> tuple[int, bool, str]:
        """(next iteration to run, converged?, reason) from the catalog."""
        done = self.catalog.loop_iterations(self.circuit.name, loop.name, prefix)
        if not done:
            return 0, False, ""
        last = done[-1]
        return last.iteration + 1, last.converged, last.reason

    def run_iteration(self, loop: LoopPlan, prefix: Time) -> IterationReport:
        """Run the next pending iteration of ``loop`` at ``prefix`` (the catalog orders them)."""
        iteration, converged, reason = self.loop_state(loop, prefix)
        if converged:
            return IterationReport(
                loop.name, prefix, iteration - 1, 0, -1, True, reason, skipped=True
            )
        if iteration >= loop.max_iterations:
            raise LoopDidNotConverge(
                f"loop {loop.name!r} of circuit {self.circuit.name!r} did not converge at "
                f"{list(prefix)} within max_iterations={loop.max_iterations}"
            )
        unit = self._epoch_unit(prefix[0])
        t = (*prefix, iteration)
        report = self._iteration(loop, t, unit)
        self.catalog.commit(
            self.circuit.name,
            f"loop:{loop.name}",
            t,
            unit.records,
            loop_iteration=LoopIteration(
                loop=loop.name,
                prefix=tuple(prefix),
                iteration=iteration,
                delta_rows=report.delta_rows,
                converged=report.converged,
                pending_depth=report.pending_depth,
                reason=report.reason,
            ),
        )
        log.info(
            "loop %s at %s iteration %s: delta %s rows; %s",
            loop.name,
            list(prefix),
            iteration,
            report.delta_rows,
            report.reason,
        )
        return report

    def _iteration(self, loop: LoopPlan, t: Time, unit: _Unit) -> IterationReport:
        prefix, iteration = t[:-1], t[-1]
        frames: dict[tuple[int, Time], Frame] = {}
        inner_report = UnitReport(f"loop:{loop.name}", t)
        before = len(unit.records)
        for stage_id in loop.stages:
            stage = self.plan.stages[stage_id]
            self._finish_stage(stage, t, frames, unit, inner_report, start=0, commit=False)
        written = unit.records[before:]
        # What changed at t: the stored deltas and the stateful operators' arranged inputs
        # (every other delta in the iteration ends in one of those or has no effect).
        changed = sum(r.rows for r in written if tuple(r.time) == t)
        result_rows = inner_report.rows_out.get(self.circuit.node(loop.result).label, 0)
        pending = -1 if changed else self._pending_depth(loop, prefix, unit, iteration)
        converged = changed == 0 and pending <= iteration
        if converged:
            reason = (
                f"converged: iteration {iteration} changed nothing and no correction is pending"
                f" (history of the touched keys reaches iteration {pending} at most)"
            )
        elif changed:
            reason = f"continue: iteration {iteration} changed {changed} rows"
        else:
            reason = f"continue: corrections pending up to iteration {pending}"
        return IterationReport(
            loop.name, prefix, iteration, result_rows, pending, converged, reason
        )

    def _iterate_inline(self, loop: LoopPlan, prefix: Time, unit: _Unit) -> None:
        for iteration in range(loop.max_iterations):
            if self._iteration(loop, (*prefix, iteration), unit).converged:
                return
        raise LoopDidNotConverge(
            f"loop {loop.name!r} did not converge at {list(prefix)} within {loop.max_iterations}"
        )

    def _pending_depth(self, loop: LoopPlan, prefix: Time, unit: _Unit, iteration: int) -> int:
        """The deepest iteration at which this prefix may still owe output (-1: none), as
        far as it decides whether ``iteration`` is the last: exact when it is deeper than
        ``iteration``, otherwise possibly an upper bound.

        A stateful node's bound comes from its batches alone (their times and the time
        columns' maxima in their Parquet footers), with no Spark job; only a node whose
        bound goes deeper than ``iteration`` is judged exactly (``_deepest_pending``)."""
        level = len(prefix)
        deepest = -1
        inside = self.circuit.nodes_within(loop.scope)
        for node_id in inside:
            node = self.circuit.node(node_id)
            for record in self._records(
                unit, f"n{node_id}.scheduled", "delta", lambda time: time[:level] == prefix
            ):
                deepest = max(deepest, record.time[level])
            if node.op not in STATEFUL_OPS:
                continue
            port_keys = _port_keys(self.circuit, node)
            depth = self.circuit.scope(node.scope).depth
            names = time_columns(depth)
            bound = self._pending_bound(node, prefix, unit, names[level])
            if bound is not None and bound <= iteration:
                deepest = max(deepest, bound)
                continue
            schemas = [self._fields(self.circuit.node(i), depth) for i in node.inputs]
            value = self._deepest_pending(node, prefix, unit, port_keys, names, schemas)
            if value is not None:
                deepest = max(deepest, value)
        return deepest

    def _pending_bound(self, node: Node, prefix: Time, unit: _Unit, column: str) -> int | None:
        """An upper bound of ``_deepest_pending`` from the catalog and the Parquet footers:
        -1 when no port has a batch in the prefix's epoch (nothing is pending), else the
        largest ``column`` (the next coordinate) among the batches it would read; None
        when a footer has no statistics."""
        level = len(prefix)
        ports = range(len(node.inputs))
        if not any(
            self._records(unit, f"n{node.id}.in{p}", "trace", lambda time: time[0] == prefix[0])
            for p in ports
        ):
            return -1
        bound = -1
        for port in ports:
            for record in self._records(
                unit,
                f"n{node.id}.in{port}",
                "trace",
                lambda time: all(a <= b for a, b in zip(time[:level], prefix, strict=True)),
            ):
                top = self.warehouse.column_max(record, column)
                if top is None:
                    return None
                bound = max(bound, top)
        return bound

    def _deepest_pending(
        self,
        node: Node,
        prefix: Time,
        unit: _Unit,
        port_keys: Sequence[Sequence[str]],
        names: Sequence[str],
        schemas: Sequence[Any],
    ) -> int | None:
        """For one stateful node: the deepest next coordinate among the updates of keys
        that, at or below ``prefix`` and on any port, match every coordinate of
        ``prefix`` exactly (so a correction may still be due under it)."""
        level = len(prefix)
        # Matching the epoch coordinate needs an update in this epoch: a cheap pruning set.
        now = [
            self._records(unit, f"n{node.id}.in{port}", "trace", lambda time: time[0] == prefix[0])
            for port in range(len(node.inputs))
        ]
        if not any(now):
            return None
        keys = self._keys_of(node, now, port_keys, schemas, unit)
        F = dialect_of(keys.frame).F
        below = reduce(
            lambda a, b: a & b,
            [F.col(n) <= v for n, v in zip(names[:level], prefix, strict=True)],
        )
        history = []
        for port in range(len(node.inputs)):
            records = self._records(
                unit,
                f"n{node.id}.in{port}",
                "trace",
                lambda time: all(a <= b for a, b in zip(time[:level], prefix, strict=True)),
            )
            rows = unit.tier.read(
                records,
                schemas[port],
                keys=keys.renamed(port_keys[port]),
                bucket_by=list(port_keys[port]),
            )
            history.append(
                _renamed(rows.where(below), port_keys[port], port_keys[0], names[: level + 1])
            )
        flags = [
            F.max(F.when(F.col(n) == v, F.lit(1)).otherwise(F.lit(0))).alias(f"__on{d}")
            for d, (n, v) in enumerate(zip(names[:level], prefix, strict=True))
        ]
        per_key = (
            reduce(ops.plus, history)
            .groupBy(*port_keys[0])
            .agg(*flags, F.max(names[level]).alias("__deepest"))
        )
        matched = reduce(lambda a, b: a & b, [F.col(f"__on{d}") == 1 for d in range(level)])
        value = per_key.where(matched).agg(F.max("__deepest")).collect()[0][0]
        return None if value is None else int(value)

    # ================================================================================ views
    def publish(self, epoch: int) -> UnitReport:
        """Append each view's delta for ``epoch`` to the view's published collection."""
        t = (epoch,)
        if self.catalog.stage_done(self.circuit.name, "publish", t):
            return UnitReport("publish", t, skipped=True)
        unit = self._epoch_unit(epoch)
        report = UnitReport("publish", t, tier=unit.tier.name)
        for name, node_id in self.circuit.views.items():
            node = self.circuit.node(node_id)
            delta = self._delta(node_id, t, unit, {})
            record = (
                None
                if delta is None
                else self._write(
                    unit, _with_time(delta, t), f"view.{name}", "trace", t, self._fields(node, 1)
                )
            )
            unit.add(record)
            report.rows_out[name] = record.rows if record else 0
        self.catalog.commit(self.circuit.name, "publish", t, unit.records)
        log.info("%s", report.describe())
        return report

    def view_frame(self, name: str, epoch: int | None = None) -> DataFrame:
        """The view's contents (consolidated, with ``__w``) as of the last committed epoch,
        or as of ``epoch`` once that epoch's publish has committed.

        A view's batch for an epoch is registered by ``publish`` before the epoch commits;
        readers must not see it until the epoch does: only the publishing task, which
        exports it, asks for an uncommitted epoch explicitly."""
        node, records = self._view_records(name, epoch, change=False)
        frame = self.warehouse.read(self.spark, records, self._schema_of(node, 1))
        return consolidate(frame.drop(*time_columns(1)), list(node.schema.names))

    def view_change(self, name: str, epoch: int) -> DataFrame:
        """The view's change at ``epoch`` (consolidated, ``__w`` = +inserted / -deleted).

        Compaction at the close of the epoch merges the batch into older ones, so the
        change is read between ``publish`` and ``close_epoch``."""
        node, records = self._view_records(name, epoch, change=True)
        frame = self.warehouse.read(self.spark, records, self._schema_of(node, 1))
        return consolidate(frame.drop(*time_columns(1)), list(node.schema.names))

    def view_table(self, name: str, epoch: int, *, change: bool = False) -> pa.Table | None:
        """``view_frame`` (or, with ``change``, ``view_change``) as Arrow, read in this
        process when the batches hold at most ``local_rows`` rows; None when they hold
        more (read them with Spark), so exporting a small epoch starts no Spark."""
        node, records = self._view_records(name, epoch, change=change)
        if records_rows(records) > self.local_rows:
            return None
        frame = self.local.read(records, self._fields(node, 1))
        return consolidate(frame.drop(*time_columns(1)), list(node.schema.names)).toArrow()

    def _view_records(
        self, name: str, epoch: int | None, *, change: bool
    ) -> tuple[Node, list[BatchRecord]]:
        node = self.circuit.node(self.circuit.views[name])
        if epoch is None:
            epoch = self.last_committed_epoch()
        else:
            self._require_published(epoch)
        if not change:
            return node, self.catalog.batches(self.circuit.name, f"view.{name}", max_epoch=epoch)
        if self.catalog.epoch_state(self.circuit.name, epoch) == "committed":
            raise EpochOrderError(
                f"circuit {self.circuit.name!r}: epoch {epoch} is committed and its view "
                f"batches may be compacted; read a change between publish and close_epoch"
            )
        return node, self.catalog.batches(self.circuit.name, f"view.{name}", epoch=epoch)

    def _require_published(self, epoch: int) -> None:
        if not self.catalog.stage_done(self.circuit.name, "publish", (epoch,)):
            raise EpochOrderError(
                f"circuit {self.circuit.name!r}: the views of epoch {epoch} are not published"
            )

    def view(self, name: str) -> ZSet:
        """The view's contents as of the last committed epoch, read in this process (no
        Spark job: the rows come to Python anyway)."""
        node = self.circuit.node(self.circuit.views[name])
        epoch = self.last_committed_epoch()
        records = self.catalog.batches(self.circuit.name, f"view.{name}", max_epoch=epoch)
        frame = self.local.read(records, self._fields(node, 1))
        return self.local.zset(frame.drop(*time_columns(1)), node.schema)

    def views(self) -> dict[str, ZSet]:
        return {name: self.view(name) for name in self.circuit.views}

    # ================================================================================ full refresh
    def input_frames(self, epoch: int | None = None) -> dict[str, DataFrame]:
        """Every source's raw input log (epochs ``0..epoch``), shaped for full refresh."""
        frames = {}
        for name, node_id in self.circuit.sources.items():
            node = self.circuit.node(node_id)
            user = node.schema if node.op == "zset_source" else node.params["user_schema"]
            extra = [(WEIGHT, "bigint")] if node.op == "zset_source" else []
            schema = struct_type(user, extra=[*extra, *time_fields(1)])
            records = self.catalog.batches(self.circuit.name, f"n{node_id}.input", max_epoch=epoch)
            frames[name] = self.warehouse.read(self.spark, records, schema)
        return frames

    def full_refresh(self, epoch: int | None = None) -> dict[str, DataFrame]:
        """Every view recomputed from scratch over the accumulated input (a full refresh)."""
        from dbspark.engine.spark.full_refresh import evaluate

        epoch = self.last_committed_epoch() if epoch is None else epoch
        if epoch < 0:
            raise ValueError(f"circuit {self.circuit.name!r} has no committed epoch yet")
        return evaluate(self.spark, self.circuit, self.input_frames(epoch), epoch)

    def verify(self) -> dict[str, list[tuple]]:
        """Per view, the rows (with ``__w`` = full refresh minus maintained) that differ
        between the incrementally maintained view and a full refresh; empty when equal."""
        from dbspark.engine.spark.full_refresh import verify

        fresh = self.full_refresh()
        differences = {}
        for name in self.circuit.views:
            diff = verify(fresh[name], self.view_frame(name))
            differences[name] = [tuple(row) for row in diff.limit(1000).collect()]
        return differences

    def rebuild(self, name: str) -> int:
        """Replace a view's published contents with its full refresh; returns its rows."""
        epoch = self.last_committed_epoch()
        fresh = self.full_refresh(epoch)[name]
        record = self.traces.write(f"view.{name}", fresh, (epoch,))
        old = [r.id for r in self.catalog.batches(self.circuit.name, f"view.{name}") if r.id]
        stage = f"rebuild:view.{name}@{uuid.uuid4().hex[:8]}"
        self.catalog.commit(
            self.circuit.name, stage, (epoch,), [record] if record else [], supersede=old
        )
        log.info(
            "view %s rebuilt from scratch at epoch %s: %s rows",
            name,
            epoch,
            record.rows if record else 0,
        )
        return record.rows if record else 0

    # ================================================================================ maintenance
    def compact(self, epoch: int) -> None:
        """Advance every trace by the frontier ``(epoch, 0, ...)`` and merge batches
        (tiered, so old large batches are rewritten only as recent ones grow), then retire
        stream deltas no later epoch reads (``delay`` reads one epoch back)."""
        for node in self.circuit.nodes:
            depth = self.circuit.scope(node.scope).depth
            frontier = [(epoch, *([0] * (depth - 1)))]
            if node.op in STATEFUL_OPS:
                for port, input_id in enumerate(node.inputs):
                    self._compact(
                        f"n{node.id}.in{port}",
                        frontier,
                        self.circuit.node(input_id),
                        depth,
                        list(_port_keys(self.circuit, node)[port]),
                    )
            elif node.op == "upsert_source":
                self._compact(f"n{node.id}.state", [(epoch,)], node, 1, list(node.params["key"]))
        for name in self.circuit.views:
            node = self.circuit.node(self.circuit.views[name])
            self._compact(f"view.{name}", [(epoch,)], node, 1, list(node.schema.names))
        stale = [
            record.id
            for node in self.circuit.nodes
            for record in self.catalog.batches(self.circuit.name, f"n{node.id}", kind="delta")
            if record.epoch < epoch and record.id is not None
        ]
        if stale:
            self.catalog.commit(self.circuit.name, "retire-deltas", (epoch,), [], supersede=stale)

    def _compact(
        self,
        collection: str,
        frontier: Sequence[Time],
        node: Node,
        depth: int,
        key_columns: list[str],
    ) -> None:
        """One trace's tiered compaction; a merge of at most ``local_rows`` rows is
        rewritten on the local tier (no Spark job), a larger one by Spark."""
        fields = self._fields(node, depth)
        names = time_columns(depth)

        def rewrite(chosen: list[BatchRecord], advanced: Any, out_time: Time) -> Any:
            frame = self.local.read(chosen, fields)
            for column, expr in advance_columns(advanced, names, dialect_of(frame).F):
                frame = frame.withColumn(column, expr)
            merged = consolidate(frame, [n for n, _ in fields if n != WEIGHT])
            return self.local.write(
                merged,
                self.circuit.name,
                collection,
                "trace",
                out_time,
                fields,
                bucket_by=key_columns or None,
            )

        self.traces.compact(
            collection,
            frontier,
            self._schema_of(node, depth),
            key_columns,
            names,
            tiered=True,
            local=rewrite,
            local_rows=self.local_rows,
        )


# ==================================================================================== helpers
def _with_time(df: Any, t: Time) -> Any:
    """``df`` with the time columns of ``t`` (missing ones added, existing ones set)."""
    F = dialect_of(df).F
    for i, (name, value) in enumerate(zip(time_columns(len(t)), t, strict=True)):
        df = df.withColumn(name, F.lit(value).cast("bigint" if i == 0 else "int"))
    return df


def _weight_field(node: Node) -> list[tuple[str, str]]:
    """A Z-set source's raw input carries weights; an upsert source's does not."""
    return [(WEIGHT, "bigint")] if node.op == "zset_source" else []


def _stored_deltas(circuit: Circuit, plan: Plan) -> frozenset[int]:
    """Nodes whose deltas are written to the warehouse: those read by another unit of work
    or at another time. Root-scope stage outputs feed later stage units and the views; a
    loop's result is fed back and summed by ``leave``; ``delay``, ``variable`` and
    ``enter`` read their inputs at an earlier time. Every other stage output inside a
    loop is consumed by the same iteration's unit and never needs a file."""
    stored = {node.id for node in circuit.nodes if node.scope == 0}
    for node in circuit.nodes:
        if node.op in ("delay", "variable", "enter"):
            stored.update(node.inputs)
    stored.update(loop.result for loop in plan.loops.values())
    stored.update(circuit.views.values())
    return frozenset(stored)


def _renamed(
    frame: Any, source: Sequence[str], target: Sequence[str], rest: Sequence[str] = ()
) -> Any:
    """``frame``'s ``source`` columns under ``target`` names (one port's keys as another's),
    then the ``rest``."""
    F = dialect_of(frame).F
    return frame.select(*[F.col(a).alias(b) for a, b in zip(source, target, strict=True)], *rest)


def _port_keys(circuit: Circuit, node: Node) -> list[tuple[str, ...]]:
    if node.op == "join":
        return [tuple(node.params["left_keys"]), tuple(node.params["right_keys"])]
    if node.op == "aggregate":
        keys = tuple(node.params["keys"])
        return [keys or circuit.node(node.inputs[0]).schema.names]
    return [circuit.node(node.inputs[0]).schema.names]


def frame_fingerprint(frame: DataFrame) -> str:
    """An order-independent hash of a frame's rows (a multiset hash: the sum of row
    hashes, with the count), computed by one Spark job."""
    row = frame.select(*_fingerprint_columns(frame)).first()
    return _fingerprint_text(frame, row.asDict() if row is not None else {})


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


def _fingerprint_text(frame: DataFrame, values: Mapping[str, Any]) -> str:
    return fingerprint_text(frame.columns, int(values.get("n") or 0), int(values.get("h") or 0))


def records_rows(records: Iterable[BatchRecord]) -> int:
    return sum(r.rows for r in records)
