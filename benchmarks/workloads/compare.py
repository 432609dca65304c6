"""An epoch side by side with a full refresh of the same snapshot, and their answers.

A :class:`Series` is one workload at one base size: a folder with landed batches
(``<root>/landing``), an engine over its own warehouse, the base load (epoch 0) and then
epochs compared one by one. The incremental side is ``SparkEngine.run_epoch`` on the
landed batch: ingest, every stage and loop, publishing the views, the commit and
compaction. The full-refresh side recomputes every view from the whole input history with
Spark (``SparkEngine.full_refresh``) and writes the results as Parquet, as publishing
does. The written results are then compared with the maintained views, outside the
timing.

A workload that supplies a :class:`~benchmarks.workloads.warm_batch.WarmBatch` also gets
a third side per epoch: the views' own queries over the sources' current tables, as a
user's warm Spark batch would compute them (see that module), checked the same way.

A compared epoch may be the last of a run of epochs of the same size
(:meth:`Series.advance`, then :meth:`Series.compare` with ``earlier``), measured as the
warm batch is: the first of them is the warm-up, and the incremental side is the median
of the others and the compared one. One epoch is one sample of a 0.2 s piece of work on
a 2-core host, and samples of the same code spread by half; the first epoch after
``warm()`` also pays the process's one-time costs (each catalog statement's first
compilation, DuckDB's and Arrow's first call of each shape), which a worker running
epoch after epoch pays once. The warm-up's time is kept (``first_s``) and reported.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from benchmarks.data import epoch_folder, land
from benchmarks.harness import Bench, Measurement
from benchmarks.workloads.warm_batch import WarmBatch
from dbspark.circuit.builder import Circuit
from dbspark.core.columns import WEIGHT, WEIGHT_TYPE
from dbspark.engine.spark.executor import SparkEngine
from dbspark.engine.spark.full_refresh import verify


class Series:
    """``workload`` at one base ``size`` (rows or edges), under ``bench.work/<name>``;
    with ``warm_batch``, each compared epoch is also timed as a warm batch."""

    def __init__(
        self,
        bench: Bench,
        workload: str,
        name: str,
        circuit: Circuit,
        size: int,
        params: dict[str, Any],
        warm_batch: WarmBatch | None = None,
    ) -> None:
        self.bench = bench
        self.workload = workload
        self.name = name
        self.root = bench.work / workload / name
        shutil.rmtree(self.root, ignore_errors=True)
        self.landing = self.root / "landing"
        self.circuit = circuit
        self.size = size
        self.params = dict(params)
        self.warm_batch = warm_batch
        self.loaded: Measurement | None = None
        self._engine: SparkEngine | None = None

    @property
    def engine(self) -> SparkEngine:
        if self._engine is None:
            # Compaction in the background, as the unit worker runs it (a long-lived
            # process). Each timed epoch waits for its compaction after the timing and
            # reports it apart (``compaction_s``): epochs here follow one another within
            # a second, where a schedule's are minutes apart, and an epoch that shared
            # the 2 cores with the one before's compaction measured 0.8 s against 0.4.
            self._engine = SparkEngine(
                self.circuit,
                self.root / "warehouse",
                spark=self.bench.spark,
                background_compaction=True,
            )
        return self._engine

    def land(self, epoch: int, tables: dict[str, pa.Table]) -> None:
        for source, table in tables.items():
            land(self.landing, source, epoch, table)

    def load(self) -> Measurement:
        """Epoch 0, the base load (measured, but not part of any comparison); then the
        engine loads its traces into memory (``warm``, timed apart), as a long-lived
        worker does when it starts."""
        read, rows = self._inputs(0)
        measurement = self._measurement("load", 0, rows, {})
        with self.bench.meter.measure(measurement):
            self.engine.run_epoch(0, read())
        measurement.stored_bytes = self._stored_bytes()
        started = time.perf_counter()
        resident = self.engine.warm()
        measurement.params["warm_s"] = round(time.perf_counter() - started, 3)
        measurement.params["resident_bytes"] = resident
        self.loaded = self.bench.results.add(measurement)
        return measurement

    def warm(self) -> None:
        """Load the engine's traces into memory (``SparkEngine.warm``), untimed."""
        self.engine.warm()

    def branch(self, name: str) -> Series:
        """Another series (``name``) over a copy of this one's warehouse as it stands and
        its landed batches so far (linked, not copied): epochs that must start from this
        state. Its engine is built, and warmed, when asked for (``warm``)."""
        other = Series(
            self.bench,
            self.workload,
            name,
            self.circuit,
            self.size,
            self.params,
            self.warm_batch,
        )
        self.engine.wait_for_compaction()  # its catalog is not being written meanwhile
        copy_warehouse(self.root / "warehouse", other.root / "warehouse")
        shutil.copytree(self.landing, other.landing, copy_function=os.link)
        other.loaded = self.loaded
        return other

    def close(self) -> None:
        """Let the engine go, its compaction finished: its resident traces with it."""
        if self._engine is not None:
            self._engine.wait_for_compaction()
            self._engine.catalog.close()
            self._engine = None

    def spent(self) -> float:
        """Seconds this series has measured so far (load, epochs and refreshes)."""
        return sum(
            m.seconds
            for m in self.bench.results.measurements
            if m.workload == self.workload and m.params.items() >= self.params.items()
        )

    def fits(self, what: str, factor: float = 2.0) -> bool:
        """Whether ``factor`` times the base load's time still fits the budget; if not,
        ``what`` is recorded as skipped."""
        needed = factor * (self.loaded.seconds if self.loaded else 0.0)
        if self.bench.budget.allows(needed):
            return True
        self.bench.results.skip(f"{self.workload} {what} (time budget)")
        return False

    def advance(self, epoch: int, **params: Any) -> Measurement:
        """Run ``epoch`` incrementally, timed but not compared: one of the epochs before a
        compared one of the same size (``compare(..., earlier=...)``). Recorded as an
        ``incremental_run``."""
        return self.bench.results.add(self._incremental(epoch, "incremental_run", params))

    def compare(
        self,
        epoch: int,
        *,
        earlier: Sequence[Measurement] = (),
        spark_only: bool = False,
        not_resident: bool = False,
        **params: Any,
    ) -> list[Measurement]:
        """Run ``epoch`` incrementally, then a full refresh of the same snapshot, then
        (with a warm batch) the views' queries over the current tables; every
        measurement carries whether its answers agreed with the maintained views. With
        ``earlier`` (runs of ``advance`` just before, of epochs of the same size), the
        incremental side is the median of ``earlier[1:]`` and this epoch, the first
        being the warm-up. With ``spark_only``, the same epoch also runs on a copy of the
        warehouse with the local tier off (``local_rows=0``), to count the Spark tier's
        jobs per unit. With ``not_resident``, it also runs on a copy by a new engine that
        keeps nothing in memory (``resident_bytes=0``), as an Airflow task does: every
        trace read from its files."""
        rows = self._inputs(epoch)[1]
        before = self._copy("spark-only") if spark_only else None
        cold = self._copy("not-resident") if not_resident else None
        incremental = _median_after_warm_up(
            [*earlier, self._incremental(epoch, "incremental", params)], epoch
        )

        meter = self.bench.meter
        refresh = self._measurement("full_refresh", epoch, rows, params)
        target = self.root / "full_refresh" / f"epoch={epoch}"
        with meter.measure(refresh):
            for name, frame in self.engine.full_refresh().items():
                frame.write.mode("overwrite").parquet(str(target / name))
        differences = self._differences(target)
        measured = [incremental, refresh]
        for measurement in measured:
            self._check(measurement, differences)
        if self.warm_batch is not None:
            measured.append(self._warm_batch(self.warm_batch, epoch, rows, params))
        if before is not None:
            measured.append(self._spark_only(before, epoch, rows, params))
        if cold is not None:
            measured.append(self._not_resident(cold, epoch, rows, params))
        return measured

    def _incremental(self, epoch: int, variant: str, params: dict[str, Any]) -> Measurement:
        """``epoch`` run by the series' engine, timed: its landed batches, read inside
        the timing (``_inputs``). The compaction it starts in the background is waited
        for after the timing and recorded as ``compaction_s``."""
        read, rows = self._inputs(epoch)
        measurement = self._measurement(variant, epoch, rows, params)
        self.engine.wait_for_compaction()
        compacted = self.engine.background_compaction_seconds
        with self.bench.meter.measure(measurement):
            report = self.engine.run_epoch(epoch, read())
        self.engine.wait_for_compaction()
        compaction = self.engine.background_compaction_seconds - compacted
        measurement.params["compaction_s"] = round(compaction, 3)
        measurement.stored_bytes = self._stored_bytes()
        measurement.params["loop_iterations"] = len(report.iterations)
        # Where the epoch's time went: each unit's wall time, then the close's.
        measurement.params["units_s"] = {
            unit.unit: round(unit.seconds, 3) for unit in report.units if not unit.skipped
        }
        measurement.params["close_s"] = round(report.close_seconds, 3)
        tiers = sorted({unit.tier for unit in report.units if unit.tier})
        measurement.params["tiers"] = ",".join(tiers)
        return measurement

    def _copy(self, name: str) -> Path:
        """A copy of the warehouse as it stands (the state the epoch starts from), made
        outside any timing."""
        self.engine.wait_for_compaction()  # its catalog is not being written meanwhile
        copy = self.root / name / "warehouse"
        shutil.rmtree(copy.parent, ignore_errors=True)
        copy_warehouse(self.root / "warehouse", copy)
        return copy

    def _not_resident(
        self, warehouse: Path, epoch: int, rows: int, params: dict[str, Any]
    ) -> Measurement:
        """The epoch again (its landed batches) by a new engine with no resident files,
        from the copied state: every trace slice is read from Parquet. Its views must
        equal the maintained ones."""
        engine = SparkEngine(self.circuit, warehouse, spark=self.bench.spark, resident_bytes=0)
        read = self._inputs(epoch)[0]
        measurement = self._measurement("not_resident", epoch, rows, params)
        with self.bench.meter.measure(measurement):
            report = engine.run_epoch(epoch, read())
        measurement.params["tiers"] = ",".join(sorted({u.tier for u in report.units if u.tier}))
        differences = self._differing(engine.view_frame)
        engine.catalog.close()
        shutil.rmtree(warehouse.parent, ignore_errors=True)
        return self._check(measurement, differences)

    def _spark_only(
        self, warehouse: Path, epoch: int, rows: int, params: dict[str, Any]
    ) -> Measurement:
        """The epoch again with the local tier off, from the copied state: its time, jobs,
        units and loop iterations; its views must equal the maintained ones."""
        engine = SparkEngine(self.circuit, warehouse, spark=self.bench.spark, local_rows=0)
        spark = self.bench.spark
        inputs = {
            source: spark.read.parquet(str(folder)) for source, folder in self._folders(epoch)
        }
        measurement = self._measurement("spark_only", epoch, rows, params)
        with self.bench.meter.measure(measurement):
            report = engine.run_epoch(epoch, inputs)
        ran = [u for u in report.units if not u.skipped]
        measurement.params.update(
            units=len(ran),
            loop_iterations=len(report.iterations),
            tiers=",".join(sorted({u.tier for u in ran if u.tier})),
        )
        differences = self._differing(engine.view_frame)
        shutil.rmtree(warehouse.parent, ignore_errors=True)
        return self._check(measurement, differences)

    def _warm_batch(
        self, batch: WarmBatch, epoch: int, rows: int, params: dict[str, Any]
    ) -> Measurement:
        """The epoch's current tables (untimed), then the warm batch over them (timed),
        then its answers against the maintained views."""
        spark = self.bench.spark
        current = self.root / "current" / f"epoch={epoch}"
        target = self.root / "warm_batch" / f"epoch={epoch}"
        batch.write_current(spark, self.landing, epoch, current)
        measurement = batch.measure(
            spark,
            self.bench.meter,
            current,
            target,
            self._measurement("warm_batch", epoch, rows, params),
        )
        return self._check(measurement, self._differences(target, one_row_per_group=True))

    def _differences(self, folder: Path, *, one_row_per_group: bool = False) -> dict[str, int]:
        """How many rows differ, per view that differs, between the results written to
        ``folder/<view>`` and the maintained views. ``one_row_per_group``: the results are
        a plain query's, without ``__w``; each row counts once (a duplicate group differs)."""

        def written(name: str) -> DataFrame:
            frame = self.bench.spark.read.parquet(str(folder / name))
            if one_row_per_group:
                frame = frame.withColumn(WEIGHT, F.lit(1).cast(WEIGHT_TYPE))
            return frame

        return self._differing(written)

    def _differing(self, other_view: Callable[[str], DataFrame]) -> dict[str, int]:
        """How many rows differ, per view that differs, between ``other_view(name)`` and
        the maintained view."""
        differences = {}
        for name in self.circuit.views:
            maintained = self.engine.view_frame(name)
            columns = [c for c in maintained.columns if c != WEIGHT]
            count = verify(other_view(name), maintained, columns).count()
            if count:
                differences[name] = count
        return differences

    def _check(self, measurement: Measurement, differences: dict[str, int]) -> Measurement:
        """Record ``measurement`` with whether its answers agreed."""
        measurement.ok = not differences
        if differences:
            measurement.params["difference"] = f"rows differing per view: {differences}"
        return self.bench.results.add(measurement)

    def _measurement(
        self, variant: str, epoch: int, rows: int, params: dict[str, Any]
    ) -> Measurement:
        return Measurement(
            self.workload, variant, 0.0, self.size, rows, epoch, params={**self.params, **params}
        )

    def _inputs(self, epoch: int) -> tuple[Callable[[], dict[str, Any]], int]:
        """A reader of the epoch's landed batches, and how many rows they hold. The reader
        runs inside the timing: a batch the engine keeps on its local tier is read as an
        Arrow table (as a user hands over a small batch), a larger one as a Spark frame."""
        folders, rows = dict(self._folders(epoch)), 0
        for folder in folders.values():
            rows += sum(pq.read_metadata(f).num_rows for f in folder.glob("*.parquet"))
        local = rows <= self.engine.local_rows

        def read() -> dict[str, Any]:
            if local:
                return {source: pq.read_table(folder) for source, folder in folders.items()}
            spark = self.bench.spark
            return {source: spark.read.parquet(str(folder)) for source, folder in folders.items()}

        return read, rows

    def _folders(self, epoch: int) -> list[tuple[str, Path]]:
        """Each source's landed folder for ``epoch`` (sources without one are left out)."""
        folders = [(s, epoch_folder(self.landing, s, epoch)) for s in self.circuit.sources]
        return [(source, folder) for source, folder in folders if folder.exists()]

    def _stored_bytes(self) -> int:
        """Live bytes of every batch of the circuit (traces, views, the raw input log)."""
        engine = self.engine
        return sum(b.bytes for b in engine.catalog.all_batches(engine.circuit.name) if b.live)


