"""Example circuits run as Airflow DAG runs (``dag.test()``: Airflow's own task runner,
task instances and metadata database, in this process), epoch after epoch, checked
against the reference engine's full refresh of everything landed so far."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from dbspark.core.zset import ZSet
from dbspark.engine.reference.full_refresh import full_refresh
from dbspark.orchestration.airflow.dag import circuit_of
from dbspark.orchestration.intervals import Interval
from dbspark.orchestration.sinks.files import CHANGES, output_dir, read_change_rows
from dbspark.orchestration.sinks.tables import table_path, table_rows
from dbspark.storage.catalog import Catalog

pytestmark = pytest.mark.slow

START = datetime(2026, 1, 1, tzinfo=UTC)


def day(n: int) -> Interval:
    return Interval(START + timedelta(days=n), START + timedelta(days=n + 1))


@pytest.fixture
def place(place, spark):
    """The folder's ``place``, with Spark up: these runs compare with full refresh."""
    return place


def run(dag, epoch: int):
    """One DAG run for the data interval of ``epoch`` (a manual run covers the interval
    that ends at its logical date); returns it with its task instances' states."""
    dag_run = dag.test(logical_date=day(epoch).end)
    states = {
        (ti.task_id, ti.map_index): str(getattr(ti.state, "value", ti.state))
        for ti in dag_run.get_task_instances()
    }
    return str(getattr(dag_run.state, "value", dag_run.state)), states


def published(place, circuit, view: str, epoch: int) -> ZSet:
    """The view as of ``epoch``, read from its published Delta table."""
    schema = circuit.node(circuit.views[view]).schema
    return ZSet(table_rows(table_path(place.outputs, circuit.name, view), schema, epoch))


def published_change(place, circuit, view: str, epoch: int) -> ZSet:
    """The change directory of ``epoch``."""
    schema = circuit.node(circuit.views[view]).schema
    where = output_dir(place.outputs, circuit.name, view, CHANGES, epoch)
    return ZSet(read_change_rows(where, schema))


def check_against_full_refresh(place, circuit, history, epoch):
    expected = full_refresh(circuit, history, epoch)
    for view in circuit.views:
        assert published(place, circuit, view, epoch) == expected[view], view
        before = full_refresh(circuit, history, epoch - 1)[view] if epoch else ZSet()
        assert published_change(place, circuit, view, epoch) == expected[view] - before, view
        # The table replaces the whole-view snapshot, which publish no longer writes.
        assert not (place.outputs / circuit.name / view / "snapshot").exists(), view


def test_reachability_epochs_with_edge_deletions_equal_full_refresh(test_dags, place):
    dag = test_dags["test_reachability"]
    circuit = circuit_of("test_reachability")
    batches = [
        {
            "edges": [(("a", "b"), 1), (("b", "c"), 1), (("c", "a"), 1), (("c", "d"), 1)],
            "roots": [(("a",), 1)],
        },
        # Deleting a->b: the cycle b->c->a must not keep b, c and d reachable.
        {"edges": [(("a", "b"), -1), (("d", "e"), 1)]},
        {"roots": [(("c",), 1)]},  # no edge files at all this interval
    ]
    history = []
    for epoch, batch in enumerate(batches):
        for source, rows in batch.items():
            columns = [*circuit.node(circuit.sources[source]).schema.names, "__w"]
            flat = [(*row, weight) for row, weight in rows]
            place.landing.land(source, day(epoch), flat, columns, "parquet")
        for source in circuit.sources:  # complete, even where nothing arrived
            place.landing.complete(source, day(epoch))
        history.append(batch)
        state, tasks = run(dag, epoch)
        assert state == "success", tasks
        iterations = [s for (task, _), s in tasks.items() if task == "loop_reach.iterate"]
        # One mapped instance per iteration slot; those after convergence skip.
        assert len(iterations) == 6 and "skipped" in iterations, iterations
        check_against_full_refresh(place, circuit, history, epoch)
    reach = published(place, circuit, "reach", 2)
    assert reach == ZSet({("a",): 1, ("c",): 1, ("d",): 1, ("e",): 1, ("b",): 0})

    catalog = Catalog.for_warehouse(place.warehouse)
    batches_before = len(catalog.all_batches(circuit.name))
    # A run for a committed epoch is a no-op: every task skips, nothing is written.
    state, tasks = run(dag, 1)
    assert state == "success"
    assert set(tasks.values()) == {"skipped"}, tasks
    assert len(catalog.all_batches(circuit.name)) == batches_before
    assert catalog.last_committed_epoch(circuit.name) == 2
    catalog.close()


