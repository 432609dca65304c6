"""Timeouts and retries per task kind (issue 18, finding 17): every task has an
``execution_timeout`` for its kind, set in ``airflow.cfg`` or by ``build_dag``; bad
input and units that never committed fail at once, with retries left; other failures
retry, spaced so that a catalog outage of over a minute does not fail the run."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from dbspark.core.errors import InputError
from dbspark.engine.circuits import CircuitChangedError
from dbspark.examples.circuits import reachability
from dbspark.orchestration import LandingDirectory, build_dag
from dbspark.orchestration.airflow.policy import DEFAULT_TIMEOUTS, retry_window
from dbspark.orchestration.intervals import Interval
from dbspark.storage.catalog import (
    CatalogError,
    CircuitDefinitionChanged,
    UncommittedUnits,
    UnsafeCatalog,
)

START = datetime(2026, 1, 1, tzinfo=UTC)

#: The kind of each task of the reachability DAG.
KINDS = {
    "open_epoch": "open",
    "ingest.edges": "ingest",
    "ingest.roots": "ingest",
    "loop_reach.iterate": "iterate",
    "loop_reach.converged": "converged",
    "publish": "publish",
    "close_epoch": "close",
    "rebuild": "rebuild",
    "verify": "verify",
    "serve": "serve",
    "maintain": "maintain",
}


def reachability_dag(tmp_path: Path, **options):
    return build_dag(
        reachability,
        schedule="@daily",
        start_date=START,
        sources={"edges": LandingDirectory(tmp_path), "roots": LandingDirectory(tmp_path)},
        **options,
    )


def timeouts(dag) -> dict[str, timedelta]:
    found = {}
    for task in dag.tasks:
        kind = KINDS.get(task.task_id, "stage")
        assert found.setdefault(kind, task.execution_timeout) == task.execution_timeout, task
    return found


def test_every_task_has_the_timeout_of_its_kind(tmp_path: Path, monkeypatch):
    monkeypatch.delenv("AIRFLOW__DBSPARK__EXECUTION_TIMEOUTS", raising=False)
    assert timeouts(reachability_dag(tmp_path)) == DEFAULT_TIMEOUTS

    # airflow.cfg's [dbspark] execution_timeouts, then build_dag's argument over it.
    monkeypatch.setenv("AIRFLOW__DBSPARK__EXECUTION_TIMEOUTS", "ingest=4h, converged=90, close=45m")
    dag = reachability_dag(tmp_path, execution_timeouts={"close": timedelta(minutes=20)})
    assert timeouts(dag) == {
        **DEFAULT_TIMEOUTS,
        "ingest": timedelta(hours=4),
        "converged": timedelta(seconds=90),
        "close": timedelta(minutes=20),
    }


@pytest.mark.parametrize(
    "setting, message",
    [
        ("ingst=2h", r"'ingst=2h' is not <kind>=<duration> with a kind among open, ingest"),
        ("stage=soon", r"execution_timeouts in airflow.cfg, stage: 'soon' is not a duration"),
        ("stage=0", r"stage: a timeout must be positive"),
    ],
)
def test_a_bad_timeout_setting_fails_the_dag_file_naming_it(
    tmp_path: Path, monkeypatch, setting: str, message: str
):
    monkeypatch.setenv("AIRFLOW__DBSPARK__EXECUTION_TIMEOUTS", setting)
    with pytest.raises(ValueError, match=message):
        reachability_dag(tmp_path)


def test_failures_a_retry_cannot_fix_fail_at_once_and_others_retry(tmp_path: Path):
    from airflow.sdk.definitions.retry_policy import RetryAction

    dag = reachability_dag(tmp_path)
    for task in dag.tasks:
        policy = task.retry_policy
        bad_input = InputError("edges", "column 'src' is NULL in row 3", "part-0.parquet")
        assert policy.evaluate(bad_input, 1, 4).action == RetryAction.FAIL, task
        missing = UncommittedUnits("missing", ["ingest_edges"])
        assert policy.evaluate(missing, 1, 4).action == RetryAction.FAIL
        changed = CircuitDefinitionChanged("the definition of circuit 'r' changed")
        assert policy.evaluate(changed, 1, 4).action == RetryAction.FAIL
        evolved = CircuitChangedError("view 'reach' changed", evolution=None)
        assert policy.evaluate(evolved, 1, 4).action == RetryAction.FAIL
        unsafe = UnsafeCatalog("refusing a SQLite catalog: ... (nfs4)")
        assert policy.evaluate(unsafe, 1, 4).action == RetryAction.FAIL
        other = CatalogError("commit of stage 's' at 3 failed: disk I/O error")
        assert policy.evaluate(other, 1, 4).action == RetryAction.DEFAULT
        outage = sa.exc.OperationalError("SELECT 1", {}, Exception("connection refused"))
        assert policy.evaluate(outage, 1, 4).action == RetryAction.DEFAULT


def test_retries_outlast_a_catalog_outage_of_over_a_minute(tmp_path: Path):
    for task in reachability_dag(tmp_path).tasks:
        window = retry_window(
            task.retries, task.retry_delay, task.retry_exponential_backoff, task.max_retry_delay
        )
        assert window >= 180, (task.task_id, window)


@pytest.mark.slow
def test_bad_input_fails_its_task_without_the_retries_it_has(test_dags, place, capfd):
    dag = test_dags["test_word_count_retrying"]
    assert dag.get_task("ingest.words").retries == 2
    interval = Interval(START, START + timedelta(days=1))
    place.landing.land("words", interval, [(1, 1)], ["word", "__w"], "parquet")  # not a string
    capfd.readouterr()
    dag_run = dag.test(logical_date=interval.end)
    ingest = next(ti for ti in dag_run.get_task_instances() if ti.task_id == "ingest.words")
    assert str(getattr(ingest.state, "value", ingest.state)) == "failed"
    assert ingest.try_number == 1
    logs = capfd.readouterr().out
    assert "source 'words'" in logs and "bad input: a retry reads the same input" in logs


def test_storage_settings_of_airflow_cfg_reach_the_catalog(monkeypatch) -> None:
    from dbspark.orchestration.airflow.tasks import apply_storage_settings
    from dbspark.storage.catalog import SHARED_SQLITE_SETTING
    from dbspark.storage.durability import SYNC_METHOD_SETTING, sync_method

    for name in (SHARED_SQLITE_SETTING, SYNC_METHOD_SETTING):
        monkeypatch.setenv(name, "")  # so that teardown restores what was there before
        monkeypatch.delenv(name)
    monkeypatch.setenv("AIRFLOW__DBSPARK__SYNC_METHOD", "fsync")
    monkeypatch.setenv("AIRFLOW__DBSPARK__SQLITE_ON_SHARED_FILESYSTEM", "allow")
    apply_storage_settings()
    assert sync_method() == "fsync"
    assert os.environ[SHARED_SQLITE_SETTING] == "allow"
    # What the environment already says wins over airflow.cfg.
    monkeypatch.setenv(SYNC_METHOD_SETTING, "auto")
    apply_storage_settings()
    assert os.environ[SYNC_METHOD_SETTING] == "auto"