def copy_warehouse(source: Path, target: Path) -> None:
    """A copy of a warehouse whose Parquet files are hard links: a batch's files never
    change once written (a compaction writes new ones, garbage collection unlinks), so
    the copy shares them; the catalog and every other file are copied. Copying the
    bytes wrote some 200 MB at W1 SF 1 right before the epoch measured next, whose
    directory creations then stalled behind the file system's write-back (170 ms of
    one 1% epoch, against 5 ms)."""

    def link_or_copy(src: str, dst: str) -> object:
        if src.endswith(".parquet"):
            os.link(src, dst)
            return dst
        return shutil.copy2(src, dst)

    shutil.copytree(source, target, copy_function=link_or_copy)


def _median_after_warm_up(runs: list[Measurement], epoch: int) -> Measurement:
    """The compared epoch's incremental measurement: the only run, or the median of the
    runs after the first (the warm-up), labelled ``epoch`` (the one compared) and its
    delta (W3's days differ in size; the runs' are ``params["deltas"]``), with every
    run's seconds in ``params["runs_s"]`` and the warm-up's in ``first_s``."""
    if len(runs) == 1:
        return runs[0]
    timed = runs[1:]
    middle = sorted(timed, key=lambda m: m.seconds)[len(timed) // 2]
    median = replace(
        middle,
        variant="incremental",
        epoch=epoch,
        delta=runs[-1].delta,
        params=dict(middle.params),
    )
    median.params["deltas"] = [m.delta for m in runs]
    median.params["runs_s"] = [round(m.seconds, 3) for m in runs]
    median.params["compaction_runs_s"] = [m.params.get("compaction_s") for m in runs]
    median.params["first_s"] = round(runs[0].seconds, 3)
    median.params["median_of_epochs"] = [m.epoch for m in timed]
    return median


def room_for_next(bench: Bench, previous: Series | None, what: str) -> bool:
    """Whether a larger series still fits the budget: one that costs twice what the
    previous one did. If not, ``what`` is recorded as skipped."""
    if previous is None or bench.budget.allows(2 * previous.spent()):
        return True
    bench.results.skip(f"{what} (time budget)")
    return False


def warehouse_of(landing: Path) -> Path:
    """The warehouse of the series whose landing folder is ``landing``."""
    return landing.parent / "warehouse"
