"""The orders DAG run by a real Airflow deployment: api-server, scheduler with the
LocalExecutor (one process per task) and dag-processor as child processes
(``devtools/airflow.py``), every task a Spark Connect client of one Spark
Connect server (``devtools/spark_connect.py``). No ``dag.test()``, no mocks.

One scenario, in order, because each step continues the epochs of the one before:

1. ``airflow backfill create`` over three daily intervals (epochs 0-2: upserts with an
   update and tombstones), with the join stage of epoch 1 killed (SIGKILL) after it
   wrote its files and before it committed; the retry completes it;
2. a run triggered through the REST API as the UI does, for the fourth interval;
3. a unit worker started (``orchestration/worker.py``; ``[dbspark] worker_socket`` was
   set from the start, so until now each task ran its unit itself), and a run for the
   fifth interval whose every unit runs there;
4. after each epoch the published views (table and change) equal the reference
   engine's full refresh; at the end ``SparkEngine.verify`` agrees as well.
"""

from __future__ import annotations

import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
import sqlalchemy as sa
from scratch_databases import scratch_database

from dbspark.core.zset import ZSet
from dbspark.devtools.airflow import LocalAirflow
from dbspark.devtools.processes import free_port
from dbspark.devtools.spark_connect import LocalConnectServer
from dbspark.devtools.unit_worker import LocalUnitWorker
from dbspark.engine.reference.full_refresh import full_refresh
from dbspark.examples.circuits import orders
from dbspark.orchestration.intervals import Interval
from dbspark.orchestration.sinks.files import CHANGES, output_dir, read_change_rows
from dbspark.orchestration.sinks.tables import table_path, table_rows
from dbspark.orchestration.sources import LandingDirectory
from dbspark.storage.catalog import Catalog, epochs_table

pytestmark = pytest.mark.slow

DAGS = Path(__file__).parent / "scheduler_dags"
DAG_ID = "scheduled_orders"  # scheduler_dags/scheduled_orders.py
START = datetime(2026, 1, 1, tzinfo=UTC)
CUSTOMERS = ["cust_id", "region", "ts", "deleted"]
ORDERS = ["order_id", "cust_id", "amount", "ts", "deleted_at"]
#: Per epoch (= daily interval), the upserts landed for it.
BATCHES = [
    {
        "customers": [(1, "EU", 1, False), (2, "US", 1, False), (3, "EU", 1, False)],
        "orders": [(10, 1, 5, 1, None), (11, 2, 7, 1, None), (12, 3, 4, 1, None)],
    },
    {  # customer 1 moves to US; order 11 is deleted (tombstone); a new order
        "customers": [(1, "US", 2, False)],
        "orders": [(11, 2, 7, 2, 2), (13, 1, 9, 2, None)],
    },
    {  # customer 3 is deleted (its order no longer joins); order 10 is updated
        "customers": [(3, "EU", 3, True)],
        "orders": [(10, 1, 50, 3, None)],
    },
    {  # a new customer with an order, by the run triggered through the REST API
        "customers": [(4, "APAC", 4, False)],
        "orders": [(14, 2, 1, 4, None), (15, 4, 3, 4, None)],
    },
    {  # by a run whose units the unit worker runs
        "customers": [(4, "EU", 5, False)],
        "orders": [(16, 4, 8, 5, None), (14, 2, 1, 5, 5)],
    },
]
KILLED_STAGE = "join_6"  # the plan's join stage of the orders circuit
KILLED_EPOCH = 1


def day(n: int) -> Interval:
    return Interval(START + timedelta(days=n), START + timedelta(days=n + 1))


@pytest.fixture(scope="module")
def airflow_database(postgres_url):
    """A fresh PostgreSQL database for Airflow's metadata. On SQLite, `airflow backfill
    create` failed now and then with "database is locked" on a busy machine: a deferred
    transaction upgrading to a write is refused at once, whatever the busy timeout."""
    with scratch_database(postgres_url, "airflow") as url:
        yield url


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, airflow_database):
    """Spark Connect server + Airflow (api-server, scheduler, dag-processor), with a
    fresh AIRFLOW_HOME (its metadata on PostgreSQL), warehouse, landing directory and
    outputs of their own."""
    root = tmp_path_factory.mktemp("scheduler")
    place = SimpleNamespace(
        root=root,
        warehouse=root / "warehouse",
        landing=LandingDirectory(root / "landing"),
        outputs=root / "published",
        kill_dir=root / "kill",
        worker_socket=root / "worker" / "units.sock",
        timings={},
    )
    place.kill_dir.mkdir()
    spark_port = free_port()
    env = {
        "AIRFLOW__DBSPARK__WAREHOUSE": str(place.warehouse),
        "AIRFLOW__DBSPARK__LANDING": str(root / "landing"),
        "AIRFLOW__DBSPARK__OUTPUTS": str(place.outputs),
        # Every task is a client of the one Spark Connect server: no JVM per task.
        "AIRFLOW_CONN_DBSPARK_SPARK": (
            f'{{"conn_type": "spark_connect", "host": "127.0.0.1", "port": {spark_port}}}'
        ),
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "DBSPARK_TEST_KILL_DIR": str(place.kill_dir),
        # No worker listens here until step 3: the tasks before it run their units.
        "AIRFLOW__DBSPARK__WORKER_SOCKET": str(place.worker_socket),
        # The test waits on runs: let the scheduler loop and the retry come round fast.
        "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": "0.2",
        # The DAG file does not change during the test: parse it once, not every 30 s.
        "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "600",
    }
    began = time.monotonic()
    airflow = LocalAirflow(
        root / "airflow", DAGS, env=env, parallelism=2, database_url=airflow_database
    )
    spark = LocalConnectServer(port=spark_port, log_path=root / "spark-connect.log")
    try:
        # Airflow first: its start is mostly waiting on other processes, so the
        # Spark server's start below overlaps the DAG processor parsing the DAG file.
        airflow.start()
        spark.start()
        airflow.wait_for_dags(DAG_ID)
        place.timings["start"] = time.monotonic() - began
        place.airflow = airflow
        place.spark = spark
        yield place
    finally:
        airflow.stop()
        spark.stop()


