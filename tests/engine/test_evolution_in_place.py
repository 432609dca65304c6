"""A circuit evolved in place (``engine/spark/evolve.py``): views added or changed are
rebuilt from the raw input log, the others continue from their state, removed views'
state is retired, and every view then equals a full refresh of the new definition, in
the epochs after as well; a loop added or changed is rebuilt an iteration at a time.
Changes that cannot evolve in place are refused, saying why, and leave the warehouse as
it was."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dbspark.circuit.aggregations import count, max_, sum_
from dbspark.circuit.builder import Circuit, Stream, emit
from dbspark.circuit.expressions import col
from dbspark.engine.circuits import CircuitChangedError, signature_path
from dbspark.engine.spark.executor import SparkEngine
from dbspark.storage import collection_names as coll
from dbspark.storage.catalog import CatalogError


def shop(
    *,
    big_first: bool = False,
    big_last: bool = False,
    total: str = "amount",
    without_totals: bool = False,
    with_returns: bool = False,
    key: tuple[str, ...] = ("order_id",),
    loop_limit: int | None = None,
    later: bool = False,
    largest: bool = True,
    widest: bool = False,
    before: bool = False,
) -> Circuit:
    """Orders and customers, with a definition's variations as options."""
    c = Circuit("shop")
    customers = c.upsert_source(
        "customers",
        {"cust_id": "bigint", "region": "string", "ts": "bigint"},
        key="cust_id",
        watermark="ts",
    )
    orders = c.upsert_source(
        "orders",
        {"order_id": "bigint", "cust_id": "bigint", "amount": "bigint", "ts": "bigint"},
        key=list(key),
        watermark="ts",
    )

    def big(stream: Stream) -> None:
        c.view("big_orders", stream.filter(col("amount") > 100).select("order_id", "amount"))

    if big_first:
        big(orders)
    current = orders.select("order_id", "cust_id", "amount")
    regions = customers.select("cust_id", "region")
    c.view("customers_current", regions)
    c.view("orders_current", current)
    joined = current.join(regions, on="cust_id")
    if not without_totals:
        c.view(
            "region_totals",
            joined.aggregate(
                by="region",
                orders=count(),
                total=sum_(col(total)),
                **({"widest": max_(col("amount"))} if widest else {}),
            ),
        )
    if largest:
        c.view("largest_per_customer", current.aggregate(by="cust_id", largest=max_(col("amount"))))
    if big_last:
        big(orders)
    if before:  # the last epoch's orders, of all and of the big ones
        c.view("orders_before", current.delay())
        c.view("big_before", current.filter(col("amount") > 100).delay())
    if later:  # each order's id again from the epoch after its watermark on
        again = orders.join_function(emit({"order_id": col("order_id")}, epoch=col("ts") + 1))
        c.view("orders_again", again)
    if with_returns:
        returns = c.zset_source("returns", {"order_id": "bigint"})
        c.view("returned", returns.join(current, on="order_id").select("order_id", "amount"))
    if loop_limit is not None:
        # Customers reachable from customer 1 through shared regions, a step at a time.
        edges = regions.join(regions.select("region", to=col("cust_id")), on="region").select(
            "cust_id", "to"
        )
        seed = regions.filter(col("cust_id") == 1).select("cust_id")

        def body(reach: Stream) -> Stream:
            step = reach.join(edges, on="cust_id").select(cust_id=col("to"))
            step = step.filter(col("cust_id") < loop_limit)
            return reach.plus(step).distinct()

        c.view("reachable", seed.iterate(body))
    return c


