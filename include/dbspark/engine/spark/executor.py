"""The Spark stage executor: run one planned stage (or one loop iteration) for one time.

This is what every caller runs: the conformance replay, the demo, the Airflow
tasks and ``orchestration/spark_job.py``. Each *unit of work* is one stage at one root time
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

This module is the epoch API and the stage loop; the rest of ``SparkEngine`` is mixed in
from one module per concern: ``unit`` (a unit's writes and its one commit), ``ingest``,
``evaluate`` (one evaluation function per operator), ``loops``, ``views`` and
``maintenance``; ``storage/collection_names`` names what they store.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from dbspark.circuit.builder import Circuit, Node
from dbspark.circuit.fingerprint import circuit_fingerprint  # noqa: F401 (units, tasks)
from dbspark.circuit.planner import Plan, Stage, plan
from dbspark.core.columns import WEIGHT, time_columns, time_fields
from dbspark.core.settings import int_setting
from dbspark.core.timestamps import Time
from dbspark.core.zset import ZSet
from dbspark.engine.api import (
    EpochOrderError,
    EpochReport,
    EpochResult,
    UnitReport,
    loop_reports,
    require_sources,
)
from dbspark.engine.batches import upsert_spec
from dbspark.engine.circuits import CircuitChangedError, register
from dbspark.engine.epoch_units import Units, epoch_units, stage_inputs
from dbspark.engine.local.resident import default_resident_bytes
from dbspark.engine.local.tier import LocalTier
from dbspark.engine.spark.evaluate import Evaluation, OperatorEvaluation, evaluate
from dbspark.engine.spark.evolve import EvolutionReport, Evolve
from dbspark.engine.spark.gateway import remember_jvm_lookups
from dbspark.engine.spark.ingest import Ingest
from dbspark.engine.spark.loops import Loops
from dbspark.engine.spark.maintenance import BackgroundCompaction, Maintenance
from dbspark.engine.spark.session import spark_session
from dbspark.engine.spark.tier import SparkTier, spark_struct
from dbspark.engine.spark.unit import Frame, Tier, Unit, records_rows
from dbspark.engine.spark.upserts import default_driver_rows
from dbspark.engine.spark.views import Views
from dbspark.storage import collection_names as coll
from dbspark.storage.catalog import BatchRecord, Catalog
from dbspark.storage.traces import TraceStore
from dbspark.storage.warehouse import KeySet, Warehouse

log = logging.getLogger("dbspark.engine")


@contextmanager
def _young_objects_only() -> Iterator[None]:
    """Let the garbage collector pass over the objects that exist when an epoch starts.

    A process that has run Spark work, or a benchmark's checks, holds hundreds of
    thousands of objects; the collections a 0.2 s epoch triggers walked the older
    generations among them for 15-30 ms of it. Frozen (``gc.freeze``), they are left
    out of every collection until the epoch ends, then go back to the oldest generation,
    so cyclic garbage among them is still collected afterwards, by the next full
    collection. Objects the epoch allocates are collected as usual."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


#: Epochs whose input has at most this many rows run every unit on the local tier. On
#: one 2-core machine the local tier is the faster one at any size measured (a 5% TPC-H
#: SF 1 epoch, 324,000 rows: 1.4 s there, 17.7 s on local Spark); the bound is the
#: worker's memory, which holds the delta and the trace slices it touches.
LOCAL_ROWS = 1_000_000


def default_local_rows() -> int:
    """``DBSPARK_LOCAL_ROWS`` (0 runs every unit on Spark), else ``LOCAL_ROWS``."""
    return int_setting("DBSPARK_LOCAL_ROWS", LOCAL_ROWS, minimum=0)


def default_background_compaction() -> bool:
    """``DBSPARK_BACKGROUND_COMPACTION`` (1 on, 0 off), else off."""
    return bool(int_setting("DBSPARK_BACKGROUND_COMPACTION", 0, minimum=0))