def moment(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)


def land(place, epoch: int) -> None:
    for source, rows in BATCHES[epoch].items():
        columns = CUSTOMERS if source == "customers" else ORDERS
        place.landing.land(source, day(epoch), rows, columns, "jsonl")


def published(place, circuit, view: str, epoch: int) -> ZSet:
    """The view as of ``epoch``, read from its published Delta table."""
    schema = circuit.node(circuit.views[view]).schema
    return ZSet(table_rows(table_path(place.outputs, circuit.name, view), schema, epoch))


def published_change(place, circuit, view: str, epoch: int) -> ZSet:
    """The change directory of ``epoch``."""
    schema = circuit.node(circuit.views[view]).schema
    where = output_dir(place.outputs, circuit.name, view, CHANGES, epoch)
    return ZSet(read_change_rows(where, schema))


def check_views(place, circuit, epoch: int) -> None:
    """The published table (as of ``epoch``) and change of every view equal the full
    refresh of everything landed up to then (and its difference to the epoch before)."""
    history = BATCHES[: epoch + 1]
    expected = full_refresh(circuit, history, epoch)
    before = full_refresh(circuit, history, epoch - 1) if epoch else {}
    for view in circuit.views:
        assert published(place, circuit, view, epoch) == expected[view], (epoch, view)
        change = expected[view] - before.get(view, ZSet())
        assert published_change(place, circuit, view, epoch) == change, (epoch, view)


def committed(place, circuit) -> list[tuple[int, str, datetime]]:
    catalog = Catalog.for_warehouse(place.warehouse)
    try:
        t = epochs_table
        with catalog.engine.connect() as conn:
            rows = conn.execute(
                sa.select(t.c.epoch, t.c.state, t.c.committed_at)
                .where(t.c.circuit == circuit.name)
                .order_by(t.c.epoch)
            ).all()
        labels = catalog.epoch_labels(circuit.name)
    finally:
        catalog.close()
    assert labels == {epoch: day(epoch).label for epoch, _, _ in rows}
    return [(int(e), s, at) for e, s, at in rows]