HISTORY: list[dict[str, list[Any]]] = [
    {
        "customers": [(1, "north", 1), (2, "south", 1), (3, "north", 1)],
        "orders": [(10, 1, 50, 1), (11, 2, 150, 1), (12, 3, 120, 1)],
    },
    {"orders": [(10, 1, 250, 2), (13, 2, 30, 2)], "customers": [(2, "north", 2)]},
    {"orders": [(14, 3, 500, 3)], "customers": [(4, "east", 3)]},
]
LATER: list[dict[str, list[Any]]] = [
    {"orders": [(15, 4, 70, 4), (11, 2, 90, 4)], "customers": [(1, "east", 4)]},
    {"orders": [(10, 1, 5, 5)], "returns": [((13,), 1), ((14,), 1)]},
    {"orders": [(16, 1, 999, 6)], "returns": [((13,), -1)]},
]


def _run(engine: SparkEngine, history: list[dict[str, list[Any]]]) -> None:
    sources = set(engine.circuit.sources)
    for batch in history:
        engine.step({name: rows for name, rows in batch.items() if name in sources})


def _equal_to_full_refresh(engine: SparkEngine) -> None:
    for tier in ("local", "spark"):
        assert engine.verify(tier=tier) == {name: [] for name in engine.circuit.views}, tier


def _orphans(engine: SparkEngine) -> set[str]:
    """Live state collections the engine's circuit has no node or view for."""
    from dbspark.circuit.planner import trace_keys

    c = engine.circuit
    expected = {coll.view(name) for name in c.views}
    for node in c.nodes:
        expected.update(coll.arranged(node.id, p) for p in range(len(trace_keys(c, node))))
        if node.op == "upsert_source":
            expected.add(coll.state(node.id))
    for node_id in c.sources.values():
        expected.add(coll.input_log(node_id))
    live = {b.collection for b in engine.catalog.all_batches(c.name) if b.live}
    kinds = ("arranged", "state", "input", "view")
    return {
        n for n in live if (coll.parse(n) and coll.parse(n).kind in kinds) and n not in expected
    }


def _live(engine: SparkEngine, collection: str) -> list[int]:
    return [b.id for b in engine.catalog.batches(engine.circuit.name, collection)]


def test_views_added_changed_and_shifted_are_rebuilt_and_the_others_continue(
    spark: Any, tmp_path: Path
) -> None:
    """A view added first (every node id shifts) and an aggregate changed: those two are
    rebuilt as of the last epoch; the unchanged views keep their published batches and
    their operators' state under the new ids; epochs then go on, equal to a full
    refresh of the new definition throughout."""
    root = tmp_path / "wh"
    old = SparkEngine(shop(), root, spark=lambda: spark)
    _run(old, HISTORY)
    kept_views = {v: _live(old, coll.view(v)) for v in ("orders_current", "customers_current")}
    old_largest = old.circuit.views["largest_per_customer"]
    old_state = _live(old, coll.arranged(old_largest, 0))
    assert old_state
    old.catalog.close()

    with pytest.raises(CircuitChangedError, match="It can evolve in place"):
        SparkEngine(shop(big_first=True, total="order_id"), root, spark=lambda: spark)

    engine = SparkEngine(
        shop(big_first=True, total="order_id"), root, spark=lambda: spark, evolve=True
    )
    report = engine.evolved
    assert report is not None and report.committed and report.epoch == len(HISTORY) - 1
    assert report.evolution.added == ["big_orders"]
    assert report.evolution.changed == ["region_totals"]
    assert report.rebuilt_views == ["big_orders", "region_totals"]
    assert report.renamed > 0  # every node id moved by one
    text = report.describe()
    assert "views added: big_orders" in text and "rebuilt from the raw input log" in text
    # Unchanged views and the unchanged aggregate's trace: the same batches, not rebuilt.
    for view, ids in kept_views.items():
        assert _live(engine, coll.view(view)) == ids, view
    largest = engine.circuit.views["largest_per_customer"]
    assert largest != old_largest
    assert _live(engine, coll.arranged(largest, 0)) == old_state
    # The commit is on the catalog's record of the epoch.
    stage = coll.evolve_stage(report.fingerprint)
    assert engine.catalog.stage_done("shop", stage, (report.epoch,))
    assert not _orphans(engine)
    _equal_to_full_refresh(engine)

    _run(engine, LATER)
    _equal_to_full_refresh(engine)
    assert {row[0] for row in engine.view("big_orders").rows()} == {12, 14, 16}

    # Opened again with the same definition: nothing to evolve.
    again = SparkEngine(
        shop(big_first=True, total="order_id"), root, spark=lambda: spark, evolve=True
    )
    assert again.evolved is None


