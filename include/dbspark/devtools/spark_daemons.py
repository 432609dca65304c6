"""Spark's JVM daemons as child processes: the common life cycle.

A Spark Connect server (``spark_connect.py``) and a standalone master and worker
(``spark_standalone.py``) are each one long-lived JVM started from the Spark distribution
inside the ``pyspark`` wheel. They share everything but their command line and what
"ready" means, and that shared part lives here:

- the process runs in a session and process group of its own, with stdout and stderr in
  one log file, so :meth:`SparkProcess.stop` can end the whole group (launcher, JVM,
  Python workers, executors a worker started) and a failure can be read afterwards;
- by default it receives SIGTERM when the thread that started it exits (Linux), so a
  killed test run does not leave JVMs behind;
- :meth:`SparkProcess.start` waits until the daemon's port accepts connections (and
  until the subclass's own readiness check passes), and otherwise raises with the tail
  of the log.

``SPARK_HOME`` from the environment is not used on purpose: a daemon must match the
client's version, and the wheel always carries a matching distribution.

**Authentication** (``auth_secret``): Spark's RPC between the master, the workers, the
executors and the driver is unauthenticated unless ``spark.authenticate`` is on, and
then every party must hold one shared secret. The secret never appears on a command
line (``ps`` shows those to every user): a master or worker reads it from the
``_SPARK_AUTH_SECRET`` environment variable (Spark's own, which a worker also hands to
the executors it starts), and a driver, which Spark requires to have it as the
``spark.authenticate.secret`` setting, from a properties file of mode 0600 in a private
directory that :meth:`SparkProcess.stop` removes. The command-line tools take it from
``DBSPARK_SPARK_AUTH_SECRET`` (:func:`auth_secret_from_environment`).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from dbspark.devtools.processes import (
    LOG_TAIL_LINES,
    LOOPBACK,
    empty_group,
    free_port,
    launch,
    port_open,
    stop_group,
    tail,
    wait_until,
)
from dbspark.engine.spark import class_archive

log = logging.getLogger(__name__)

#: The JVM's optimizing compiler (C2) costs more start-up CPU than short runs win back.
#: Stopping at C1 also shrinks the default code cache to 48 MB, which Spark's generated
#: code fills in a long session (the JVM then evicts and recompiles, or stops compiling),
#: so it is set back to the tiered default's size. The class-data archive built at set-up
#: (``dbspark.engine.spark.class_archive``) saves a third of a JVM's start, when it exists.
DEFAULT_JAVA_OPTIONS: tuple[str, ...] = (
    "-XX:TieredStopAtLevel=1",
    "-XX:ReservedCodeCacheSize=240m",
    *class_archive.java_options(),
)
DEFAULT_STARTUP_TIMEOUT = 120.0
BIND_FAILURES = ("Address already in use", "BindException", "Failed to bind")
#: Launches of one start when ports are lost to other processes.
BIND_ATTEMPTS = 3
#: A failure message quotes up to this many error lines from above the log's tail.
ERROR_LINES = 5
ERROR_WORDS = ("Exception", " ERROR ", "Error:")
MAX_LAUNCH_LOG_BYTES = 4 * 1024 * 1024
#: Where the command-line tools (and so docker-compose.yml) take the cluster's secret from.
AUTH_SECRET_VARIABLE = "DBSPARK_SPARK_AUTH_SECRET"
#: Spark's own variable for a daemon's (and an executor's) authentication secret.
SPARK_AUTH_SECRET_VARIABLE = "_SPARK_AUTH_SECRET"


class SparkProcessError(RuntimeError):
    """A Spark daemon could not be started (the message quotes its log)."""


def spark_home() -> Path:
    """The Spark distribution inside the installed ``pyspark`` package."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        raise SparkProcessError("pyspark is not installed")
    home = Path(next(iter(spec.submodule_search_locations)))
    for tool in ("spark-submit", "spark-class"):
        if not (home / "bin" / tool).exists():
            raise SparkProcessError(f"pyspark at {home} ships no bin/{tool}")
    return home


def is_local_master(master: str) -> bool:
    return master == "local" or master.startswith("local[")


def is_loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")


def conf_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def parse_conf(pairs: list[str] | None) -> dict[str, str]:
    """``["k=v", ...]`` from a command line as a dict; a pair without ``=`` is an error."""
    settings: dict[str, str] = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--conf {pair!r}: expected key=value")
        settings[key.strip()] = value
    return settings


def auth_secret_from_environment(*, required: bool, what: str) -> str | None:
    """The secret in ``DBSPARK_SPARK_AUTH_SECRET``; when ``required`` and it is unset, a
    :class:`SparkProcessError` saying how to set it (``what`` names the daemon)."""
    secret = os.environ.get(AUTH_SECRET_VARIABLE, "").strip()
    if not secret and required:
        raise SparkProcessError(
            f"{AUTH_SECRET_VARIABLE} is not set: the {what} runs with spark.authenticate, "
            "and every Spark daemon and driver of the cluster needs the same secret "
            "(bin/make-env writes one into .env); --no-auth runs it without, for a cluster "
            "nobody else can reach"
        )
    return secret or None