def test_bad_input_fails_its_ingest_task_and_the_fixed_input_completes_the_epoch(
    test_dags, place, capfd
):
    dag = test_dags["test_orders"]
    circuit = circuit_of("test_orders")
    customers = ["cust_id", "region", "ts", "deleted"]
    orders = ["order_id", "cust_id", "amount", "ts", "deleted_at"]
    place.landing.land(
        "customers", day(0), [(1, "EU", 1, False), (2, "US", 1, False)], customers, "jsonl"
    )
    place.landing.land(
        "orders", day(0), [(10, 1, 5, 1, None), (11, 2, 7, 1, None)], orders, "jsonl"
    )
    state, _ = run(dag, 0)
    assert state == "success"

    # Epoch 1: customer 2 is deleted, but the orders file has a broken line.
    place.landing.land("customers", day(1), [(2, "US", 2, True)], customers, "jsonl", name="c")
    bad = place.landing.partition("orders", day(1)) / "part-bad.jsonl"
    bad.parent.mkdir(parents=True)
    bad.write_text('{"order_id": 12, "cust_id": 1, "amount": 3, "ts": 2}\n{"order_id": 13,\n')
    capfd.readouterr()
    state, tasks = run(dag, 1)
    assert state == "failed"
    assert tasks[("ingest.orders", -1)] == "failed"
    assert tasks[("ingest.customers", -1)] == "success"
    assert tasks[("close_epoch", -1)] == "upstream_failed"
    logs = capfd.readouterr().out
    assert "source 'orders'" in logs and "part-bad.jsonl" in logs and "line 2" in logs
    catalog = Catalog.for_warehouse(place.warehouse)
    assert catalog.epoch_state(circuit.name, 1) == "open"
    assert catalog.last_committed_epoch(circuit.name) == 0

    # Changing an input that a committed ingest already consumed is refused, loudly.
    place.landing.land("customers", day(1), [(2, "US", 3, True)], customers, "jsonl", name="c")
    capfd.readouterr()
    state, tasks = run(dag, 1)
    assert tasks[("ingest.customers", -1)] == "failed"
    assert "already ingested a different batch" in capfd.readouterr().out

    # Put customers back, fix the orders file: the same interval's run completes.
    place.landing.land("customers", day(1), [(2, "US", 2, True)], customers, "jsonl", name="c")
    bad.write_text('{"order_id": 12, "cust_id": 1, "amount": 3, "ts": 2}\n')
    state, tasks = run(dag, 1)
    assert state == "success", tasks
    assert catalog.last_committed_epoch(circuit.name) == 1
    catalog.close()
    history = [
        {
            "customers": [(1, "EU", 1, False), (2, "US", 1, False)],
            "orders": [(10, 1, 5, 1, None), (11, 2, 7, 1, None)],
        },
        {"customers": [(2, "US", 2, True)], "orders": [(12, 1, 3, 2, None)]},
    ]
    check_against_full_refresh(place, circuit, history, 1)
    totals = published(place, circuit, "region_totals", 1)
    assert totals == ZSet({("EU", 2, 8, 5): 1})