def test_removed_views_retire_their_state_and_a_new_source_starts_empty(
    spark: Any, tmp_path: Path
) -> None:
    root = tmp_path / "wh"
    old = SparkEngine(shop(), root, spark=lambda: spark)
    _run(old, HISTORY)
    totals = old.circuit.views["region_totals"]
    join = old.circuit.node(totals).inputs[0]
    retired = [coll.view("region_totals"), coll.arranged(totals, 0)]
    assert all(_live(old, name) for name in retired)
    old.catalog.close()

    engine = SparkEngine(
        shop(without_totals=True, with_returns=True), root, spark=lambda: spark, evolve=True
    )
    report = engine.evolved
    assert report is not None
    assert report.evolution.removed == ["region_totals"]
    assert report.evolution.added == ["returned"]
    assert report.evolution.sources == {"returns": ["added"]}
    # Nothing of the removed aggregate, its join (no other reader) or its view is live;
    # the superseded batches stay until garbage collection.
    assert not _orphans(engine)
    assert not _live(engine, coll.view("region_totals"))
    assert {b.collection for b in engine.catalog.all_batches("shop")} >= set(retired)
    assert join not in engine.circuit.views.values()
    _equal_to_full_refresh(engine)
    _run(engine, LATER)
    _equal_to_full_refresh(engine)
    assert sorted(engine.view("returned").rows()) == [(14, 500)]


def graph(
    *,
    limit: int | None = None,
    reach: bool = True,
    delayed: bool = False,
    nested: bool = False,
    relayed: bool = False,
) -> Circuit:
    """Nodes reachable from the roots along edges (below ``limit``), and the edges;
    ``delayed`` also feeds each iterate back one iteration late (the same fixed point,
    through a ``delay`` in the loop); ``nested`` walks each step's paths to their end in
    a loop of its own inside the loop (the same fixed point again); ``relayed`` passes
    each step through a ``join_function`` that holds a step to node ``n`` until epoch
    ``n - 2`` (so that steps reached at one epoch arrive at later ones)."""
    c = Circuit("graph")
    edges = c.zset_source("edges", {"src": "bigint", "dst": "bigint"})
    roots = c.zset_source("roots", {"node": "bigint"})
    c.view("edges_now", edges)
    steps = edges.select(node=col("src"), to=col("dst"))

    def body(reached: Stream) -> Stream:
        step = reached.join(steps, on="node").select(node=col("to"))
        if limit is not None:
            step = step.filter(col("node") < limit)
        if delayed:
            step = step.plus(reached.delay())
        if relayed:
            step = step.join_function(emit({"node": col("node")}, epoch=col("node") - 2))
        if nested:

            def walk(further: Stream) -> Stream:
                ahead = further.join(steps, on="node").select(node=col("to"))
                if limit is not None:
                    ahead = ahead.filter(col("node") < limit)
                return further.plus(ahead).distinct()

            step = step.iterate(walk, name="walk")
        return reached.plus(step).distinct()

    if reach:
        c.view("reach", roots.iterate(body))
    return c


