"""The full refresh: every public conformance vector, and one hand example per operator.

The full refresh is an oracle (ARCHITECTURE.md, "Two ways to every answer"), so its own answers are
checked against values worked out by hand here, never against the incremental
engine alone; where a case is subtle the incremental engine is asked too.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from dbspark.circuit.aggregations import avg, count, max_, min_, sum_, udf
from dbspark.circuit.builder import Circuit, Stream, emit
from dbspark.circuit.expressions import col, if_else, lit, sequence, split
from dbspark.core.upsert import BadUpsertRow, UpsertConflict
from dbspark.core.zset import ZSet
from dbspark.engine.api import InputError, LoopDidNotConverge
from dbspark.engine.reference.engine import ReferenceEngine
from dbspark.engine.reference.full_refresh import FullRefresh, full_refresh
from dbspark.examples.circuits import NAMED_CIRCUITS, reachability


def rows(z: ZSet) -> list[list[Any]]:
    """A view as the vectors write it: [row, weight] sorted by the JSON text of the row."""
    return sorted(
        ([list(row), weight] for row, weight in z.items()), key=lambda p: json.dumps(p[0])
    )


def zset(*pairs: tuple[tuple, int]) -> ZSet:
    return ZSet(pairs)


def ones(*rows_: tuple) -> ZSet:
    return ZSet((row, 1) for row in rows_)


# --- sources and arguments ---------------------------------------------------------------
def passthrough(source: str = "s", schema: dict[str, str] | None = None) -> Circuit:
    c = Circuit("passthrough")
    c.view("v", c.zset_source(source, schema or {"x": "bigint"}))
    return c


def test_zset_source_is_the_sum_of_its_batches() -> None:
    c = passthrough()
    history = [{"s": [((1,), 2), ((2,), 1)]}, {}, None, {"s": [((1,), -2), ((3,), -1)]}]
    assert full_refresh(c, history, 0)["v"] == zset(((1,), 2), ((2,), 1))
    assert full_refresh(c, history, 2)["v"] == zset(((1,), 2), ((2,), 1))
    assert full_refresh(c, history)["v"] == zset(((2,), 1), ((3,), -1))


def test_epoch_argument_and_empty_history() -> None:
    c = passthrough()
    assert full_refresh(c, []) == {"v": ZSet()}
    with pytest.raises(ValueError, match="outside the history"):
        full_refresh(c, [{}], 1)
    with pytest.raises(ValueError, match="outside the history"):
        full_refresh(c, [{}], -1)


def test_unknown_source_and_bad_rows_are_rejected() -> None:
    c = passthrough()
    with pytest.raises(InputError, match=r"source 'nope': epoch 0: .* has no such source"):
        full_refresh(c, [{"nope": []}])
    with pytest.raises(InputError, match="'s'"):
        full_refresh(c, [{"s": [(("text",), 1)]}])
    with pytest.raises(InputError, match="weight"):
        full_refresh(c, [{"s": [((1,), 1.5)]}])


def test_bad_input_after_the_asked_epoch_does_not_matter() -> None:
    c = passthrough()
    history = [{"s": [((1,), 1)]}, {"s": [(("bad",), 1)]}]
    assert full_refresh(c, history, 0)["v"] == ones((1,))
    with pytest.raises(InputError):
        full_refresh(c, history)


# --- linear operators -------------------------------------------------------------------
def one_source(build: Any, schema: dict[str, str]) -> Circuit:
    c = Circuit("linear")
    s = c.zset_source("s", schema)
    c.view("v", build(s))
    return c


def test_select_computes_with_sql_nulls() -> None:
    c = one_source(lambda s: s.select(y=col("x") * 2, z=col("x") / 0), {"x": "bigint"})
    history = [{"s": [((3,), 1), ((None,), 2), ((-3,), -1)]}]
    assert full_refresh(c, history)["v"] == zset(
        ((6, None), 1), ((None, None), 2), ((-6, None), -1)
    )


def test_select_merges_rows_that_become_equal() -> None:
    c = one_source(lambda s: s.select(y=col("x") % 2), {"x": "bigint"})
    history = [{"s": [((1,), 1), ((3,), 2), ((4,), 1), ((6,), -1)]}]
    assert full_refresh(c, history)["v"] == zset(((1,), 3))


def test_filter_drops_false_and_null() -> None:
    c = one_source(lambda s: s.filter(col("x") > 1), {"x": "bigint"})
    history = [{"s": [((1,), 1), ((2,), -1), ((None,), 1), ((5,), 3)]}]
    assert full_refresh(c, history)["v"] == zset(((2,), -1), ((5,), 3))


def test_flat_map_one_row_per_element_and_none_for_null() -> None:
    c = one_source(
        lambda s: s.flat_map("i", sequence(lit(1), col("x"))), {"x": "bigint", "tag": "string"}
    )
    history = [{"s": [((2, "a"), 2), ((None, "b"), 1), ((1, "c"), -1)]}]
    assert full_refresh(c, history)["v"] == zset(
        ((2, "a", 1), 2), ((2, "a", 2), 2), ((1, "c", 1), -1)
    )
    words = one_source(lambda s: s.flat_map("w", split(col("line"), " ")), {"line": "string"})
    assert full_refresh(words, [{"s": [(("a b a",), 1)]}])["v"] == zset(
        (("a b a", "a"), 2), (("a b a", "b"), 1)
    )


def test_negate_plus_minus() -> None:
    c = Circuit("arith")
    a = c.zset_source("a", {"x": "bigint"})
    b = c.zset_source("b", {"x": "bigint"})
    c.view("neg", a.negate())
    c.view("sum", a.plus(b))
    c.view("diff", a.minus(b))
    history = [{"a": [((1,), 2), ((2,), 1)], "b": [((1,), 2), ((3,), 1)]}]
    got = full_refresh(c, history)
    assert got["neg"] == zset(((1,), -2), ((2,), -1))
    assert got["sum"] == zset(((1,), 4), ((2,), 1), ((3,), 1))
    assert got["diff"] == zset(((2,), 1), ((3,), -1))


def test_index_by_consolidate_and_inspect_pass_through() -> None:
    seen: list[Any] = []
    c = one_source(
        lambda s: s.index_by("x").consolidate().inspect(lambda t, z: seen.append((t, z))),
        {"x": "bigint"},
    )
    history = [{"s": [((1,), 1), ((1,), 1), ((2,), 0)]}]
    assert full_refresh(c, history)["v"] == zset(((1,), 2))
    assert seen == []  # the callback shows deltas; a full refresh has none


# --- the general linear operator ----------------------------------------------------------
def test_explode_multiplies_weights_and_drops_null_or_zero() -> None:
    c = one_source(lambda s: s.explode(col("n")), {"k": "string", "n": "bigint"})
    history = [{"s": [(("a", 3), 2), (("b", -1), 1), (("c", 0), 5), (("d", None), 1)]}]
    assert full_refresh(c, history)["v"] == zset((("a", 3), 6), (("b", -1), -1))


def test_join_function_several_emits_with_when() -> None:
    c = one_source(
        lambda s: s.join_function(
            emit({"y": col("x")}),
            emit({"y": col("x") * 10}, weight=2, when=col("x") > 1),
        ),
        {"x": "bigint"},
    )
    history = [{"s": [((1,), 1), ((2,), -1), ((None,), 1)]}]
    assert full_refresh(c, history)["v"] == zset(((1,), 1), ((2,), -1), ((20,), -2), ((None,), 1))


def window_circuit() -> Circuit:
    """A temporal filter: each event is visible in epochs [start, end)."""
    return one_source(
        lambda s: s.join_function(
            emit({"id": col("id")}, epoch=col("start")),
            emit({"id": col("id")}, weight=-1, epoch=col("end")),
        ),
        {"id": "string", "start": "bigint", "end": "bigint"},
    )


def test_temporal_filter_shows_rows_from_their_epoch() -> None:
    c = window_circuit()
    events = [(("early", 0, 2), 1), (("late", 2, 3), 1), (("open", 1, None), 1)]
    events.append((("never", None, 1), 1))  # a NULL start never arrives; its end still does
    history: list[dict[str, Any]] = [{"s": events}, {}, {}, {}]
    never = zset((("never",), -1))
    expected = [
        ones(("early",)),
        ones(("early",), ("open",)) + never,
        ones(("late",), ("open",)) + never,
        ones(("open",)) + never,
    ]
    engine = ReferenceEngine(c)
    for epoch, want in enumerate(expected):
        assert full_refresh(c, history, epoch)["v"] == want, f"epoch {epoch}"
        assert engine.step(history[epoch]).views["v"] == want, f"engine, epoch {epoch}"


def test_temporal_filter_with_a_row_arriving_after_its_start() -> None:
    c = window_circuit()
    history: list[dict[str, Any]] = [{}, {}, {"s": [(("x", 0, 3), 1)]}, {}]
    assert full_refresh(c, history, 2)["v"] == ones(("x",))
    assert full_refresh(c, history, 3)["v"] == ZSet()


# --- stateful operators -------------------------------------------------------------------
def test_join_multiplies_weights() -> None:
    c = Circuit("j")
    left = c.zset_source("left", {"k": "bigint", "a": "string"})
    right = c.zset_source("right", {"key": "bigint", "b": "string"})
    c.view("v", left.join(right, left_on="k", right_on="key"))
    history = [
        {
            "left": [((1, "x"), 2), ((1, "y"), -1), ((2, "z"), 1)],
            "right": [((1, "p"), 3), ((3, "q"), 1)],
        }
    ]
    assert full_refresh(c, history)["v"] == zset(((1, "x", "p"), 6), ((1, "y", "p"), -3))


def test_join_on_index_by_keys() -> None:
    c = Circuit("j")
    left = c.zset_source("left", {"k": "bigint", "a": "string"}).index_by("k")
    right = c.zset_source("right", {"k": "bigint", "b": "string"}).index_by("k")
    c.view("v", left.join(right))
    history = [{"left": [((1, "x"), 1)], "right": [((1, "p"), 1), ((1, "q"), 1)]}]
    assert full_refresh(c, history)["v"] == ones((1, "x", "p"), (1, "x", "q"))


def test_distinct_keeps_positive_rows_once() -> None:
    c = one_source(lambda s: s.distinct(), {"x": "bigint"})
    history = [{"s": [((1,), 3), ((2,), -1), ((3,), 1)]}, {"s": [((3,), -1), ((2,), 2)]}]
    assert full_refresh(c, history, 0)["v"] == ones((1,), (3,))
    assert full_refresh(c, history)["v"] == ones((1,), (2,))


def test_aggregate_follows_sql() -> None:
    c = one_source(
        lambda s: s.aggregate(
            by="g",
            n=count(),
            n_v=count(col("v")),
            total=sum_(col("v")),
            low=min_(col("v")),
            high=max_(col("v")),
            mean=avg(col("v")),
        ),
        {"g": "string", "v": "bigint"},
    )
    history = [
        {
            "s": [
                (("a", 1), 2),
                (("a", 4), 1),
                (("a", None), 1),
                (("b", None), 3),
                (("c", 5), 1),
                (("c", 5), -1),  # cancels: group c is empty
                (("d", 7), -1),  # only a negative row: the group is present
            ]
        }
    ]
    assert full_refresh(c, history)["v"] == ones(
        ("a", 4, 3, 6, 1, 4, 2.0),
        ("b", 3, 0, None, None, None, None),
        ("d", -1, -1, -7, None, None, 7.0),
    )


def test_global_aggregate_is_absent_on_empty_input() -> None:
    c = one_source(lambda s: s.aggregate(n=count(), total=sum_(col("x"))), {"x": "bigint"})
    history = [{"s": [((2,), 2)]}, {"s": [((2,), -2)]}]
    assert full_refresh(c, history, 0)["v"] == ones((2, 4))
    assert full_refresh(c, history)["v"] == ZSet()


def test_user_defined_aggregate_sees_one_value_per_copy() -> None:
    def spread(values: list[Any]) -> int:
        present = [v for v in values if v is not None]
        return max(present) - min(present) if present else 0

    c = one_source(
        lambda s: s.aggregate(by="g", spread=udf(spread, col("v"), "bigint")),
        {"g": "string", "v": "bigint"},
    )
    history = [{"s": [(("a", 1), 2), (("a", 9), 1), (("b", None), 1)]}]
    assert full_refresh(c, history)["v"] == ones(("a", 8), ("b", 0))


# --- time -------------------------------------------------------------------------------
def test_delay_at_the_root_is_the_previous_epoch() -> None:
    c = Circuit("d")
    s = c.zset_source("s", {"x": "bigint"})
    c.view("previous", s.delay())
    c.view("change", s.minus(s.delay()))
    history = [{"s": [((1,), 1)]}, {"s": [((2,), 1)]}, {}, {"s": [((1,), -1)]}]
    expected_previous = [ZSet(), ones((1,)), ones((1,), (2,)), ones((1,), (2,))]
    expected_change = [ones((1,)), ones((2,)), ZSet(), zset(((1,), -1))]
    engine = ReferenceEngine(c)
    for epoch in range(len(history)):
        got = full_refresh(c, history, epoch)
        assert got == {"previous": expected_previous[epoch], "change": expected_change[epoch]}
        assert engine.step(history[epoch]).views == got


def test_delay_chain_over_many_epochs_does_not_recurse_deeply() -> None:
    c = Circuit("d")
    s = c.zset_source("s", {"x": "bigint"})
    c.view("v", s.delay().delay())
    history = [{"s": [((e,), 1)]} for e in range(1200)]
    assert full_refresh(c, history)["v"] == ones(*((e,) for e in range(1198)))


# --- recursion ---------------------------------------------------------------------------
def test_iterate_reachability_with_a_cycle() -> None:
    c = reachability()
    history = [
        {"edges": [(("a", "b"), 1), (("b", "c"), 1), (("c", "b"), 1)], "roots": [(("a",), 1)]},
        {"edges": [(("a", "b"), -1)]},
        {"roots": [(("c",), 1)]},
    ]
    assert full_refresh(c, history, 0)["reach"] == ones(("a",), ("b",), ("c",))
    assert full_refresh(c, history, 1)["reach"] == ones(("a",))
    assert full_refresh(c, history, 2)["reach"] == ones(("a",), ("b",), ("c",))


def test_iterate_fixed_point_per_iteration() -> None:
    """X_0 = the initial collection, X_{i+1} = body(X_i); past the fixed point nothing moves."""
    c = Circuit("chain")
    n = c.zset_source("n", {"x": "bigint"})
    out = n.iterate(lambda x: x.plus(x.select(x=col("x") + 1)).filter(col("x") <= 3).distinct())
    c.view("v", out)
    scope = c.scopes[1]
    refresh = FullRefresh(c, [{"n": [((0,), 1)]}])
    assert refresh.collection(scope.variable, (0, 0)) == ones((0,))
    assert refresh.collection(scope.result, (0, 0)) == ones((0,), (1,))
    assert refresh.collection(scope.variable, (0, 1)) == ones((0,), (1,))
    assert refresh.collection(scope.result, (0, 2)) == ones((0,), (1,), (2,), (3,))
    assert refresh.collection(scope.result, (0, 9)) == ones((0,), (1,), (2,), (3,))
    assert refresh.views() == {"v": ones((0,), (1,), (2,), (3,))}


def test_iterate_that_never_settles_raises() -> None:
    c = Circuit("runaway")
    n = c.zset_source("n", {"x": "bigint"})
    out = n.iterate(
        lambda x: x.plus(x.select(x=col("x") + 1)).distinct(), max_iterations=20, name="up"
    )
    c.view("v", out)
    with pytest.raises(LoopDidNotConverge, match="'up'"):
        full_refresh(c, [{"n": [((0,), 1)]}])
    # With an empty input it settles at once.
    assert full_refresh(c, [{}]) == {"v": ZSet()}


def test_iterate_max_iterations_counts_applications_of_the_body() -> None:
    def circuit(bound: int) -> Circuit:
        c = Circuit("bounded")
        n = c.zset_source("n", {"x": "bigint"})
        out = n.iterate(
            lambda x: x.plus(x.select(x=col("x") + 1)).filter(col("x") <= 3).distinct(),
            max_iterations=bound,
        )
        c.view("v", out)
        return c

    # X_0 = {0}, X_1 = {0, 1}, X_2 = {0, 1, 2}, X_3 = {0..3} = body(X_3): four applications.
    # (The incremental engine counts iterations differently: it also runs the one that
    # confirms nothing changed, so the two need not agree exactly at the bound.)
    assert full_refresh(circuit(4), [{"n": [((0,), 1)]}])["v"] == ones(*((i,) for i in range(4)))
    with pytest.raises(LoopDidNotConverge):
        full_refresh(circuit(3), [{"n": [((0,), 1)]}])


def delayed_loop() -> Circuit:
    """X = distinct(input + map(n + 10, delay(X))) below 40: the delay is part of the state."""
    c = Circuit("delayed")
    n = c.zset_source("n", {"x": "bigint"})
    out = n.iterate(
        lambda x: n.plus(x.delay().select(x=col("x") + 10)).filter(col("x") < 40).distinct()
    )
    c.view("v", out)
    return c


def test_delay_inside_a_loop_is_the_previous_iteration() -> None:
    c = delayed_loop()
    # Iteration 0: X_0 = {1}, body sees an empty delay and gives {1} = X_0, but the delay's
    # input moved (from nothing to {1}), so the loop has not settled; it stops at {1..31}.
    history = [{"n": [((1,), 1)]}, {"n": [((2,), 1)]}, {"n": [((1,), -1)]}]
    expected = [
        ones((1,), (11,), (21,), (31,)),
        ones((1,), (11,), (21,), (31,), (2,), (12,), (22,), (32,)),
        ones((2,), (12,), (22,), (32,)),
    ]
    scope = c.scopes[1]
    delay = next(node for node in c.nodes if node.op == "delay")
    refresh = FullRefresh(c, history)
    assert refresh.collection(delay.id, (0, 0)) == ZSet()
    assert refresh.collection(delay.id, (0, 1)) == ones((1,))
    assert refresh.collection(scope.result, (0, 1)) == ones((1,), (11,))
    engine = ReferenceEngine(c)
    for epoch, want in enumerate(expected):
        assert full_refresh(c, history, epoch)["v"] == want
        assert engine.step(history[epoch]).views["v"] == want


def nested_reachability() -> Circuit:
    """Reachability where each outer step closes over ``a`` edges, then takes one ``b`` edge.

    The inner loop is a fixed point inside every iteration of the outer one; the
    answer is reachability over ``a`` and ``b`` edges together.
    """
    c = Circuit("nested")
    a = c.zset_source("a", {"src": "string", "dst": "string"})
    b = c.zset_source("b", {"src": "string", "dst": "string"})
    roots = c.zset_source("roots", {"node": "string"})

    def outer(x: Stream) -> Stream:
        closure = x.iterate(
            lambda y: (
                y.join(a, left_on="node", right_on="src").select(node=col("dst")).plus(x).distinct()
            ),
            name="inner",
        )
        hop = closure.join(b, left_on="node", right_on="src").select(node=col("dst"))
        return closure.plus(hop).plus(roots).distinct()

    c.view("reach", roots.iterate(outer, name="outer"))
    return c


def test_nested_loops() -> None:
    c = nested_reachability()
    history = [
        {
            "a": [(("r", "s"), 1), (("s", "t"), 1), (("u", "v"), 1), (("v", "u"), 1)],
            "b": [(("t", "u"), 1)],
            "roots": [(("r",), 1)],
        },
        {"b": [(("t", "u"), -1), (("s", "v"), 1)]},
        {"a": [(("r", "s"), -1)]},
    ]
    expected = [
        ones(("r",), ("s",), ("t",), ("u",), ("v",)),
        ones(("r",), ("s",), ("t",), ("u",), ("v",)),
        ones(("r",)),
    ]
    refresh = FullRefresh(c, history)
    for epoch, want in enumerate(expected):
        assert refresh.views(epoch)["reach"] == want, f"epoch {epoch}"


def test_inner_loop_values_per_outer_iteration() -> None:
    c = nested_reachability()
    inner = next(s for s in c.scopes if s.name == "inner")
    history = [
        {"a": [(("r", "s"), 1)], "b": [(("s", "t"), 1)], "roots": [(("r",), 1)]},
    ]
    refresh = FullRefresh(c, history)
    # Outer iteration 0 closes {r} over a: {r, s}; outer iteration 1 starts from {r, s, t}.
    assert refresh.collection(inner.output, (0, 0)) == ones(("r",), ("s",))
    assert refresh.collection(inner.result, (0, 1, 0)) == ones(("r",), ("s",), ("t",))


# --- upsert sources -----------------------------------------------------------------------
def accounts_history() -> list[dict[str, Any]]:
    def row(i: int, status: str | None, balance: int | None, major: Any, minor: Any) -> dict:
        return {"id": i, "status": status, "balance": balance, "wm_major": major, "wm_minor": minor}

    return [
        {"accounts": [row(1, "open", 10, 1, 0), row(2, "open", 5, None, None)]},
        {"accounts": [row(1, "open", 99, 0, 9), row(2, "open", 6, 0, None)]},  # 1 late, 2 fresher
        {"accounts": [row(1, "DELETED", None, 2, 0), row(2, "open", 7, 0, 0)]},
        {"accounts": [row(1, "open", 50, 1, 5)]},  # older than the tombstone: nothing
        {"accounts": [row(1, "open", 60, 2, 1), row(2, "open", 6, 0, None)]},  # comes back
    ]


def test_upsert_greatest_watermark_wins_tombstones_delete() -> None:
    c = NAMED_CIRCUITS["accounts"]()
    history = accounts_history()
    expected = [
        ones((1, "open", 10), (2, "open", 5)),
        ones((1, "open", 10), (2, "open", 6)),
        ones((2, "open", 7)),
        ones((2, "open", 7)),
        ones((1, "open", 60), (2, "open", 7)),
    ]
    engine = ReferenceEngine(c)
    for epoch, want in enumerate(expected):
        assert full_refresh(c, history, epoch)["accounts_current"] == want, f"epoch {epoch}"
        assert engine.step(history[epoch]).views["accounts_current"] == want


def test_upsert_source_state_keeps_tombstones_flagged() -> None:
    c = Circuit("state")
    c.upsert_source(
        "s",
        {"k": "bigint", "v": "string", "ts": "bigint", "gone": "boolean"},
        key="k",
        watermark="ts",
        tombstone="gone",
    )
    c.view("state", c.stream("s"))
    history = [{"s": [(1, "a", 1, None), (2, "b", 1, False), (1, None, 2, True)]}]
    assert full_refresh(c, history)["state"] == ones(
        (1, None, 2, True, True), (2, "b", 1, False, False)
    )


def test_upsert_conflicts_raise_like_ingestion() -> None:
    c = NAMED_CIRCUITS["accounts"]()

    def row(balance: int, major: int) -> dict[str, Any]:
        return {"id": 1, "status": "open", "balance": balance, "wm_major": major, "wm_minor": 0}

    in_one_batch = [{"accounts": [row(1, 5), row(2, 5)]}]
    against_winner = [{"accounts": [row(1, 5)]}, {"accounts": [row(2, 5)]}]
    below_winner_in_batch = [{"accounts": [row(1, 9)]}, {"accounts": [row(1, 2), row(2, 2)]}]
    for history in (in_one_batch, against_winner, below_winner_in_batch):
        with pytest.raises(UpsertConflict, match="'accounts'") as raised:
            full_refresh(c, history)
        assert raised.value.keys == [(1,)]
        engine = ReferenceEngine(c)
        with pytest.raises(UpsertConflict):
            for batches in history:
                engine.step(batches)


def test_upsert_resends_and_stale_rows_are_not_conflicts() -> None:
    c = NAMED_CIRCUITS["accounts"]()

    def row(balance: int, major: int) -> dict[str, Any]:
        return {"id": 1, "status": "open", "balance": balance, "wm_major": major, "wm_minor": 0}

    # A resend of the winner, and a row that differs from an old (no longer winning) one at
    # the old one's watermark: both change nothing, as in ingestion.
    history = [
        {"accounts": [row(1, 5), row(1, 5)]},
        {"accounts": [row(2, 9)]},
        {"accounts": [row(3, 5), row(2, 9)]},
    ]
    assert full_refresh(c, history)["accounts_current"] == ones((1, "open", 2))
    engine = ReferenceEngine(c)
    for batches in history:
        view = engine.step(batches).views["accounts_current"]
    assert view == ones((1, "open", 2))


def test_upsert_bad_rows_raise() -> None:
    c = NAMED_CIRCUITS["accounts"]()
    with pytest.raises(BadUpsertRow, match="NULL in key"):
        full_refresh(c, [{"accounts": [{"id": None, "status": "x", "wm_major": 1}]}])
    with pytest.raises(InputError, match="unknown columns"):
        full_refresh(c, [{"accounts": [{"id": 1, "colour": "red"}]}])


def test_orders_region_totals_ignore_null_amounts() -> None:
    c = NAMED_CIRCUITS["orders"]()
    history = [
        {
            "customers": [{"cust_id": 1, "region": "EU", "ts": 1}],
            "orders": [
                {"order_id": 1, "cust_id": 1, "amount": None, "ts": 1},
                {"order_id": 2, "cust_id": 1, "amount": 4, "ts": 1},
                {"order_id": 3, "cust_id": 2, "amount": 8, "ts": 1},  # no such customer
                {"order_id": 4, "cust_id": None, "amount": 8, "ts": 1},
            ],
        },
        {"orders": [{"order_id": 2, "ts": 2, "deleted_at": 2}]},
    ]
    assert full_refresh(c, history, 0)["region_totals"] == ones(("EU", 2, 4, 4))
    assert full_refresh(c, history)["region_totals"] == ones(("EU", 1, None, None))


def test_if_else_in_a_join_function_epoch() -> None:
    c = one_source(
        lambda s: s.join_function(
            emit({"x": col("x")}, epoch=if_else(col("x") > 10, lit(2), lit(None)))
        ),
        {"x": "bigint"},
    )
    history: list[dict[str, Any]] = [{"s": [((5,), 1), ((50,), 1)]}, {}, {}]
    assert full_refresh(c, history, 1)["v"] == ZSet()
    assert full_refresh(c, history, 2)["v"] == ones((50,))
