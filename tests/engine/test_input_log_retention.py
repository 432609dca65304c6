"""Input log retention (``Maintenance.compact_input_logs``): the raw input logs merged
in runs of neighbouring epochs keep every full refresh from the merged epoch on exact,
on both the reference engine in this process and Spark; earlier epochs are refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dbspark.circuit.aggregations import count, sum_
from dbspark.circuit.builder import Circuit
from dbspark.circuit.expressions import col
from dbspark.core.upsert import UpsertConflict
from dbspark.engine.spark.executor import SparkEngine
from dbspark.storage import collection_names as coll


def _circuit() -> Circuit:
    """An upsert source with tombstones, a Z-set source, and a view that reads its
    source one epoch back (a root-level ``delay``)."""
    c = Circuit("retained")
    orders = c.upsert_source(
        "orders",
        {
            "order_id": "bigint",
            "cust_id": "bigint",
            "amount": "bigint",
            "ts": "bigint",
            "deleted": "boolean",
        },
        key="order_id",
        watermark="ts",
        tombstone="deleted",
    )
    events = c.zset_source("events", {"k": "bigint", "v": "bigint"})
    live = orders.select("order_id", "cust_id", "amount")
    c.view("orders", live)
    c.view("per_customer", live.aggregate(by="cust_id", n=count(), total=sum_(col("amount"))))
    c.view("events", events.distinct())
    c.view("events_change", events.minus(events.delay()))
    return c


#: Per epoch, the batches: key 1's versions arrive out of order (a stale row at 5 that
#: differs from the stored row of 1 at the same watermark, a tombstone at 6, a stale
#: row at 7 that must not bring it back, a fresher one at 9 that does), so a replay that
#: compared rows with the wrong winners would find a conflict or a wrong answer.
HISTORY: list[dict[str, list[Any]]] = [
    {"orders": [(1, 10, 5, 7, False), (2, 10, 3, 1, False)], "events": [((1, 1), 1)]},
    {"orders": [(3, 11, 4, 1, False)], "events": [((2, 1), 1), ((1, 1), 1)]},
    {"orders": [(1, 10, 9, 9, False)], "events": [((1, 1), -1)]},
    {"orders": [(2, 12, 3, 2, False)]},
    {"orders": [(1, 10, 6, 7, False)], "events": [((3, 3), 1)]},
    {"orders": [(1, 10, 9, 10, True)], "events": [((2, 1), -1)]},
    {"orders": [(1, 10, 8, 8, False), (4, 12, 1, 1, False), (2, 12, 3, 5, True)]},
    {"events": [((5, 5), 2)]},
    {"orders": [(1, 13, 2, 11, False), (3, 11, 4, 1, False)]},
    {"orders": [(5, 13, 1, 1, False)], "events": [((1, 1), -1)]},
]


def _engine(spark: Any, root: Path, **options: Any) -> SparkEngine:
    engine = SparkEngine(_circuit(), root, spark=lambda: spark, **options)
    for batch in HISTORY:
        engine.step(batch)
    return engine


def _log_batches(engine: SparkEngine, source: str) -> list[Any]:
    node_id = engine.circuit.sources[source]
    return engine.catalog.batches(engine.circuit.name, coll.input_log(node_id))


def _equal_everywhere(engine: SparkEngine) -> None:
    for tier in ("local", "spark"):
        assert engine.verify(tier=tier) == {name: [] for name in engine.circuit.views}, tier


def test_merged_logs_replay_to_the_same_views_on_both_tiers(spark: Any, tmp_path: Path) -> None:
    engine = _engine(spark, tmp_path / "wh")
    before = {name: len(_log_batches(engine, name)) for name in engine.circuit.sources}
    assert engine.replayable_from() == 0

    # Merging in steps, up to the last epoch a delay one epoch deep allows (8 of 9).
    for through in (2, 5, 8):
        done = engine.compact_input_logs(through)
        assert done and all(c.committed for c in done)
        assert (
            engine.replayable_from()
            == max(c.output.time[0] for c in done if c.output is not None) + 1
        )
        _equal_everywhere(engine)
    after = {name: len(_log_batches(engine, name)) for name in engine.circuit.sources}
    assert after["orders"] < before["orders"] and after["events"] < before["events"]

    # Every merged batch holds one winner per key (tombstones too), at its run's last
    # epoch; the Z-set log holds no row twice and no zero weight.
    orders = engine.local.read(_log_batches(engine, "orders"), _log_fields(engine, "orders"))
    rows = orders.toArrow().to_pylist()
    by_epoch: dict[int, list[int]] = {}
    for row in rows:
        by_epoch.setdefault(row["__epoch"], []).append(row["order_id"])
    assert all(len(keys) == len(set(keys)) for keys in by_epoch.values())
    assert any(row["order_id"] == 1 and row["ts"] == 11 for row in rows)

    # An epoch a delay would read from before the merge is refused, naming both epochs.
    first = engine.replayable_from()
    with pytest.raises(ValueError, match=f"possible as of epoch {first} or later"):
        engine.full_refresh(first - 1)
    with pytest.raises(ValueError, match="can be merged up to epoch 8 at most"):
        engine.compact_input_logs(9)

    # Epochs go on after the merge: a row that ties the merged winner of key 1 and
    # differs is still refused, and the views still equal a full refresh.
    with pytest.raises(UpsertConflict):
        engine.step({"orders": [(1, 99, 2, 11, False)]})
    # Order 2's tombstone (epoch 6, merged) still keeps its older rows from coming back.
    engine.step({"orders": [(1, 13, 3, 12, False), (2, 12, 9, 4, False)], "events": [((7, 7), 1)]})
    assert 2 not in {row[0] for row in engine.view("orders").rows()}
    _equal_everywhere(engine)
    assert engine.compact_input_logs(8) == []  # nothing left to merge there: a no-op


def _log_fields(engine: SparkEngine, source: str) -> list[tuple[str, str]]:
    node = engine.circuit.node(engine.circuit.sources[source])
    return [*node.params["user_schema"].fields, ("__epoch", "bigint")]


def test_large_merges_run_on_spark(spark: Any, tmp_path: Path) -> None:
    """With the local tier off and no driver writes, a merge is a Spark job: the same
    winners and sums."""
    _engine(spark, tmp_path / "wh")
    engine = SparkEngine(
        _circuit(), tmp_path / "wh", spark=lambda: spark, local_rows=0, driver_rows=0
    )
    done = engine.compact_input_logs(8)
    assert done and all(c.committed for c in done)
    _equal_everywhere(engine)
    assert engine.full_refresh()["orders"].count() == 4


def test_many_small_epochs_keep_a_logarithmic_log(spark: Any, tmp_path: Path) -> None:
    c = Circuit("counted")
    c.view("events", c.zset_source("events", {"k": "bigint"}))
    engine = SparkEngine(c, tmp_path / "wh", spark=lambda: spark)
    for epoch in range(40):
        engine.step({"events": [((epoch % 7,), 1)]})
        if epoch % 10 == 9:
            engine.compact_input_logs(epoch)
    live = _log_batches(engine, "events")
    assert len(live) <= 6, [b.time for b in live]  # 40 epochs, 7 distinct rows
    assert sum(b.rows for b in live) <= 7 * len(live)
    _equal_everywhere(engine)