def test_backfill_kill_and_retry_and_a_triggered_run_equal_full_refresh(deployment):
    place, airflow = deployment, deployment.airflow
    api = airflow.api
    circuit = orders()
    api.unpause(DAG_ID)  # runs of a paused DAG are never scheduled, backfills included

    # --- 1. backfill three intervals; the join of epoch 1 is killed before committing
    for epoch in range(3):
        land(place, epoch)
    (place.kill_dir / f"{KILLED_STAGE}@{KILLED_EPOCH}").touch()
    began = time.monotonic()
    airflow.backfill(DAG_ID, day(0).start, day(2).start)  # logical dates, both inclusive
    runs = api.wait_for_runs(DAG_ID, run_type="backfill", count=3, timeout=240)
    place.timings["backfill (3 runs)"] = time.monotonic() - began
    assert [r.state for r in runs] == ["success"] * 3, api.explain(DAG_ID, runs)
    assert [moment(r.data_interval_start) for r in runs] == [day(n).start for n in range(3)]
    assert not list(place.kill_dir.iterdir()), "the kill switch never fired"

    killed_run = runs[KILLED_EPOCH].run_id
    instances = {ti["task_id"]: ti for ti in api.task_instances(DAG_ID, killed_run)}
    join = instances[KILLED_STAGE]
    assert (join["state"], join["try_number"]) == ("success", 2), api.explain(DAG_ID, runs)
    tries = api.tries(DAG_ID, killed_run, KILLED_STAGE)
    assert [t["state"] for t in sorted(tries, key=lambda t: t["try_number"])] == [
        "failed",
        "success",
    ]
    attempt = (
        airflow.logs
        / f"dag_id={DAG_ID}"
        / f"run_id={killed_run}"
        / f"task_id={KILLED_STAGE}"
        / "attempt=1.log"
    )
    assert "SIGKILL" in attempt.read_text()  # the supervisor saw its task process killed
    others = [ti for ti in instances.values() if ti["task_id"] != KILLED_STAGE]
    # A backfill takes the params' defaults: no rebuild, no verification. close_epoch
    # branches past them, so the scheduler skips them without starting a process.
    # No serving database, and maintain is due at epoch 0 only (every 10th epoch).
    assert {(ti["task_id"], ti["state"]) for ti in others if ti["state"] != "success"} == {
        ("rebuild", "skipped"),
        ("verify", "skipped"),
        ("serve", "skipped"),
        ("maintain", "skipped"),
    }
    maintenance = {"rebuild", "verify", "serve", "maintain"}
    assert {ti["try_number"] for ti in others if ti["task_id"] not in maintenance} == {1}
    skipped = [ti for ti in others if ti["task_id"] in maintenance and ti["state"] == "skipped"]
    assert {ti["try_number"] for ti in skipped} == {0}

    # Backfill runs emit each view's asset event like any run: one per view and epoch.
    events = api.get(f"/api/v2/assets/events?source_dag_id={DAG_ID}&limit=100")["asset_events"]
    assert sorted((e["uri"], e["extra"]["epoch"]) for e in events) == sorted(
        (f"dbspark://{circuit.name}/{view}", epoch) for view in circuit.views for epoch in range(3)
    )
    assert {e["source_run_id"] for e in events} == {r.run_id for r in runs}

    epochs = committed(place, circuit)
    assert [(e, s) for e, s, _ in epochs] == [(0, "committed"), (1, "committed"), (2, "committed")]
    times = [at for _, _, at in epochs]
    assert times == sorted(times) and len(set(times)) == 3
    for epoch in range(3):
        check_views(place, circuit, epoch)

    # The killed attempt committed nothing: the join ran at epoch 1 exactly once.
    catalog = Catalog.for_warehouse(place.warehouse)
    joins = [t for stage, t in catalog.stage_runs(circuit.name) if stage == KILLED_STAGE]
    catalog.close()
    assert sorted(tuple(t) for t in joins) == [(0,), (1,), (2,)]

    # --- 2. a manual run through the REST API, as the UI's trigger form sends it. A
    # manual run covers the last complete interval: the one ending at its logical date.
    land(place, 3)
    began = time.monotonic()
    run = api.trigger(DAG_ID, logical_date=day(3).end)
    assert run.run_type == "manual"
    (run,) = api.wait_for_runs(DAG_ID, run_ids=[run.run_id], timeout=120)
    place.timings["triggered run"] = time.monotonic() - began
    assert run.state == "success", api.explain(DAG_ID, [run])
    assert moment(run.data_interval_start) == day(3).start
    epochs = committed(place, circuit)
    assert [(e, s) for e, s, _ in epochs][-1] == (3, "committed")
    assert epochs[3][2] > epochs[2][2]
    check_views(place, circuit, 3)
    totals = published(place, circuit, "region_totals", 3)
    assert totals == ZSet({("US", 3, 60, 50): 1, ("APAC", 1, 3, 3): 1})

    # --- 3. a unit worker, and a run whose every unit it runs
    # Its Spark, should a unit need it, is the deployment's Connect server.
    spark_remote = {"SPARK_REMOTE": place.spark.url()}
    with LocalUnitWorker(place.worker_socket, place.root / "worker.log", spark_remote):
        land(place, 4)
        run = api.trigger(DAG_ID, logical_date=day(4).end)
        (run,) = api.wait_for_runs(DAG_ID, run_ids=[run.run_id], timeout=120)
        assert run.state == "success", api.explain(DAG_ID, [run])
    logs = "\n".join(
        p.read_text(errors="replace")
        for p in (airflow.logs / f"dag_id={DAG_ID}" / f"run_id={run.run_id}").rglob("*.log")
    )
    for kind in ("ingest", "stage", "publish", "close"):
        assert f"the {kind} unit ran in the dbspark worker" in logs, kind
    assert "in this task instead" not in logs
    check_views(place, circuit, 4)

    # --- 4. Spark recomputes every view from the warehouse's input log: it agrees.
    from dbspark.engine.spark.executor import SparkEngine
    from dbspark.engine.spark.session import connect_session

    with connect_session(place.spark.url()) as spark:
        engine = SparkEngine(circuit, place.warehouse, spark=spark)
        try:
            assert {v: d for v, d in engine.verify().items() if d} == {}
        finally:
            engine.catalog.close()
    print(f"\ntimings (s): {', '.join(f'{k} {v:.1f}' for k, v in place.timings.items())}")
