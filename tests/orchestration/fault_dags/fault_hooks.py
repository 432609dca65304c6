"""Fault hooks for ``fault_dags.py`` (see its docstring), installed on import: by the
DAG file in every task process, and by the second process of a ``twice`` case."""

from __future__ import annotations

import errno
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from dbspark.storage.catalog import Catalog

ROOT = Path(os.environ.get("DBSPARK_FAULT_ROOT", "/nonexistent/dbspark-faults"))
HOOKS = ROOT / "hooks"
#: Set in the second process of a ``twice`` case: the race it joins.
RACE_VARIABLE = "DBSPARK_FAULT_RACE"
WAIT_SECONDS = 120.0

_race: dict[str, str] = {}  # this process's race, until its first commit
_settings: dict[str, str | None] = {}  # what the settings hook replaced, by name


def _kill_if_armed(key: str) -> None:
    """SIGKILL this process, as the OOM killer or a lost host does, if ``kill/<key>``
    exists (test-and-clear, so the retry goes on); ``killed/<key>`` holds its pid."""
    try:
        (HOOKS / "kill" / key).unlink()
    except FileNotFoundError:
        return
    (HOOKS / "killed").mkdir(parents=True, exist_ok=True)
    (HOOKS / "killed" / key).write_text(str(os.getpid()))
    os.kill(os.getpid(), signal.SIGKILL)


def _dag_of(path: Any) -> str:
    """The DAG a warehouse or outputs path belongs to (``<root>/<dag_id>/...``)."""
    try:
        return Path(os.fspath(path)).resolve().relative_to(ROOT.resolve()).parts[0]
    except (TypeError, ValueError, IndexError):
        return ""


def _apply_settings(dag_id: str) -> None:
    """``settings/<dag_id>`` (JSON: variable -> value), set in this task process's
    environment as ``airflow.cfg`` would set them, e.g. ``AIRFLOW__DBSPARK__LATE_FILES``;
    a variable no longer listed gets back its value from before."""
    try:
        wanted = json.loads((HOOKS / "settings" / dag_id).read_text())
    except FileNotFoundError:
        wanted = {}
    for name in [n for n in _settings if n not in wanted]:
        before = _settings.pop(name)
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before
    for name, value in wanted.items():
        _settings.setdefault(name, os.environ.get(name))
        os.environ[name] = str(value)


def _wait_for(path: Path, count: int = 1) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline:
        if (count == 1 and path.exists()) or (
            count > 1 and path.is_dir() and len(list(path.glob("*.ready"))) >= count
        ):
            return
        time.sleep(0.05)
    raise TimeoutError(f"fault hook: waited {WAIT_SECONDS}s for {path}")