class SparkEngine(Ingest, OperatorEvaluation, Loops, Views, Maintenance, Evolve):
    """Runs a circuit incrementally on Spark with traces in a warehouse and a SQL catalog.

    A warehouse kept for another definition of the circuit is refused, saying what
    changed (``CircuitChangedError``); with ``evolve``, the new definition takes the
    state over instead, the views added or changed rebuilt from the raw input log and
    the rest continuing (``evolve.py``; what it did is ``evolved``)."""

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
        resident_bytes: int | None = None,
        background_compaction: bool | None = None,
        evolve: bool = False,
    ) -> None:
        self.circuit = circuit
        #: On the Spark tier, upsert batches of up to this many rows are decided on the
        #: driver, and the units of an epoch with up to this many input rows write from the
        #: driver; with the local tier off, compaction merges this small run in-process
        #: (0: never; None: ``DBSPARK_DRIVER_ROWS`` or 20,000). See ``upserts.py``.
        self.driver_rows = default_driver_rows() if driver_rows is None else driver_rows
        #: Units of an epoch whose input has at most this many rows run on the local tier,
        #: in this process with no Spark job (0: never; None: ``DBSPARK_LOCAL_ROWS`` or
        #: 1,000,000). Larger ones run on Spark. See ARCHITECTURE.md, "Two tiers".
        self.local_rows = default_local_rows() if local_rows is None else local_rows
        #: The local tier keeps the trace files it reads and writes decoded in memory, up
        #: to this many bytes, for the epochs after (0: nothing kept across epochs, for a
        #: process that runs one unit; None: ``DBSPARK_RESIDENT_BYTES`` or 4 GiB). See
        #: ARCHITECTURE.md, "Resident arrangements".
        self.resident_bytes = default_resident_bytes() if resident_bytes is None else resident_bytes
        #: The compaction after an epoch's commit runs in a thread of this process while
        #: the caller goes on, the next close waiting for it (None:
        #: ``DBSPARK_BACKGROUND_COMPACTION``, else off). For a process that runs epoch
        #: after epoch: a long-lived worker, a script. See ``BackgroundCompaction``.
        self.background_compaction = (
            default_background_compaction()
            if background_compaction is None
            else background_compaction
        )
        self._background: BackgroundCompaction | None = None
        self.plan: Plan = plan(circuit)
        self._spark = spark
        self._lookups_remembered = False
        self.root = Path(warehouse)
        self.root.mkdir(parents=True, exist_ok=True)
        self.catalog = (
            Catalog(catalog_url, warehouse=self.root)
            if catalog_url
            else Catalog.for_warehouse(self.root)
        )
        self.warehouse = Warehouse(self.root)
        # The views after this engine's last ``step``, to give the next step its change.
        self._step_views: dict[str, ZSet] | None = None
        self.buckets = buckets
        self.traces = TraceStore(
            lambda: self.spark, self.warehouse, self.catalog, circuit.name, buckets=buckets
        )
        self._local: LocalTier | None = None
        self._spark_tier: SparkTier | None = None
        self._specs = {n.id: upsert_spec(n) for n in circuit.nodes if n.op == "upsert_source"}
        self._stored = _stored_deltas(circuit, self.plan)
        self._key_sets: dict[tuple[Any, ...], KeySet] = {}  # see _keys_of
        #: What evolving to this definition did, if this engine did it (``evolve``).
        self.evolved: EvolutionReport | None = None
        # A changed definition is refused saying what changed (engine/circuits.py).
        try:
            register(self.catalog, self.root, circuit)
        except CircuitChangedError as changed:
            if not evolve:
                raise
            self.evolved = self._evolve(changed)

    @property
    def spark(self) -> SparkSession:
        """The Spark session, started on first use: an epoch that stays on the local tier
        never starts one. ``spark`` may be given as a function that opens it (a task's
        Spark Connect client, say), which is then called only if a unit needs Spark."""
        if self._spark is None:
            self._spark = spark_session()
        elif callable(self._spark):  # a session object is not callable; its opener is
            self._spark = self._spark()
        if not self._lookups_remembered:
            remember_jvm_lookups(self._spark)
            self._lookups_remembered = True
        return self._spark

    @property
    def spark_started(self) -> bool:
        return self._spark is not None and not callable(self._spark)

    @property
    def local(self) -> LocalTier:
        if self._local is None:
            self._local = LocalTier(
                self.warehouse, buckets=self.buckets, resident_bytes=self.resident_bytes
            )
        return self._local

    @property
    def resident_nbytes(self) -> int:
        """The bytes of traces the local tier keeps decoded now (0 before it is used)."""
        return 0 if self._local is None else self._local.resident.nbytes

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

    def _epoch_unit(self, epoch: int) -> Unit:
        """A new unit of ``epoch``: on the local tier when the epoch's input (its raw input
        logs, from the catalog) is small, else on Spark."""
        rows = self._input_rows(epoch)
        tier = self.tier_for(rows)
        driver_rows = self.driver_rows if rows <= self.driver_rows else 0
        return self._unit(tier, driver_rows if tier.name == "spark" else 0)

    def _unit(self, tier: Tier, driver_rows: int = 0) -> Unit:
        if not isinstance(tier, LocalTier):
            # A commit group (run_epoch) must not hold the catalog's write lock while
            # Spark works: what committed so far becomes durable and visible first.
            self.catalog.flush()
        return Unit(tier, self.catalog, self.circuit.name, driver_rows)

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
        with _young_objects_only():
            return self._run_epoch(epoch, inputs)

    def _run_epoch(self, epoch: int, inputs: Mapping[str, Any] | None) -> EpochReport:
        report = EpochReport(epoch)
        inputs = dict(inputs or {})
        require_sources(self.circuit.name, self.circuit.sources, inputs)
        # Bad rows are rejected before the epoch opens or anything is written.
        checked = {name: self.check_batch(name, batch) for name, batch in inputs.items()}
        # One process runs every unit: their commits are grouped (one fsync pass and one
        # database commit for all of them, flushed before any Spark work), each unit
        # still committing, or not, on its own.
        with self.catalog.grouped():
            if not self.open_epoch(epoch):
                report.skipped = True
                return report
            t = (epoch,)
            for stage in self.plan.stages_in_scope(0):
                anchor = self.circuit.node(stage.anchor)
                started = time.perf_counter()
                if anchor.op in ("zset_source", "upsert_source"):
                    batch = checked.get(anchor.label)
                    unit = self.ingest(anchor.label, epoch, batch)
                else:
                    if anchor.op == "leave":
                        loop = self.plan.loops[anchor.params["loop"]]
                        report.iterations.extend(self.run_loop(loop, t))
                    unit = self.run_stage(stage.id, t)
                unit.seconds = time.perf_counter() - started
                report.units.append(unit)
            started = time.perf_counter()
            report.units.append(self.publish(epoch))
            report.units[-1].seconds = time.perf_counter() - started
            started = time.perf_counter()
            self.close_epoch(epoch)
            report.close_seconds = time.perf_counter() - started
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
        """Commit the epoch, then compact traces under the new frontier. The commit checks,
        in its transaction, that every unit the epoch planned committed (its stages,
        ingests included, its loops converged, and ``publish``), and otherwise raises
        ``UncommittedUnits`` naming the missing ones."""
        planned = epoch_units(self.plan)
        self.catalog.commit_epoch(
            self.circuit.name, epoch, stages=planned.stages, loops=planned.loops
        )
        self.catalog.flush()  # the epoch is durable before its compaction starts
        self._compact_after_close(epoch)
        if self._local is not None:
            self._local.forget_files()

    def run_stage(self, stage_id: int, t: Time) -> UnitReport:
        """Run one root-scope stage at time ``t`` and commit it (a no-op if already done)."""
        stage = self.plan.stages[stage_id]
        if self.catalog.stage_done(self.circuit.name, stage.name, t):
            return UnitReport(stage.name, t, skipped=True)
        self.require_inputs(f"stage {stage.name}", t[0], stage_inputs(self.plan, stage))
        unit = self._epoch_unit(t[0])
        report = UnitReport(stage.name, t, tier=unit.tier.name)
        self._finish_stage(stage, t, {}, unit, report, start=0)
        return report

    def require_inputs(self, what: str, epoch: int, units: Units) -> None:
        """Refuse to run ``what`` before the ``units`` it reads committed at ``epoch``
        (``UncommittedUnits``): a missing delta would read as empty, and the unit would
        commit an answer without that input."""
        if units:
            self.catalog.require_units(
                self.circuit.name, epoch, what, stages=units.stages, loops=units.loops
            )

    def _finish_stage(
        self,
        stage: Stage,
        t: Time,
        frames: dict[tuple[int, Time], Frame],
        unit: Unit,
        report: UnitReport,
        start: int,
        commit: bool = True,
        fingerprint: str | None = None,
    ) -> None:
        for node_id in stage.nodes[start:]:
            node = self.circuit.node(node_id)
            frames[(node_id, t)] = evaluate(Evaluation(self, node, t, frames, unit, report))
        for node_id in stage.outputs:
            frame = frames[(node_id, t)]
            if node_id not in self._stored:
                continue  # read only by this unit, at this time: it stays a DataFrame
            node = self.circuit.node(node_id)
            record = (
                None
                if frame is None
                else unit.write(frame, coll.delta(node_id), "delta", t, self._fields(node))
            )
            # Later work in this unit reads the written batch instead of recomputing the
            # stage's whole lineage once per consumer.
            frames[(node_id, t)] = self._read_back(record, node, unit)
            report.rows_out[node.label] = record.rows if record else 0
            if record:
                report.paths.append(record.path)
        if commit:
            unit.commit(stage.name, t, input_fingerprint=fingerprint)
            log.info("%s", report.describe())

    def _schema_of(self, node: Node, depth: int = 0) -> Any:
        """``_fields`` as a Spark schema (for Spark's own reads: views, full refresh)."""
        return spark_struct(self._fields(node, depth))

    def _fields(self, node: Node, depth: int = 0) -> list[tuple[str, str]]:
        """A node's collection as ``(name, type)`` pairs: its columns, ``__w`` and the time
        columns of ``depth`` (none for a delta)."""
        return [*node.schema.fields, (WEIGHT, "bigint"), *(time_fields(depth) if depth else [])]

    def _delta(
        self, node_id: int, t: Time, unit: Unit, frames: Mapping[tuple[int, Time], Frame]
    ) -> Frame:
        """The delta of a node at ``t``; None when it is known to be empty (from the
        catalog alone, so an empty input costs no Spark job)."""
        if (node_id, t) in frames:
            return frames[(node_id, t)]
        node = self.circuit.node(node_id)
        records = unit.batches(coll.delta(node_id), "delta", lambda time: time == t)
        if not records:
            return None
        return unit.tier.read(records, self._fields(node))

    def _read_back(
        self, record: BatchRecord | None, node: Node, unit: Unit, depth: int = 0
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
        logs = [coll.input_log(i) for i in self.circuit.sources.values()]
        return records_rows(self.catalog.live_batches(self.circuit.name, logs, epoch=epoch))

    def _or_empty(self, frame: Frame, node: Node, unit: Unit) -> Any:
        return frame if frame is not None else unit.tier.empty(self._fields(node))


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
