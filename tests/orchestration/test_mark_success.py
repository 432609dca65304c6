"""Marking tasks "success" in Airflow never commits an incomplete epoch (issue 18,
finding 6): a stage whose input's task was marked success without running fails at once,
naming the missing unit and its task; with every unit's task marked success, the close
fails naming them all, and the epoch stays open until they run. ``dag.test``'s
``mark_success_pattern`` marks tasks success without running them, as the UI does."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from dbspark.engine.reference.full_refresh import full_refresh
from dbspark.engine.spark.executor import SparkEngine
from dbspark.orchestration.airflow.dag import circuit_of
from dbspark.orchestration.intervals import Interval
from dbspark.storage.catalog import Catalog

pytestmark = pytest.mark.slow

START = datetime(2026, 1, 1, tzinfo=UTC)


def day(n: int) -> Interval:
    return Interval(START + timedelta(days=n), START + timedelta(days=n + 1))


def run(dag, epoch: int, mark_success: str | None = None):
    dag_run = dag.test(logical_date=day(epoch).end, mark_success_pattern=mark_success)
    states = {
        ti.task_id: str(getattr(ti.state, "value", ti.state)) for ti in dag_run.get_task_instances()
    }
    return str(getattr(dag_run.state, "value", dag_run.state)), states


def test_tasks_marked_success_without_running_never_commit_the_epoch(test_dags, place, capfd):
    dag = test_dags["test_word_count"]
    circuit = circuit_of("test_word_count")
    stages = [s.name for s in SparkEngine(circuit, place.warehouse).plan.stages_in_scope(0)]
    history = [[("a", 1), ("b", 1)], [("b", 1), ("c", 2)]]
    for epoch, rows in enumerate(history):
        place.landing.land("words", day(epoch), rows, ["word", "__w"], "parquet")
    state, _ = run(dag, 0)
    assert state == "success"

    # The ingest failed and someone marked it success: its readers refuse to run.
    capfd.readouterr()
    state, tasks = run(dag, 1, mark_success=r"ingest\..*")
    assert state == "failed"
    assert tasks["ingest.words"] == "success"
    readers = [name for name in stages if name != "ingest_words"]
    assert all(tasks[name] == "failed" for name in readers), tasks
    assert tasks["close_epoch"] == "upstream_failed"
    logs = capfd.readouterr().out
    assert f"stage {readers[0]} of circuit 'word_count' cannot run at epoch 1" in logs
    assert "have not committed: ingest_words. Their tasks: ingest.words" in logs
    catalog = Catalog.for_warehouse(place.warehouse)
    assert catalog.epoch_state("word_count", 1) == "open"

    # Every task before the close marked success: the close fails, naming every unit.
    state, tasks = run(dag, 1, mark_success=r"(?!open_epoch$|close_epoch$).*")
    assert tasks["publish"] == "success" and tasks["close_epoch"] == "failed", tasks
    logs = capfd.readouterr().out
    missing = ", ".join([*stages, "publish"])
    assert f"cannot commit: planned units have not committed: {missing}" in logs
    assert "clear those tasks" in logs
    assert catalog.epoch_state("word_count", 1) == "open"
    assert catalog.last_committed_epoch("word_count") == 0

    # Run for real: the epoch commits with its input.
    state, tasks = run(dag, 1)
    assert state == "success", tasks
    assert catalog.last_committed_epoch("word_count") == 1
    catalog.close()
    inputs = [{"words": [((word,), w) for word, w in rows]} for rows in history]
    engine = SparkEngine(circuit, place.warehouse)
    assert engine.views() == full_refresh(circuit, inputs, 1)
    engine.catalog.close()