def test_a_loop_that_exceeds_its_bound_fails_the_convergence_check(test_dags, place, capfd):
    dag = test_dags["test_bounded_loop"]
    place.landing.land("numbers", day(0), [(1, 1)], ["n", "__w"], "parquet")
    capfd.readouterr()
    state, tasks = run(dag, 0)
    assert state == "failed"
    assert tasks[("loop_doubling.converged", -1)] == "failed"
    assert tasks[("close_epoch", -1)] == "upstream_failed"
    logs = capfd.readouterr().out
    assert "loop doubling of circuit doubling_low_bound did not converge at epoch 0" in logs
    assert "max_iterations=3" in logs
    catalog = Catalog.for_warehouse(place.warehouse)
    assert catalog.epoch_state("doubling_low_bound", 0) == "open"
    catalog.close()


def test_a_file_landed_after_its_interval_committed_is_refused_or_reported(
    test_dags, place, capfd, caplog, monkeypatch
):
    """A file that lands in a committed interval's partition is never read: the next
    ingest of the source finds it, and with ``[dbspark] late_files = fail`` refuses to
    run until it is moved into a current interval; by default it warns."""
    dag = test_dags["test_word_count"]
    circuit = circuit_of("test_word_count")
    columns = ["word", "__w"]
    place.landing.land("words", day(0), [("a", 1)], columns, "parquet")
    assert run(dag, 0)[0] == "success"

    late = place.landing.land("words", day(0), [("late", 1)], columns, "parquet", name="late")
    place.landing.land("words", day(1), [("b", 1)], columns, "parquet")
    monkeypatch.setenv("AIRFLOW__DBSPARK__LATE_FILES", "fail")
    capfd.readouterr()
    state, tasks = run(dag, 1)
    assert state == "failed" and tasks[("ingest.words", -1)] == "failed", tasks
    logs = capfd.readouterr().out
    assert f"{late} arrived after interval {day(0)} was ingested" in logs
    catalog = Catalog.for_warehouse(place.warehouse)
    assert catalog.last_committed_epoch(circuit.name) == 0

    # The remedy the message gives: move the late file into the current interval.
    late.rename(place.landing.partition("words", day(1)) / late.name)
    state, tasks = run(dag, 1)
    assert state == "success", tasks
    assert published(place, circuit, "counts", 1) == ZSet(
        {("a", 1): 1, ("b", 1): 1, ("late", 1): 1}
    )

    # Replaced after its ingest, under the default policy: a warning, and the run goes on.
    monkeypatch.delenv("AIRFLOW__DBSPARK__LATE_FILES")
    place.landing.land("words", day(1), [("b", 5)], columns, "parquet", name="part-00000")
    place.landing.land("words", day(2), [("c", 1)], columns, "parquet")
    capfd.readouterr()
    state, tasks = run(dag, 2)
    assert state == "success", tasks
    logs = capfd.readouterr().out
    replaced = place.landing.partition("words", day(1)) / "part-00000.parquet"
    assert f"{replaced} was replaced after interval {day(1)} was ingested" in logs
    assert catalog.last_committed_epoch(circuit.name) == 2
    # Warned about once: the next ingest, whose late window still holds day 1, is quiet
    # about it, and warns about what is new.
    stray = place.landing.land("words", day(2), [("z", 1)], columns, "parquet", name="stray")
    place.landing.land("words", day(3), [("d", 1)], columns, "parquet")
    caplog.clear()
    assert run(dag, 3)[0] == "success"
    [warned] = [r.getMessage() for r in caplog.records if "to refuse" in r.getMessage()]
    assert "was replaced after interval" not in warned
    assert f"{stray} arrived after interval {day(2)} was ingested" in warned
    catalog.close()


