"""The DAG files import cleanly and build the graph the plan describes (no Spark)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from dbspark.examples.circuits import orders, reachability
from dbspark.orchestration import LandingDirectory, build_dag

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def example_dags():
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(str(REPO / "dags"))
    assert bag.import_errors == {}
    return bag.dags


def test_the_example_dag_files_import_without_errors(example_dags):
    assert set(example_dags) == {"dbspark_orders_by_region", "dbspark_reachability"}


def _upstream(dag, task_id):
    return set(dag.get_task(task_id).upstream_task_ids)


def test_orders_dag_follows_the_plan(example_dags):
    dag = example_dags["dbspark_orders_by_region"]
    assert {t.task_id for t in dag.tasks} == {
        "epoch.open",
        "ingest.customers",
        "ingest.orders",
        "stages.join_6",
        "stages.aggregate_7",
        "publish",
        "epoch.close",
    }
    assert dag.max_active_runs == 1
    assert dag.catchup is True
    assert type(dag.timetable).__name__ == "CronDataIntervalTimetable"
    assert all(t.depends_on_past for t in dag.tasks)
    assert _upstream(dag, "ingest.orders") == {"epoch.open"}
    assert _upstream(dag, "stages.join_6") == {"ingest.customers", "ingest.orders"}
    assert _upstream(dag, "stages.aggregate_7") == {"stages.join_6"}
    assert _upstream(dag, "publish") >= {"stages.aggregate_7", "ingest.customers"}
    assert _upstream(dag, "epoch.close") == {"publish"}
    assert {g for g in dag.task_group.children} >= {"epoch", "ingest", "stages"}


def test_reachability_dag_maps_the_loop_and_checks_it(example_dags):
    dag = example_dags["dbspark_reachability"]
    iterate = dag.get_task("loop_reach.iterate")
    converged = dag.get_task("loop_reach.converged")
    from airflow.sdk.definitions.mappedoperator import MappedOperator

    assert isinstance(iterate, MappedOperator)  # dynamically mapped
    assert iterate.max_active_tis_per_dagrun == 1  # the catalog orders iterations
    assert converged.trigger_rule == "none_failed"  # runs after skipped iterations
    assert _upstream(dag, "loop_reach.iterate") == {"ingest.edges", "ingest.roots"}
    assert _upstream(dag, "loop_reach.converged") == {"loop_reach.iterate"}
    assert _upstream(dag, "stages.leave_9") == {"loop_reach.converged"}
    assert "loop_reach" in dag.task_group.children


def test_every_source_needs_a_connector():
    landing = LandingDirectory("/tmp/landing")
    with pytest.raises(ValueError, match=r"missing \['roots'\]"):
        build_dag(
            reachability,
            schedule="@daily",
            start_date=datetime(2026, 1, 1, tzinfo=UTC),
            sources={"edges": landing},
        )
    with pytest.raises(ValueError, match=r"unknown \['nodes'\]"):
        build_dag(
            reachability,
            schedule="@daily",
            start_date=datetime(2026, 1, 1, tzinfo=UTC),
            sources={"edges": landing, "roots": landing, "nodes": landing},
        )


def test_start_date_needs_a_time_zone_and_timedelta_schedules_are_intervals():
    landing = LandingDirectory("/tmp/landing")
    sources = {"customers": landing, "orders": landing}
    with pytest.raises(ValueError, match="time zone"):
        build_dag(orders, schedule="@daily", start_date=datetime(2026, 1, 1), sources=sources)
    dag = build_dag(
        orders,
        dag_id="hourly_orders",
        schedule=timedelta(hours=1),
        start_date=datetime(2026, 1, 1, tzinfo=UTC),
        sources=sources,
    )
    assert type(dag.timetable).__name__ == "DeltaDataIntervalTimetable"
