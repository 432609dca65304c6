"""One unit of an epoch's Spark work, run in the Airflow worker or by ``spark-submit``.

A unit is what one Spark-using task does: ingest a source's batch, run a stage, run
the loop's next pending iteration, publish and export the views, close the epoch, or,
when a run asks for them, rebuild views or verify them against a full refresh.
``execute_unit`` runs it on a ``SparkEngine``; the task calls it directly (local Spark
or Spark Connect), or ships it to ``spark_jobs/run_unit.py`` with ``spark-submit``
(a cluster), which calls the same function. No Airflow import here: a unit must run
where Airflow is not installed.

A shipped unit is a file: the circuit and the unit's description, pickled with
cloudpickle (pyspark's), so circuits whose functions are lambdas travel too. The job
writes its result next to it as JSON.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from dbspark.circuit.builder import Circuit

log = logging.getLogger("dbspark.airflow")


@dataclass(frozen=True)
class IngestUnit:
    """Ingest ``source``'s batch for the epoch (and run the chain fused onto it)."""

    epoch: int
    source: str
    batch: Any = None
    kind: ClassVar[str] = "ingest"

    def run(self, engine: Any) -> dict[str, Any]:
        report = engine.ingest(self.source, self.epoch, self.batch)
        log.info("epoch %s, source %s: %s", self.epoch, self.source, report.describe())
        return {"epoch": self.epoch, "rows_in": report.rows_in, "rows_out": report.rows_out}


@dataclass(frozen=True)
class StageUnit:
    """Run one root-scope stage at the epoch."""

    epoch: int
    stage: int
    kind: ClassVar[str] = "stage"

    def run(self, engine: Any) -> dict[str, Any]:
        report = engine.run_stage(self.stage, (self.epoch,))
        log.info("epoch %s: %s", self.epoch, report.describe())
        for path in report.paths:
            log.info("wrote %s", engine.root / path)
        return {"epoch": self.epoch, "rows_in": report.rows_in, "rows_out": report.rows_out}


@dataclass(frozen=True)
class IterateUnit:
    """The loop's next pending iteration. The task of the last slot carries on inline, so
    a loop deeper than the DAG's iteration tasks still runs up to its own bound."""

    epoch: int
    loop: int
    iteration_tasks: int
    map_index: int | None = None
    kind: ClassVar[str] = "iterate"

    def run(self, engine: Any) -> dict[str, Any]:
        loop = engine.plan.loops[self.loop]
        ran = []
        while True:
            report = engine.run_iteration(loop, (self.epoch,))
            ran.append(report.iteration)
            log.info(
                "loop %s, epoch %s, iteration %s (task map index %s): delta %s rows; %s",
                loop.name,
                self.epoch,
                report.iteration,
                self.map_index,
                report.delta_rows,
                report.reason,
            )
            last_slot = report.iteration + 1 >= self.iteration_tasks
            if report.converged or not last_slot or report.iteration + 1 >= loop.max_iterations:
                break
        return {"epoch": self.epoch, "iterations": ran, "converged": report.converged}


@dataclass(frozen=True)
class PublishUnit:
    """Publish the epoch's view changes, then export them to ``outputs`` (each view's
    Delta table, kept as ``DBSPARK_TABLE_*`` say, and change feed) and to the serving
    database at ``serving_url``, when there is one."""

    epoch: int
    outputs: str
    serving_url: str | None = None
    serving_prefix: str = "dbspark_"
    kind: ClassVar[str] = "publish"

    def run(self, engine: Any) -> dict[str, Any]:
        from dbspark.orchestration.sinks.export import export_epoch
        from dbspark.orchestration.sinks.serving import ServingTarget
        from dbspark.orchestration.sinks.tables import TableSettings

        report = engine.publish(self.epoch)
        log.info("epoch %s: %s", self.epoch, report.describe())
        serving = None
        if self.serving_url:
            serving = ServingTarget(self.serving_url, prefix=self.serving_prefix)
        exported = export_epoch(
            engine,
            self.epoch,
            root=self.outputs,
            serving=serving,
            tables=TableSettings.from_environment(),
        )
        log.info("epoch %s outputs:\n%s", self.epoch, exported.describe())
        # Per view, what its asset event tells consumers (orchestration/airflow/assets.py).
        # The counts come from the change feed's marker, so a retry that finds the
        # outputs complete reports what the first attempt wrote.
        views = {}
        for name, item in exported.views.items():
            changes, snapshot, table = item.changes, item.snapshot, item.table
            views[name] = {
                "rows": changes.rows if changes else 0,
                "inserted": changes.inserted if changes else 0,
                "deleted": changes.deleted if changes else 0,
                "changes": str(changes.path) if changes and changes.path else None,
                "snapshot": str(snapshot.path) if snapshot and snapshot.path else None,
                "table": str(table.path) if table else None,
            }
        return {"epoch": self.epoch, "view_changes": report.rows_out, "views": views}