#: A chain 1 -> 2 -> ... -> 7, each node an iteration further than the one before.
GRAPH_HISTORY: list[dict[str, list[Any]]] = [
    {"edges": [((1, 2), 1), ((2, 3), 1), ((3, 4), 1)], "roots": [((1,), 1)]},
    {"edges": [((4, 5), 1), ((5, 6), 1)]},
    {"edges": [((6, 7), 1)]},
]
#: An epoch that changes nothing (where steps held until it arrive), the chain cut
#: after 2 (what was reached at iterations 2 and later goes), then a shortcut from 1 to
#: 4 (back, an iteration earlier than before), then the cut mended.
GRAPH_LATER: list[dict[str, list[Any]]] = [
    {},
    {"edges": [((2, 3), -1)]},
    {"edges": [((1, 4), 1)]},
    {"edges": [((2, 3), 1), ((6, 7), -1)]},
]


def _loop_traces(engine: SparkEngine) -> dict[str, set[tuple[int, ...]]]:
    """Each live arranged collection of a stateful node inside a loop, with the times of
    its batches."""
    c = engine.circuit
    inside = {n.id for n in c.nodes if c.scope(n.scope).depth > 1}
    traces: dict[str, set[tuple[int, ...]]] = {}
    for batch in engine.catalog.all_batches(c.name):
        parsed = coll.parse(batch.collection)
        if batch.live and parsed and parsed.kind == "arranged" and parsed.node in inside:
            traces.setdefault(batch.collection, set()).add(tuple(batch.time))
    return traces


#: The chain's nodes reached as of the last epoch of GRAPH_HISTORY, below 6 ...
UP_TO_5 = [1, 2, 3, 4, 5]
#: ... and when each step to node ``n`` is held until epoch ``n - 2`` (``relayed``).
UP_TO_4 = [1, 2, 3, 4]


@pytest.mark.parametrize(
    ("before", "after", "how", "reached"),
    [
        (lambda: graph(reach=False), lambda: graph(limit=6), "added", UP_TO_5),
        (graph, lambda: graph(limit=6), "changed", UP_TO_5),
        (graph, lambda: graph(limit=6, delayed=True), "changed", UP_TO_5),
        (graph, lambda: graph(limit=6, nested=True), "changed", UP_TO_5),
        (lambda: graph(nested=True), lambda: graph(limit=6, nested=True), "changed", UP_TO_5),
        (graph, lambda: graph(limit=6, relayed=True), "changed", UP_TO_4),
        # (the nested walk takes a step's paths to their end at once, unheld)
        (graph, lambda: graph(limit=6, relayed=True, nested=True), "changed", UP_TO_5),
    ],
    ids=[
        "recursive view added",
        "loop body changed",
        "a delay added in the loop",
        "a loop added in the loop",
        "a loop in the loop changed",
        "a join_function added in the loop",
        "a join_function and a loop added in the loop",
    ],
)
def test_a_loop_added_or_changed_is_rebuilt_an_iteration_at_a_time_and_continues(
    spark: Any, tmp_path: Path, before: Any, after: Any, how: str, reached: list[int]
) -> None:
    """A recursive view added, or its loop's body changed: the loop's state is rebuilt
    whole from a full refresh, one trace batch per iteration at the last epoch (the
    times its own epochs would have left, advanced to that epoch), and a
    ``join_function``'s rows due later held at their epochs' iterations; the epochs
    after it, which retract what later iterations reached (and, relayed, see held steps
    arrive), equal a full refresh of the new definition."""
    root = tmp_path / "wh"
    old = SparkEngine(before(), root, spark=lambda: spark)
    _run(old, GRAPH_HISTORY)
    old_traces = _loop_traces(old)
    old.catalog.close()

    engine = SparkEngine(after(), root, spark=lambda: spark, evolve=True)
    report = engine.evolved
    assert report is not None and report.committed
    assert getattr(report.evolution, how) == ["reach"]
    assert report.evolution.unchanged == ["edges_now"]
    last = len(GRAPH_HISTORY) - 1
    traces = _loop_traces(engine)
    assert traces
    # Every batch rebuilt (the old ones, at their own epochs, superseded) ...
    assert {t[0] for t in set().union(*old_traces.values())} == (
        set() if how == "added" else set(range(last + 1))
    )
    times = set().union(*traces.values())
    assert {t[0] for t in times} == {last}  # ... all at the last epoch ...
    # ... an iteration after the other (nested: an inner iteration after the other)
    if any(len(t) == 3 for t in times):
        assert {(last, 0, j) for j in range(len(reached) - 1)} <= times
    else:
        assert {(last, i) for i in range(len(reached))} <= times
    assert all(name in report.seeded for name in traces)
    assert not _orphans(engine)
    _equal_to_full_refresh(engine)
    assert sorted(engine.view("reach").rows()) == [(n,) for n in reached]

    expected = [[1, 2, 3, 4, 5], [1, 2], [1, 2, 4, 5], [1, 2, 3, 4, 5]]
    for batch, nodes in zip(GRAPH_LATER, expected, strict=True):
        _run(engine, [batch])
        _equal_to_full_refresh(engine)
        assert sorted(engine.view("reach").rows()) == [(n,) for n in nodes]