def _install_hooks() -> None:
    if getattr(Catalog.commit, "fault_hooks", False):
        return
    commit = Catalog.commit

    def commit_with_faults(
        self: Catalog, circuit: str, stage: str, time_: Any, *args: Any, **kw: Any
    ) -> bool:
        key = f"{self.engine.url.database}.{stage}@{next(iter(time_))}"
        if stage.startswith("compact:"):  # any trace's compaction at the epoch
            _kill_if_armed(f"{self.engine.url.database}.compact@{next(iter(time_))}")
        else:  # a loop iteration's key names its full time: loop:<name>@<epoch>.<i>
            _kill_if_armed(f"{self.engine.url.database}.{stage}@{'.'.join(map(str, time_))}")
        pause = HOOKS / "pause" / key
        try:
            pause.unlink()  # test-and-clear: only one attempt pauses
        except FileNotFoundError:
            pass
        else:
            (HOOKS / "paused").mkdir(parents=True, exist_ok=True)
            (HOOKS / "paused" / key).write_text(str(os.getpid()))
            _wait_for(HOOKS / "go" / key)
        race = _race.pop("key", None) or os.environ.pop(RACE_VARIABLE, None)
        if race is None:
            return commit(self, circuit, stage, time_, *args, **kw)
        folder = HOOKS / "race" / race
        (folder / f"{os.getpid()}.arrived").write_text(stage)
        (folder / f"{os.getpid()}.ready").touch()
        _wait_for(folder, count=2)
        try:
            done = commit(self, circuit, stage, time_, *args, **kw)
        except BaseException as err:
            (folder / f"{os.getpid()}.result").write_text(f"{type(err).__name__}: {err}")
            raise
        (folder / f"{os.getpid()}.result").write_text(json.dumps(done))
        return done

    commit_with_faults.fault_hooks = True  # type: ignore[attr-defined]
    Catalog.commit = commit_with_faults  # type: ignore[method-assign]

    exclusive = Catalog.exclusive

    def exclusive_ready(self: Catalog, circuit: str, what: str) -> Any:
        # A racer that waits for the other's lock is as far as it gets: the other's
        # commit goes on without it (``.ready``), or the two would wait for each other.
        race = _race.get("key") or os.environ.get(RACE_VARIABLE)
        if race is not None:
            (HOOKS / "race" / race / f"{os.getpid()}.ready").touch()
        return exclusive(self, circuit, what)

    Catalog.exclusive = exclusive_ready  # type: ignore[method-assign]

    commit_epoch = Catalog.commit_epoch

    def commit_epoch_or_die(self: Catalog, circuit: str, epoch: int, **kw: Any) -> bool:
        _kill_if_armed(f"{self.engine.url.database}.close@{epoch}")
        return commit_epoch(self, circuit, epoch, **kw)

    Catalog.commit_epoch = commit_epoch_or_die  # type: ignore[method-assign]

    from dbspark.orchestration.sinks import export
    from dbspark.storage import catalog as catalog_module

    publish_table = export.publish_table

    def publish_table_then_die(path: Any, *args: Any, **kw: Any) -> Any:
        done = publish_table(path, *args, **kw)  # the view's table holds the epoch
        _kill_if_armed(f"{_dag_of(path)}.export@{kw.get('epoch')}")
        return done

    export.publish_table = publish_table_then_die

    remove_tree = catalog_module._remove_tree

    def remove_tree_then_die(path: Path) -> int:
        freed = remove_tree(path)  # garbage collection deleted one path
        _kill_if_armed(f"{_dag_of(path)}.gc")
        return freed

    catalog_module._remove_tree = remove_tree_then_die

    from dbspark.orchestration.sinks import files

    sync_tree = files.sync_tree

    def sync_tree_then_die(path: Any, *args: Any, **kw: Any) -> None:
        sync_tree(path, *args, **kw)  # the hidden directory is written, not yet renamed
        where = Path(os.fspath(path))
        if where.name.startswith("."):  # ".epoch=<n>.tmp-<id>": <kind>.tmp@<n>
            number = where.name.split(".")[1].split("=")[-1]
            _kill_if_armed(f"{_dag_of(where)}.{where.parent.name}.tmp@{number}")

    files.sync_tree = sync_tree_then_die

    import pyarrow.parquet as pq

    write_table = pq.write_table

    def write_table_or_full(table: Any, where: Any, *args: Any, **kw: Any) -> Any:
        marker = HOOKS / "enospc"
        try:
            text = marker.read_text().strip()
        except FileNotFoundError:
            return write_table(table, where, *args, **kw)
        if isinstance(where, (str, os.PathLike)) and text in os.fspath(where):
            with open(where, "wb") as half:  # the disk fills up part way through
                half.write(b"PAR1" + b"\0" * 100)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.fspath(where))
        return write_table(table, where, *args, **kw)

    pq.write_table = write_table_or_full

    from dbspark.orchestration.airflow.tasks import EpochTasks

    deployment_of = EpochTasks._deployment

    def deployment_with_settings(self: EpochTasks) -> Any:
        _apply_settings(_dag_of(self.options.warehouse))
        return deployment_of(self)

    EpochTasks._deployment = deployment_with_settings  # type: ignore[method-assign]

    execute_leased = EpochTasks._execute_leased

    def execute_twice(self: EpochTasks, deployment: Any, unit: Any) -> dict[str, Any]:
        name = {
            "ingest": lambda: f"ingest.{getattr(unit, 'source', '')}",
            "stage": lambda: self.plan.stages[unit.stage].name,
        }.get(unit.kind, lambda: unit.kind)()
        database = sa.make_url(deployment.catalog_url).database
        key = f"{database}.{name}@{unit.epoch}"
        try:
            (HOOKS / "twice" / key).unlink()
        except FileNotFoundError:
            return execute_leased(self, deployment, unit)
        (HOOKS / "race" / key).mkdir(parents=True)
        twin = _start_twin(self, deployment, unit, key)
        _race["key"] = key
        try:
            return execute_leased(self, deployment, unit)
        finally:
            _race.pop("key", None)
            code = twin.wait(timeout=WAIT_SECONDS)
            (HOOKS / "race" / key / "twin.exit").write_text(str(code))

    EpochTasks._execute_leased = execute_twice  # type: ignore[method-assign]


def _start_twin(tasks: Any, deployment: Any, unit: Any, key: str) -> subprocess.Popen[bytes]:
    """The same unit in a second process, as the unit worker or a spark-submit driver
    runs it: a private, HMAC-checked unit file read by ``run_unit_file``."""
    from dbspark.orchestration.units import (
        CATALOG_URL_VARIABLE,
        UNIT_KEY_VARIABLE,
        unit_directory,
        write_unit_file,
    )

    secret = secrets.token_bytes(32)
    folder = unit_directory(deployment.warehouse, tasks.name)
    path = write_unit_file(folder, tasks._shipped(deployment, unit), secret)
    env = {
        **os.environ,
        UNIT_KEY_VARIABLE: secret.hex(),
        CATALOG_URL_VARIABLE: deployment.catalog_url,
        RACE_VARIABLE: key,
    }
    code = (
        "import sys, pathlib\n"
        "sys.path.insert(0, sys.argv[2])\n"
        "import fault_hooks\n"
        "from dbspark.orchestration.units import run_unit_file\n"
        "run_unit_file(pathlib.Path(sys.argv[1]), spark=None)\n"
    )
    log = (HOOKS / "race" / key / "twin.log").open("wb")
    return subprocess.Popen(
        [sys.executable, "-c", code, str(path), str(Path(__file__).parent)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )


_install_hooks()
