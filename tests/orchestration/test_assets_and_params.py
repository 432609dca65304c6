"""Views as Airflow Assets and the ``verify`` / ``rebuild`` params of every dbspark DAG.

DAG runs are real (``dag.test()``: Airflow's task runner and metadata database, the
catalog in a fresh warehouse), as in ``test_dag_runs.py``; asset events are read back
from Airflow's metadata database, where the scheduler would read them. Only the
verify/rebuild test needs Spark (a full refresh); the rest run on the local tier.
"""

from __future__ import annotations

import importlib.util
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from deltalake import DeltaTable

from dbspark.core.zset import ZSet
from dbspark.examples.circuits import orders, word_count
from dbspark.orchestration import LandingDirectory, build_dag, view_asset
from dbspark.orchestration.airflow.dag import circuit_of
from dbspark.orchestration.airflow.tasks import maintenance_of
from dbspark.orchestration.airflow.ui.status import rebuild_run, task_of_stage
from dbspark.orchestration.intervals import Interval
from dbspark.orchestration.sinks.files import CHANGES, output_dir, read_change_rows
from dbspark.orchestration.sinks.tables import (
    TableError,
    read_table,
    table_path,
    table_versions,
)
from dbspark.storage.catalog import Catalog

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
START = datetime(2026, 1, 1, tzinfo=UTC)


def day(n: int) -> Interval:
    return Interval(START + timedelta(days=n), START + timedelta(days=n + 1))


def run(dag, epoch: int, **conf):
    """One DAG run for ``epoch``'s interval with ``conf`` as its params; returns its state
    and its task instances' states."""
    dag_run = dag.test(logical_date=day(epoch).end, run_conf=conf or None)
    states = {
        ti.task_id: str(getattr(ti.state, "value", ti.state)) for ti in dag_run.get_task_instances()
    }
    return str(getattr(dag_run.state, "value", dag_run.state)), states


def asset_events(dag_id: str, after: int = 0) -> list[tuple[int, str, dict]]:
    """(id, asset URI, extra) of the events a DAG's runs emitted after event ``after``,
    oldest first (other test files run the same test DAGs in this metadata database)."""
    from airflow import settings
    from airflow.models.asset import AssetEvent, AssetModel
    from sqlalchemy import select

    query = (
        select(AssetEvent.id, AssetModel.uri, AssetEvent.extra)
        .join(AssetModel, AssetModel.id == AssetEvent.asset_id)
        .where(AssetEvent.source_dag_id == dag_id, AssetEvent.id > after)
        .order_by(AssetEvent.id)
    )
    with settings.Session() as session:
        return [(id_, uri, dict(extra)) for id_, uri, extra in session.execute(query)]


def last_run_id(dag_id: str) -> str:
    from airflow import settings
    from airflow.models.dagrun import DagRun
    from sqlalchemy import select

    query = select(DagRun.run_id).where(DagRun.dag_id == dag_id).order_by(DagRun.id.desc())
    with settings.Session() as session:
        return session.execute(query.limit(1)).scalar_one()


def last_event(dag_id: str) -> int:
    return max((id_ for id_, _, _ in asset_events(dag_id)), default=0)


