"""Exported views: Delta tables (read by Spark here), change feeds per epoch, Parquet
snapshots when asked for, and SQL serving tables.

The SQL tests feed changes straight to a ``ServingTarget`` (SQLite, and PostgreSQL when
the ``postgres_url`` fixture finds a server); the Spark tests run a few epochs of real
circuits and export between ``publish`` and ``close_epoch``, as the DAG's publish task does.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Iterator, Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa

from dbspark.circuit.builder import Circuit
from dbspark.core.types import Schema
from dbspark.core.zset import ZSet
from dbspark.examples.circuits import orders
from dbspark.orchestration.sinks.export import ExportReport, export_epoch
from dbspark.orchestration.sinks.files import (
    MARKER,
    ExportError,
    _publish_dir,
    exported_epochs,
    output_dir,
    read_change_rows,
    read_changes,
    read_snapshot,
)
from dbspark.orchestration.sinks.serving import (
    ServingEpochError,
    ServingError,
    ServingTarget,
    initialize_serving,
)
from dbspark.orchestration.sinks.tables import (
    publish_table,
    read_table,
    spark_table,
    table_path,
    table_versions,
)

SCHEMA = Schema.of(
    {"tag": "string", "n": "bigint", "x": "double", "ok": "boolean", "xs": "array<bigint>"},
    what="test",
)


# ==================================================================================== SQL serving
@pytest.fixture(params=["sqlite", "postgres"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ServingTarget]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'serving.db'}"
    else:
        url = request.getfixturevalue("postgres_url")
    # A fresh prefix and bookkeeping table per test: the PostgreSQL database is shared.
    tag = uuid.uuid4().hex[:8]
    serving = ServingTarget(url, prefix=f"t{tag}_", epochs_table=f"epochs_{tag}")
    yield serving
    serving.engine.dispose()


def contents(target: ServingTarget, view: str = "v", circuit: str = "c") -> ZSet:
    return ZSet(target.contents(circuit, view, SCHEMA))


def test_serving_applies_changes_null_safely(target: ServingTarget) -> None:
    a = ("a", 1, 1.5, True, (1, 2))
    nulls = (None, None, None, None, None)
    half = ("b", None, None, False, ())
    assert target.epoch_of("v") == -1
    first = target.apply("c", "v", SCHEMA, 0, [(a, 2), (nulls, 1), (half, 1)])
    assert (first.inserted, first.updated, first.deleted) == (3, 0, 0)
    assert contents(target) == ZSet([(a, 2), (nulls, 1), (half, 1)])

    # An update of a row of NULLs and a delete of a half-NULL row must find exactly them.
    second = target.apply(
        "c", "v", SCHEMA, 1, [(nulls, 2), (half, -1), (a, -1), (("c", 3, None, None, None), 1)]
    )
    assert (second.inserted, second.updated, second.deleted) == (1, 2, 1)
    assert target.epoch_of("v") == 1
    want = ZSet([(a, 1), (nulls, 3), (("c", 3, None, None, None), 1)])
    assert contents(target) == want

    again = target.apply("c", "v", SCHEMA, 1, [(a, 5)])
    assert again.skipped
    assert "already at epoch 1" in again.describe()
    assert contents(target) == want


def test_serving_refuses_out_of_order_and_inconsistent_changes(target: ServingTarget) -> None:
    a = ("a", 1, None, None, None)
    target.apply("c", "v", SCHEMA, 0, [(a, 1)])
    with pytest.raises(ServingEpochError, match=r"at epoch 0; epoch 2 can only be applied"):
        target.apply("c", "v", SCHEMA, 2, [])
    # Deleting more copies than the table holds: nothing of the epoch may stay behind.
    with pytest.raises(ServingError, match="out of sync"):
        target.apply("c", "v", SCHEMA, 1, [(("b", 1, None, None, None), 1), (a, -2)])
    assert target.epoch_of("v") == 0
    assert contents(target) == ZSet([(a, 1)])
    with pytest.raises(ServingError, match="serves circuit 'c'"):
        ServingTarget(target.engine, prefix=target.prefix, epochs_table=target.epochs_table).apply(
            "other", "v", SCHEMA, 1, []
        )


def test_serving_initialize_reloads_a_table(target: ServingTarget) -> None:
    target.apply("c", "v", SCHEMA, 0, [(("old", 1, None, None, None), 1)])
    snapshot = [(("a", 1, 0.5, True, (3,)), 2), ((None, 2, None, None, None), 1)]
    loaded = target.initialize("c", "v", SCHEMA, 7, iter(snapshot), batch_size=1)
    assert loaded.initialized and loaded.inserted == 2
    assert target.epoch_of("v") == 7
    assert contents(target) == ZSet(snapshot)
    target.apply("c", "v", SCHEMA, 8, [((None, 2, None, None, None), -1)])
    assert contents(target) == ZSet(snapshot[:1])


# ==================================================================================== atomic dirs
def test_publish_dir_is_atomic_and_idempotent(tmp_path: Path) -> None:
    final = output_dir(tmp_path, "c", "v", "changes", 3)
    # A leftover of a killed attempt (hidden temporary) and a foreign, unmarked directory.
    final.parent.mkdir(parents=True)
    (final.parent / ".epoch=3.tmp-dead").mkdir()
    final.mkdir()
    (final / "junk.parquet").write_text("not ours")
    assert exported_epochs(tmp_path, "c", "v") == []
    calls = []

    def write(tmp: Path) -> dict[str, int]:
        calls.append(tmp)
        tmp.mkdir()
        (tmp / "part-0.parquet").write_text("data")
        return {"rows": 1}

    skipped, marker = _publish_dir(final, write, {"epoch": 3})
    assert not skipped and marker["rows"] == 1
    assert sorted(p.name for p in final.iterdir()) == [MARKER, "part-0.parquet"]
    assert exported_epochs(tmp_path, "c", "v") == [3]
    skipped, again = _publish_dir(final, write, {"epoch": 3})
    assert skipped and again == marker and len(calls) == 1
    # Only the dead attempt's temporary remains: no temporary of ours is left behind.
    assert sorted(p.name for p in final.parent.iterdir()) == [".epoch=3.tmp-dead", "epoch=3"]


# ==================================================================================== Spark
def run_and_export(
    engine: Any, epoch: int, inputs: Mapping[str, Any], **export: Any
) -> list[ExportReport]:
    """``SparkEngine.run_epoch`` with exports between publish and close (as the DAG does).
    ``export`` maps a label to the keyword arguments of one ``export_epoch`` call."""
    checked = {name: engine.check_batch(name, batch) for name, batch in inputs.items()}
    assert engine.open_epoch(epoch)
    t = (epoch,)
    for stage in engine.plan.stages_in_scope(0):
        anchor = engine.circuit.node(stage.anchor)
        if anchor.op in ("zset_source", "upsert_source"):
            engine.ingest(anchor.label, epoch, checked.get(anchor.label))
            continue
        if anchor.op == "leave":
            engine.run_loop(engine.plan.loops[anchor.params["loop"]], t)
        engine.run_stage(stage.id, t)
    engine.publish(epoch)
    reports = [export_epoch(engine, epoch, **kwargs) for kwargs in export.values()]
    engine.close_epoch(epoch)
    return reports


def table_zset(table: Any, schema: Schema) -> ZSet:
    """A published table (the view's columns and ``__copies``) as the multiset it holds."""
    return ZSet(
        (tuple(record[name] for name in schema.names), record["__copies"])
        for record in table.to_pylist()
    )


def spark_zset(spark: Any, path: Path, schema: Schema, epoch: int | None = None) -> ZSet:
    """A published table as Spark reads it (``spark_table``), copies as weights."""
    from dbspark.engine.spark.frames import frame_to_zset

    frame = spark_table(spark, path, epoch).withColumnRenamed("__copies", "__w")
    return frame_to_zset(frame, schema)


def tags() -> Circuit:
    """A view with multiplicities above 1 and NULLs: the tags of items."""
    c = Circuit("tags")
    items = c.zset_source("items", {"tag": "string", "qty": "bigint"})
    c.view("tags", items.select("tag"))
    return c


AUDIT = """
CREATE TRIGGER audit_{op} AFTER {op} ON {table}
BEGIN INSERT INTO audit VALUES ('{op}', {row}.tag); END
"""


def audited(engine: sa.Engine, table: str) -> None:
    """Record every row statement on ``table`` in ``audit``: which rows an epoch touched."""
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE audit (op TEXT, tag TEXT)")
        for op, row in (("INSERT", "NEW"), ("UPDATE", "NEW"), ("DELETE", "OLD")):
            conn.exec_driver_sql(AUDIT.format(op=op, table=table, row=row))


def touched(engine: sa.Engine) -> set[tuple[str, str | None]]:
    with engine.begin() as conn:
        rows = {tuple(r) for r in conn.exec_driver_sql("SELECT op, tag FROM audit")}
        conn.exec_driver_sql("DELETE FROM audit")
    return rows


def test_export_epochs_of_a_view_with_multiplicities(spark: Any, tmp_path: Path) -> None:
    from dbspark.engine.spark.executor import SparkEngine
    from dbspark.engine.spark.frames import frame_to_zset

    engine = SparkEngine(tags(), tmp_path / "wh", spark=spark)
    root = tmp_path / "out"
    serving = ServingTarget(f"sqlite:///{tmp_path / 'serving.db'}")
    # Serving without directories reads the change from the engine (Arrow when small).
    alone = ServingTarget(f"sqlite:///{tmp_path / 'alone.db'}")
    schema = engine.circuit.node(engine.circuit.views["tags"]).schema
    epochs = [
        [[("a", 1), 1], [("a", 2), 1], [(None, 5), 1], [("b", 1), 1]],
        # one "a" goes (update), a NULL tag comes (update of the NULL row), "b" goes
        # (delete), "c" comes (insert)
        [[("a", 1), -1], [(None, 6), 1], [("b", 1), -1], [("c", 1), 1]],
        [],  # nothing changes
    ]
    want = [
        ZSet([(("a",), 2), ((None,), 1), (("b",), 1)]),
        ZSet([(("a",), 1), ((None,), 2), (("c",), 1)]),
        ZSet([(("a",), 1), ((None,), 2), (("c",), 1)]),
    ]
    want_touched = [
        None,
        {("UPDATE", "a"), ("UPDATE", None), ("DELETE", "b"), ("INSERT", "c")},
        set(),
    ]
    for epoch, batch in enumerate(epochs):
        [report, _] = run_and_export(
            engine,
            epoch,
            {"items": batch},
            main={"root": root, "serving": serving, "snapshots": True},
            alone={"serving": alone},
        )
        view = engine.view("tags")
        assert view == want[epoch], f"epoch {epoch}"
        assert ZSet(alone.contents("tags", "tags", schema)) == want[epoch], f"alone, {epoch}"
        snapshot = frame_to_zset(read_snapshot(spark, root, "tags", "tags", epoch), schema)
        assert snapshot == view, f"snapshot of epoch {epoch}"
        assert ZSet(serving.contents("tags", "tags", schema)) == view, f"serving, epoch {epoch}"
        published = read_table(table_path(root, "tags", "tags"))
        assert table_zset(published, schema) == view, f"table, epoch {epoch}"
        if epoch == 0:
            audited(serving.engine, serving.table_name("tags"))
        else:
            assert touched(serving.engine) == want_touched[epoch], f"rows touched, epoch {epoch}"
        text = report.describe()
        snap_dir = output_dir(root, "tags", "tags", "snapshot", epoch)
        assert f"snapshot {len(view)} rows -> {snap_dir}" in text
        assert str(output_dir(root, "tags", "tags", "changes", epoch)) in text
        assert f"serving table dbspark_tags in sqlite:///{tmp_path}" in text

    item = report.views["tags"]
    assert item.snapshot is not None and item.snapshot.rows == 3
    changes = [
        read_change_rows(output_dir(root, "tags", "tags", "changes", e), schema) for e in range(3)
    ]
    assert ZSet(changes[1]) == ZSet([(("a",), -1), ((None,), 1), (("b",), -1), (("c",), 1)])
    marker = json.loads((output_dir(root, "tags", "tags", "changes", 1) / MARKER).read_text())
    assert (marker["rows"], marker["inserted"], marker["deleted"]) == (4, 2, 2)
    # The empty change is a complete, typed, empty dataset, not a missing one.
    empty = output_dir(root, "tags", "tags", "changes", 2)
    assert changes[2] == []
    assert json.loads((empty / MARKER).read_text())["rows"] == 0
    assert list(empty.glob("part-*.parquet"))
    assert pq.read_table(empty).schema.names == ["tag", "__w"]
    assert "change +0/-0 in 0 rows" in report.describe()
    # Summing the feed gives the snapshot; Spark reads it with an epoch column.
    feed = read_changes(spark, root, "tags", "tags")
    assert sorted({r["epoch"] for r in feed.select("epoch").collect()}) == [0, 1]
    assert frame_to_zset(feed, schema) == want[2]
    with pytest.raises(ExportError, match=r"not exported for epochs \[5\]"):
        read_changes(spark, root, "tags", "tags", [1, 5])

    # The table: one version per epoch, each readable as of its epoch.
    table = table_path(root, "tags", "tags")
    assert table_versions(table) == {0: 0, 1: 1, 2: 2}
    for epoch in range(3):
        assert table_zset(read_table(table, epoch), schema) == want[epoch], f"as of {epoch}"
        assert spark_zset(spark, table, schema, epoch) == want[epoch], f"Spark, as of {epoch}"
    assert "table " in report.describe() and "version 2" in report.describe()

    # A retried task, even after the epoch closed, finds every output done.
    before = {p: p.stat().st_mtime_ns for p in root.rglob("*")}
    retried = export_epoch(engine, 2, root=root, serving=serving, snapshots=True)
    item = retried.views["tags"]
    assert item.snapshot.skipped and item.changes.skipped and item.serving.skipped
    assert item.table.skipped
    assert {p: p.stat().st_mtime_ns for p in root.rglob("*")} == before
    assert touched(serving.engine) == set()
    assert not list(root.rglob(".*tmp-*")), "a temporary directory was left behind"

    # Recovery: the serving table reloaded from the published Delta table, as of an
    # earlier epoch, then of the last.
    with serving.engine.begin() as conn:
        conn.exec_driver_sql("DELETE FROM dbspark_tags")
    [reloaded] = initialize_serving(engine, serving, epoch=0, root=root).values()
    assert reloaded.inserted == 3
    assert ZSet(serving.contents("tags", "tags", schema)) == want[0]
    [reloaded] = initialize_serving(engine, serving, epoch=2, root=root).values()
    assert reloaded.inserted == 3
    assert ZSet(serving.contents("tags", "tags", schema)) == want[2]
    serving.engine.dispose()


def test_spark_reads_a_table_whose_view_emptied(spark: Any, tmp_path: Path) -> None:
    """A table version with no data file (every row deleted) still reads in Spark, as an
    empty frame of the view's columns; the version before reads its rows."""
    import pyarrow as pa

    schema = Schema.of({"tag": "string", "n": "bigint"}, what="test")
    path = tmp_path / "table"
    rows = [(("a", 1), 2), ((None, 2), 1)]

    def change(pairs: list[tuple[tuple[Any, ...], int]]) -> pa.Table:
        return pa.table(
            {
                "tag": pa.array([r[0] for r, _ in pairs], pa.string()),
                "n": pa.array([r[1] for r, _ in pairs], pa.int64()),
                "__w": pa.array([w for _, w in pairs], pa.int64()),
            }
        )

    for epoch, pairs in enumerate([rows, [(r, -w) for r, w in rows]]):
        publish_table(
            path,
            circuit="c",
            view="v",
            schema=schema,
            epoch=epoch,
            change=change(pairs),
            whole_view=lambda: change([]),
        )
    empty = spark_table(spark, path)
    assert empty.columns == ["tag", "n", "__copies"] and empty.count() == 0
    assert spark_zset(spark, path, schema, 0) == ZSet(rows)
    assert spark_zset(spark, path, schema, 1) == ZSet()


def test_export_upsert_deletions(spark: Any, tmp_path: Path) -> None:
    from dbspark.engine.spark.executor import SparkEngine

    engine = SparkEngine(orders(), tmp_path / "wh", spark=spark)
    root = tmp_path / "out"
    with_root = ServingTarget(f"sqlite:///{tmp_path / 'a.db'}", views=["region_totals"])
    # Without a root the change is collected from the engine instead of the files.
    no_root = ServingTarget(f"sqlite:///{tmp_path / 'b.db'}")
    epochs = [
        {
            "customers": [(1, "eu", 1, False), (2, "us", 1, False)],
            "orders": [(10, 1, 5, 1, None), (11, 2, 7, 1, None), (12, 1, 3, 1, None)],
        },
        {"customers": [(2, "us", 2, True)], "orders": [(12, 1, 4, 2, None)]},
    ]
    for epoch, inputs in enumerate(epochs):
        reports = run_and_export(
            engine,
            epoch,
            inputs,
            files={"root": root, "serving": with_root},
            sql={"serving": no_root},
        )
        for name in engine.circuit.views:
            schema = engine.circuit.node(engine.circuit.views[name]).schema
            view = engine.view(name)
            table = table_path(root, "orders", name)
            assert spark_zset(spark, table, schema, epoch) == view, f"Spark: {name}, {epoch}"
            assert ZSet(no_root.contents("orders", name, schema)) == view, name
            published = read_table(table_path(root, "orders", name))
            assert table_zset(published, schema) == view, f"table {name}, epoch {epoch}"
        totals = engine.circuit.node(engine.circuit.views["region_totals"]).schema
        assert ZSet(with_root.contents("orders", "region_totals", totals)) == engine.view(
            "region_totals"
        )
        assert reports[0].views["customers_current"].serving is None  # not in views=
    schema = engine.circuit.node(engine.circuit.views["customers_current"]).schema
    change = read_change_rows(output_dir(root, "orders", "customers_current", "changes", 1), schema)
    assert change == [((2, "us"), -1)]
    totals_change = ZSet(
        read_change_rows(output_dir(root, "orders", "region_totals", "changes", 1), totals)
    )
    assert ZSet([(("us", 1, 7, 7), -1), (("eu", 2, 8, 5), -1), (("eu", 2, 9, 5), 1)]) == (
        totals_change
    )
    assert reports[1].views["region_totals"].serving.deleted == 2
    # First use of a serving table at a later epoch: loaded from the engine's view.
    late = ServingTarget(f"sqlite:///{tmp_path / 'c.db'}")
    [loaded] = initialize_serving(engine, late, views=["region_totals"]).values()
    assert (loaded.epoch, loaded.inserted) == (1, 1)
    assert ZSet(late.contents("orders", "region_totals", totals)) == engine.view("region_totals")
    late.engine.dispose()
    with_root.engine.dispose()
    no_root.engine.dispose()


# ==================================================================================== typed values
TYPED = Schema.of(
    {"day": "date", "at": "timestamp", "amount": "decimal(12,2)", "wide": "decimal(30,6)"},
    what="typed view",
)


def test_serving_holds_dates_instants_and_decimals(target: ServingTarget) -> None:
    """A DATE, a TIMESTAMP (an instant, in UTC) and DECIMALs of both widths come back
    exactly, and a change finds its row by them (NULLs included)."""
    utc = dt.UTC
    a = (
        dt.date(2026, 1, 2),
        dt.datetime(2026, 1, 2, 10, 30, 0, 250000, tzinfo=utc),
        Decimal("-12.50"),
        Decimal("123456789012345678901234.000001"),
    )
    b = (dt.date(1999, 12, 31), None, Decimal("0.00"), None)
    target.apply("c", "typed", TYPED, 0, [(a, 2), (b, 1)])
    assert ZSet(target.contents("c", "typed", TYPED)) == ZSet([(a, 2), (b, 1)])
    [(row, _)] = [(r, w) for r, w in target.contents("c", "typed", TYPED) if r[1] is not None]
    assert str(row[2]) == "-12.50" and row[1].utcoffset() == dt.timedelta(0)
    target.apply("c", "typed", TYPED, 1, [(a, -1), (b, -1)])
    assert ZSet(target.contents("c", "typed", TYPED)) == ZSet([(a, 1)])


def test_export_a_sql_view_over_typed_columns(spark: Any, tmp_path: Path) -> None:
    """The ledger's SQL views (a SUM of decimals per date, the latest instant) published
    as Delta tables read by Spark and serving tables equal the engine's views."""
    from dbspark.engine.spark.executor import SparkEngine
    from dbspark.sql import compile_circuit

    circuit = compile_circuit(
        "ledger",
        {
            "ledger": {
                "columns": [
                    ["entry_id", "BIGINT"],
                    ["day", "DATE"],
                    ["at", "TIMESTAMP"],
                    ["amount", "DECIMAL(10,2)"],
                    ["ts", "BIGINT"],
                ],
                "key": ["entry_id"],
                "watermark": ["ts"],
            }
        },
        "CREATE VIEW daily AS SELECT day, SUM(amount) AS total, AVG(amount) AS mean "
        "FROM ledger GROUP BY day;\n"
        "CREATE VIEW latest AS SELECT MAX(at) AS last_at FROM ledger "
        "WHERE day >= '2026-01-02';",
    )
    engine = SparkEngine(circuit, tmp_path / "wh", spark=spark)
    root = tmp_path / "out"
    serving = ServingTarget(f"sqlite:///{tmp_path / 'serving.db'}")

    def entry(key: int, day: int, hour: int, amount: str, ts: int) -> tuple:
        at = dt.datetime(2026, 1, day, hour, tzinfo=dt.UTC)
        return (key, dt.date(2026, 1, day), at, Decimal(amount), ts)

    epochs = [
        {
            "ledger": [
                entry(1, 1, 9, "10.50", 1),
                entry(2, 2, 8, "0.01", 1),
                entry(3, 2, 9, "0.02", 1),
            ]
        },
        {"ledger": [entry(3, 3, 0, "-1", 2)]},
    ]
    for epoch, inputs in enumerate(epochs):
        run_and_export(engine, epoch, inputs, files={"root": root, "serving": serving})
        for name in circuit.views:
            schema = circuit.stream(name).schema
            view = engine.view(name)
            table = table_path(root, "ledger", name)
            assert spark_zset(spark, table, schema, epoch) == view, f"Spark: {name}, {epoch}"
            assert ZSet(serving.contents("ledger", name, schema)) == view, name
            published = read_table(table_path(root, "ledger", name))
            assert table_zset(published, schema) == view, f"table {name}, epoch {epoch}"
    daily = circuit.stream("daily").schema
    assert daily.types == ("date", "decimal(20,2)", "decimal(14,6)")
    assert ZSet(serving.contents("ledger", "daily", daily)) == ZSet(
        [
            ((dt.date(2026, 1, 1), Decimal("10.50"), Decimal("10.500000")), 1),
            ((dt.date(2026, 1, 2), Decimal("0.01"), Decimal("0.010000")), 1),
            ((dt.date(2026, 1, 3), Decimal("-1.00"), Decimal("-1.000000")), 1),
        ]
    )
    serving.engine.dispose()


# ==================================================================================== rebuilds
def feed_zset(root: Path, circuit: str, view: str, schema: Schema, epoch: int) -> ZSet:
    """The change feed summed up to ``epoch`` as a reader adds it up: the changes of
    epochs ``0..epoch`` and the corrections of epochs up to it."""
    from dbspark.orchestration.sinks.files import exported_corrections, read_correction

    total = ZSet()
    for e in range(epoch + 1):
        feed = output_dir(root, circuit, view, "changes", e)
        total = total + ZSet(read_change_rows(feed, schema))
    for correction in exported_corrections(root, circuit, view):
        if correction.epoch <= epoch:
            rows = read_correction(correction, schema).to_pylist()
            total = total + ZSet((tuple(r[n] for n in schema.names), r["__w"]) for r in rows)
    return total


def publish_only(engine: Any, epoch: int, items: list[Any]) -> None:
    """Run ``epoch`` of the tags circuit up to its publish: exported and closed (or not)
    by the test."""
    checked = engine.check_batch("items", items)
    assert engine.open_epoch(epoch)
    engine.ingest("items", epoch, checked)
    for stage in engine.plan.stages_in_scope(0):
        if engine.circuit.node(stage.anchor).op != "zset_source":
            engine.run_stage(stage.id, (epoch,))
    engine.publish(epoch)


def damage(engine: Any, spark: Any, epoch: int, tag: str, weight: int) -> None:
    """A bogus row in the engine's view at ``epoch``, as a bug in an operator would leave."""
    rows = spark.createDataFrame([(tag, weight, epoch)], "tag string, __w bigint, __epoch bigint")
    record = engine.traces.write("view.tags", rows, (epoch,))
    engine.catalog.commit("tags", f"damage-{uuid.uuid4().hex[:6]}", (epoch,), [record])


def test_a_rebuild_corrects_each_output_against_what_it_holds(spark: Any, tmp_path: Path) -> None:
    from deltalake import DeltaTable

    from dbspark.engine.spark.executor import SparkEngine
    from dbspark.orchestration.sinks.export import correct_views
    from dbspark.orchestration.sinks.files import exported_corrections
    from dbspark.orchestration.sinks.serving import catch_up, reconcile_with_tables

    engine = SparkEngine(tags(), tmp_path / "wh", spark=spark)
    root = tmp_path / "out"
    serving = ServingTarget(f"sqlite:///{tmp_path / 'serving.db'}")
    behind = ServingTarget(f"sqlite:///{tmp_path / 'behind.db'}")
    schema = engine.circuit.node(engine.circuit.views["tags"]).schema
    table = table_path(root, "tags", "tags")
    run_and_export(engine, 0, {"items": [[("a", 1), 1], [("b", 1), 1]]}, main={"root": root})
    catch_up(behind, "tags", {"tags": schema}, root, 0)

    # Epoch 1 publishes a wrong change: a bogus row reaches the engine's view between
    # publish and export, so the feed and the table get it too.
    publish_only(engine, 1, [[("c", 1), 1]])
    damage(engine, spark, 1, "zebra", 2)
    export_epoch(engine, 1, root=root)
    engine.close_epoch(1)
    catch_up(serving, "tags", {"tags": schema}, root, 1)
    right = ZSet([(("a",), 1), (("b",), 1), (("c",), 1)])
    wrong = right + ZSet([(("zebra",), 2)])
    assert table_zset(read_table(table), schema) == wrong
    assert ZSet(serving.contents("tags", "tags", schema)) == wrong

    engine.rebuild("tags")
    assert engine.view("tags") == right
    [item] = correct_views(engine, ["tags"], root=root, serving=serving).values()
    assert item.changed and item.correction is not None and item.table is not None
    assert (item.correction.name, item.correction.epoch, item.correction.rows) == (
        "rebuild=1",
        1,
        1,
    )
    assert (item.correction.inserted, item.correction.deleted) == (0, 2)
    assert (item.table.deleted, item.serving.deleted) == (1, 1)
    assert "correction of epoch 1: +0/-2 in 1 rows" in item.describe()
    # The table holds the rebuilt view, as of epoch 1 too; its epochs keep their versions.
    assert table_zset(read_table(table), schema) == right
    assert table_zset(read_table(table, 1), schema) == right
    assert table_zset(read_table(table, 0), schema) == ZSet([(("a",), 1), (("b",), 1)])
    assert table_versions(table) == {0: 0, 1: 1}
    assert DeltaTable(str(table)).history(1)[0]["dbspark.corrected_epoch"] == 1
    assert spark_zset(spark, table, schema) == right
    # A reader of the feed adds the correction to the changes.
    assert feed_zset(root, "tags", "tags", schema, 1) == right
    # The serving table at the epoch holds the rebuilt view, and its catch-up does not
    # apply the feed's correction again; one behind applies it after the changes.
    assert ZSet(serving.contents("tags", "tags", schema)) == right
    assert serving.corrections_applied("tags") == {"rebuild=1"}
    catch_up(serving, "tags", {"tags": schema}, root, 1)
    assert ZSet(serving.contents("tags", "tags", schema)) == right
    catch_up(behind, "tags", {"tags": schema}, root, 1)
    assert ZSet(behind.contents("tags", "tags", schema)) == right
    assert behind.corrections_applied("tags") == {"rebuild=1"}

    # Done again, nothing more is written: every output holds the rebuilt view.
    [again] = correct_views(engine, ["tags"], root=root, serving=serving).values()
    assert not again.changed and (again.serving.inserted, again.serving.deleted) == (0, 0)
    assert len(exported_corrections(root, "tags", "tags")) == 1

    # The engine wrong this time, the outputs right: the rebuild repairs the engine only.
    damage(engine, spark, 1, "b", 1)
    engine.rebuild("tags")
    assert not correct_views(engine, ["tags"], root=root)["tags"].changed

    # A row lost from the table and from the serving table behind dbspark's back: each
    # is repaired, the feed (which was right) takes no correction.
    DeltaTable(str(table)).delete("tag = 'c'")
    with serving.engine.begin() as conn:
        conn.exec_driver_sql("DELETE FROM dbspark_tags WHERE tag = 'a'")
    engine.rebuild("tags")
    [item] = correct_views(engine, ["tags"], root=root, serving=serving).values()
    assert item.correction is None and item.table is not None and item.table.inserted == 1
    assert item.serving is not None and item.serving.inserted == 1
    assert table_zset(read_table(table), schema) == right
    assert ZSet(serving.contents("tags", "tags", schema)) == right
    assert len(exported_corrections(root, "tags", "tags")) == 1
    # The serve task's way, after a DAG run's rebuild: from the corrected table.
    with serving.engine.begin() as conn:
        conn.exec_driver_sql("UPDATE dbspark_tags SET __w = 5 WHERE tag = 'b'")
    [repaired] = reconcile_with_tables(serving, "tags", {"tags": schema}, root, 1).values()
    assert (repaired.inserted, repaired.updated, repaired.deleted) == (0, 1, 0)
    assert ZSet(serving.contents("tags", "tags", schema)) == right
    assert reconcile_with_tables(behind, "tags", {"tags": schema}, root, 0) == {"tags": None}

    # Later epochs go on from the corrected outputs.
    run_and_export(engine, 2, {"items": [[("a", 1), -1]]}, main={"root": root})
    catch_up(serving, "tags", {"tags": schema}, root, 2)
    after = ZSet([(("b",), 1), (("c",), 1)])
    assert engine.view("tags") == after
    assert table_zset(read_table(table), schema) == after
    assert table_zset(read_table(table, 1), schema) == right
    assert feed_zset(root, "tags", "tags", schema, 2) == after
    assert ZSet(serving.contents("tags", "tags", schema)) == after
    # A serving table loaded from the table holds the feed's corrections already.
    fresh = ServingTarget(f"sqlite:///{tmp_path / 'fresh.db'}")
    [loaded] = catch_up(fresh, "tags", {"tags": schema}, root, 2).values()
    assert loaded.initialized and fresh.corrections_applied("tags") == {"rebuild=1"}
    assert ZSet(fresh.contents("tags", "tags", schema)) == after
    for target in (serving, behind, fresh):
        target.engine.dispose()


def test_a_rebuild_while_an_epoch_is_open_corrects_outputs_that_already_hold_it(
    spark: Any, tmp_path: Path
) -> None:
    from dbspark.engine.spark.executor import SparkEngine
    from dbspark.orchestration.sinks.export import rebuild_views

    engine = SparkEngine(tags(), tmp_path / "wh", spark=spark)
    root = tmp_path / "out"
    schema = engine.circuit.node(engine.circuit.views["tags"]).schema
    table = table_path(root, "tags", "tags")
    # Epoch 0 publishes a bogus row; epoch 1 is published and exported, not yet closed.
    publish_only(engine, 0, [[("a", 1), 1]])
    damage(engine, spark, 0, "zebra", 1)
    export_epoch(engine, 0, root=root)
    engine.close_epoch(0)
    publish_only(engine, 1, [[("b", 1), 1]])
    export_epoch(engine, 1, root=root)
    assert table_versions(table) == {0: 0, 1: 1}

    rows, first = rebuild_views(engine, ["tags"], root=root)
    assert first["tags"].correction.epoch == 0 and first["tags"].table is not None
    rows, corrected = rebuild_views(engine, ["tags"], root=root)
    assert rows == {"tags": 1} and not corrected["tags"].changed  # done once
    engine.close_epoch(1)
    view = ZSet([(("a",), 1), (("b",), 1)])
    assert engine.view("tags") == view
    assert table_zset(read_table(table), schema) == view
    assert table_zset(read_table(table, 1), schema) == view
    assert feed_zset(root, "tags", "tags", schema, 1) == view
    assert feed_zset(root, "tags", "tags", schema, 0) == ZSet([(("a",), 1)])