def write_private_properties(settings: Mapping[str, str]) -> Path:
    """``settings`` in a Java properties file of mode 0600 inside a fresh directory of
    mode 0700 (the caller removes the directory)."""
    folder = Path(tempfile.mkdtemp(prefix="dbspark-spark-conf-"))  # mode 0700
    path = folder / "spark.properties"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        for key, value in settings.items():
            # Properties files treat backslashes as escapes; a secret of hex or
            # URL-safe characters needs none.
            handle.write(f"{key}={value}\n")
    return path


class SparkProcess:
    """One Spark daemon process. Subclasses give :meth:`command` and may refine
    :meth:`ready`; ``port`` is the port that must accept connections when it is up.

    ``port`` None picks a free one (and a bind failure is retried with another).
    ``log_path`` receives stdout and stderr (default: a fresh temporary directory, kept
    after :meth:`stop` so a failure can be read; ``"-"``: this process's own stdout and
    stderr, as a container wants). ``env`` adds variables for the process.
    ``auth_secret`` turns ``spark.authenticate`` on with that shared secret (see the
    module docstring); None leaves Spark's RPC unauthenticated.
    """

    #: A short name for messages ("Spark Connect server", "Spark master", ...).
    kind = "Spark process"
    #: The log file's name when no ``log_path`` is given.
    default_log_name = "spark.log"
    #: What a failure raises (subclasses name their own).
    error: type[SparkProcessError] = SparkProcessError

    def __init__(
        self,
        *,
        port: int | None = None,
        host: str = LOOPBACK,
        log_path: Path | str | None = None,
        startup_timeout: float = DEFAULT_STARTUP_TIMEOUT,
        die_with_parent: bool = True,
        env: Mapping[str, str] | None = None,
        auth_secret: str | None = None,
    ) -> None:
        self.host = host
        self.auth_secret = auth_secret or None
        #: Files only this process may read (a driver's secret), removed by stop().
        self._private_dirs: list[Path] = []
        self.requested_port = port
        self.port: int | None = None
        self.inherit_output = str(log_path) == "-"
        self.log_path = Path(log_path) if log_path is not None and not self.inherit_output else None
        self.startup_timeout = startup_timeout
        self.die_with_parent = die_with_parent
        self.env = dict(env or {})
        self._proc: subprocess.Popen[bytes] | None = None
        self._home: Path | None = None
        self._launches = 0
        self._launch_offset = 0

    # --- what subclasses say -----------------------------------------------------------
    def command(self, home: Path | None = None) -> list[str]:
        raise NotImplementedError

    def ready(self) -> bool:
        """Whether the daemon serves (called once its port accepts connections)."""
        return True

    def choose_ports(self, *, keep_main: bool = False) -> None:
        """Pick this launch's ports (more than one for daemons with a web UI);
        ``keep_main`` keeps :attr:`port` and picks only the others again."""
        if not (keep_main and self.port is not None):
            self.port = self.requested_port or free_port(self.host)

    # --- lifecycle ---------------------------------------------------------------------
    def start(self, *, wait: bool = True) -> SparkProcess:
        """Start the daemon and wait until it serves.

        ``wait=False`` only launches it: start several side by side, then call
        :meth:`wait_until_ready` on each.

        Raises ``SparkProcessError`` quoting the log when the process exits early or does
        not serve within ``startup_timeout``. A port lost to another process between
        choosing and binding it is retried with new ports, for ports not given.
        """
        if self._proc is not None:
            raise self.error(f"the {self.kind} is already started (port {self.port})")
        home = spark_home()
        if self.inherit_output:
            pass
        elif self.log_path is None:
            self.log_path = Path(tempfile.mkdtemp(prefix="dbspark-spark-")) / self.default_log_name
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._home = home
        self._launches = 0
        self.choose_ports()
        self._launch(home)
        if wait:
            # Nobody has seen the main port yet: a retry may choose it again too.
            self._serve_or_raise(keep_main=False)
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the daemon's whole process group: SIGTERM, then SIGKILL after
        ``timeout``. Safe to call more than once and on a daemon that never started."""
        proc, self._proc = self._proc, None
        for folder in self._private_dirs:
            shutil.rmtree(folder, ignore_errors=True)
        self._private_dirs.clear()
        if proc is None:
            return
        stop_group(proc, timeout)
        if not empty_group(proc.pid):
            log.warning("processes of the %s's group %s did not go away", self.kind, proc.pid)

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        """The daemon's process id (also its process group id), while it runs."""
        return self._proc.pid if self._proc is not None else None

    def wait(self, timeout: float | None = None) -> int | None:
        """Wait for the process to exit; its status, or None on timeout."""
        if self._proc is None:
            raise self.error(f"the {self.kind} has not been started")
        try:
            return self._proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last ``lines`` lines of the log ('' when there is none)."""
        return tail(self.log_path, lines)

    def __enter__(self) -> SparkProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- internals ---------------------------------------------------------------------
    def private_properties(self, settings: Mapping[str, str]) -> Path:
        """A properties file only this user can read, removed when the daemon stops."""
        path = write_private_properties(settings)
        self._private_dirs.append(path.parent)
        return path

    def _environment(self, home: Path) -> dict[str, str]:
        env = dict(os.environ)
        # A secret is handed on only where asked for, never inherited by accident.
        env.pop(SPARK_AUTH_SECRET_VARIABLE, None)
        env.pop(AUTH_SECRET_VARIABLE, None)
        env["SPARK_HOME"] = str(home)
        # Python UDFs run in workers the JVM starts: this interpreter has pyspark.
        env.setdefault("PYSPARK_PYTHON", sys.executable)
        if is_loopback(self.host):
            env["SPARK_LOCAL_IP"] = self.host
        # A Spark Connect client mode of the caller must not leak into a JVM's session.
        for name in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "SPARK_LOCAL_REMOTE"):
            env.pop(name, None)
        env.update(self.env)
        return env

    def _launch(self, home: Path) -> None:
        self._launches += 1
        if self.log_path is not None:
            self._launch_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        self._proc = launch(
            self.command(home),
            log_path=self.log_path,
            env=self._environment(home),
            cwd=self.log_path.parent if self.log_path is not None else None,
            parent_death_signal=signal.SIGTERM if self.die_with_parent else None,
        )

    def wait_until_ready(self) -> None:
        """Wait until the launched daemon serves; raise (quoting its log) otherwise, after
        stopping it.

        A bind failure ("Address already in use") on a port this object chose is retried
        with fresh ports, up to ``BIND_ATTEMPTS`` launches. After ``start(wait=False)``
        the main port may already have been handed out (to clients' settings), so only
        the other ports (web UIs) are chosen again then.
        """
        self._serve_or_raise(keep_main=True)

    def _serve_or_raise(self, *, keep_main: bool) -> None:
        while True:
            try:
                self._wait_until_ready()
                return
            except self.error:
                lost_port = self.bind_failed()
                self.stop()
                if not lost_port or self._launches >= BIND_ATTEMPTS or self._home is None:
                    raise
            log.warning("the %s lost a port to another process; starting it again", self.kind)
            self.choose_ports(keep_main=keep_main)
            self._launch(self._home)

    def bind_failed(self) -> bool:
        """Whether the last launch's log says it could not bind a port."""
        return any(marker in self.launch_log() for marker in BIND_FAILURES)

    def launch_log(self) -> str:
        """The log of the last launch only (the file collects every launch)."""
        if self.log_path is None:
            return ""
        try:
            with open(self.log_path, "rb") as handle:
                handle.seek(self._launch_offset)
                text = handle.read(MAX_LAUNCH_LOG_BYTES)
        except OSError:
            return ""
        return text.decode("utf-8", errors="replace")

    def failure_excerpt(self) -> str:
        """The log's tail, preceded by the launch's first error lines when a long stack
        trace pushed them out of the tail (they name the cause)."""
        tail = self.log_tail()
        causes = [
            line
            for line in self.launch_log().splitlines()
            if any(word in line for word in ERROR_WORDS)
        ][:ERROR_LINES]
        missing = [line for line in causes if line not in tail]
        if not missing:
            return tail
        return "\n".join([*missing, "...", tail])

    def _wait_until_ready(self) -> None:
        proc = self._proc
        assert proc is not None and self.port is not None

        def serving() -> bool:
            code = proc.poll()
            if code is not None:
                raise self.error(
                    f"the {self.kind} exited with status {code} before serving on "
                    f"{self.host}:{self.port}; log {self.log_path}:\n{self.failure_excerpt()}"
                )
            return port_open(self.host, self.port) and self.ready()

        if not wait_until(serving, self.startup_timeout):
            raise self.error(
                f"the {self.kind} did not serve on {self.host}:{self.port} within "
                f"{self.startup_timeout:g}s; log {self.log_path}:\n{self.failure_excerpt()}"
            )


def run_in_foreground(process: SparkProcess, describe: Callable[[], str]) -> int:
    """Run ``process`` until Ctrl-C/SIGTERM (or until it dies), for the modules' CLIs."""
    # SIGTERM takes the same way out as Ctrl-C, so the daemon is stopped either way.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        process.start()
        where = f"  (log: {process.log_path})" if process.log_path is not None else ""
        print(f"{describe()}{where}", flush=True)
        code = process.wait()
        print(
            f"the {process.kind} exited with status {code}; log {process.log_path}",
            file=sys.stderr,
        )
        return 1
    except SparkProcessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        process.stop()
