"""Spark Declarative Pipelines (SDP): the benchmark's views as ``spark-pipelines`` runs.

SDP is the baseline dbspark is measured against: the same views as the circuits of
``benchmarks.circuits`` (``tpch_q3``, ``flights``), written as an SDP project in
``benchmarks/pipelines/<pipeline>/`` and computed by the ``spark-pipelines`` CLI of the
pyspark wheel. Its materialized views are recomputed in full on every run, from every
file landed so far (``<landing>/<source>/epoch=<e>/part-0.parquet``, see
``benchmarks.data``); the transformations find the landing folder in the environment
variable :data:`LANDING_ENV`.

The CLI always talks Spark Connect. A run on its own (``spark-pipelines run``) starts a
server of its own whose in-memory catalog dies with it, so a second run finds the
views' folders but not their tables and fails (LOCATION_ALREADY_EXISTS). An
:class:`SdpPipeline` therefore keeps one Connect server up for all its runs, and each
:meth:`SdpPipeline.run` is one CLI process against it (``--remote``)::

    with SdpPipeline("tpch_q3", landing, work) as sdp:
        done = sdp.run()            # after each landed epoch
        frame = spark.read.parquet(str(sdp.view_path("q3")))

The work folder holds ``project/`` (the spec, with ``storage`` set inside the work
folder, and a copy of the transformations), ``storage/`` (SDP's checkpoints),
``spark-warehouse/`` (the views, as Parquet) and ``logs/`` (the server's and each run's
output). Starting a pipeline clears all four: a new server has an empty catalog.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from benchmarks import queries
from dbspark.devtools.spark_connect import LocalConnectServer, spark_home

#: The views each pipeline publishes (the materialized views the circuits have as views).
PIPELINES: dict[str, tuple[str, ...]] = {
    "tpch_q3": ("q3",),
    "flights": ("per_carrier_month", "routes"),
}
#: Materialized views a project defines in SQL, by pipeline: each is written into the
#: project's copy as ``transformations/<view>.sql`` (one text for every side of W1).
SQL_VIEWS: dict[str, dict[str, str]] = {"tpch_q3": {"q3": queries.Q3_SQL}}
#: The SDP projects (spec and transformations), one folder per pipeline.
PROJECTS = Path(__file__).resolve().parent / "pipelines"
REPO = PROJECTS.parents[1]
SPEC_NAME = "spark-pipeline.yml"
#: The environment variable that tells the transformations where the data lands.
LANDING_ENV = "DBSPARK_BENCH_LANDING"
#: The Connect server's settings (``conf`` of :class:`SdpPipeline` adds to them).
SERVER_CONF: dict[str, Any] = {
    # Exact input bytes: vectored Parquet reads report only footer bytes (as harness.py).
    "spark.hadoop.parquet.hadoop.vectored.io.enabled": "false",
    "spark.sql.shuffle.partitions": 4,
}
#: How long one CLI run may take before it is killed.
RUN_TIMEOUT = 3600.0
#: How many lines of a failed run's output an error quotes.
TAIL_LINES = 40
#: The CLI's log line: "YYYY-MM-DD HH:MM:SS: message".
LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d): (.*)$")
STARTING = "Starting run..."
COMPLETED = "Run is COMPLETED."
FAILED = "Run is FAILED"


class SdpError(RuntimeError):
    """A pipeline run failed (the message quotes the end of the CLI's output)."""


@dataclass
class SdpRun:
    """One pipeline run."""

    #: Wall time of the CLI process: what a user waits for (client start included).
    seconds: float
    #: "Starting run..." to "Run is COMPLETED.": the graph's execution on the server,
    #: timed by when the CLI printed the two lines (its own timestamps have whole seconds).
    graph_seconds: float | None
    #: Bytes the server's executors read over the run (None: its REST API did not answer).
    input_bytes: int | None
    #: Shuffle bytes the server's executors read over the run (as ``harness.Meter``).
    shuffle_bytes: int | None


@dataclass
class _Counters:
    input_bytes: int
    shuffle_bytes: int


class SdpPipeline:
    """One SDP pipeline with its Connect server (see the module docstring).

    ``landing`` is the folder the sources land in (it may fill up between runs);
    ``work`` receives the project copy, checkpoints, views and logs (other things in it
    are left alone). ``master`` and ``conf`` go to the Connect server.
    """

    def __init__(
        self,
        pipeline: str,
        landing: Path,
        work: Path,
        *,
        master: str = "local[2]",
        conf: Mapping[str, Any] | None = None,
        timeout: float = RUN_TIMEOUT,
    ) -> None:
        if pipeline not in PIPELINES:
            raise ValueError(f"unknown pipeline {pipeline!r} (known: {', '.join(PIPELINES)})")
        self.pipeline = pipeline
        self.landing = Path(landing).resolve()
        self.work = Path(work).resolve()
        self.project = self.work / "project"
        self.spec = self.project / SPEC_NAME
        self.storage = self.work / "storage"
        self.warehouse = self.work / "spark-warehouse"
        self.logs = self.work / "logs"
        self.master = master
        self.conf = {**SERVER_CONF, **(conf or {})}
        self.timeout = timeout
        self.runs = 0
        self.server: LocalConnectServer | None = None
        self._app_url: str | None = None

    # --- life cycle --------------------------------------------------------------------
    def __enter__(self) -> SdpPipeline:
        for folder in (self.project, self.storage, self.warehouse, self.logs):
            shutil.rmtree(folder, ignore_errors=True)
        self._write_project()
        self.logs.mkdir(parents=True)
        self.runs = 0
        self.server = LocalConnectServer(
            master=self.master,
            ui_port=0,
            log_path=self.logs / "server.log",
            conf={"spark.sql.warehouse.dir": str(self.warehouse), **self.conf},
        )
        try:
            self.server.start()
        except BaseException:
            self.server = None
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        server, self.server = self.server, None
        self._app_url = None
        if server is not None:
            server.stop()

    def _write_project(self) -> None:
        """The repository's project, with ``storage`` in the work folder and its SQL views."""
        source = PROJECTS / self.pipeline
        shutil.copytree(
            source / "transformations",
            self.project / "transformations",
            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
        )
        for view, query in SQL_VIEWS.get(self.pipeline, {}).items():
            sql = f"CREATE MATERIALIZED VIEW {view} AS\n{query};\n"
            (self.project / "transformations" / f"{view}.sql").write_text(sql)
        spec = yaml.safe_load((source / SPEC_NAME).read_text())
        spec["storage"] = self.storage.as_uri()
        self.spec.write_text(yaml.safe_dump(spec, sort_keys=False))

    # --- runs --------------------------------------------------------------------------
    def run(self) -> SdpRun:
        """Refresh every view over what is landed now (one ``spark-pipelines run``)."""
        if self.server is None:
            raise SdpError("the pipeline is not started (use it as a context manager)")
        self.runs += 1
        log_path = self.logs / f"run-{self.runs:03d}.log"
        command = [
            str(spark_home() / "bin" / "spark-pipelines"),
            "--remote",
            self.server.url(),
            "run",
            "--spec",
            str(self.spec),
        ]
        before = self._counters()
        start = time.perf_counter()
        lines, code, timed_out = self._run_cli(command, log_path)
        seconds = time.perf_counter() - start
        after = self._counters(settle=True)
        texts = [text for _, text in lines]
        messages = [m.group(2) for m in map(LOG_LINE.match, texts) if m]
        failed = any(FAILED in m for m in messages) or COMPLETED not in messages
        if timed_out or code != 0 or failed:
            why = f"timed out after {self.timeout:g}s" if timed_out else f"exit status {code}"
            tail = "\n".join(texts[-TAIL_LINES:])
            raise SdpError(
                f"spark-pipelines run of {self.pipeline!r} failed ({why}); "
                f"output {log_path}, server log {self.server.log_path}:\n{tail}"
            )
        input_bytes = shuffle_bytes = None
        if before is not None and after is not None:
            input_bytes = after.input_bytes - before.input_bytes
            shuffle_bytes = after.shuffle_bytes - before.shuffle_bytes
        return SdpRun(seconds, _graph_seconds(lines), input_bytes, shuffle_bytes)

    def view_path(self, name: str) -> Path:
        """The folder of view ``name``'s Parquet files (after a run)."""
        if name not in PIPELINES[self.pipeline]:
            raise ValueError(f"pipeline {self.pipeline!r} has no view {name!r}")
        return self.warehouse / name

    def _environment(self) -> dict[str, str]:
        env = dict(os.environ)
        for name in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "SPARK_LOCAL_REMOTE"):
            env.pop(name, None)
        interpreter = Path(sys.executable)
        env.update(
            {
                "PATH": os.pathsep.join([str(interpreter.parent), env.get("PATH", "")]),
                "PYSPARK_PYTHON": str(interpreter),
                # The transformations import benchmarks.pipelines.upserts and benchmarks.queries.
                "PYTHONPATH": os.pathsep.join(
                    p for p in (str(REPO), env.get("PYTHONPATH", "")) if p
                ),
                "SPARK_HOME": str(spark_home()),  # the wheel's, matching the server
                "SPARK_LOCAL_IP": "127.0.0.1",
                LANDING_ENV: str(self.landing),
                # Lines as they happen, to time them; timestamps in UTC like the events'.
                "PYTHONUNBUFFERED": "1",
                "TZ": "UTC",
            }
        )
        return env

    def _run_cli(
        self, command: list[str], log_path: Path
    ) -> tuple[list[tuple[float, str]], int, bool]:
        """Run the CLI; its output lines with the time each arrived, its exit status and
        whether it was killed for taking longer than ``timeout``."""
        lines: list[tuple[float, str]] = []
        timed_out = threading.Event()
        with open(log_path, "w") as log:
            log.write(f"$ {' '.join(command)}\n")
            proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=self._environment(),
                cwd=self.project,
                text=True,
                errors="replace",
                start_new_session=True,  # its own group: the launcher, its JVM, Python
            )

            def kill() -> None:
                timed_out.set()
                _kill_group(proc)

            timer = threading.Timer(self.timeout, kill)
            timer.start()
            try:
                assert proc.stdout is not None
                for line in proc.stdout:
                    lines.append((time.perf_counter(), line.rstrip("\n")))
                    log.write(line)
                code = proc.wait()
            finally:
                timer.cancel()
                _kill_group(proc)  # nothing of the run outlives it
        return lines, code, timed_out.is_set()

    # --- the server's counters ---------------------------------------------------------
    def _counters(self, *, settle: bool = False) -> _Counters | None:
        """The executors' cumulative input and shuffle-read bytes, or None when the REST
        API does not answer. ``settle`` waits (briefly) until the totals stop moving:
        the status store takes tasks' ends from the listener bus, a little after them."""
        try:
            counters = self._read_counters()
            deadline = time.monotonic() + 3.0
            while settle and time.monotonic() < deadline:
                time.sleep(0.25)
                again = self._read_counters()
                if again == counters:
                    break
                counters = again
            return counters
        except (OSError, ValueError, KeyError, IndexError):
            return None

    def _read_counters(self) -> _Counters:
        assert self.server is not None
        if self._app_url is None:
            api = f"{self.server.ui_url()}/api/v1/applications"
            self._app_url = f"{api}/{_get_json(api)[0]['id']}"
        executors = _get_json(f"{self._app_url}/executors")
        return _Counters(
            sum(int(e["totalInputBytes"]) for e in executors),
            sum(int(e["totalShuffleRead"]) for e in executors),
        )


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


def _kill_group(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _graph_seconds(lines: list[tuple[float, str]]) -> float | None:
    """ "Starting run..." to "Run is COMPLETED.", by when the CLI printed the lines (None
    when one is missing). The CLI's own timestamps have whole seconds only; they are
    used when they disagree with the arrival times by more, as if the output had come
    buffered (the CLI runs with PYTHONUNBUFFERED, so it should not)."""
    starting = completed = None
    for arrived, text in lines:
        match = LOG_LINE.match(text)
        if match is None:
            continue
        stamp = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S")
        if match.group(2) == STARTING and starting is None:
            starting = (arrived, stamp)
        elif match.group(2) == COMPLETED:
            completed = (arrived, stamp)
    if starting is None or completed is None:
        return None
    by_arrival = completed[0] - starting[0]
    by_stamps = (completed[1] - starting[1]).total_seconds()
    return by_arrival if abs(by_arrival - by_stamps) <= 1.5 else by_stamps