def test_partitions_are_named_by_the_utc_start_of_intervals_across_a_dst_change(test_dags, place):
    """A DAG scheduled at midnight in Berlin: its intervals last 24 h, then 23 h across
    the change to summer time, and each partition is named by its interval's start in
    UTC, which is where a writer working in local time lands its files too."""
    import pendulum

    dag = test_dags["test_word_count_berlin"]
    circuit = circuit_of("test_word_count_berlin")
    midnights = [pendulum.datetime(2026, 3, 28 + n, tz="Europe/Berlin") for n in range(3)]
    intervals = [Interval(midnights[n], midnights[n + 1]) for n in range(2)]
    assert [i.end - i.start for i in intervals] == [timedelta(hours=24), timedelta(hours=23)]
    names = [place.landing.partition("words", i).name for i in intervals]
    assert names == ["interval=20260327T230000Z", "interval=20260328T230000Z"]
    for epoch, interval in enumerate(intervals):
        place.landing.land("words", interval, [(f"w{epoch}", 1)], ["word", "__w"], "parquet")
        dag_run = dag.test(logical_date=midnights[epoch + 1])
        assert str(getattr(dag_run.state, "value", dag_run.state)) == "success"
    catalog = Catalog.for_warehouse(place.warehouse)
    assert catalog.epoch_labels(circuit.name) == {0: intervals[0].label, 1: intervals[1].label}
    catalog.close()
    counts = published(place, circuit, "counts", 1)
    assert counts == ZSet({("w0", 1): 1, ("w1", 1): 1})


def test_a_large_sql_pull_goes_through_files_and_leaves_none(
    test_dags, place, tmp_path, monkeypatch
):
    """The orders pulled from a table, more rows than the DAG's ``spill_rows``: the
    ingest task writes them to its scratch folder as Parquet, the engine reads them, the
    views equal a full refresh of the same rows, and no scratch folder is left."""
    import json

    import sqlalchemy as sa
    from test_connectors import make_orders_table

    url = f"sqlite:///{tmp_path / 'operational.db'}"
    make_orders_table(url)
    monkeypatch.setenv(
        "AIRFLOW_CONN_TEST_ORDERS_DB",
        json.dumps({"conn_type": "sqlite", "host": str(tmp_path / "operational.db")}),
    )
    engine = sa.create_engine(url)
    with engine.connect() as conn:  # what day 0 pulls: stamped in [midnight, midnight)
        pulled = conn.exec_driver_sql(
            "SELECT order_id, cust_id, amount, ts, deleted_at FROM orders_cdc "
            "WHERE changed_at >= '2026-01-01' AND changed_at < '2026-01-02'"
        ).fetchall()
    engine.dispose()
    assert len(pulled) == 3  # more than spill_rows=2: two files
    customers = [(7, "north", 1, False)]
    place.landing.land(
        "customers", day(0), customers, ["cust_id", "region", "ts", "deleted"], "parquet"
    )
    dag = test_dags["test_orders_pulled"]
    circuit = circuit_of("test_orders_pulled")
    state, tasks = run(dag, 0)
    assert state == "success", tasks
    history = [{"customers": customers, "orders": [tuple(r) for r in pulled]}]
    check_against_full_refresh(place, circuit, history, 0)
    units = place.warehouse / "_units" / circuit.name
    assert not any(p.name.startswith("pull-") for p in units.iterdir())


def test_a_run_of_a_committed_epoch_is_linked_to_it(test_dags, place):
    """A second run of a committed interval skips (nothing to do), and the dbspark page
    still lists it under the epoch, beside the run that committed it."""
    dag = test_dags["test_word_count"]
    place.landing.land("words", day(0), [("a", 1)], ["word", "__w"], "parquet")
    first, tasks = run(dag, 0)
    assert first == "success", tasks
    again, tasks = run(dag, 0)
    assert again == "success" and tasks[("open_epoch", -1)] == "skipped", tasks
    catalog = Catalog.for_warehouse(place.warehouse)
    runs = catalog.epoch_runs("word_count")
    catalog.close()
    assert [r.epoch for r in runs] == [0, 0] and len({r.run_id for r in runs}) == 2


