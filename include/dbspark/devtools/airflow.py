"""A real Airflow deployment as local child processes, for tests and for a person's UI.

``dag.test()`` runs a DAG run inside one Python process, without a scheduler. This
module runs what a deployment runs: ``airflow api-server`` (UI, REST API and the
Execution API the task processes report to), ``airflow scheduler`` with the
LocalExecutor (each task in a process of its own) and ``airflow dag-processor``, the
way ``devtools/spark_connect.py`` runs a Spark Connect server: on loopback, from
the installed wheels, as children of this process, with their output in log files.

    with LocalAirflow(home, dags_folder, env={"AIRFLOW_CONN_DBSPARK_SPARK": ...}) as af:
        af.wait_for_dags("dbspark_orders_by_region")
        af.api.unpause("dbspark_orders_by_region")
        af.backfill("dbspark_orders_by_region", from_date, to_date)
        runs = af.api.wait_for_runs("dbspark_orders_by_region", count=3)

Configuration is given as ``AIRFLOW__*`` environment variables of the children only
(``airflow.cfg`` in the home, if any, is left alone and overridden where it matters);
inherited ``AIRFLOW*`` variables are dropped so that the caller's own Airflow settings
(e.g. the test run's home) never leak in. The metadata database is SQLite in the home:
Airflow 3 runs the LocalExecutor on SQLite (``airflow standalone`` does the same), one
task at a time writing to it. Login is SimpleAuthManager with a known user and
password (written to the passwords file the auth manager reads), so the REST API works
with a JWT from ``POST /auth/token`` and a person can log in to the UI.

Every component runs in a session (and process group) of its own. :meth:`stop` sends
SIGTERM to each group, then SIGKILL, and then kills whatever is left in the session:
the task processes, which the task supervisor moves to process groups of their own.
Children also get SIGTERM when the thread that started them dies (Linux), so a killed
test run leaves no scheduler behind.

From a shell, ``python -m dbspark.devtools.airflow --home var/airflow
--port 8080`` runs the example DAGs' deployment in the foreground (the demo's home,
warehouse, landing directory and outputs, see ``demo.configure``), prints the UI's
address and login, and stops everything on Ctrl-C.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from dbspark.devtools.processes import (
    LOG_TAIL_LINES,
    LOOPBACK,
    free_port,
    kill_sessions,
    launch,
    port_is_free,
    stop_groups,
    tail,
)

log = logging.getLogger(__name__)

DEFAULT_USER = "admin"
DEFAULT_PASSWORD = "admin"
DEFAULT_ROLE = "admin"
DEFAULT_STARTUP_TIMEOUT = 180.0
#: Run states after which nothing more happens to a run.
FINISHED = frozenset({"success", "failed"})
#: Task instance states whose logs explain a failure or a hang.
TELLING_STATES = frozenset({"failed", "up_for_retry", "upstream_failed", "running", "queued"})
#: Seconds a writer of the metadata database waits for SQLite's lock.
SQLITE_BUSY_TIMEOUT = 60.0
#: Variables of the caller that must not reach the children: its own Airflow settings
#: (home, DAG folder, database) and a Spark Connect client mode of the caller's Python.
_DROPPED_PREFIXES = ("AIRFLOW_", "AIRFLOW__")
_DROPPED = ("AIRFLOW_HOME", "SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "SPARK_LOCAL_REMOTE")


class LocalAirflowError(RuntimeError):
    """The deployment could not start, or an awaited run did not finish (the message
    quotes the relevant logs)."""


def _readable_task_log(text: str) -> str:
    """Airflow 3 task logs are JSON lines; show them as ``time level event`` lines."""
    shown = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            shown.append(line)
            continue
        if not isinstance(record, dict):
            shown.append(line)
            continue
        when = str(record.get("timestamp", ""))[11:23]
        level = str(record.get("level", "")).upper()
        event = record.get("event", "")
        extra = ""
        if record.get("error_detail"):
            frames = record["error_detail"]
            extra = " | " + json.dumps(frames)[-1500:]
        shown.append(f"{when} {level:7} {event}{extra}")
    return "\n".join(shown)


# ======================================================================================= REST
@dataclass(frozen=True)
class Run:
    """One DAG run as the REST API shows it."""

    run_id: str
    state: str
    run_type: str
    logical_date: str | None
    data_interval_start: str | None
    data_interval_end: str | None

    @classmethod
    def of(cls, payload: Mapping[str, Any]) -> Run:
        return cls(
            run_id=payload["dag_run_id"],
            state=str(payload.get("state")),
            run_type=str(payload.get("run_type")),
            logical_date=payload.get("logical_date"),
            data_interval_start=payload.get("data_interval_start"),
            data_interval_end=payload.get("data_interval_end"),
        )


class AirflowApiError(RuntimeError):
    """A REST call answered with an error status (the message holds the response)."""

    def __init__(self, method: str, url: str, status: int, body: str) -> None:
        super().__init__(f"{method} {url} -> HTTP {status}: {body[:2000]}")
        self.status = status
        self.body = body


class RestClient:
    """A small client of Airflow 3's public REST API (``/api/v2``), on ``httpx``.

    It logs in like the UI does (``POST /auth/token`` with the user and password, then
    ``Authorization: Bearer``), and renews the token once when a call answers 401.
    ``logs`` is the deployment's task log folder, quoted by :meth:`wait_for_runs`.
    """

    def __init__(
        self, base_url: str, username: str, password: str, *, logs: Path | None = None
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.username = username
        self.password = password
        self.logs = logs
        self._token: str | None = None

    # --- plumbing ----------------------------------------------------------------------
    def _send(
        self, method: str, path: str, body: Any = None, *, auth: bool = True, timeout: float = 30
    ) -> Any:
        url = self.base_url + path
        for attempt in (1, 2):
            headers = {"Accept": "application/json"}
            if auth:
                headers["Authorization"] = f"Bearer {self.token()}"
            response = httpx.request(method, url, json=body, headers=headers, timeout=timeout)
            if response.status_code == 401 and auth and attempt == 1:
                self._token = None  # expired, or signed by a previous deployment
                continue
            if response.is_error:
                raise AirflowApiError(method, url, response.status_code, response.text)
            return response.json() if response.content else None
        raise AssertionError("unreachable")  # pragma: no cover

    @staticmethod
    def _quote(part: str) -> str:
        # Run ids hold ':' and '+' (manual__2026-01-05T00:00:00+00:00).
        return urllib.parse.quote(part, safe="")

    # --- calls -------------------------------------------------------------------------
    def token(self) -> str:
        """A JWT for the user, from ``POST /auth/token`` (cached until a call gets 401)."""
        if self._token is None:
            answer = self._send(
                "POST",
                "/auth/token",
                {"username": self.username, "password": self.password},
                auth=False,
            )
            self._token = str(answer["access_token"])
        return self._token

    def get(self, path: str) -> Any:
        """``GET`` any path of the api-server as the logged-in user, e.g. the endpoints
        behind the UI's Graph and Grid views (``/ui/structure/structure_data``)."""
        return self._send("GET", path)

    def health(self) -> dict[str, Any]:
        """``/api/v2/monitor/health``: metadatabase, scheduler, dag_processor, triggerer."""
        return dict(self._send("GET", "/api/v2/monitor/health", auth=False, timeout=5))

    def dag(self, dag_id: str) -> dict[str, Any]:
        return dict(self._send("GET", f"/api/v2/dags/{self._quote(dag_id)}"))

    def import_errors(self) -> list[dict[str, Any]]:
        return list(self._send("GET", "/api/v2/importErrors?limit=100")["import_errors"])

    def unpause(self, dag_id: str) -> dict[str, Any]:
        """Unpause a DAG (paused DAGs get no run scheduled, not even a triggered one)."""
        return dict(
            self._send("PATCH", f"/api/v2/dags/{self._quote(dag_id)}", {"is_paused": False})
        )

    def pause(self, dag_id: str) -> dict[str, Any]:
        return dict(self._send("PATCH", f"/api/v2/dags/{self._quote(dag_id)}", {"is_paused": True}))

    def trigger(
        self,
        dag_id: str,
        logical_date: datetime | str | None = None,
        conf: Mapping[str, Any] | None = None,
        *,
        run_id: str | None = None,
        note: str | None = None,
    ) -> Run:
        """Trigger a run with the body the UI's trigger form sends.

        The data interval is left to the DAG's timetable (the UI sends none unless the
        user fills it in): for a data-interval schedule a manual run covers the last
        complete interval, the one ending at ``logical_date``.
        """
        if isinstance(logical_date, datetime):
            if logical_date.tzinfo is None:
                raise ValueError(f"logical_date {logical_date} needs a time zone")
            logical_date = logical_date.isoformat()
        body: dict[str, Any] = {
            "conf": dict(conf or {}),
            "data_interval_end": None,
            "data_interval_start": None,
            "logical_date": logical_date,
            "partition_key": None,
        }
        if run_id:
            body["dag_run_id"] = run_id
        if note:
            body["note"] = note
        return Run.of(self._send("POST", f"/api/v2/dags/{self._quote(dag_id)}/dagRuns", body))

    def backfill(
        self,
        dag_id: str,
        from_date: datetime | str,
        to_date: datetime | str,
        *,
        reprocess_behavior: str = "failed",
        max_active_runs: int = 1,
    ) -> dict[str, Any]:
        """Create a backfill as the UI's backfill dialog does (``POST /api/v2/backfills``):
        runs for the intervals whose start lies in ``[from_date, to_date]``. The defaults
        differ from the API's for the reasons given at :meth:`LocalAirflow.backfill`."""
        body = {
            "dag_id": dag_id,
            "from_date": _iso(from_date),
            "to_date": _iso(to_date),
            "run_backwards": False,
            "dag_run_conf": {},
            "reprocess_behavior": reprocess_behavior,
            "max_active_runs": max_active_runs,
        }
        return dict(self._send("POST", "/api/v2/backfills", body))

    def runs(self, dag_id: str) -> list[Run]:
        """Every run of the DAG, oldest logical date first."""
        path = f"/api/v2/dags/{self._quote(dag_id)}/dagRuns?limit=100&order_by=logical_date"
        return [Run.of(r) for r in self._send("GET", path)["dag_runs"]]

    def task_instances(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        """The run's task instances (``task_id``, ``map_index``, ``state``,
        ``try_number``, ...), in task id order."""
        path = (
            f"/api/v2/dags/{self._quote(dag_id)}/dagRuns/{self._quote(run_id)}"
            "/taskInstances?limit=100"
        )
        found = self._send("GET", path)["task_instances"]
        return sorted(found, key=lambda ti: (ti["task_id"], ti.get("map_index", -1)))

    def tries(
        self, dag_id: str, run_id: str, task_id: str, map_index: int = -1
    ) -> list[dict[str, Any]]:
        """Every attempt of one task instance, with its state (failed attempts too)."""
        path = (
            f"/api/v2/dags/{self._quote(dag_id)}/dagRuns/{self._quote(run_id)}"
            f"/taskInstances/{self._quote(task_id)}/tries?map_index={map_index}"
        )
        return list(self._send("GET", path)["task_instances"])

    def clear(self, dag_id: str, run_id: str, *, only_failed: bool = True) -> list[str]:
        """Clear the run's failed tasks and those downstream of them, as the UI's "Clear"
        of a failed run does (``POST .../clearTaskInstances``); the run is queued again.
        Returns the cleared task ids."""
        body = {
            "dry_run": False,
            "dag_run_id": run_id,
            "only_failed": only_failed,
            "include_downstream": True,
            "reset_dag_runs": True,
        }
        path = f"/api/v2/dags/{self._quote(dag_id)}/clearTaskInstances"
        answer = self._send("POST", path, body)
        return [ti["task_id"] for ti in answer.get("task_instances", [])]

    def set_state(
        self, dag_id: str, run_id: str, task_id: str, state: str, *, map_index: int = -1
    ) -> list[dict[str, Any]]:
        """Set a task instance's state as the UI's "Mark as success" / "Mark as failed"
        does (``PATCH .../taskInstances/<task_id>``, without upstream, downstream, past or
        future); Airflow then clears the failed and upstream-failed tasks downstream of
        it, so they run again. Returns the task instances it set."""
        path = (
            f"/api/v2/dags/{self._quote(dag_id)}/dagRuns/{self._quote(run_id)}"
            f"/taskInstances/{self._quote(task_id)}"
        )
        if map_index >= 0:
            path += f"/{map_index}"
        body = {
            "new_state": state,
            "include_upstream": False,
            "include_downstream": False,
            "include_future": False,
            "include_past": False,
        }
        return list(self._send("PATCH", path, body)["task_instances"])

    def wait_for_runs(
        self,
        dag_id: str,
        *,
        run_ids: Iterable[str] | None = None,
        count: int | None = None,
        run_type: str | None = None,
        timeout: float = 300.0,
        poll: float = 1.0,
    ) -> list[Run]:
        """Wait until the runs are finished (success or failed) and return them.

        Waited for are the runs named in ``run_ids``, else the DAG's runs (of
        ``run_type`` if given), of which there must be at least ``count``. A timeout
        raises :class:`LocalAirflowError` with every run's state, its task instances'
        states and the tail of the logs of the tasks that failed or did not finish.
        """
        wanted = None if run_ids is None else list(run_ids)
        deadline = time.monotonic() + timeout
        runs: list[Run] = []
        while True:
            runs = [r for r in self.runs(dag_id) if run_type is None or r.run_type == run_type]
            if wanted is not None:
                by_id = {r.run_id: r for r in runs}
                runs = [by_id[i] for i in wanted if i in by_id]
                enough = len(runs) == len(wanted)
            else:
                enough = len(runs) >= (count or 1)
            if enough and all(r.state in FINISHED for r in runs):
                return runs
            if time.monotonic() >= deadline:
                raise LocalAirflowError(
                    f"DAG {dag_id}: runs did not finish within {timeout:g}s "
                    f"(waiting for {wanted or f'{count or 1} runs'}):\n"
                    + self.explain(dag_id, runs)
                )
            time.sleep(poll)

    def explain(self, dag_id: str, runs: Sequence[Run] | None = None) -> str:
        """The runs' states, their task instances' states and the tails of the task logs
        of the instances that failed, are retried or still run (for error messages)."""
        runs = self.runs(dag_id) if runs is None else runs
        parts = []
        for run in runs:
            parts.append(
                f"run {run.run_id} ({run.run_type}, interval {run.data_interval_start} to "
                f"{run.data_interval_end}): {run.state}"
            )
            try:
                instances = self.task_instances(dag_id, run.run_id)
            except AirflowApiError as err:
                parts.append(f"  (task instances unavailable: {err})")
                continue
            for ti in instances:
                index = "" if ti.get("map_index", -1) < 0 else f"[{ti['map_index']}]"
                parts.append(
                    f"  {ti['task_id']}{index}: {ti.get('state')} (try {ti.get('try_number')})"
                )
            for ti in instances:
                if str(ti.get("state")) in TELLING_STATES:
                    parts.append(self._log_tail(dag_id, run.run_id, ti))
        return "\n".join(parts)

    def _log_tail(self, dag_id: str, run_id: str, ti: Mapping[str, Any]) -> str:
        if self.logs is None:
            return f"  (no log folder known for {ti['task_id']})"
        folder = self.logs / f"dag_id={dag_id}" / f"run_id={run_id}" / f"task_id={ti['task_id']}"
        if ti.get("map_index", -1) >= 0:
            folder = folder / f"map_index={ti['map_index']}"
        attempts = sorted(folder.glob("attempt=*.log"), key=lambda p: p.stat().st_mtime)
        if not attempts:
            return f"  --- {ti['task_id']}: no log file under {folder}"
        shown = []
        for attempt in attempts:
            text = _readable_task_log(tail(attempt, LOG_TAIL_LINES * 4))
            lines = text.splitlines()[-LOG_TAIL_LINES:]
            shown.append(f"  --- {attempt}:\n" + "\n".join(f"    {line}" for line in lines))
        return "\n".join(shown)


# ================================================================================ deployment
@dataclass
class _Component:
    name: str
    args: list[str]
    proc: subprocess.Popen[bytes] | None = None


def async_database_setting(url: str) -> dict[str, str]:
    """Airflow's async engine for a PostgreSQL metadata database on psycopg 3.

    Airflow derives its async URL from the sync one as ``postgresql+asyncpg``, a driver
    dbspark does not install; psycopg 3 has an async mode of its own.
    """
    scheme, sep, rest = url.partition("://")
    if scheme in ("postgresql+psycopg", "postgresql+psycopg_async"):
        return {"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC": f"postgresql+psycopg_async{sep}{rest}"}
    return {}


@dataclass(frozen=True)
class CeleryOptions:
    """The CeleryExecutor's settings: ``workers`` worker processes taking tasks from
    ``broker_url`` (e.g. Redis), each running up to ``concurrency`` tasks at once."""

    broker_url: str
    workers: int = 1
    concurrency: int = 1
    result_backend: str | None = None

    def environment(self, database_url: str) -> dict[str, str]:
        # Celery's database result backend is SQLAlchemy with a "db+" prefix.
        backend = self.result_backend or f"db+{database_url}"
        return {
            "AIRFLOW__CELERY__BROKER_URL": self.broker_url,
            "AIRFLOW__CELERY__RESULT_BACKEND": backend,
            "AIRFLOW__CELERY__WORKER_CONCURRENCY": str(self.concurrency),
        }

    def components(self) -> list[_Component]:
        return [
            _Component(
                f"celery-worker-{n}",
                [
                    "celery",
                    "worker",
                    "--concurrency",
                    str(self.concurrency),
                    "--celery-hostname",
                    f"worker{n}@%h",
                    "--skip-serve-logs",
                ],
            )
            for n in range(1, self.workers + 1)
        ]


class LocalAirflow:
    """One local Airflow deployment (see the module docstring).

    ``home`` is AIRFLOW_HOME (metadata database, logs, component logs under
    ``home/processes``); ``dags_folder`` the DAG files; ``env`` extra variables for
    every component and therefore every task (``AIRFLOW__DBSPARK__*``,
    ``AIRFLOW_CONN_*``, ``PYSPARK_PYTHON``, overrides of the settings here). ``port``
    None picks a free one. ``triggerer`` starts ``airflow triggerer`` too (only
    deferrable tasks need it; dbspark's do not).

    ``database_url`` puts the metadata database elsewhere than SQLite in the home (a
    PostgreSQL URL, as in a multi-machine deployment). ``celery`` switches from the
    LocalExecutor to the CeleryExecutor: ``celery.workers`` ``airflow celery worker``
    processes take the tasks from the broker ``celery.broker_url``, results go to
    ``celery.result_backend`` (default: the metadata database).
    """

    def __init__(
        self,
        home: str | os.PathLike[str],
        dags_folder: str | os.PathLike[str],
        *,
        env: Mapping[str, str] | None = None,
        port: int | None = None,
        host: str = LOOPBACK,
        username: str = DEFAULT_USER,
        password: str = DEFAULT_PASSWORD,
        role: str = DEFAULT_ROLE,
        triggerer: bool = False,
        parallelism: int = 4,
        startup_timeout: float = DEFAULT_STARTUP_TIMEOUT,
        die_with_parent: bool = True,
        database_url: str | None = None,
        celery: CeleryOptions | None = None,
    ) -> None:
        self.home = Path(home).resolve()
        self.dags_folder = Path(dags_folder).resolve()
        self.extra_env = dict(env or {})
        self.requested_port = port
        self.port: int | None = port
        self.host = host
        self.username = username
        self.password = password
        self.role = role
        self.triggerer = triggerer
        self.parallelism = parallelism
        self.startup_timeout = startup_timeout
        self.die_with_parent = die_with_parent
        self.database_url = database_url
        self.celery = celery
        self._components: list[_Component] = []
        self._env: dict[str, str] | None = None
        self._api: RestClient | None = None

    # --- configuration -----------------------------------------------------------------
    @property
    def url(self) -> str:
        """The UI and REST API address, ``http://127.0.0.1:<port>``."""
        if self.port is None:
            raise LocalAirflowError("the deployment has not been started")
        return f"http://{self.host}:{self.port}"

    @property
    def logs(self) -> Path:
        """Task logs: ``dag_id=.../run_id=.../task_id=.../attempt=N.log``."""
        return self.home / "logs"

    @property
    def process_logs(self) -> Path:
        """One ``<component>.log`` per process (api-server, scheduler, ...)."""
        return self.home / "processes"

    @property
    def database(self) -> Path:
        """The SQLite metadata database (unless ``database_url`` names another)."""
        return self.home / "airflow.db"

    @property
    def sql_alchemy_conn(self) -> str:
        # Every component writes to the one SQLite file; a writer waits up to a minute
        # for the lock instead of SQLite's 5 s (on a busy machine the backfill's run
        # inserts lost that race: "database is locked").
        return self.database_url or f"sqlite:///{self.database}?timeout={SQLITE_BUSY_TIMEOUT:g}"

    @property
    def passwords_file(self) -> Path:
        return self.home / "simple_auth_manager_passwords.json"

    @property
    def api(self) -> RestClient:
        if self._api is None:
            self._api = RestClient(self.url, self.username, self.password, logs=self.logs)
        return self._api

    def environment(self) -> dict[str, str]:
        """The children's environment: ours, without the caller's Airflow settings."""
        if self.port is None:
            raise LocalAirflowError("no port chosen yet (start() chooses one)")
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(_DROPPED_PREFIXES) and k not in _DROPPED
        }
        env.update(
            {
                "AIRFLOW_HOME": str(self.home),
                "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags_folder),
                "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor" if self.celery else "LocalExecutor",
                "AIRFLOW__CORE__PARALLELISM": str(self.parallelism),
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": self.sql_alchemy_conn,
                **async_database_setting(self.sql_alchemy_conn),
                "AIRFLOW__CORE__AUTH_MANAGER": (
                    "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"
                ),
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{self.username}:{self.role}",
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(self.passwords_file),
                # Task processes report to the Execution API of this api-server; the
                # scheduler signs their tokens, the api-server checks them: one secret.
                "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.url}/execution/",
                "AIRFLOW__API__HOST": self.host,
                "AIRFLOW__API__PORT": str(self.port),
                "AIRFLOW__API__WORKERS": "1",
                "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(32),
                "AIRFLOW__API__SECRET_KEY": secrets.token_urlsafe(32),
                # One parser process: parsing a dbspark DAG file imports the engine, and
                # on a small machine a second parser only competes with the tasks.
                "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": "1",
                # New DAG files show up within seconds instead of five minutes.
                "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "10",
                "PYTHONUNBUFFERED": "1",
            }
        )
        if self.celery is not None:
            env.update(self.celery.environment(self.sql_alchemy_conn))
        env.update(self.extra_env)
        return env

    def _write_passwords(self) -> None:
        """The known login: SimpleAuthManager generates a password only for users the
        file does not name, so naming ours fixes it."""
        passwords: dict[str, str] = {}
        with contextlib.suppress(OSError, ValueError):
            passwords = dict(json.loads(self.passwords_file.read_text() or "{}"))
        passwords[self.username] = self.password
        self.passwords_file.write_text(json.dumps(passwords) + "\n")
        self.passwords_file.chmod(0o600)

    # --- the CLI -----------------------------------------------------------------------
    def airflow_command(self) -> str:
        """The ``airflow`` entry point next to this interpreter (the same install)."""
        airflow = Path(sys.executable).with_name("airflow")
        if not airflow.exists():
            raise LocalAirflowError(f"no airflow command next to {sys.executable}")
        return str(airflow)

    def cli(self, *args: str, timeout: float = 300.0, check: bool = True) -> str:
        """Run ``airflow <args>`` against this deployment; its output (stdout+stderr)."""
        env = self._env or self.environment()
        done = subprocess.run(
            [self.airflow_command(), *args],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            env=env,
            cwd=self.home,
            timeout=timeout,
        )
        output = done.stdout + done.stderr
        if check and done.returncode != 0:
            raise LocalAirflowError(
                f"airflow {' '.join(args)} failed with status {done.returncode}:\n"
                + "\n".join(output.splitlines()[-60:])
            )
        return output

    def migrate(self) -> None:
        """``airflow db migrate``: create or upgrade the SQLite metadata database, then
        put it in WAL mode (kept in the file): readers (the UI, the scheduler's
        queries) then no longer block the one writer, nor it them."""
        self.cli("db", "migrate")
        if self.database_url:
            return
        with contextlib.closing(sqlite3.connect(self.database, timeout=SQLITE_BUSY_TIMEOUT)) as db:
            db.execute("PRAGMA journal_mode=WAL")

    def backfill(
        self,
        dag_id: str,
        from_date: datetime | str,
        to_date: datetime | str,
        *,
        reprocess_behavior: str = "failed",
        max_active_runs: int = 1,
        conf: Mapping[str, Any] | None = None,
        dry_run: bool = False,
    ) -> str:
        """``airflow backfill create``: runs for every interval whose start (the logical
        date) lies in ``[from_date, to_date]``, both inclusive; returns the CLI output.

        The scheduler runs the backfill's runs; wait with ``api.wait_for_runs(dag_id,
        run_type="backfill", ...)``. Two defaults differ from the CLI's on purpose:
        ``reprocess_behavior`` (``none`` | ``completed`` | ``failed``) is ``failed``
        because Airflow refuses ``none`` for DAGs with ``depends_on_past`` (every dbspark
        DAG) and a committed epoch is a no-op anyway; ``max_active_runs`` is 1 because a
        backfill ignores the DAG's ``max_active_runs`` (its own default is 10), and
        dbspark epochs must run one after the other.
        """
        args = [
            "backfill",
            "create",
            "--dag-id",
            dag_id,
            "--from-date",
            _iso(from_date),
            "--to-date",
            _iso(to_date),
            "--reprocess-behavior",
            reprocess_behavior,
            "--max-active-runs",
            str(max_active_runs),
        ]
        if conf is not None:
            args += ["--dag-run-conf", json.dumps(dict(conf))]
        if dry_run:
            args.append("--dry-run")
        return self.cli(*args)

    # --- lifecycle ---------------------------------------------------------------------
    def start(self) -> LocalAirflow:
        """Migrate the database, start the components, wait until they are healthy.

        On any failure everything started is stopped again and the error quotes the
        logs of the component that failed.
        """
        if self._components:
            raise LocalAirflowError(f"the deployment is already started ({self.url})")
        self.port = self.requested_port or free_port(self.host)
        if not port_is_free(self.port, self.host):
            raise LocalAirflowError(
                f"port {self.port} on {self.host} is in use (another Airflow UI?); pick another"
            )
        self.home.mkdir(parents=True, exist_ok=True)
        self.process_logs.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        self._env = self.environment()
        self._api = None
        self._write_passwords()
        try:
            self.migrate()
            # --skip-serve-logs: the api-server reads task logs from the shared disk,
            # so the scheduler needs no log server (nor its fixed port 8793).
            components = [
                _Component(
                    "api-server", ["api-server", "--host", self.host, "--port", str(self.port)]
                ),
                _Component("scheduler", ["scheduler", "--skip-serve-logs"]),
                _Component("dag-processor", ["dag-processor"]),
            ]
            if self.triggerer:
                components.append(_Component("triggerer", ["triggerer", "--skip-serve-logs"]))
            if self.celery is not None:
                components += self.celery.components()
            for component in components:
                self._launch(component)
            self.wait_until_ready()
            if self.celery is not None:
                self._wait_for_celery_workers()
        except BaseException:
            self.stop()
            raise
        return self

    def _launch(self, component: _Component) -> None:
        assert self._env is not None
        component.proc = launch(
            [self.airflow_command(), *component.args],
            log_path=self.process_log(component.name),
            env=self._env,
            cwd=self.home,
            parent_death_signal=signal.SIGTERM if self.die_with_parent else None,
        )
        self._components.append(component)

    def process_log(self, name: str) -> Path:
        return self.process_logs / f"{name}.log"

    def check_alive(self) -> None:
        """Raise (quoting its log) when a component has exited."""
        for component in self._components:
            assert component.proc is not None
            code = component.proc.poll()
            if code is not None:
                raise LocalAirflowError(
                    f"airflow {component.name} exited with status {code}; log "
                    f"{self.process_log(component.name)}:\n"
                    f"{tail(self.process_log(component.name))}"
                )

    def wait_until_ready(self, timeout: float | None = None) -> None:
        """Wait until the API answers and reports the metadatabase, scheduler and DAG
        processor healthy (and the triggerer, when started)."""
        timeout = self.startup_timeout if timeout is None else timeout
        wanted = ["metadatabase", "scheduler", "dag_processor"]
        if self.triggerer:
            wanted.append("triggerer")
        deadline = time.monotonic() + timeout
        health: dict[str, Any] | str = "no answer yet"
        while True:
            self.check_alive()
            try:
                health = self.api.health()
                if all((health.get(part) or {}).get("status") == "healthy" for part in wanted):
                    self.api.token()  # the login works too
                    return
            except (OSError, httpx.TransportError, AirflowApiError, ValueError) as err:
                health = f"{type(err).__name__}: {err}"
            if time.monotonic() >= deadline:
                logs = "\n".join(
                    f"--- {c.name} ({path}):\n{tail(path, 20)}"
                    for c in self._components
                    for path in [self.process_log(c.name)]
                )
                raise LocalAirflowError(
                    f"Airflow at {self.url} was not ready within {timeout:g}s "
                    f"(health: {health}):\n{logs}"
                )
            time.sleep(0.5)

    def _wait_for_celery_workers(self) -> None:
        """Each Celery worker says "ready" in its log once it consumes from the broker."""
        deadline = time.monotonic() + self.startup_timeout
        waiting = [c.name for c in self._components if c.name.startswith("celery-worker")]
        while waiting:
            self.check_alive()
            waiting = [n for n in waiting if " ready." not in tail(self.process_log(n), 200)]
            if not waiting:
                return
            if time.monotonic() >= deadline:
                raise LocalAirflowError(
                    f"Celery workers {waiting} were not ready within "
                    f"{self.startup_timeout:g}s:\n{tail(self.process_log(waiting[0]))}"
                )
            time.sleep(0.5)

    def wait_for_dags(self, *dag_ids: str, timeout: float = 120.0) -> None:
        """Wait until the DAG processor has stored every DAG; an import error of a file
        in the DAG folder fails at once, with its traceback."""
        deadline = time.monotonic() + timeout
        missing = list(dag_ids)
        while True:
            self.check_alive()
            errors = self.api.import_errors()
            if errors:
                shown = "\n".join(f"{e.get('filename')}:\n{e.get('stack_trace')}" for e in errors)
                raise LocalAirflowError(f"DAG files in {self.dags_folder} do not import:\n{shown}")
            still = []
            for dag_id in missing:
                try:
                    self.api.dag(dag_id)
                except AirflowApiError as err:
                    if err.status != 404:
                        raise
                    still.append(dag_id)
            missing = still
            if not missing:
                return
            if time.monotonic() >= deadline:
                raise LocalAirflowError(
                    f"DAGs {missing} did not appear within {timeout:g}s; dag-processor log:\n"
                    f"{tail(self.process_log('dag-processor'))}"
                )
            time.sleep(0.5)

    @property
    def running(self) -> bool:
        return bool(self._components) and all(
            c.proc is not None and c.proc.poll() is None for c in self._components
        )

    def wait(self, poll: float = 1.0) -> _Component:
        """Block until some component exits; return it."""
        while True:
            for component in self._components:
                assert component.proc is not None
                if component.proc.poll() is not None:
                    return component
            time.sleep(poll)

    def stop(self, timeout: float = 20.0) -> None:
        """Stop every component and whatever it started; safe to call more than once.

        SIGTERM to each component's process group (the scheduler then stops its running
        tasks), SIGKILL after ``timeout``, then SIGKILL to every process still in the
        components' sessions: task processes sit in process groups of their own there.
        """
        components, self._components = self._components, []
        started = [c.proc for c in components if c.proc is not None]
        stop_groups(started, timeout)
        leftovers = kill_sessions(proc.pid for proc in started)
        if leftovers:
            log.warning("processes %s of the local Airflow did not go away", leftovers)

    def __enter__(self) -> LocalAirflow:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _iso(moment: datetime | str) -> str:
    if isinstance(moment, datetime):
        if moment.tzinfo is None:
            raise ValueError(f"{moment} needs a time zone")
        return moment.isoformat()
    return moment


