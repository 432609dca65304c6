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
    assert set(example_dags) == {
        "dbspark_orders_by_region",
        "dbspark_reachability",
        "dbspark_orders_sql",
        "dbspark_reachable_sql",
        "region_totals_report",  # downstream of a view's asset, not a circuit
    }


def _upstream(dag, task_id):
    return set(dag.get_task(task_id).upstream_task_ids)


def test_orders_dag_follows_the_plan(example_dags):
    dag = example_dags["dbspark_orders_by_region"]
    assert {t.task_id for t in dag.tasks} == {
        "open_epoch",
        "ingest.customers",
        "ingest.orders",
        "join_6",
        "aggregate_7",
        "publish",
        "close_epoch",
        "rebuild",
        "verify",
        "serve",
        "maintain",
    }
    assert dag.max_active_runs == 1
    assert dag.catchup is False  # Airflow 3's default: a backfill is a choice
    assert type(dag.timetable).__name__ == "CronDataIntervalTimetable"
    # After the epoch, rebuild, verify, serve and maintain must not wait for the last
    # run's (a failed verification or serving table would block every later epoch).
    assert {t.task_id for t in dag.tasks if not t.depends_on_past} == {
        "rebuild",
        "verify",
        "serve",
        "maintain",
    }
    assert _upstream(dag, "ingest.orders") == {"open_epoch"}
    assert _upstream(dag, "join_6") == {"ingest.customers", "ingest.orders"}
    assert _upstream(dag, "aggregate_7") == {"join_6"}
    assert _upstream(dag, "publish") >= {"aggregate_7", "ingest.customers"}
    assert _upstream(dag, "close_epoch") == {"publish"}
    assert _upstream(dag, "rebuild") == {"close_epoch"}
    assert _upstream(dag, "verify") == {"close_epoch", "rebuild"}  # close_epoch branches
    # serve also applies what a rebuild of the run corrected
    assert _upstream(dag, "serve") == {"close_epoch", "rebuild"}
    assert _upstream(dag, "maintain") == {"close_epoch"}
    assert dag.get_task("serve").trigger_rule == "none_failed_min_one_success"
    assert [a.name for a in dag.get_task("rebuild").outlets] == ["dbspark-rebuild:orders"]
    assert set(dag.task_group.children) == {
        "open_epoch",
        "ingest",
        "join_6",
        "aggregate_7",
        "publish",
        "close_epoch",
        "rebuild",
        "verify",
        "serve",
        "maintain",
    }


@pytest.mark.parametrize(
    "dag_id",
    [
        "dbspark_orders_by_region",
        "dbspark_reachability",
        "dbspark_orders_sql",
        "dbspark_reachable_sql",
    ],
)
def test_the_graph_view_can_draw_every_example_dag(example_dags, dag_id):
    """What the api-server's ``/ui/structure/structure_data`` computes, on the DAG as the
    scheduler stores it: groups collapsed to nodes must not form a cycle, or the Graph
    view answers 500 (an ``epoch`` group holding both ``open`` and ``close`` did)."""
    from airflow.api_fastapi.core_api.services.ui.task_group import task_group_to_dict
    from airflow.serialization.serialized_objects import DagSerialization
    from airflow.utils.dag_edges import dag_edges

    stored = DagSerialization.deserialize_dag(DagSerialization.serialize_dag(example_dags[dag_id]))
    group_dict: dict = {}
    nodes = [
        task_group_to_dict(child, group_dict=group_dict)
        for child in stored.task_group.topological_sort(group_dict=group_dict)
    ]
    ids = [node["id"] for node in nodes]
    assert ids[0] == "open_epoch" and ids[-5] == "close_epoch"
    assert set(ids[-4:]) == {"rebuild", "verify", "serve", "maintain"}
    assert dag_edges(stored)


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
    assert _upstream(dag, "leave_9") == {"loop_reach.converged"}
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