@dataclass(frozen=True)
class CloseUnit:
    """Commit the epoch (then compact)."""

    epoch: int
    kind: ClassVar[str] = "close"

    def run(self, engine: Any) -> dict[str, Any]:
        engine.close_epoch(self.epoch)
        log.info("circuit %s: epoch %s committed", engine.circuit.name, self.epoch)
        return {"epoch": self.epoch}


@dataclass(frozen=True)
class RebuildUnit:
    """Replace each of ``views`` with its full refresh over the raw input log, at the last
    committed epoch (``SparkEngine.rebuild``; the engine's rule, as ``python -m
    dbspark.refresh rebuild`` runs it)."""

    epoch: int
    views: tuple[str, ...]
    kind: ClassVar[str] = "rebuild"

    def run(self, engine: Any) -> dict[str, Any]:
        at = engine.last_committed_epoch()
        rows = {name: engine.rebuild(name) for name in self.views}  # the engine logs each
        return {"epoch": at, "rows": rows}


@dataclass(frozen=True)
class VerifyUnit:
    """Recompute every view from the raw input log and compare it with the maintained
    view, at the last committed epoch (``SparkEngine.verify``). Returns per view the
    number of differing rows (at most the engine's listing limit) and the first few."""

    epoch: int
    kind: ClassVar[str] = "verify"
    shown: ClassVar[int] = 10

    def run(self, engine: Any) -> dict[str, Any]:
        at = engine.last_committed_epoch()
        differences = engine.verify()
        return {
            "epoch": at,
            "differing": {name: len(rows) for name, rows in differences.items() if rows},
            "examples": {
                name: [
                    f"{row[:-1]} weight(full refresh - maintained) = {row[-1]}"
                    for row in rows[: self.shown]
                ]
                for name, rows in differences.items()
                if rows
            },
            "views": sorted(differences),
        }


Unit = IngestUnit | StageUnit | IterateUnit | PublishUnit | CloseUnit | RebuildUnit | VerifyUnit


def execute_unit(engine: Any, unit: Unit) -> dict[str, Any]:
    """Run ``unit`` on ``engine`` and return what the task reports (JSON-serialisable)."""
    return unit.run(engine)


# ------------------------------------------------------------------ shipping to spark-submit
def write_unit_file(path: Path, circuit: Circuit, unit: Unit, engine: dict) -> None:
    """Write what ``spark_jobs/run_unit.py`` needs: the circuit, the unit, and how to
    open the engine (warehouse, catalog URL)."""
    from pyspark import cloudpickle

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(cloudpickle.dumps({"circuit": circuit, "unit": unit, "engine": engine}))


def run_unit_file(path: Path, spark: Any) -> dict[str, Any]:
    """Run a unit written by ``write_unit_file`` and write its result beside it."""
    import pickle

    from dbspark.engine.spark.executor import SparkEngine

    shipped = pickle.loads(path.read_bytes())  # written by this project, trusted
    options = shipped["engine"]
    engine = SparkEngine(
        shipped["circuit"],
        options["warehouse"],
        spark=spark,
        catalog_url=options["catalog_url"],
        resident_bytes=0,  # one unit per process: nothing to keep across epochs
    )
    try:
        result = execute_unit(engine, shipped["unit"])
    finally:
        engine.catalog.close()
    result_path(path).write_text(json.dumps(result, default=str))
    return result


def result_path(unit_file: Path) -> Path:
    return unit_file.with_suffix(".result.json")