def load_downstream_example():
    path = REPO / "dags" / "region_totals_report.py"
    spec = importlib.util.spec_from_file_location("region_totals_report_example", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ============================================================================ structure (no run)
def test_every_dag_has_typed_params_and_publishes_its_views_as_assets():
    from airflow.serialization.serialized_objects import DagSerialization

    landing = LandingDirectory("/tmp/landing")
    dag = build_dag(
        word_count,
        dag_id="params_word_count",
        schedule="@daily",
        start_date=START,
        sources={"words": landing},
        params={"note": "kept"},
    )
    # What the trigger form reads: the DAG as the scheduler stores it.
    stored = DagSerialization.deserialize_dag(DagSerialization.serialize_dag(dag))
    verify = stored.params.get_param("verify")
    assert verify.value is False and verify.schema["type"] == "boolean"
    assert "full refresh" in verify.description
    rebuild = stored.params.get_param("rebuild")
    assert rebuild.value == []
    assert rebuild.schema["type"] == ["array", "null"]  # the form sends null when cleared
    assert rebuild.schema["items"] == {"type": "string", "enum": ["counts", "distinct_words"]}
    assert rebuild.schema["examples"] == ["counts", "distinct_words"]  # a multi-select
    assert stored.params["note"] == "kept"
    # A scheduled run takes the defaults: neither verify nor rebuild.
    assert maintenance_of(circuit_of("params_word_count"), dag.dag_id, dict(dag.params)) == (
        maintenance_of(word_count(), dag.dag_id, {})
    )
    assert not maintenance_of(word_count(), dag.dag_id, {"rebuild": None}).rebuild

    publish = dag.get_task("publish")
    assert publish.outlets == [
        view_asset(word_count, "counts"),
        view_asset("word_count", "distinct_words"),
    ]
    assert [a.uri for a in publish.outlets] == [
        "dbspark://word_count/counts",
        "dbspark://word_count/distinct_words",
    ]
    # close_epoch branches to the maintenance tasks a run asks for; the scheduler skips
    # the others without starting them.
    for task_id, upstream in (("rebuild", {"close_epoch"}), ("verify", {"close_epoch", "rebuild"})):
        task = dag.get_task(task_id)
        assert task.upstream_task_ids == upstream
        assert task.trigger_rule == "none_failed" and task.depends_on_past is False
    assert dag.get_task("close_epoch").task_type == "_BranchPythonDecoratedOperator"
    assert maintenance_of(word_count(), dag.dag_id, {}).tasks == []
    asked = maintenance_of(word_count(), dag.dag_id, {"verify": True, "rebuild": ["counts"]})
    assert asked.tasks == ["rebuild", "verify"]
    assert maintenance_of(word_count(), dag.dag_id, {"verify": True}).tasks == ["verify"]

    with pytest.raises(ValueError, match=r"params \['verify'\] are dbspark's own"):
        build_dag(
            word_count,
            schedule="@daily",
            start_date=START,
            sources={"words": landing},
            params={"verify": 1},
        )
    with pytest.raises(ValueError, match=r"circuit 'orders' has no view 'totals'.*region_totals"):
        view_asset(orders, "totals")


def test_an_unknown_view_to_rebuild_fails_naming_it_before_anything_is_written(test_dags, place):
    from airflow.sdk.definitions.param import ParamValidationError

    dag = test_dags["test_word_count"]
    # Airflow refuses it when the run is created (trigger form, API, dag.test) ...
    with pytest.raises(ParamValidationError, match="'nope' is not one of"):
        dag.test(logical_date=day(0).end, run_conf={"rebuild": ["nope"]})
    # ... and the open task names the DAG and the views for a conf Airflow let through
    # (one accepted by an older version of the DAG).
    with pytest.raises(ValueError) as refused:
        maintenance_of(
            circuit_of("test_word_count"), "test_word_count", {"rebuild": ["counts", "nope"]}
        )
    assert str(refused.value) == (
        "DAG 'test_word_count': param 'rebuild' names 'nope', not a view of circuit "
        "'word_count' (its views: counts, distinct_words); nothing was written"
    )
    assert not place.warehouse.exists()


# ============================================================================ asset events
def rows_of(table) -> list[str]:
    return sorted(map(str, table.to_pylist()))


def test_publish_emits_one_event_per_view_with_the_epochs_change(test_dags, place, monkeypatch):
    # The tables' settings from [dbspark] in airflow.cfg: housekeeping after every
    # epoch, keeping no old file, so the view as of epoch 0 is gone after epoch 1.
    monkeypatch.setenv("AIRFLOW__DBSPARK__TABLE_MAINTAIN_EVERY", "1")
    monkeypatch.setenv("AIRFLOW__DBSPARK__TABLE_RETENTION_HOURS", "0")
    dag = test_dags["test_orders"]
    circuit = circuit_of("test_orders")
    customers = ["cust_id", "region", "ts", "deleted"]
    order_columns = ["order_id", "cust_id", "amount", "ts", "deleted_at"]
    place.landing.land(
        "customers", day(0), [(1, "EU", 1, False), (2, "US", 1, False)], customers, "parquet"
    )
    place.landing.land(
        "orders", day(0), [(10, 1, 5, 1, None), (11, 2, 7, 1, None)], order_columns, "parquet"
    )
    place.landing.land("customers", day(1), [(2, "EU", 2, False)], customers, "parquet")  # US -> EU
    place.landing.complete("orders", day(1))  # no orders arrived on day 1

    for epoch in (0, 1):
        mark = last_event(dag.dag_id)
        state, tasks = run(dag, epoch)
        assert state == "success", tasks
        # A scheduled run's defaults: no rebuild, no verification.
        assert tasks["rebuild"] == tasks["verify"] == "skipped"
        events = {uri: extra for _, uri, extra in asset_events(dag.dag_id, mark)}
        assert set(events) == {f"dbspark://orders/{v}" for v in circuit.views}
        for uri, extra in events.items():
            view = uri.rsplit("/", 1)[1]
            schema = circuit.node(circuit.views[view]).schema
            feed = output_dir(place.outputs, "orders", view, CHANGES, epoch)
            change = ZSet(read_change_rows(feed, schema))
            table = table_path(place.outputs, "orders", view)
            assert extra == {
                "circuit": "orders",
                "view": view,
                "epoch": epoch,
                "data_interval_start": day(epoch).start.isoformat(),
                "data_interval_end": day(epoch).end.isoformat(),
                "rows_changed": len(change),
                "rows_inserted": sum(w for _, w in change.items() if w > 0),
                "rows_deleted": -sum(w for _, w in change.items() if w < 0),
                "table": str(table),
                "table_version": table_versions(table)[epoch],
                "changes": str(feed),
            }
            # The event's version is the view as of its epoch.
            at_version = DeltaTable(str(table), version=extra["table_version"])
            assert rows_of(at_version.to_pyarrow_table()) == rows_of(read_table(table, epoch))
    totals = events["dbspark://orders/region_totals"]
    # The settings reached the publish: epoch 0's files of region_totals, which epoch
    # 1 rewrote, were vacuumed.
    with pytest.raises(TableError, match="vacuumed"):
        read_table(table_path(place.outputs, "orders", "region_totals"), 0)
    # Epoch 1 moved customer 2 and its order from US to EU: EU's row replaced, US's gone.
    assert (totals["rows_inserted"], totals["rows_deleted"]) == (1, 2)

    # A run for a committed epoch skips publish: no second event for epoch 1.
    mark = last_event(dag.dag_id)
    state, tasks = run(dag, 1)
    assert state == "success" and tasks["publish"] == "skipped"
    assert asset_events(dag.dag_id, mark) == []

    # The example downstream DAG reads what the event points at.
    example = load_downstream_example()
    text = example.describe_change(totals)
    assert text.splitlines()[0] == (
        f"epoch 1 [{day(1).start.isoformat()}, {day(1).end.isoformat()}): "
        "+1/-2 rows of region_totals"
    )
    assert "-1 {'region': 'US'" in text and "+1 {'region': 'EU'" in text


def test_the_example_downstream_dag_is_scheduled_on_the_published_view():
    """As the scheduler stores it: an asset-triggered timetable on the view's asset,
    which the producing DAG's publish task updates."""
    from airflow.dag_processing.dagbag import DagBag
    from airflow.serialization.definitions.assets import SerializedAsset
    from airflow.serialization.serialized_objects import DagSerialization
    from airflow.timetables.simple import AssetTriggeredTimetable

    bag = DagBag(str(REPO / "dags"))
    assert bag.import_errors == {}
    stored = DagSerialization.deserialize_dag(
        DagSerialization.serialize_dag(bag.dags["region_totals_report"])
    )
    assert isinstance(stored.timetable, AssetTriggeredTimetable)
    condition = stored.timetable.asset_condition
    assert isinstance(condition, SerializedAsset)
    assert (condition.name, condition.uri) == ("dbspark://orders/region_totals",) * 2
    asset = view_asset(orders, "region_totals")
    assert asset in bag.dags["dbspark_orders_by_region"].get_task("publish").outlets


# ============================================================================ verify / rebuild
def test_verify_passes_on_correct_views_fails_naming_a_damaged_one_and_rebuild_repairs_it(
    test_dags, place, spark, capfd
):
    from dbspark.engine.spark.executor import SparkEngine

    dag = test_dags["test_word_count"]
    place.landing.land("words", day(0), [("a", 1), ("b", 1), ("a", 1)], ["word", "__w"], "parquet")
    state, tasks = run(dag, 0, verify=True)
    assert state == "success", tasks
    assert tasks["verify"] == "success" and tasks["rebuild"] == "skipped"

    # Damage the published view behind the engine's back (as the engine's own verify test
    # does): one bogus committed row in the view's storage.
    engine = SparkEngine(circuit_of("test_word_count"), place.warehouse, spark=spark)
    bogus = spark.createDataFrame(
        [("zebra", 1, 1, 0)], "word string, n bigint, __w bigint, __epoch bigint"
    )
    engine.catalog.commit(
        "word_count", "damage", (0,), [engine.traces.write("view.counts", bogus, (0,))]
    )
    engine.catalog.close()

    place.landing.land("words", day(1), [("b", -1)], ["word", "__w"], "parquet")
    capfd.readouterr()
    state, tasks = run(dag, 1, verify=True)
    assert state == "failed"
    assert tasks["close_epoch"] == "success" and tasks["verify"] == "failed"
    logs = capfd.readouterr().out
    assert (
        "DAG 'test_word_count', circuit 'word_count', epoch 1: views counts differ from a "
        "full refresh over the input log" in logs
    )
    assert "('zebra', 1) weight(full refresh - maintained) = -1" in logs
    assert "rebuild=['counts']" in logs

    # The same interval again, asking to rebuild the damaged view: the epoch is committed,
    # so publish skips (no event), then rebuild replaces the view and verify passes.
    mark = last_event(dag.dag_id)
    state, tasks = run(dag, 1, rebuild=["counts"], verify=True)
    assert state == "success", tasks
    assert tasks["publish"] == "skipped"
    assert tasks["rebuild"] == tasks["verify"] == "success"
    assert asset_events(dag.dag_id, mark) == []
    catalog = Catalog.for_warehouse(place.warehouse)
    assert catalog.last_committed_epoch("word_count") == 1
    catalog.close()
    engine = SparkEngine(circuit_of("test_word_count"), place.warehouse, spark=spark)
    assert engine.view("counts") == ZSet({("a", 2): 1})
    # The rebuild's commit names the run and its task, for the dbspark page.
    [stage] = [s for s, _ in engine.catalog.stage_runs("word_count", epoch=1) if "rebuild" in s]
    assert task_of_stage(stage) == "rebuild"
    assert rebuild_run(stage) == (dag.dag_id, last_run_id(dag.dag_id))
    engine.catalog.close()

    # The engine's view was wrong, its outputs right: the rebuild changed none of them.
    table = table_path(place.outputs, "word_count", "counts")
    assert rows_of(read_table(table)) == ["{'word': 'a', 'n': 2, '__copies': 1}"]
    assert not (place.outputs / "word_count" / "counts" / "corrections").exists()

    # Now the table loses its row behind dbspark's back: a rebuild repairs the table,
    # and only the table, and says so in an event of the view's asset.
    DeltaTable(str(table)).delete("word = 'a'")
    mark = last_event(dag.dag_id)
    state, tasks = run(dag, 1, rebuild=["counts"])
    assert state == "success", tasks
    assert rows_of(read_table(table)) == ["{'word': 'a', 'n': 2, '__copies': 1}"]
    assert rows_of(read_table(table, 1)) == ["{'word': 'a', 'n': 2, '__copies': 1}"]
    [(_, uri, extra)] = asset_events(dag.dag_id, mark)
    assert uri == "dbspark://word_count/counts"
    assert extra == {
        "circuit": "word_count",
        "view": "counts",
        "epoch": 1,
        "rebuild": True,
        "correction": None,  # the change feed was right
        "rows_inserted": 0,
        "rows_deleted": 0,
        "table": str(table),
        "table_version": DeltaTable(str(table)).version(),
        "table_rows_inserted": 1,
        "table_rows_updated": 0,
        "table_rows_deleted": 0,
    }
