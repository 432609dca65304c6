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

The server runs in its own process group, writes stdout and stderr to one log file
(``log_path``), and by default receives SIGTERM when the thread that started it exits
(Linux), so a killed test run does not leave a JVM behind. :meth:`stop` terminates the
whole group (the ``spark-submit`` launcher, the JVM, any Python workers), escalating to
SIGKILL after a grace period.

From a shell, ``python -m dbspark.engine.spark.connect_server [--port N] [--master M]``
runs one in the foreground, prints its address, and stops it on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
LOOPBACK = "127.0.0.1"
DEFAULT_MASTER = "local[2]"
#: The JVM's optimizing compiler (C2) costs more start-up CPU than short runs win back.
DEFAULT_JAVA_OPTIONS: tuple[str, ...] = ("-XX:TieredStopAtLevel=1",)
DEFAULT_STARTUP_TIMEOUT = 120.0
#: How many lines of the server's log an error message quotes.
LOG_TAIL_LINES = 40
_BIND_FAILURES = ("Address already in use", "BindException", "Failed to bind")


class ConnectServerError(RuntimeError):
    """The Spark Connect server could not be started (the message quotes its log)."""


def spark_home() -> Path:
    """The Spark distribution inside the installed ``pyspark`` package.

    ``SPARK_HOME`` is not used on purpose: the server must match the client's version,
    and the wheel always carries a matching one.
    """
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        raise ConnectServerError("pyspark is not installed")
    home = Path(next(iter(spec.submodule_search_locations)))
    if not (home / "bin" / "spark-submit").exists():
        raise ConnectServerError(f"pyspark at {home} ships no bin/spark-submit")
    if not list((home / "jars").glob("spark-connect_*.jar")):
        raise ConnectServerError(
            f"pyspark at {home} ships no Spark Connect server jar (jars/spark-connect_*.jar)"
        )
    return home


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port that was free on ``host`` a moment ago (the server may still lose a
    race for it; :meth:`LocalConnectServer.start` then retries with another port)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def _parent_death_signal() -> None:
    """In the child, before exec: SIGTERM when the starting thread dies (Linux only)."""
    import ctypes

    pr_set_pdeathsig = 1
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


