"""A Spark standalone cluster (master and workers) as child processes.

The multi-machine deployment runs Spark as a standalone cluster: one master, any number
of workers, and a Spark Connect server as the cluster's driver (``spark_connect.py``),
which every Airflow task talks to. This module starts the master and the workers from
the Spark distribution in the ``pyspark`` wheel (``bin/spark-class`` with Spark's own
``Master`` and ``Worker`` classes), the same way on a laptop's loopback, in CI, and in
each container of ``docker-compose.yml``:

    with LocalSparkCluster(workers=2, root=tmp) as cluster:
        with LocalConnectServer(master=cluster.master_url) as server:
            ...  # tasks are clients of server.url(); executors run on the workers

The master's web UI serves the cluster's state as JSON (``/json/``: workers, their
cores and memory in use, the applications), which :meth:`LocalSparkMaster.state`
returns; readiness means the master says ``ALIVE`` and each worker is registered with
it. Each worker keeps its executors' logs under its work directory
(``<work>/<app id>/<executor id>/stderr``).

From a shell (one daemon each, in the foreground; ``docker-compose.yml`` uses these):

    python -m dbspark.devtools.spark_standalone master --host H --port 7077 --webui-port 8080
    python -m dbspark.devtools.spark_standalone worker --master spark://H:7077 --cores 2 \\
        --memory 2g --webui-port 8081

With ``auth_secret`` (from a shell: ``DBSPARK_SPARK_AUTH_SECRET``, required unless
``--no-auth``) the daemons run with ``spark.authenticate``: a worker, executor or
driver without the secret cannot register or connect. Whatever the secret, the master's
REST submission server stays off (it would take a job from anyone who reaches it) and
the web UIs have no kill links.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from dbspark.devtools.processes import LOOPBACK, free_port
from dbspark.devtools.spark_daemons import (
    DEFAULT_JAVA_OPTIONS,
    DEFAULT_STARTUP_TIMEOUT,
    SPARK_AUTH_SECRET_VARIABLE,
    SparkProcess,
    SparkProcessError,
    auth_secret_from_environment,
    run_in_foreground,
    spark_home,
)

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
#: Master and worker JVMs only keep books; the executors do the work.
DAEMON_MEMORY = "512m"
#: Settings of every daemon: no job submission over unauthenticated REST, no kill links.
DAEMON_SETTINGS = ("-Dspark.master.rest.enabled=false", "-Dspark.ui.killEnabled=false")


def fetch_json(url: str, timeout: float = 5.0) -> Any:
    """GET ``url`` and parse its JSON body (Spark's web UIs and REST API)."""
    response = httpx.get(url, timeout=timeout)
    response.raise_for_status()
    return response.json()


def _reachable(host: str) -> str:
    return LOOPBACK if host in ("0.0.0.0", "") else host


class _Daemon(SparkProcess):
    """A standalone daemon: ``spark-class <class> <args>`` with a web UI port."""

    main_class = ""

    def __init__(
        self,
        *,
        port: int | None = None,
        host: str | None = LOOPBACK,
        webui_port: int | None = None,
        java_options: Sequence[str] = DEFAULT_JAVA_OPTIONS,
        log_path: Path | str | None = None,
        startup_timeout: float = DEFAULT_STARTUP_TIMEOUT,
        die_with_parent: bool = True,
        env: Mapping[str, str] | None = None,
        auth_secret: str | None = None,
    ) -> None:
        # host None: let Spark pick the machine's address to advertise (a container's).
        self.advertised_host = host
        options = [*java_options, *DAEMON_SETTINGS]
        secret_env = {}
        if auth_secret:
            options.append("-Dspark.authenticate=true")
            secret_env[SPARK_AUTH_SECRET_VARIABLE] = auth_secret
        super().__init__(
            port=port,
            host=host or "0.0.0.0",
            log_path=log_path,
            startup_timeout=startup_timeout,
            die_with_parent=die_with_parent,
            env={
                "SPARK_DAEMON_MEMORY": DAEMON_MEMORY,
                "SPARK_DAEMON_JAVA_OPTS": " ".join(options),
                **(env or {}),
                **secret_env,
            },
            auth_secret=auth_secret,
        )
        self.requested_webui_port = webui_port
        self.webui_port: int | None = None

    def choose_ports(self, *, keep_main: bool = False) -> None:
        super().choose_ports(keep_main=keep_main)
        self.webui_port = self.requested_webui_port or free_port(_reachable(self.host))

    @property
    def webui_url(self) -> str:
        if self.webui_port is None:
            raise self.error(f"the {self.kind} has not been started")
        return f"http://{_reachable(self.host)}:{self.webui_port}"

    def arguments(self) -> list[str]:
        raise NotImplementedError

    def command(self, home: Path | None = None) -> list[str]:
        home = home or spark_home()
        args = [str(home / "bin" / "spark-class"), self.main_class]
        if self.advertised_host:
            args += ["--host", self.advertised_host]
        ports = ["--port", str(self.port), "--webui-port", str(self.webui_port)]
        return [*args, *ports, *self.arguments()]


class LocalSparkMaster(_Daemon):
    """A standalone master. :attr:`master_url` is what workers and drivers connect to."""

    kind = "Spark master"
    default_log_name = "master.log"
    main_class = MASTER_CLASS

    def arguments(self) -> list[str]:
        return []

    @property
    def master_url(self) -> str:
        if self.port is None:
            raise self.error("the Spark master has not been started")
        return f"spark://{self.advertised_host or _reachable(self.host)}:{self.port}"

    def state(self) -> dict[str, Any]:
        """The master's view of the cluster (its web UI's ``/json/``): ``status``,
        ``workers`` (``host``, ``port``, ``state``, ``cores``, ``coresused``, ...),
        ``activeapps`` and ``completedapps``."""
        return dict(fetch_json(f"{self.webui_url}/json/"))

    def ready(self) -> bool:
        try:
            return self.state().get("status") == "ALIVE"
        except (OSError, ValueError, httpx.HTTPError):
            return False


class LocalSparkWorker(_Daemon):
    """A standalone worker of ``master_url`` with ``cores`` and ``memory`` to offer;
    its executors' logs go under ``work_dir``. Given the ``master`` object, readiness
    waits until the master lists this worker as ALIVE."""

    kind = "Spark worker"
    default_log_name = "worker.log"
    main_class = WORKER_CLASS

    def __init__(
        self,
        master_url: str,
        *,
        cores: int = 1,
        memory: str = "1g",
        work_dir: Path | str | None = None,
        master: LocalSparkMaster | None = None,
        **options: Any,
    ) -> None:
        super().__init__(**options)
        self.master_url = master_url
        self.cores = cores
        self.memory = memory
        self.work_dir = Path(work_dir) if work_dir is not None else None
        self.master = master

    def arguments(self) -> list[str]:
        args = ["--cores", str(self.cores), "--memory", self.memory]
        if self.work_dir is not None:
            self.work_dir.mkdir(parents=True, exist_ok=True)
            args += ["--work-dir", str(self.work_dir)]
        return [*args, self.master_url]

    def state(self) -> dict[str, Any]:
        """The worker's own view (its web UI's ``/json/``): ``id``, ``cores``,
        ``coresused``, ``executors`` (running) and ``finishedexecutors``."""
        return dict(fetch_json(f"{self.webui_url}/json/"))

    def ready(self) -> bool:
        try:
            own_id = self.state().get("id")
            if self.master is None:
                return bool(own_id)
            workers = self.master.state().get("workers", [])
        except (OSError, ValueError, httpx.HTTPError):
            return False
        return any(w.get("id") == own_id and w.get("state") == "ALIVE" for w in workers)


class LocalSparkCluster:
    """A master and ``workers`` workers on loopback, each worker with ``cores`` cores and
    ``memory`` memory; logs and work directories under ``root``; ``auth_secret`` turns
    ``spark.authenticate`` on for all of them (a driver then needs the same secret)."""

    def __init__(
        self,
        root: Path | str,
        *,
        workers: int = 2,
        cores: int = 1,
        memory: str = "1g",
        host: str = LOOPBACK,
        env: Mapping[str, str] | None = None,
        auth_secret: str | None = None,
    ) -> None:
        self.root = Path(root)
        self.auth_secret = auth_secret
        self.master = LocalSparkMaster(
            host=host, log_path=self.root / "master.log", env=env, auth_secret=auth_secret
        )
        self.workers = [
            LocalSparkWorker(
                "",  # set once the master has its port
                cores=cores,
                memory=memory,
                work_dir=self.root / f"worker-{n}" / "work",
                master=self.master,
                host=host,
                log_path=self.root / f"worker-{n}" / "worker.log",
                env=env,
                auth_secret=auth_secret,
            )
            for n in range(1, workers + 1)
        ]

    @property
    def master_url(self) -> str:
        return self.master.master_url

    def start(self) -> LocalSparkCluster:
        try:
            self.master.start()
            # The workers' JVMs start side by side; then each must register.
            for worker in self.workers:
                worker.master_url = self.master.master_url
                worker.start(wait=False)
            for worker in self.workers:
                worker.wait_until_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop()
        self.master.stop()

    @property
    def running(self) -> bool:
        return self.master.running and all(w.running for w in self.workers)

    def executor_logs(self) -> list[Path]:
        """Every executor's stderr on every worker: ``<work>/<app>/<executor>/stderr``."""
        return sorted(
            path
            for worker in self.workers
            if worker.work_dir is not None
            for path in worker.work_dir.glob("*/*/stderr")
        )

    def __enter__(self) -> LocalSparkCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: Sequence[str] | None = None) -> int:
    """Run a master or a worker in the foreground until Ctrl-C/SIGTERM."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m dbspark.devtools.spark_standalone",
        description="Run a Spark standalone master or worker from the pyspark wheel.",
    )
    roles = parser.add_subparsers(dest="role", required=True)
    for role in ("master", "worker"):
        sub = roles.add_parser(role)
        sub.add_argument(
            "--host",
            help="address to bind and advertise (default: the machine's own address)",
        )
        sub.add_argument("--port", type=int, help="RPC port (master default 7077)")
        sub.add_argument("--webui-port", type=int, help="web UI port")
        sub.add_argument("--log", help="log file ('-' or none: this process's output)")
        sub.add_argument("--startup-timeout", type=float, default=DEFAULT_STARTUP_TIMEOUT)
        sub.add_argument(
            "--no-auth",
            action="store_true",
            help="run without spark.authenticate (default: on, with DBSPARK_SPARK_AUTH_SECRET)",
        )
        if role == "worker":
            sub.add_argument("--master", required=True, help="spark://host:port")
            sub.add_argument("--cores", type=int, default=1)
            sub.add_argument("--memory", default="1g")
            sub.add_argument("--work-dir", help="where executors run and keep their logs")
    args = parser.parse_args(argv)
    try:
        secret = auth_secret_from_environment(required=not args.no_auth, what=f"Spark {args.role}")
    except SparkProcessError as err:
        parser.error(str(err))
    common: dict[str, Any] = {
        "auth_secret": None if args.no_auth else secret,
        "host": args.host,
        "webui_port": args.webui_port,
        "log_path": args.log or "-",
        "startup_timeout": args.startup_timeout,
    }
    daemon: _Daemon
    if args.role == "master":
        daemon = LocalSparkMaster(port=args.port or 7077, **common)
        return run_in_foreground(daemon, lambda: f"Spark master {daemon.master_url}")
    daemon = LocalSparkWorker(
        args.master,
        port=args.port,
        cores=args.cores,
        memory=args.memory,
        work_dir=args.work_dir,
        **common,
    )
    return run_in_foreground(daemon, lambda: f"Spark worker of {args.master}")


__all__ = [
    "LocalSparkCluster",
    "LocalSparkMaster",
    "LocalSparkWorker",
    "SparkProcessError",
    "fetch_json",
]

if __name__ == "__main__":
    sys.exit(main())