# ====================================================================================== main
def main(argv: Sequence[str] | None = None) -> int:
    """Run the example DAGs' deployment in the foreground until Ctrl-C or SIGTERM."""
    import argparse

    from dbspark.devtools.demo import DEFAULT_HOME, REPO, configure

    parser = argparse.ArgumentParser(
        prog="python -m dbspark.devtools.airflow",
        description=(
            "Run Airflow (api-server with the UI, scheduler, dag-processor; LocalExecutor, "
            "SQLite) on loopback until interrupted, with the demo's home and settings."
        ),
    )
    parser.add_argument("--home", default=DEFAULT_HOME, help="AIRFLOW_HOME and all data")
    parser.add_argument("--port", type=int, default=8080, help="UI/API port (default 8080)")
    parser.add_argument("--dags-folder", default=str(REPO / "dags"))
    parser.add_argument("--user", default=DEFAULT_USER)
    parser.add_argument("--password", default=DEFAULT_PASSWORD)
    parser.add_argument("--startup-timeout", type=float, default=DEFAULT_STARTUP_TIMEOUT)
    args = parser.parse_args(argv)

    home = Path(args.home).resolve()
    home.mkdir(parents=True, exist_ok=True)
    # The demo's layout (warehouse, landing, outputs under the home), so the UI shows
    # the runs `python -m dbspark.devtools.demo` made and continues their epochs.
    settings = configure(home, Path(args.dags_folder).resolve())
    # The demo quiets task logs because it prints its own account; in the UI the task
    # logs are the account, so they keep dbspark's INFO lines.
    settings["AIRFLOW__LOGGING__LOGGING_LEVEL"] = "INFO"
    env = {
        "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable),
        "PYSPARK_DRIVER_PYTHON": os.environ.get("PYSPARK_DRIVER_PYTHON", sys.executable),
        "SPARK_LOCAL_IP": os.environ.get("SPARK_LOCAL_IP", LOOPBACK),
        **settings,
    }
    env.update({k: v for k, v in os.environ.items() if k.startswith("AIRFLOW_CONN_")})
    deployment = LocalAirflow(
        home,
        args.dags_folder,
        env=env,
        port=args.port,
        username=args.user,
        password=args.password,
        startup_timeout=args.startup_timeout,
    )
    # SIGTERM takes the same way out as Ctrl-C, so everything is stopped either way;
    # SIGINT too when started in the background, where a shell leaves it ignored.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        print(f"starting Airflow in {home} (logs: {deployment.process_logs}) ...", flush=True)
        deployment.start()
        print(
            f"\nAirflow UI: {deployment.url}\n"
            f"login:      user {deployment.username!r}, password {deployment.password!r}\n"
            f"DAGs:       {deployment.dags_folder} (new DAGs start paused)\n"
            f"data:       {settings['AIRFLOW__DBSPARK__LANDING']} (landing), "
            f"{settings['AIRFLOW__DBSPARK__WAREHOUSE']} (warehouse), "
            f"{settings['AIRFLOW__DBSPARK__OUTPUTS']} (outputs)\n"
            "Ctrl-C stops everything.",
            flush=True,
        )
        dead = deployment.wait()
        assert dead.proc is not None
        print(
            f"airflow {dead.name} exited with status {dead.proc.returncode}; log "
            f"{deployment.process_log(dead.name)}:\n{tail(deployment.process_log(dead.name))}",
            file=sys.stderr,
        )
        return 1
    except LocalAirflowError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nstopping Airflow ...", flush=True)
        return 0
    finally:
        deployment.stop()
        print("stopped.", flush=True)


if __name__ == "__main__":
    sys.exit(main())
