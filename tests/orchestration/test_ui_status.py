"""What the dbspark page of the Airflow UI shows, read from a real catalog: a reachability
circuit run epoch by epoch by the engine (local tier, no Spark job), its runs recorded
as the open task records them. The page's app, its authentication and real DAG runs
are tested in ``test_ui_page.py``."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from urllib.parse import quote

import pytest

from dbspark.engine.spark.executor import SparkEngine
from dbspark.examples.circuits import reachability
from dbspark.orchestration import LandingDirectory, build_dag
from dbspark.orchestration.airflow.ui import render
from dbspark.orchestration.airflow.ui.status import (
    AirflowLinks,
    circuit_status,
    summarize,
    task_of_stage,
)
from dbspark.orchestration.intervals import Interval

START = datetime(2026, 1, 1, tzinfo=UTC)
DAG_ID = "dbspark_reach"
LINKS = AirflowLinks("/airflow/")


def day(n: int) -> Interval:
    return Interval(START + timedelta(days=n), START + timedelta(days=n + 1))


def run_id(n: int) -> str:
    return f"scheduled__{day(n).start.isoformat()}"


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    """Epoch 0: a chain a->b->c->d from root a. Epoch 1: a->b deleted, d->e added, no
    roots. Epoch 2 opened and left open, as a failed run leaves it."""
    engine = SparkEngine(reachability(), tmp_path_factory.mktemp("warehouse"))
    batches = [
        {"edges": [(("a", "b"), 1), (("b", "c"), 1), (("c", "d"), 1)], "roots": [(("a",), 1)]},
        {"edges": [(("a", "b"), -1), (("d", "e"), 1)]},
    ]
    for n, batch in enumerate(batches):
        engine.open_epoch(n, day(n).label)
        engine.catalog.record_epoch_run("reachability", n, DAG_ID, run_id(n))
        engine.run_epoch(n, batch)
    engine.open_epoch(2, day(2).label)
    engine.catalog.record_epoch_run("reachability", 2, DAG_ID, run_id(2))
    yield engine
    engine.catalog.close()


@pytest.fixture(scope="module")
def status(engine):
    return circuit_status(engine.catalog, "reachability", LINKS)


def test_every_epoch_with_its_interval_state_and_duration(engine, status):
    assert [e.epoch for e in status.epochs] == [2, 1, 0]  # newest first
    recorded = {r.epoch: r for r in engine.catalog.epochs("reachability")}
    for shown in status.epochs:
        assert (shown.interval_start, shown.interval_end) == (
            day(shown.epoch).start,
            day(shown.epoch).end,
        )
        record = recorded[shown.epoch]
        assert shown.state == record.state
        if shown.epoch < 2:
            assert shown.state == "committed"
            spent = record.committed_at - record.opened_at
            assert shown.duration_seconds == pytest.approx(spent.total_seconds())
            assert shown.duration_seconds >= 0
    assert (status.epochs[0].state, status.epochs[0].duration_seconds) == ("open", None)


def test_rows_in_per_source_and_rows_changed_per_view(status):
    by_epoch = {e.epoch: e for e in status.epochs}
    assert status.sources == ["edges", "roots"] and status.views == ["reach"]
    # The batches as landed; an ingest of no batch is zero rows, not missing.
    assert by_epoch[0].rows_in == {"edges": 3, "roots": 1}
    assert by_epoch[1].rows_in == {"edges": 2, "roots": 0}
    # reach = {a, b, c, d}; then b, c and d are no longer reachable (e never was).
    assert by_epoch[0].rows_changed == {"reach": 4}
    assert by_epoch[1].rows_changed == {"reach": 3}
    # Nothing ingested or published yet in the open epoch.
    assert by_epoch[2].rows_in == {} and by_epoch[2].rows_changed == {}


def test_each_loop_iteration_delta_as_the_catalog_recorded_it(engine, status):
    (loop,) = status.loops
    assert loop.name == "reach"
    assert [run.prefix for run in loop.runs] == [(0,), (1,)]
    for run in loop.runs:
        recorded = engine.catalog.loop_iterations("reachability", "reach", run.prefix)
        assert [(i.iteration, i.delta_rows) for i in run.iterations] == [
            (r.iteration, r.delta_rows) for r in recorded
        ]
        assert run.converged and run.iterations[-1].delta_rows == 0
        assert "converged" in run.iterations[-1].reason
    # The first iteration of epoch 0 adds b (reached from a over a->b), one row.
    assert loop.runs[0].iterations[0].delta_rows >= 1


def test_trace_sizes_and_frontiers_add_up_the_catalog_batches(engine, status):
    batches = engine.catalog.all_batches("reachability")
    for c in status.collections:
        mine = [b for b in batches if b.collection == c.collection]
        live = [b for b in mine if b.live]
        old = [b for b in mine if not b.live]
        assert (c.live_batches, c.live_rows, c.live_bytes) == (
            len(live),
            sum(b.rows for b in live),
            sum(b.bytes for b in live),
        ), c.collection
        assert (c.superseded_batches, c.superseded_rows) == (
            len(old),
            sum(b.rows for b in old),
        ), c.collection
        assert c.frontier == engine.catalog.frontier("reachability", c.collection)
    assert {c.collection for c in status.collections} == {b.collection for b in batches}
    roles = {c.collection: c.role for c in status.collections}
    assert roles["view.reach"] == "view reach (published changes)"
    edges = engine.circuit.sources["edges"]
    assert roles[f"n{edges}.input"] == "input log of source edges"
    # Compaction of the loop's traces left superseded batches and a frontier behind.
    assert any(c.superseded_batches and c.frontier for c in status.collections)


def test_links_go_to_the_runs_and_the_tasks_of_the_dag(engine, status, tmp_path):
    dag = build_dag(
        reachability,
        dag_id=DAG_ID,
        schedule="@daily",
        start_date=START,
        sources={"edges": LandingDirectory(tmp_path), "roots": LandingDirectory(tmp_path)},
    )
    by_epoch = {e.epoch: e for e in status.epochs}
    run = f"/airflow/dags/{DAG_ID}/runs/{quote(run_id(1), safe='')}"
    assert [(link.label, link.url) for link in by_epoch[1].runs] == [(run_id(1), run)]
    tasks = [link.label for link in by_epoch[1].task_logs]
    assert tasks[0] == "open_epoch" and tasks[-1] == "close_epoch"
    assert {"ingest.edges", "ingest.roots", "loop_reach.iterate", "publish"} <= set(tasks)
    assert set(tasks) <= set(dag.task_ids), set(tasks) - set(dag.task_ids)
    urls = {link.label: link.url for link in by_epoch[1].task_logs}
    assert urls["publish"] == f"{run}/tasks/publish"
    assert urls["loop_reach.iterate"] == f"{run}/tasks/loop_reach.iterate/mapped"
    # The open epoch only opened: no close, no stage yet.
    assert [link.label for link in by_epoch[2].task_logs] == ["open_epoch"]
    # Every stage the engine committed names a task of the DAG (or none: a rebuild).
    for stage, _ in engine.catalog.stage_runs("reachability"):
        assert task_of_stage(stage) in dag.task_ids, stage


def test_the_newest_epochs_only_when_asked_for_fewer(engine):
    status = circuit_status(engine.catalog, "reachability", LINKS, limit=1)
    assert [e.epoch for e in status.epochs] == [2]
    assert status.summary.epochs == 3 and status.loops == []
    summary = summarize(engine.catalog, "reachability", LINKS)
    assert (summary.last_committed_epoch, summary.open_epochs) == (1, [2])
    assert [d.url for d in summary.dags] == [f"/airflow/dags/{DAG_ID}"]


def test_the_html_shows_the_tables_and_one_plotted_line_per_epoch(status):
    html = render.circuit_page(status, "SQLite in the warehouse", "/dbspark/", "/dbspark/json")
    assert "<h1>circuit reachability</h1>" in html
    for head in ("rows in: edges", "rows in: roots", "rows changed: reach"):
        assert f"<th>{head}</th>" in html
    (plot,) = re.findall(r"<svg.*?</svg>", html, flags=re.S)
    lines = re.findall(r'<polyline[^>]*points="([^"]*)"', plot)
    (loop,) = status.loops
    assert [len(points.split()) for points in lines] == [
        len(run.iterations) for run in sorted(loop.runs, key=lambda r: r.prefix, reverse=True)
    ]
    # Links into the Airflow UI are marked for the frame's link handler; text is escaped.
    assert f'href="/airflow/dags/{DAG_ID}/runs/' in html and "data-airflow-ui" in html
    # Nothing is fetched from elsewhere when the page is shown.
    assert not re.search(r'(src|href)="(https?:)?//', html)


def test_values_from_the_catalog_are_escaped(tmp_path):
    engine = SparkEngine(reachability(), tmp_path / "warehouse")
    engine.open_epoch(0, "<b>by hand</b>")
    status = circuit_status(engine.catalog, "reachability", LINKS)
    html = render.circuit_page(status, "x", "/", "/json")
    assert "&lt;b&gt;by hand&lt;" in html and "<b>" not in html
    assert status.epochs[0].interval_start is None  # not an interval: shown as it is
    engine.catalog.close()


def test_a_rebuild_links_to_the_task_log_of_the_run_that_asked(tmp_path):
    from dbspark.storage import collection_names as coll

    engine = SparkEngine(reachability(), tmp_path)
    engine.open_epoch(0, day(0).label)
    engine.catalog.record_epoch_run("reachability", 0, DAG_ID, run_id(0))
    engine.run_epoch(0, {"edges": [(("a", "b"), 1)], "roots": [(("a",), 1)]})
    # A later run, for another epoch, rebuilt the view at epoch 0; and the command line
    # rebuilt it too, in no run.
    asked = f"manual__{day(5).start.isoformat()}"
    by_run = coll.rebuild_stage("reach", "0a1b2c3d", f"{DAG_ID}/{asked}")
    by_hand = coll.rebuild_stage("reach", "4e5f6a7b")
    for stage in (by_run, by_hand):
        engine.catalog.commit("reachability", stage, (0,), [])
    assert task_of_stage(by_run) == "rebuild" and task_of_stage(by_hand) is None
    [epoch] = circuit_status(engine.catalog, "reachability", LINKS).epochs
    links = [(link.label, link.url) for link in epoch.task_logs]
    assert links[-1] == (
        "rebuild",
        f"/airflow/dags/{DAG_ID}/runs/{quote(asked, safe='')}/tasks/rebuild",
    )
    assert [label for label, _ in links].count("rebuild") == 1
    engine.catalog.close()