def test_a_delay_added_puts_out_the_last_epoch_at_the_next(spark: Any, tmp_path: Path) -> None:
    """Views of a new root-level delay, over a kept input (whose stored change at the
    last epoch it reads) and over a new one (whose change was never stored: written
    from full refreshes at the last epoch and the one before): the epoch after the
    evolution puts out the last epoch's change, so both views equal a full refresh of
    the new definition then, and later."""
    root = tmp_path / "wh"
    old = SparkEngine(shop(), root, spark=lambda: spark)
    _run(old, HISTORY)
    old.catalog.close()

    engine = SparkEngine(shop(before=True), root, spark=lambda: spark, evolve=True)
    report = engine.evolved
    assert report is not None and report.evolution.added == ["big_before", "orders_before"]
    _equal_to_full_refresh(engine)  # as of epoch 1: order 14 of epoch 2 not in yet
    assert {row[0] for row in engine.view("orders_before").rows()} == {10, 11, 12, 13}
    for batch in LATER:
        _run(engine, [batch])
        _equal_to_full_refresh(engine)
    assert {row[0] for row in engine.view("big_before").rows()} == {12, 14}


def test_a_join_function_added_holds_the_rows_due_after_the_last_epoch(
    spark: Any, tmp_path: Path
) -> None:
    """A new root-level ``join_function`` whose rows are due an epoch after their
    watermark: those of the input as of the evolution's epoch that are due later are
    held for their epochs, so the view equals a full refresh then, and later."""
    root = tmp_path / "wh"
    old = SparkEngine(shop(), root, spark=lambda: spark)
    _run(old, HISTORY)
    old.catalog.close()

    engine = SparkEngine(shop(later=True), root, spark=lambda: spark, evolve=True)
    assert engine.evolved is not None and engine.evolved.evolution.added == ["orders_again"]
    assert sorted(engine.view("orders_again").rows()) == [(11,), (12,)]  # due by epoch 2
    _equal_to_full_refresh(engine)
    for batch in LATER:
        _run(engine, [batch])
        _equal_to_full_refresh(engine)


def test_a_delay_is_not_added_once_the_input_logs_no_longer_hold_its_epoch(
    spark: Any, tmp_path: Path
) -> None:
    """Merged through the last epoch, the raw input logs cannot give the sources as of
    the epoch before it, which a new delay's first change needs: refused, saying so."""
    root = tmp_path / "wh"
    old = SparkEngine(shop(), root, spark=lambda: spark)
    _run(old, HISTORY)
    old.compact_input_logs(len(HISTORY) - 1)
    old.catalog.close()
    with pytest.raises(CircuitChangedError, match="the raw input logs were merged"):
        SparkEngine(shop(before=True), root, spark=lambda: spark, evolve=True)
    assert SparkEngine(shop(), root, spark=lambda: spark).evolved is None


