"""W1 through Airflow: the small epoch as a DAG run of a real scheduler.

The same warehouse the engine-only side loaded (a copy of W1's largest scale factor
right after its base load, epoch 0 labelled as the DAG's first data interval) is handed
to a local Airflow deployment (``devtools/airflow.py``: api-server, scheduler
with the LocalExecutor, dag-processor, every task a process of its own). Then, each
triggered through the REST API as the UI's trigger button does:

1. the first 0.1% epoch (the same landed files the engine-only side ingested), each
   task running its unit itself;
2. an empty epoch (nothing landed): the floor, what Airflow alone costs per epoch;
3. then, with a unit worker started (``orchestration/worker.py``, which the tasks find
   at ``[dbspark] worker_socket``), the size's next 0.1% epochs (the first fills the
   worker's resident traces, the others are the steady state) and another empty one.

Measured per run: the wall time from the trigger to the run's success, the sum of its
task instances' durations, and per task its queue wait (queued to started). Checked:
the run succeeded, the views after the last epoch equal the engine-only side's
(``same answer``), no log says a unit ran on the Spark tier or that a Spark session
started, and with the worker every unit ran there, on one engine.
"""

from __future__ import annotations

import os
import shutil
import textwrap
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from benchmarks.circuits import tpch_q3
from benchmarks.data import epoch_folder
from benchmarks.harness import Bench, Measurement
from benchmarks.workloads.compare import Series

WORKLOAD = "W1-airflow"
DAG_ID = "bench_w1_q3"
REPO = Path(__file__).resolve().parents[2]

DAG_FILE = textwrap.dedent(
    '''
    """Airflow DAG of the benchmark's W1 epochs (TPC-H Q3 over landed Parquet files).

    ``catchup=False`` and an ``end_date``: the scheduler makes no run of its own; the
    benchmark triggers each one.
    """

    from datetime import UTC, datetime, timedelta

    from benchmarks.circuits import TPCH_SCHEMAS, tpch_q3
    from dbspark.orchestration import LandingDirectory, build_dag

    START = datetime(2026, 1, 1, tzinfo=UTC)
    landing = LandingDirectory()

    dag = build_dag(
        tpch_q3,
        dag_id="bench_w1_q3",
        schedule="@daily",
        start_date=START,
        end_date=START + timedelta(days=31),
        catchup=False,
        sources={name: landing for name in TPCH_SCHEMAS},
        retries=0,
    )
    '''
)

#: What a task log says when a unit did not stay on the local tier.
SPARK_SIGNS = ("ran on the spark tier", "SparkContext: Running Spark version")