def test_a_run_after_a_gap_fails_naming_the_backfill_that_fills_it(test_dags, place, capfd):
    """What unpausing a DAG after a pause does without catch-up (Airflow 3's default): one
    run for the latest interval, which may not skip the ones before it."""
    dag = test_dags["test_word_count"]
    assert dag.catchup is False
    for epoch in (0, 2):
        place.landing.land("words", day(epoch), [("a", 1)], ["word", "__w"], "parquet")
    assert run(dag, 0)[0] == "success"
    capfd.readouterr()
    state, tasks = run(dag, 2)
    assert state == "failed" and tasks[("open_epoch", -1)] == "failed"
    logs = capfd.readouterr().out
    assert "epoch 1, the interval starting at 2026-01-02T00:00:00+00:00, has not run" in logs
    assert (
        "airflow backfill create --dag-id test_word_count --from-date "
        "2026-01-02T00:00:00+00:00 --to-date 2026-01-03T00:00:00+00:00 "
        "--reprocess-behavior failed --max-active-runs 1"
    ) in logs
    catalog = Catalog.for_warehouse(place.warehouse)
    assert catalog.epoch_labels("word_count") == {0: day(0).label}  # nothing opened
    catalog.close()


def test_a_redefined_circuit_evolves_in_its_next_run(test_dags, place):
    """Two epochs of ``word_count``, then its redefinition's first run: open_epoch evolves
    the circuit in place (the view added rebuilt from the raw input log, the view
    removed retired with its outputs, ``counts`` continuing), and the epoch publishes
    every view equal to a full refresh of the new definition."""
    old = test_dags["test_word_count_before_evolution"]
    new = test_dags["test_word_count_evolved"]
    history = [
        {"words": [(("a",), 1), (("b",), 1), (("a",), 1)]},
        {"words": [(("b",), 1), (("c",), 1)]},
        {"words": [(("c",), 1), (("a",), -1), (("d",), 1)]},
    ]
    for epoch, batch in enumerate(history):
        rows = [(*row, weight) for row, weight in batch["words"]]
        place.landing.land("words", day(epoch), rows, ["word", "__w"], "parquet")
    for epoch in (0, 1):
        state, tasks = run(old, epoch)
        assert state == "success", tasks
    assert (place.outputs / "word_count" / "distinct_words").is_dir()

    state, tasks = run(new, 2)
    assert state == "success", tasks
    # The evolution is on the catalog's record of epoch 1, and its outputs' too.
    catalog = Catalog.for_warehouse(place.warehouse)
    stages = [stage for stage, _ in catalog.stage_runs("word_count", epoch=1)]
    catalog.close()
    assert [s.split(":")[0] for s in stages if s.startswith("evolve")] == [
        "evolve",
        "evolve-outputs",
    ]
    circuit = circuit_of("test_word_count_evolved")
    for epoch in (1, 2):
        expected = full_refresh(circuit, history, epoch)
        for view in circuit.views:
            assert published(place, circuit, view, epoch) == expected[view], (view, epoch)
    assert published_change(place, circuit, "frequent", 2) == ZSet([(("c", 2), 1), (("a", 2), -1)])
    assert not (place.outputs / "word_count" / "distinct_words").exists()
    assert (place.outputs / "word_count" / "_retired" / "distinct_words@epoch=1").is_dir()

    # Deployed again, the old definition evolves back the same way: distinct_words is
    # rebuilt (its feed starting again at epoch 2), frequent retired.
    history.append({"words": [(("e",), 1)]})
    place.landing.land("words", day(3), [("e", 1)], ["word", "__w"], "parquet")
    state, tasks = run(old, 3)
    assert state == "success", tasks
    circuit = circuit_of("test_word_count_before_evolution")
    expected = full_refresh(circuit, history, 3)
    for view in circuit.views:
        assert published(place, circuit, view, 3) == expected[view], view
    assert (place.outputs / "word_count" / "_retired" / "frequent@epoch=2").is_dir()