@pytest.mark.parametrize(
    ("variant", "says"),
    [
        (lambda: shop(key=("order_id", "cust_id")), "so source 'orders' cannot continue"),
    ],
    ids=["source key"],
)
def test_what_cannot_evolve_in_place_is_refused_and_changes_nothing(
    spark: Any, tmp_path: Path, variant: Any, says: str
) -> None:
    root = tmp_path / "wh"
    base = graph() if "node" in says else shop()
    old = SparkEngine(base, root, spark=lambda: spark)
    _run(old, HISTORY)
    before = [(b.id, b.collection, b.live) for b in old.catalog.all_batches("shop")]
    old.catalog.close()
    with pytest.raises(CircuitChangedError) as refused:
        SparkEngine(variant(), root, spark=lambda: spark, evolve=True)
    assert says in str(refused.value)
    engine = SparkEngine(base, root, spark=lambda: spark)
    assert [(b.id, b.collection, b.live) for b in engine.catalog.all_batches("shop")] == before
    _run(engine, LATER)
    _equal_to_full_refresh(engine)


def test_an_open_epoch_is_finished_under_the_old_definition_first(
    spark: Any, tmp_path: Path
) -> None:
    root = tmp_path / "wh"
    old = SparkEngine(shop(), root, spark=lambda: spark)
    _run(old, HISTORY)
    old.open_epoch(len(HISTORY))
    old.catalog.close()
    with pytest.raises(CatalogError, match="while epoch 3 is open"):
        SparkEngine(shop(big_last=True), root, spark=lambda: spark, evolve=True)
    # Nothing the refused evolution wrote is left registered, nor noted as under way.
    engine = SparkEngine(shop(), root, spark=lambda: spark)
    assert not _live(engine, coll.view("big_orders"))
    assert "evolution" not in json.loads(signature_path(root, "shop").read_text())


def _run_and_export(engine: SparkEngine, epoch: int, batch: dict[str, Any], out: Path) -> None:
    """One epoch with its outputs exported between publish and close, as the DAG runs it."""
    from dbspark.orchestration.sinks.export import export_epoch

    sources = engine.circuit.sources
    checked = {n: engine.check_batch(n, rows) for n, rows in batch.items() if n in sources}
    assert engine.open_epoch(epoch)
    for stage in engine.plan.stages_in_scope(0):
        anchor = engine.circuit.node(stage.anchor)
        if anchor.op in ("zset_source", "upsert_source"):
            engine.ingest(anchor.label, epoch, checked.get(anchor.label))
            continue
        engine.run_stage(stage.id, (epoch,))
    engine.publish(epoch)
    export_epoch(engine, epoch, root=out)
    engine.close_epoch(epoch)


def _outputs_hold_the_views(engine: SparkEngine, out: Path, epoch: int) -> None:
    """Each view's change feed, summed, and its table equal the engine's view."""
    from dbspark.core.zset import ZSet
    from dbspark.orchestration.sinks.files import arrow_rows, feed_view
    from dbspark.orchestration.sinks.tables import read_table, table_path

    for view, node_id in engine.circuit.views.items():
        schema = engine.circuit.node(node_id).schema
        expected = engine.view(view)
        fed = feed_view(out, "shop", view, schema, epoch)
        assert fed is not None, view
        assert ZSet(arrow_rows(fed, schema)) == expected, view
        table = read_table(table_path(out, "shop", view))
        held = ZSet((tuple(r[n] for n in schema.names), r["__copies"]) for r in table.to_pylist())
        assert held == expected, view


def _serve(engine: SparkEngine, serving: Any, out: Path, epoch: int) -> None:
    """What the DAG's serve task does after an epoch: every serving table caught up, and
    those of views no longer in the circuit dropped."""
    from dbspark.orchestration.sinks.serving import catch_up, retire_removed

    c = engine.circuit
    schemas = {view: c.node(node).schema for view, node in c.views.items()}
    results = catch_up(serving, c.name, schemas, out, epoch)
    assert {view: r.epoch for view, r in results.items()} == {view: epoch for view in schemas}
    retire_removed(serving, c.name, schemas)
    assert serving.served_views(c.name) == sorted(schemas)