def run(bench: Bench, series: Series, loaded: Path, epochs: list[int]) -> None:
    """Run ``series``' landed ``epochs`` (small ones, at least three) through Airflow,
    over ``loaded``: a copy of the series' warehouse holding only the base load. Call it
    right after the series ran them, so that its views are the ones to match."""
    from dbspark.devtools.airflow import LocalAirflow
    from dbspark.devtools.demo import interval
    from dbspark.devtools.unit_worker import LocalUnitWorker
    from dbspark.orchestration import LandingDirectory
    from dbspark.storage.catalog import Catalog

    root = bench.work / "W1" / "airflow"
    shutil.rmtree(root, ignore_errors=True)
    warehouse, home, dags = root / "warehouse", root / "home", root / "dags"
    shutil.move(loaded, warehouse)
    circuit = tpch_q3()
    catalog = Catalog.for_warehouse(warehouse)
    try:
        catalog.open_epoch(circuit.name, 0, interval(0).label)  # the DAG's first interval
    finally:
        catalog.close()
    engine_side = {
        m.epoch: m
        for m in bench.results.of(series.workload)
        if m.variant in ("incremental", "incremental_run") and m.epoch in epochs
    }
    # (label, the series' epoch landed in the interval or None, with the worker?)
    runs = [
        ("small epoch", epochs[0], False),
        ("empty epoch", None, False),
        ("small epoch, worker's first", epochs[1], True),
        *[("small epoch, worker", epoch, True) for epoch in epochs[2:]],
        ("empty epoch, worker", None, True),
    ]
    landing = LandingDirectory(root / "landing")
    for n, (_, epoch, _) in enumerate(runs, start=1):
        for source in circuit.sources:
            folder = None if epoch is None else epoch_folder(series.landing, source, epoch)
            if folder is not None and folder.is_dir():
                target = landing.partition(source, interval(n))
                target.mkdir(parents=True)
                for file in folder.glob("*.parquet"):
                    os.link(file, target / file.name)
            # As a writer does when an interval's files are all there.
            landing.complete(source, interval(n))
    dags.mkdir(parents=True)
    (dags / "bench_w1_q3.py").write_text(DAG_FILE)
    socket_path = root / "worker" / "units.sock"
    env = {
        "AIRFLOW__DBSPARK__WAREHOUSE": str(warehouse),
        "AIRFLOW__DBSPARK__LANDING": str(root / "landing"),
        "AIRFLOW__DBSPARK__OUTPUTS": str(root / "published"),
        # Set from the start: until the worker listens, each task runs its unit itself.
        "AIRFLOW__DBSPARK__WORKER_SOCKET": str(socket_path),
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    worker = None
    try:
        with LocalAirflow(home, dags, env=env) as airflow:
            airflow.wait_for_dags(DAG_ID, timeout=180)
            airflow.api.unpause(DAG_ID)
            for n, (label, epoch, in_worker) in enumerate(runs, start=1):
                if in_worker and worker is None:
                    worker = LocalUnitWorker(socket_path, root / "worker.log", env).start()
                _trigger(bench, airflow, series, n, label, epoch, engine_side, in_worker)
    finally:
        if worker is not None:
            worker.stop()
    worker_log = (root / "worker.log").read_text(errors="replace")
    engines = worker_log.count("an engine for circuit")
    spark_in_worker = [s for s in SPARK_SIGNS if s in worker_log]
    for m in bench.results.of(WORKLOAD, "airflow"):
        if m.params.get("in_worker"):
            m.params["worker_engines"] = engines
            m.ok = bool(m.ok and engines == 1 and not spark_in_worker)
    if engines != 1 or spark_in_worker:
        bench.results.failures.append(
            f"W1 through Airflow with the worker: {engines} engines built (1 expected), "
            f"Spark signs {spark_in_worker}"
        )
    if bench.results.failures:
        return
    _check_views(bench, warehouse, series, epochs[-1], len(runs))


def _trigger(
    bench: Bench,
    airflow: Any,
    series: Series,
    n: int,
    label: str,
    epoch: int | None,
    engine_side: dict[int, Measurement],
    in_worker: bool,
) -> None:
    """Trigger the DAG's run of interval ``n`` and record it."""
    from dbspark.devtools.demo import interval

    measurement = Measurement(
        WORKLOAD,
        "airflow",
        0.0,
        size=series.size,
        delta=0 if epoch is None else engine_side[epoch].delta,
        epoch=n,
        params={**series.params, "run": label, "in_worker": in_worker},
    )
    began = time.perf_counter()
    triggered = airflow.api.trigger(DAG_ID, logical_date=interval(n).end)
    (finished,) = airflow.api.wait_for_runs(
        DAG_ID, run_ids=[triggered.run_id], timeout=900, poll=0.2
    )
    measurement.seconds = time.perf_counter() - began
    instances = airflow.api.task_instances(DAG_ID, finished.run_id)
    measurement.params.update(_task_times(instances))
    logs = _logs(airflow.logs, finished.run_id)
    measurement.params["spark_signs"] = [s for s in SPARK_SIGNS if s in logs]
    measurement.params["state"] = finished.state
    if epoch is not None:
        measurement.params["engine_only_s"] = round(engine_side[epoch].seconds, 3)
    # Each task that runs a unit says where it ran (the maintain task runs none).
    handed = logs.count("ran in the dbspark worker at")
    measurement.params["units_in_worker"] = handed
    measurement.ok = finished.state == "success" and not measurement.params["spark_signs"]
    if in_worker and (handed == 0 or "in this task instead" in logs):
        measurement.ok = False
    if not measurement.ok:
        bench.results.failures.append(
            f"W1 through Airflow, {label}: run {finished.state}, Spark signs "
            f"{measurement.params['spark_signs']}, {handed} units in the worker:\n"
            + airflow.api.explain(DAG_ID, [finished])
        )
    bench.results.add(measurement)


def _task_times(instances: list[dict[str, Any]]) -> dict[str, Any]:
    durations, waits = {}, {}
    for ti in instances:
        name = ti["task_id"] + ("" if ti.get("map_index", -1) < 0 else f"[{ti['map_index']}]")
        if ti.get("duration") is not None:
            durations[name] = round(float(ti["duration"]), 3)
        queued, started = _moment(ti.get("queued_when")), _moment(ti.get("start_date"))
        if queued and started:
            waits[name] = round((started - queued).total_seconds(), 3)
    return {
        "tasks": len(instances),
        "task_seconds_sum": round(sum(durations.values()), 3),
        "queue_wait_sum": round(sum(waits.values()), 3),
        "task_seconds": durations,
    }


def _moment(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value.replace("Z", "+00:00")) if value else None


def _logs(folder: Path, run_id: str) -> str:
    run_logs = folder / f"dag_id={DAG_ID}" / f"run_id={run_id}"
    return "\n".join(p.read_text(errors="replace") for p in run_logs.rglob("*.log"))


def _check_views(bench: Bench, warehouse: Path, series: Series, epoch: int, dag_epoch: int) -> None:
    """The DAG's views after its ``dag_epoch`` equal the series' after ``epoch`` (the
    empty epochs change nothing)."""
    from dbspark.engine.spark.executor import SparkEngine

    ours = SparkEngine(series.circuit, warehouse, spark=lambda: bench.spark)
    try:
        same = all(
            _sorted(ours.view_frame(name, dag_epoch).toArrow())
            == _sorted(series.engine.view_frame(name, epoch).toArrow())
            for name in series.circuit.views
        )
    finally:
        ours.catalog.close()
    for measurement in bench.results.of(WORKLOAD, "airflow"):
        measurement.ok = bool(measurement.ok and same)
    if not same:
        bench.results.failures.append("W1 through Airflow: the views differ from the engine's")


def _sorted(table: Any) -> Any:
    return table.sort_by([(c, "ascending") for c in table.column_names])
