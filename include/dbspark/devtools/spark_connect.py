"""A Spark Connect server as a local child process, for tests and single-machine runs.

dbspark's engine talks to Spark only through the DataFrame API, so it can run against
a Spark Connect server instead of an in-process (classic) session. This module starts
such a server from the Spark distribution bundled in the ``pyspark`` wheel (its
``bin/spark-submit`` and ``jars/spark-connect_*.jar``): a JVM of its own, in local mode
by default, listening on loopback at a free port.

    with LocalConnectServer(master="local[2]") as server:
        spark = spark_session(remote=server.url())

Why a separate process rather than pyspark's ``remote("local")`` (which runs the server
inside this Python process's JVM): the point is to exercise what a real deployment
does, a client that only speaks gRPC to a JVM somewhere else, and to let tests and
tools start, stop and inspect that JVM (its log, its exit status) like any server.

Its life cycle (own process group, one log file, SIGTERM when its starter dies, stop
escalating to SIGKILL) is :class:`~dbspark.devtools.spark_daemons.SparkProcess`'s.
With ``master`` a standalone cluster's URL (``spark://host:7077``, see
``spark_standalone.py``) the server is that cluster's driver, and the executors on its
workers do the work: that is the multi-machine deployment's Spark endpoint.

From a shell, ``python -m dbspark.devtools.spark_connect [--port N] [--master M]
[--ui-port P] [--conf k=v ...]`` runs one in the foreground, prints its address, and
stops it on Ctrl-C or SIGTERM (``docker-compose.yml`` starts it this way).

**Authentication.** As a cluster's driver the server holds the cluster's
``spark.authenticate`` secret (``auth_secret``; from a shell ``DBSPARK_SPARK_AUTH_SECRET``,
required with a ``spark://`` master unless ``--no-auth``), passed in a private
properties file, never on the command line. Its gRPC port has no authentication here:
Spark 4.2's server checks a pre-shared token (``spark.connect.authenticate.token``), but
pyspark's client sends a token only over TLS, or to ``localhost`` over gRPC's local
credentials, and the server speaks no TLS itself. So the port is reachable only where
it must be: loopback by default, the compose network (never a published port) in
``docker-compose.yml``.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dbspark.devtools.processes import LOOPBACK, free_port
from dbspark.devtools.spark_daemons import (
    DEFAULT_JAVA_OPTIONS,
    DEFAULT_STARTUP_TIMEOUT,
    SparkProcess,
    SparkProcessError,
    auth_secret_from_environment,
    conf_value,
    is_local_master,
    is_loopback,
    parse_conf,
    run_in_foreground,
)
from dbspark.devtools.spark_daemons import spark_home as _spark_home

__all__ = ["ConnectServerError", "LocalConnectServer", "spark_home"]

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
DEFAULT_MASTER = "local[2]"


class ConnectServerError(SparkProcessError):
    """The Spark Connect server could not be started (the message quotes its log)."""


def spark_home() -> Path:
    """The Spark distribution inside the installed ``pyspark`` package, checked to carry
    the Spark Connect server jar."""
    try:
        home = _spark_home()
    except SparkProcessError as err:
        raise ConnectServerError(str(err)) from None
    if not list((home / "jars").glob("spark-connect_*.jar")):
        raise ConnectServerError(
            f"pyspark at {home} ships no Spark Connect server jar (jars/spark-connect_*.jar)"
        )
    return home


class LocalConnectServer(SparkProcess):
    """One Spark Connect server process (see the module docstring).

    ``port`` None picks a free one. ``master`` is the server's Spark master (``local[N]``
    or a cluster URL). ``java_options`` go to the server JVM. ``conf`` adds or overrides
    Spark settings of the server. ``ui_port`` turns the driver's web UI (and its REST
    API, ``/api/v1``) on at that port, 0 meaning a free one; None leaves it off.
    ``log_path``, ``startup_timeout``, ``die_with_parent``, ``env`` and ``auth_secret``
    (the cluster's ``spark.authenticate`` secret): see
    :class:`~dbspark.devtools.spark_daemons.SparkProcess`.
    """

    kind = "Spark Connect server"
    default_log_name = "server.log"
    error = ConnectServerError

    def __init__(
        self,
        *,
        port: int | None = None,
        host: str = LOOPBACK,
        master: str = DEFAULT_MASTER,
        java_options: Sequence[str] = DEFAULT_JAVA_OPTIONS,
        conf: Mapping[str, Any] | None = None,
        ui_port: int | None = None,
        log_path: Path | str | None = None,
        startup_timeout: float = DEFAULT_STARTUP_TIMEOUT,
        die_with_parent: bool = True,
        env: Mapping[str, str] | None = None,
        auth_secret: str | None = None,
    ) -> None:
        super().__init__(
            port=port,
            host=host,
            log_path=log_path,
            startup_timeout=startup_timeout,
            die_with_parent=die_with_parent,
            env=env,
            auth_secret=auth_secret,
        )
        self.master = master
        self.java_options = tuple(java_options)
        self.conf = {k: conf_value(v) for k, v in (conf or {}).items()}
        self.requested_ui_port = ui_port
        self.ui_port: int | None = None

    def choose_ports(self, *, keep_main: bool = False) -> None:
        super().choose_ports(keep_main=keep_main)
        if self.requested_ui_port is not None:
            self.ui_port = self.requested_ui_port or free_port(self.host)

    def start(self, *, wait: bool = True) -> LocalConnectServer:
        super().start(wait=wait)
        return self

    def __enter__(self) -> LocalConnectServer:
        return self.start()

    def url(self) -> str:
        """The Spark Connect address, ``sc://host:port``, for ``spark_session(remote=...)``."""
        if self.port is None:
            raise ConnectServerError("the server has not been started")
        host = LOOPBACK if self.host == "0.0.0.0" else self.host
        return f"sc://{host}:{self.port}"

    def ui_url(self) -> str:
        """The driver's web UI (its REST API is under ``/api/v1``)."""
        if self.ui_port is None:
            raise ConnectServerError("the server's web UI is off (give ui_port)")
        host = LOOPBACK if self.host == "0.0.0.0" else self.host
        return f"http://{host}:{self.ui_port}"

    def command(self, home: Path | None = None) -> list[str]:
        """The ``spark-submit`` command line that starts the server."""
        home = home or spark_home()
        settings = {
            "spark.connect.grpc.binding.address": self.host,
            "spark.connect.grpc.binding.port": str(self.port),
            # Fail instead of silently moving to another port the client does not know.
            "spark.connect.grpc.port.maxRetries": "0",
            "spark.ui.enabled": "false",
            "spark.ui.killEnabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.sql.session.timeZone": "UTC",
        }
        if self.ui_port is not None:
            settings["spark.ui.enabled"] = "true"
            settings["spark.ui.port"] = str(self.ui_port)
            settings["spark.port.maxRetries"] = "0"
        if is_loopback(self.host):
            # Executors (local threads, or a cluster's workers on this machine) reach the
            # driver on loopback.
            settings["spark.driver.host"] = self.host
            settings["spark.driver.bindAddress"] = self.host
        if self.auth_secret:
            settings["spark.authenticate"] = "true"
        settings.update(self.conf)
        cmd = [
            str(home / "bin" / "spark-submit"),
            "--master",
            self.master,
            "--name",
            "dbspark Spark Connect server",
            "--class",
            SERVER_CLASS,
        ]
        if self.auth_secret:
            # Spark wants a driver's secret as a setting; a file keeps it out of `ps`.
            secret = {"spark.authenticate.secret": self.auth_secret}
            cmd += ["--properties-file", str(self.private_properties(secret))]
        if self.java_options:
            cmd += ["--driver-java-options", " ".join(shlex.quote(o) for o in self.java_options)]
        for key, value in settings.items():
            cmd += ["--conf", f"{key}={value}"]
        return cmd


def main(argv: Sequence[str] | None = None) -> int:
    """Run a server in the foreground until Ctrl-C/SIGTERM (or until it dies)."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m dbspark.devtools.spark_connect",
        description="Run a Spark Connect server from the pyspark wheel until interrupted.",
    )
    parser.add_argument("--port", type=int, help="gRPC port (default: a free one)")
    parser.add_argument("--host", default=LOOPBACK, help=f"address to bind (default {LOOPBACK})")
    parser.add_argument("--master", default=DEFAULT_MASTER, help="default: %(default)s")
    parser.add_argument("--ui-port", type=int, help="serve the driver's web UI on this port")
    parser.add_argument(
        "--conf", action="append", metavar="KEY=VALUE", help="a Spark setting (repeatable)"
    )
    parser.add_argument("--log", help="log file ('-' or none: this process's output)")
    parser.add_argument("--startup-timeout", type=float, default=DEFAULT_STARTUP_TIMEOUT)
    parser.add_argument(
        "--no-auth",
        action="store_true",
        help="no spark.authenticate towards a cluster (default: on, DBSPARK_SPARK_AUTH_SECRET)",
    )
    args = parser.parse_args(argv)
    try:
        conf = parse_conf(args.conf)
        # A local master has no cluster to authenticate to: the secret is optional there.
        secret = auth_secret_from_environment(
            required=not (args.no_auth or is_local_master(args.master)),
            what="Spark Connect server (a cluster's driver)",
        )
    except (ValueError, SparkProcessError) as err:
        parser.error(str(err))
    server = LocalConnectServer(
        port=args.port,
        host=args.host,
        master=args.master,
        conf=conf,
        ui_port=args.ui_port,
        log_path=args.log or "-",
        startup_timeout=args.startup_timeout,
        auth_secret=None if args.no_auth else secret,
    )
    return run_in_foreground(server, lambda: f"{server.url()}  (master {server.master})")


if __name__ == "__main__":
    sys.exit(main())