def _served(engine: SparkEngine, serving: Any) -> None:
    """Each view's serving table holds the view."""
    from dbspark.core.zset import ZSet

    for view, node in engine.circuit.views.items():
        schema = engine.circuit.node(node).schema
        assert ZSet(serving.contents("shop", view, schema)) == engine.view(view), view


def _served_history(spark: Any, tmp_path: Path) -> tuple[Path, Path, Any]:
    """The warehouse, outputs and SQLite serving database of ``shop()`` after HISTORY,
    each epoch exported and served as the DAG does."""
    from dbspark.orchestration.sinks.serving import ServingTarget

    root, out = tmp_path / "wh", tmp_path / "out"
    serving = ServingTarget(f"sqlite:///{tmp_path / 'serving.db'}")
    old = SparkEngine(shop(), root, spark=lambda: spark)
    for epoch, batch in enumerate(HISTORY):
        _run_and_export(old, epoch, batch, out)
        _serve(old, serving, out, epoch)
    _served(old, serving)
    old.catalog.close()
    return root, out, serving


def _retried_then_continued(
    spark: Any, new: Circuit, root: Path, out: Path, serving: Any
) -> SparkEngine:
    """The evolve unit run again (the task failed after it): the state is evolved and
    the outputs done, so it does nothing; then LATER's epochs, exported and served,
    leave every output holding its view."""
    from dbspark.orchestration.units import EvolveUnit, execute_unit

    again = SparkEngine(new, root, spark=lambda: spark, evolve=True)
    assert again.evolved is None
    assert execute_unit(again, EvolveUnit(-1, outputs=str(out)))["outputs"] == {}
    for epoch, batch in enumerate(LATER, start=len(HISTORY)):
        _run_and_export(again, epoch, batch, out)
        _serve(again, serving, out, epoch)
    _outputs_hold_the_views(again, out, len(HISTORY) + len(LATER) - 1)
    _served(again, serving)
    return again


def test_the_evolve_unit_brings_the_outputs_along(spark: Any, tmp_path: Path) -> None:
    """A view added gets its feed (first change: its whole contents), its table and its
    serving table, a view changed their correction, a view removed has its outputs moved
    to ``_retired/``; run again, the unit finds it all done; later epochs publish and
    serve as usual."""
    from dbspark.orchestration.units import EvolveUnit, execute_unit

    root, out, serving = _served_history(spark, tmp_path)
    assert (out / "shop" / "largest_per_customer").is_dir()

    new = shop(big_last=True, total="order_id", largest=False)
    engine = SparkEngine(new, root, spark=lambda: spark, evolve=True)
    result = execute_unit(engine, EvolveUnit(-1, outputs=str(out)))
    assert result["evolved"] and result["epoch"] == 2
    outputs = result["outputs"]
    assert outputs["big_orders"].startswith("added: change +4/-0")
    assert outputs["region_totals"].startswith("changed: region_totals: correction of epoch 2")
    assert outputs["largest_per_customer"].startswith("removed: outputs moved to")
    assert not (out / "shop" / "largest_per_customer").exists()
    assert (out / "shop" / "_retired" / "largest_per_customer@epoch=2" / "table").is_dir()
    _outputs_hold_the_views(engine, out, 2)
    _serve(engine, serving, out, 2)
    _served(engine, serving)
    engine.catalog.close()

    again = _retried_then_continued(spark, new, root, out, serving)
    _equal_to_full_refresh(again)


