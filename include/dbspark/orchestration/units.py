"""One unit of an epoch's Spark work, run in the Airflow worker or by ``spark-submit``.

A unit is what one Spark-using task does: ingest a source's batch, run a stage, run
the loop's next pending iteration, publish and export the views, or close the epoch.
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
from pathlib import Path
from typing import Any

from dbspark.circuit.builder import Circuit

log = logging.getLogger("dbspark.airflow")

KINDS = ("ingest", "stage", "iterate", "publish", "close")


def execute_unit(engine: Any, unit: dict[str, Any]) -> dict[str, Any]:
    """Run ``unit`` (``kind`` is one of ``KINDS``, ``epoch`` its epoch) on ``engine``
    and return what the task reports (JSON-serialisable)."""
    kind, epoch = unit["kind"], int(unit["epoch"])
    if kind == "ingest":
        report = engine.ingest(unit["source"], epoch, unit.get("batch"))
        log.info("epoch %s, source %s: %s", epoch, unit["source"], report.describe())
        return {"epoch": epoch, "rows_in": report.rows_in, "rows_out": report.rows_out}
    if kind == "stage":
        report = engine.run_stage(int(unit["stage"]), (epoch,))
        log.info("epoch %s: %s", epoch, report.describe())
        for path in report.paths:
            log.info("wrote %s", engine.root / path)
        return {"epoch": epoch, "rows_in": report.rows_in, "rows_out": report.rows_out}
    if kind == "iterate":
        return _iterate(engine, unit, epoch)
    if kind == "publish":
        return _publish(engine, unit, epoch)
    if kind == "close":
        engine.close_epoch(epoch)
        log.info("circuit %s: epoch %s committed", engine.circuit.name, epoch)
        return {"epoch": epoch}
    raise ValueError(f"unknown unit kind {kind!r}; expected one of {KINDS}")


def _iterate(engine: Any, unit: dict[str, Any], epoch: int) -> dict[str, Any]:
    """The loop's next pending iteration; the task of the last slot carries on inline,
    so a loop deeper than the DAG's iteration tasks still runs up to its own bound."""
    loop = engine.plan.loops[int(unit["loop"])]
    slots = int(unit["iteration_tasks"])
    ran = []
    while True:
        report = engine.run_iteration(loop, (epoch,))
        ran.append(report.iteration)
        log.info(
            "loop %s, epoch %s, iteration %s (task map index %s): delta %s rows; %s",
            loop.name,
            epoch,
            report.iteration,
            unit.get("map_index"),
            report.delta_rows,
            report.reason,
        )
        last_slot = report.iteration + 1 >= slots
        if report.converged or not last_slot or report.iteration + 1 >= loop.max_iterations:
            break
    return {"epoch": epoch, "iterations": ran, "converged": report.converged}


def _publish(engine: Any, unit: dict[str, Any], epoch: int) -> dict[str, Any]:
    from dbspark.orchestration.outputs import ServingTarget, export_epoch

    report = engine.publish(epoch)
    log.info("epoch %s: %s", epoch, report.describe())
    serving = None
    if unit.get("serving_url"):
        serving = ServingTarget(unit["serving_url"], prefix=unit["serving_prefix"])
    exported = export_epoch(engine, epoch, root=unit["outputs"], serving=serving)
    log.info("epoch %s outputs:\n%s", epoch, exported.describe())
    return {"epoch": epoch, "view_changes": report.rows_out}


# ------------------------------------------------------------------ shipping to spark-submit
def write_unit_file(path: Path, circuit: Circuit, unit: dict[str, Any], engine: dict) -> None:
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
        shipped["circuit"], options["warehouse"], spark=spark, catalog_url=options["catalog_url"]
    )
    try:
        result = execute_unit(engine, shipped["unit"])
    finally:
        engine.catalog.close()
    result_path(path).write_text(json.dumps(result, default=str))
    return result


def result_path(unit_file: Path) -> Path:
    return unit_file.with_suffix(".result.json")