class LocalConnectServer:
    """One Spark Connect server process (see the module docstring).

    ``port`` None picks a free one. ``master`` is the server's Spark master (``local[N]``
    or a cluster URL). ``java_options`` go to the server JVM. ``conf`` adds or overrides
    Spark settings of the server. ``log_path`` receives the server's stdout and stderr
    (default: a fresh temporary directory, kept after :meth:`stop` so a failure can be
    read). ``startup_timeout`` bounds the wait for the port to accept connections.
    ``die_with_parent`` (Linux) sends the server SIGTERM when the thread that started it
    exits; turn it off when a short-lived thread starts a server that must outlive it.
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        host: str = LOOPBACK,
        master: str = DEFAULT_MASTER,
        java_options: Sequence[str] = DEFAULT_JAVA_OPTIONS,
        conf: Mapping[str, Any] | None = None,
        log_path: Path | str | None = None,
        startup_timeout: float = DEFAULT_STARTUP_TIMEOUT,
        die_with_parent: bool = True,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.host = host
        self.requested_port = port
        self.port: int | None = None
        self.master = master
        self.java_options = tuple(java_options)
        self.conf = {k: _conf_value(v) for k, v in (conf or {}).items()}
        self.log_path = Path(log_path) if log_path is not None else None
        self.startup_timeout = startup_timeout
        self.die_with_parent = die_with_parent
        self.env = dict(env or {})
        self._proc: subprocess.Popen[bytes] | None = None

    # --- lifecycle ---------------------------------------------------------------------
    def start(self) -> LocalConnectServer:
        """Start the server and wait until its gRPC port accepts connections.

        Raises ``ConnectServerError`` with the tail of the server's log when the
        process exits early or the port does not open within ``startup_timeout``.
        A port lost to another process between choosing and binding it is retried
        with a new port (only when the port was not given).
        """
        if self._proc is not None:
            raise ConnectServerError(f"the server is already started ({self.url()})")
        home = spark_home()
        if self.log_path is None:
            self.log_path = Path(tempfile.mkdtemp(prefix="dbspark-connect-")) / "server.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        attempts = 1 if self.requested_port is not None else 3
        for attempt in range(1, attempts + 1):
            self.port = self.requested_port or free_port(self.host)
            try:
                self._launch(home)
                self._wait_until_ready()
                return self
            except ConnectServerError:
                log_text = self.log_tail()
                self.stop()
                if attempt == attempts or not any(m in log_text for m in _BIND_FAILURES):
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the server's whole process group: SIGTERM, then SIGKILL after ``timeout``.

        Safe to call more than once and on a server that never started.
        """
        proc, self._proc = self._proc, None
        if proc is None:
            return
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            try:
                proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        # The JVM may be gone while others in its group linger (e.g. Python workers):
        # kill them and wait (briefly) until the group is empty.
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                return
            time.sleep(0.1)
        log.warning("processes of the Spark Connect server's group %s did not go away", proc.pid)

    def url(self) -> str:
        """The Spark Connect address, ``sc://host:port``, for ``spark_session(remote=...)``."""
        if self.port is None:
            raise ConnectServerError("the server has not been started")
        return f"sc://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        """The server's process id (also its process group id), while it runs."""
        return self._proc.pid if self._proc is not None else None

    def wait(self, timeout: float | None = None) -> int | None:
        """Wait for the server process to exit; its status, or None on timeout."""
        if self._proc is None:
            raise ConnectServerError("the server has not been started")
        try:
            return self._proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last ``lines`` lines of the server's log ('' when there is none)."""
        if self.log_path is None:
            return ""
        try:
            with open(self.log_path, "rb") as handle:
                handle.seek(0, os.SEEK_END)
                handle.seek(max(0, handle.tell() - 64 * 1024))
                text = handle.read().decode("utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def __enter__(self) -> LocalConnectServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- internals ---------------------------------------------------------------------
    def command(self, home: Path | None = None) -> list[str]:
        """The ``spark-submit`` command line that starts the server."""
        home = home or spark_home()
        settings = {
            "spark.connect.grpc.binding.address": self.host,
            "spark.connect.grpc.binding.port": str(self.port),
            # Fail instead of silently moving to another port the client does not know.
            "spark.connect.grpc.port.maxRetries": "0",
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.sql.session.timeZone": "UTC",
        }
        if _is_local(self.master) and _is_loopback(self.host):
            settings["spark.driver.host"] = self.host
            settings["spark.driver.bindAddress"] = self.host
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
        if self.java_options:
            cmd += ["--driver-java-options", " ".join(shlex.quote(o) for o in self.java_options)]
        for key, value in settings.items():
            cmd += ["--conf", f"{key}={value}"]
        return cmd

    def _launch(self, home: Path) -> None:
        env = dict(os.environ)
        env["SPARK_HOME"] = str(home)
        # Python UDFs run in workers the server starts: use this interpreter (it has pyspark).
        env.setdefault("PYSPARK_PYTHON", sys.executable)
        if _is_loopback(self.host):
            env["SPARK_LOCAL_IP"] = self.host
        # The client's Connect settings must not leak into the server's own session.
        for name in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "SPARK_LOCAL_REMOTE"):
            env.pop(name, None)
        env.update(self.env)
        assert self.log_path is not None
        with open(self.log_path, "ab") as log_file:
            log_file.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} starting: ".encode())
            log_file.write(shlex.join(self.command(home)).encode() + b"\n")
            log_file.flush()
            self._proc = subprocess.Popen(
                self.command(home),
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.log_path.parent,
                start_new_session=True,  # its own process group, for stop()
                preexec_fn=_parent_death_signal
                if self.die_with_parent and sys.platform.startswith("linux")
                else None,
            )

    def _wait_until_ready(self) -> None:
        assert self._proc is not None and self.port is not None
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            code = self._proc.poll()
            if code is not None:
                raise ConnectServerError(
                    f"the Spark Connect server exited with status {code} before listening "
                    f"on {self.host}:{self.port}; log {self.log_path}:\n{self.log_tail()}"
                )
            if _port_open(self.host, self.port):
                return
            time.sleep(0.25)
        raise ConnectServerError(
            f"the Spark Connect server did not listen on {self.host}:{self.port} within "
            f"{self.startup_timeout:g}s; log {self.log_path}:\n{self.log_tail()}"
        )


def _is_local(master: str) -> bool:
    return master == "local" or master.startswith("local[")


def _is_loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")


def _conf_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def main(argv: Sequence[str] | None = None) -> int:
    """Run a server in the foreground until Ctrl-C/SIGTERM (or until it dies)."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m dbspark.engine.spark.connect_server",
        description="Run a Spark Connect server from the pyspark wheel until interrupted.",
    )
    parser.add_argument("--port", type=int, help="gRPC port (default: a free one)")
    parser.add_argument("--host", default=LOOPBACK, help=f"address to bind (default {LOOPBACK})")
    parser.add_argument("--master", default=DEFAULT_MASTER, help="default: %(default)s")
    parser.add_argument("--log", type=Path, help="server log file (default: a temporary one)")
    parser.add_argument("--startup-timeout", type=float, default=DEFAULT_STARTUP_TIMEOUT)
    args = parser.parse_args(argv)
    server = LocalConnectServer(
        port=args.port,
        host=args.host,
        master=args.master,
        log_path=args.log,
        startup_timeout=args.startup_timeout,
    )
    # SIGTERM takes the same way out as Ctrl-C, so the server is stopped either way.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        server.start()
        print(f"{server.url()}  (log: {server.log_path})", flush=True)
        code = server.wait()
        print(f"the server exited with status {code}; log {server.log_path}", file=sys.stderr)
        return 1
    except ConnectServerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