def test_a_view_given_other_columns_starts_its_outputs_again(spark: Any, tmp_path: Path) -> None:
    """A changed view whose definition adds a column cannot take a correction in its
    old columns: its outputs move to ``_retired/`` and start again at the evolution's
    epoch as an added view's do (feed, table), and its serving table is loaded again in
    the new columns; the removed view's serving table is dropped. Later epochs publish
    and serve as usual."""
    from dbspark.orchestration.sinks.tables import table_columns, table_path
    from dbspark.orchestration.units import EvolveUnit, execute_unit

    root, out, serving = _served_history(spark, tmp_path)
    assert "largest_per_customer" in serving.served_views("shop")

    new = shop(widest=True, largest=False)
    engine = SparkEngine(new, root, spark=lambda: spark, evolve=True)
    outputs = execute_unit(engine, EvolveUnit(-1, outputs=str(out)))["outputs"]
    assert outputs["region_totals"].startswith("changed, with other columns: change +")
    assert (out / "shop" / "_retired" / "region_totals@epoch=2" / "table").is_dir()
    table = table_path(out, "shop", "region_totals")
    assert table_columns(table) == ["region", "orders", "total", "widest", "__copies"]
    _outputs_hold_the_views(engine, out, 2)
    _serve(engine, serving, out, 2)  # reloaded in the new columns; the removed one dropped
    _served(engine, serving)
    assert "largest_per_customer" not in serving.served_views("shop")
    engine.catalog.close()

    _retried_then_continued(spark, new, root, out, serving)


def test_outputs_are_brought_along_by_the_next_run_when_the_evolving_task_failed(
    spark: Any, tmp_path: Path
) -> None:
    """The state evolved and the task died before the outputs: the next EvolveUnit (its
    engine finds nothing left to evolve) still brings them along, once."""
    from dbspark.orchestration.units import EvolveUnit, execute_unit

    root, out = tmp_path / "wh", tmp_path / "out"
    old = SparkEngine(shop(), root, spark=lambda: spark)
    for epoch, batch in enumerate(HISTORY):
        _run_and_export(old, epoch, batch, out)
    old.catalog.close()
    new = shop(big_last=True)
    SparkEngine(new, root, spark=lambda: spark, evolve=True).catalog.close()  # no outputs
    engine = SparkEngine(new, root, spark=lambda: spark, evolve=True)
    assert engine.evolved is None
    result = execute_unit(engine, EvolveUnit(-1, outputs=str(out)))
    assert list(result["outputs"]) == ["big_orders"]
    _outputs_hold_the_views(engine, out, 2)
    assert execute_unit(engine, EvolveUnit(-1, outputs=str(out)))["outputs"] == {}


def test_a_process_that_died_after_the_commit_leaves_enough_for_the_outputs(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed between the catalog's commit and keeping the new signature: the catalog
    holds the new definition, the signature file still the old one and the evolution
    under way. The next registration keeps what it evolved from, and the EvolveUnit
    brings the outputs along."""
    import dbspark.engine.circuits as circuits
    from dbspark.orchestration.units import EvolveUnit, execute_unit

    root, out = tmp_path / "wh", tmp_path / "out"
    old = SparkEngine(shop(), root, spark=lambda: spark)
    for epoch, batch in enumerate(HISTORY):
        _run_and_export(old, epoch, batch, out)
    old.catalog.close()

    def killed(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("killed after the commit")

    monkeypatch.setattr(circuits, "register", killed)  # after the commit: the new signature
    with pytest.raises(RuntimeError, match="killed after the commit"):
        SparkEngine(shop(big_last=True), root, spark=lambda: spark, evolve=True)
    monkeypatch.undo()
    engine = SparkEngine(shop(big_last=True), root, spark=lambda: spark)  # no evolve asked
    assert engine.evolved is None
    result = execute_unit(engine, EvolveUnit(-1, outputs=str(out)))
    assert list(result["outputs"]) == ["big_orders"]
    _outputs_hold_the_views(engine, out, 2)
    _equal_to_full_refresh(engine)
