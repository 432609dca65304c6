"""The docker-compose topology as real processes on loopback, driven as a user would.

``LocalCluster`` (``devtools/cluster.py``) starts what ``docker-compose.yml``
starts: PostgreSQL with Airflow's metadata and the dbspark catalog in two databases,
Redis, Airflow's api-server, scheduler, dag-processor and two Celery workers, a Spark
standalone master with two workers, and a Spark Connect server driving that cluster.
Then, through the REST API only:

1. the example DAGs are unpaused and backfilled over two daily intervals (the UI's
   backfill dialog), both DAGs at once, then a third interval is triggered by hand;
2. every epoch's published views (the Delta table as of the epoch, and the change)
   equal the pure-Python reference engine's full refresh of everything landed up to
   then, and the catalog in PostgreSQL has the epochs committed in order;
3. the Spark work ran on the standalone workers' executors (the driver's REST API
   counts their tasks; the driver itself ran none) and the Airflow tasks were only
   Spark Connect clients (their logs say so, and they ran on the Celery workers), which
   handed every unit to the unit worker beside them;
4. everything stops, and no process of the topology is left.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
from datetime import datetime, timedelta
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import sqlalchemy as sa

from dbspark.core.zset import ZSet
from dbspark.devtools.cluster import LocalCluster
from dbspark.devtools.demo import land
from dbspark.devtools.engine_demo import SCENARIOS, engine_inputs, verify_views
from dbspark.devtools.redis import LocalRedis
from dbspark.engine.reference.full_refresh import full_refresh
from dbspark.examples.circuits import orders, reachability
from dbspark.orchestration.intervals import Interval
from dbspark.orchestration.sinks.files import CHANGES, output_dir, read_change_rows
from dbspark.orchestration.sinks.tables import table_path, table_rows
from dbspark.orchestration.sources import LandingDirectory
from dbspark.storage.catalog import epochs_table

pytestmark = pytest.mark.slow

DAGS = Path(__file__).parent / "cluster_dags"
START = datetime.fromisoformat("2026-01-01T00:00:00+00:00")
EPOCHS = 3  # = cluster_dags/examples.py DAYS
#: The example DAGs: their circuit and the demo scenario whose batches the test lands.
EXAMPLES = {
    "dbspark_orders_by_region": (orders, "orders"),
    "dbspark_reachability": (reachability, "reachability"),
}


def day(n: int) -> Interval:
    return Interval(START + timedelta(days=n), START + timedelta(days=n + 1))


def published(cluster, circuit, view: str, epoch: int) -> ZSet:
    """The view as of ``epoch``, read from its published Delta table."""
    schema = circuit.node(circuit.views[view]).schema
    return ZSet(table_rows(table_path(cluster.outputs, circuit.name, view), schema, epoch))


def published_change(cluster, circuit, view: str, epoch: int) -> ZSet:
    """The change directory of ``epoch``."""
    schema = circuit.node(circuit.views[view]).schema
    where = output_dir(cluster.outputs, circuit.name, view, CHANGES, epoch)
    return ZSet(read_change_rows(where, schema))


def check_views(cluster, circuit, history, epoch: int) -> None:
    views = {v: published(cluster, circuit, v, epoch) for v in circuit.views}
    assert verify_views(full_refresh, circuit, history, epoch, views) == [], epoch
    before = {v: published(cluster, circuit, v, epoch - 1) for v in circuit.views} if epoch else {}
    for view, rows in views.items():
        change = published_change(cluster, circuit, view, epoch)
        assert change == rows - before.get(view, ZSet()), (circuit.name, view, epoch)


def committed_epochs(cluster, circuit_name: str) -> list[tuple[int, datetime]]:
    engine = sa.create_engine(cluster.catalog_url())
    try:
        t = epochs_table
        with engine.connect() as conn:
            rows = conn.execute(
                sa.select(t.c.epoch, t.c.committed_at)
                .where(t.c.circuit == circuit_name, t.c.state == "committed")
                .order_by(t.c.epoch)
            ).all()
    finally:
        engine.dispose()
    return [(int(e), at) for e, at in rows]


def require_redis() -> None:
    """Redis comes from the system (bin/test installs it on CI): a missing one fails the
    test under CI and skips it, with the reason, elsewhere."""
    if shutil.which("redis-server") is None:
        reason = "redis-server is not installed (apt-get install redis-server)"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)


def test_example_dags_on_the_compose_topology(tmp_path):
    require_redis()
    cluster = LocalCluster(
        tmp_path,
        DAGS,
        spark_workers=2,
        airflow_workers=2,
        worker_concurrency=2,
        env={
            # The test waits on runs: let the scheduler loop come round fast, and parse
            # the (unchanging) DAG file once rather than every 30 s.
            "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": "0.2",
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "600",
        },
    )
    ports: list[int] = []
    try:
        cluster.start()
        airflow = cluster.airflow
        assert airflow is not None
        api = airflow.api
        airflow.wait_for_dags(*EXAMPLES)
        ports = [airflow.port, cluster.connect.port, cluster.spark.master.port]

        # --- land every interval's files, as upstream systems would
        landing = LandingDirectory(cluster.landing)
        circuits, histories = {}, {}
        for dag_id, (factory, scenario_name) in EXAMPLES.items():
            circuit = factory()
            circuits[dag_id] = circuit
            histories[dag_id] = []
            scenario = SCENARIOS[scenario_name]()
            for epoch, (_, inputs) in enumerate(scenario.epochs(EPOCHS)):
                histories[dag_id].append(engine_inputs(circuit, inputs))
                # Edges as CSV, which Spark reads: these small epochs would otherwise all
                # stay in the tasks (the local tier), and the test is of where Spark runs.
                land(circuit, epoch, inputs, landing, zset_format="csv")

        # --- 1. the UI's actions, through the REST API: unpause, backfill, trigger
        for dag_id in EXAMPLES:
            api.unpause(dag_id)
            api.backfill(dag_id, day(0).start, day(1).start)
        manual = {}
        for dag_id in EXAMPLES:
            runs = api.wait_for_runs(dag_id, run_type="backfill", count=2, timeout=600)
            assert [r.state for r in runs] == ["success"] * 2, api.explain(dag_id, runs)
            starts = [datetime.fromisoformat(r.data_interval_start) for r in runs]
            assert starts == [day(0).start, day(1).start]
            # The UI's Trigger button: a manual run covers the interval before its date.
            manual[dag_id] = api.trigger(dag_id, logical_date=day(2).end)
        for dag_id, run in manual.items():
            (done,) = api.wait_for_runs(dag_id, run_ids=[run.run_id], timeout=600)
            assert done.state == "success", api.explain(dag_id, [done])
            assert datetime.fromisoformat(done.data_interval_start) == day(2).start

        # --- 2. every epoch equals full refresh; the catalog (PostgreSQL) has them in order
        for dag_id, circuit in circuits.items():
            for epoch in range(EPOCHS):
                check_views(cluster, circuit, histories[dag_id], epoch)
            epochs = committed_epochs(cluster, circuit.name)
            assert [e for e, _ in epochs] == list(range(EPOCHS))
            assert [at for _, at in epochs] == sorted(at for _, at in epochs)
        assert not (cluster.warehouse / "catalog.db").exists()  # no SQLite catalog

        # --- 3. where the work ran: executors on the two workers, none in the driver
        executors = {e["id"]: e for e in cluster.executors()}
        workers = {i: e for i, e in executors.items() if i != "driver"}
        assert len(workers) == 2, executors
        assert all(e["totalTasks"] > 0 for e in workers.values()), workers
        assert executors["driver"]["totalTasks"] == 0
        state = cluster.spark.master.state()
        assert [w["state"] for w in state["workers"]] == ["ALIVE", "ALIVE"]
        (app,) = state["activeapps"]
        assert app["name"] == "dbspark Spark Connect server" and app["cores"] == 2
        logs = cluster.spark.executor_logs()
        assert {p.parents[2] for p in logs} == {w.work_dir for w in cluster.spark.workers}, (
            logs
        )  # each worker ran an executor and kept its log

        # The tasks were Spark Connect clients on the Celery workers, no Spark of their own.
        opened = list(airflow.logs.glob("dag_id=*/run_id=*/task_id=open_epoch/attempt=*.log"))
        assert len(opened) == EPOCHS * len(EXAMPLES)
        for path in opened:
            assert f"Spark Connect at sc://127.0.0.1:{cluster.connect.port}" in path.read_text()
        received = [
            airflow.process_log(f"celery-worker-{n}").read_text().count(" received") for n in (1, 2)
        ]
        assert sum(received) > 0, received
        # ... which handed every unit to the unit worker beside them (its Spark: the
        # same Connect server), as the compose file's airflow-worker does.
        task_logs = "\n".join(
            p.read_text(errors="replace") for p in airflow.logs.glob("dag_id=*/**/*.log")
        )
        for kind in ("ingest", "stage", "publish", "close"):
            assert f"the {kind} unit ran in the dbspark worker" in task_logs, kind
        assert "in this task instead" not in task_logs
        assert cluster.unit_worker.running
        print(
            f"\ntasks received per Celery worker: {received}; executors: "
            f"{ {i: e['totalTasks'] for i, e in executors.items()} }"
        )
    finally:
        cluster.stop()

    # --- 4. nothing left running, no port still served
    assert cluster.leftovers() == []
    for port in ports:
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0, port


def test_the_broker_refuses_clients_without_its_password(tmp_path):
    """The local Redis requires a password, as the compose file's does (issue 18,
    finding 10): made afresh per server, carried in its URL, never on a command line."""
    require_redis()
    redis = LocalRedis(tmp_path / "redis").start()
    try:
        assert redis.refuses_without_password()
        assert urlsplit(redis.url()).password == redis.password
        assert redis._answers()  # with AUTH first, as Celery does from the URL
        config = tmp_path / "redis" / "redis.conf"
        assert stat.S_IMODE(config.stat().st_mode) == 0o600
        shown = subprocess.run(
            ["ps", "-o", "args=", "-p", str(redis.pid)], capture_output=True, text=True
        ).stdout
        assert shown and redis.password not in shown
    finally:
        redis.stop()
    assert LocalRedis(tmp_path / "other").password != redis.password
