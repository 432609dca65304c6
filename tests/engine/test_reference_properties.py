"""Property tests: the incremental reference engine against the full refresh.

For random update streams (insertions and deletions, late and tombstoned
upserts, NULLs), after every epoch the views the ``ReferenceEngine`` publishes
must equal ``full_refresh`` over the inputs accumulated so far. For circuits
with loops a stronger check also runs: with compaction off, every node's
accumulated deltas at every ``(epoch, iteration, ...)`` time must equal the
full refresh's collection at that time, which is exactly the invariant that a
loop stopping too early breaks.

Graph inputs keep multiplicities valid (an edge is deleted only while present);
Z-set inputs of the non-recursive circuits take arbitrary (also negative)
weights. Upsert streams are generated so that most rows are consistent per
(key, watermark) and some are not: when ingestion rejects a batch with an
``UpsertConflict``, the full refresh must reject the same history with the
same keys, and the batch is dropped (it was never committed).
"""

from __future__ import annotations

import itertools
import zlib
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import pytest
from circuits_for_tests import aggregates_circuit
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dbspark.circuit.aggregations import count
from dbspark.circuit.builder import Circuit, Stream, emit
from dbspark.circuit.expressions import col, if_else, lit, sequence
from dbspark.core.upsert import UpsertConflict
from dbspark.core.zset import ZSet
from dbspark.engine.reference.engine import ReferenceEngine
from dbspark.engine.reference.full_refresh import FullRefresh, full_refresh
from dbspark.examples.circuits import NAMED_CIRCUITS

History = list[dict[str, Any]]

PROPERTY = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


# A bug in the reference engine, found by ``test_nested_loops_every_time``: a nested loop's
# convergence check (``ReferenceEngine._pending_depth``) only counts a key as touched at
# prefix ``(e, i)`` when it has an update at exactly that prefix. A correction at
# ``(e, i, j)`` can also come from updates at ``(e, 0, 0)`` and ``(0, i, j)`` (their least
# upper bound), with nothing at prefix ``(e, i)``: the inner loop then stops at iteration 0.
# The minimal history: roots r; b: r->s; a: s->d, d->x; then delete a: d->x.
NESTED_BUG_HISTORY: list[dict[str, Any]] = [
    {"a": [(("d", "x"), 1), (("s", "d"), 1)], "b": [(("r", "s"), 1)], "roots": [(("r",), 1)]},
    {"a": [(("d", "x"), -1)], "b": [], "roots": []},
]


# --- running and comparing ------------------------------------------------------------------
def run_and_compare(factory: Callable[[], Circuit], history: History) -> None:
    """Step the engine through ``history``; after each epoch its views equal the full refresh."""
    circuit = factory()
    engine = ReferenceEngine(circuit)
    committed: History = []
    for batches in history:
        try:
            step = engine.step(batches)
        except UpsertConflict as conflict:
            with pytest.raises(UpsertConflict) as refused:
                full_refresh(circuit, [*committed, batches])
            assert refused.value.source == conflict.source
            assert sorted(refused.value.keys) == sorted(conflict.keys)
            continue
        committed.append(batches)
        expected = full_refresh(circuit, committed)
        assert step.views == expected, f"epoch {len(committed) - 1}: {batches}"
        for name in circuit.views:
            assert engine.view(name) == expected[name]


def run_and_compare_every_time(factory: Callable[[], Circuit], history: History) -> None:
    """With compaction off: every node's accumulation at every time equals the full refresh."""
    circuit = factory()
    engine = ReferenceEngine(circuit, compact=False)
    deepest = 1
    for epoch, batches in enumerate(history):
        step = engine.step(batches)
        deepest = max([deepest, *(report.iterations for report in step.loops)])
        refresh = FullRefresh(circuit, history[: epoch + 1])
        for node in circuit.nodes:
            depth = circuit.scope(node.scope).depth
            grid = [range(epoch + 1), *([range(deepest + 2)] * (depth - 1))]
            accumulated = _prefix_sums(lambda t, n=node.id: engine.delta(n, t), grid)
            for time in itertools.product(*grid):
                if time[0] != epoch:
                    continue
                assert accumulated[time] == refresh.collection(node.id, time), f"{node!r} at {time}"


def _prefix_sums(delta: Callable[[tuple], ZSet], grid: list[range]) -> dict[tuple, ZSet]:
    """time -> the sum of ``delta`` over every grid time at or below it (product order)."""
    sums = {t: delta(t) for t in itertools.product(*grid)}
    for axis in range(len(grid)):
        for t in itertools.product(*grid):  # lexicographic: t - 1_axis is already done
            if t[axis] > 0:
                below = (*t[:axis], t[axis] - 1, *t[axis + 1 :])
                sums[t] = sums[t] + sums[below]
    return sums


# --- strategies -------------------------------------------------------------------------------
@st.composite
def valid_changes(
    draw: st.DrawFn,
    rows: list[Any] | st.SearchStrategy[Any],
    epochs: int,
    first: tuple[int, int] = (0, 4),
    later: tuple[int, int] = (0, 4),
) -> list[list[tuple[Any, int]]]:
    """Per epoch, changes to a collection that never holds a row a negative number of times.

    The first epoch inserts ``first`` rows; each later epoch makes ``later`` changes,
    each an insert or a delete of a present row. Building a graph at once and then
    changing it an edge at a time is what reaches deep iterations first and then asks
    for corrections there (and it finds loops that stop too early far more often
    than mixing deletions into the first epoch does).
    """
    row_strategy = st.sampled_from(rows) if isinstance(rows, list) else rows
    present: Counter[Any] = Counter()
    per_epoch = []
    for epoch in range(epochs):
        batch: Counter[Any] = Counter()
        for _ in range(draw(st.integers(*(first if epoch == 0 else later)))):
            alive = sorted((r for r, n in present.items() if n > 0), key=repr)
            if epoch > 0 and alive and draw(st.booleans()):
                row, step = draw(st.sampled_from(alive)), -1
            else:
                row, step = draw(row_strategy), 1
            present[row] += step
            batch[row] += step
        per_epoch.append(sorted(((r, w) for r, w in batch.items() if w), key=repr))
    return per_epoch


def any_changes(universe: list[Any], max_ops: int = 5) -> st.SearchStrategy[list]:
    """One epoch of arbitrary weights (also negative, also below zero in total)."""
    return st.lists(
        st.tuples(st.sampled_from(universe), st.integers(-3, 3).filter(bool)), max_size=max_ops
    )


def histories(**sources: st.SearchStrategy[list]) -> st.SearchStrategy[History]:
    """Zip per-source lists of per-epoch batches into a history (shortest list wins)."""

    def combine(per_source: dict[str, list[list]]) -> History:
        length = min(len(batches) for batches in per_source.values())
        return [
            {name: batches[e] for name, batches in per_source.items() if batches[e]}
            for e in range(length)
        ]

    return st.fixed_dictionaries(sources).map(combine)


LETTERS = list("abcdef")
# Any pair, self-loops and both directions included, drawn as two independent endpoints:
# hypothesis spreads these over the graph better than draws from a list of all 36 pairs.
EDGE = st.tuples(st.sampled_from(LETTERS), st.sampled_from(LETTERS))
INT_EDGE = st.tuples(st.integers(0, 5), st.integers(0, 5))
ROOT = st.tuples(st.sampled_from(LETTERS[:3]))

# Graph circuits are cheap and the bugs they catch are rare per example: more examples.
GRAPHS = settings(PROPERTY, max_examples=200)


@st.composite
def graph_history(draw: st.DrawFn) -> History:
    epochs = draw(st.integers(2, 6))
    edges = draw(valid_changes(EDGE, epochs, first=(3, 9), later=(1, 2)))
    roots = draw(valid_changes(ROOT, epochs, first=(1, 2), later=(0, 1)))
    return [{"edges": e, "roots": r} for e, r in zip(edges, roots, strict=True)]


@st.composite
def int_graph_history(draw: st.DrawFn) -> History:
    epochs = draw(st.integers(2, 6))
    edges = draw(valid_changes(INT_EDGE, epochs, first=(3, 9), later=(1, 2)))
    return [{"edges": e} for e in edges]


def reach_from(edges: Iterable[tuple[str, str]], roots: Iterable[str]) -> set[str]:
    """Plain breadth-first search, to check the oracle itself."""
    edges = list(edges)
    seen = set(roots)
    frontier = list(seen)
    while frontier:
        node = frontier.pop()
        for src, dst in edges:
            if src == node and dst not in seen:
                seen.add(dst)
                frontier.append(dst)
    return seen


def accumulate(history: History, source: str) -> ZSet:
    total = ZSet()
    for batches in history:
        total = total + ZSet(batches.get(source, []))
    return total


# --- the named recursive circuits -------------------------------------------------------------
@GRAPHS
@given(graph_history())
def test_reachability(history: History) -> None:
    run_and_compare(NAMED_CIRCUITS["reachability"], history)


@GRAPHS
@given(graph_history())
def test_reachability_every_time(history: History) -> None:
    run_and_compare_every_time(NAMED_CIRCUITS["reachability"], history)


@PROPERTY
@given(graph_history())
def test_reachability_oracle_is_breadth_first_search(history: History) -> None:
    circuit = NAMED_CIRCUITS["reachability"]()
    for epoch in range(len(history)):
        edges = accumulate(history[: epoch + 1], "edges")
        roots = accumulate(history[: epoch + 1], "roots")
        expected = reach_from(edges.rows(), (r for (r,) in roots.rows()))
        got = full_refresh(circuit, history, epoch)["reach"]
        assert got == ZSet(((n,), 1) for n in expected)


@settings(PROPERTY, max_examples=100)
@given(int_graph_history())
def test_transitive_closure(history: History) -> None:
    run_and_compare(NAMED_CIRCUITS["transitive_closure"], history)


@settings(PROPERTY, max_examples=100)
@given(int_graph_history())
def test_transitive_closure_every_time(history: History) -> None:
    run_and_compare_every_time(NAMED_CIRCUITS["transitive_closure"], history)


@PROPERTY
@given(int_graph_history())
def test_transitive_closure_oracle(history: History) -> None:
    circuit = NAMED_CIRCUITS["transitive_closure"]()
    edges = list(accumulate(history, "edges").rows())
    assert full_refresh(circuit, history)["tc"] == ZSet((pair, 1) for pair in _paths(edges))


def _paths(edges: list[tuple[int, int]]) -> set[tuple[int, int]]:
    """Pairs joined by one or more edges."""
    return {(u, v) for u, w in edges for v in reach_from(edges, [w])}


NUMBERS = [(n,) for n in range(0, 41)]


@PROPERTY
@given(histories(numbers=st.lists(any_changes(NUMBERS, 4), min_size=1, max_size=5)))
def test_geometric(history: History) -> None:
    run_and_compare(NAMED_CIRCUITS["geometric"], history)


@PROPERTY
@given(histories(numbers=st.lists(any_changes(NUMBERS, 4), min_size=1, max_size=5)))
def test_geometric_every_time(history: History) -> None:
    run_and_compare_every_time(NAMED_CIRCUITS["geometric"], history)


# --- the named non-recursive circuits -----------------------------------------------------------
WORDS = [(w,) for w in ("ant", "bee", "cat", "")]


@PROPERTY
@given(histories(words=st.lists(any_changes(WORDS), min_size=1, max_size=6)))
def test_word_count(history: History) -> None:
    run_and_compare(NAMED_CIRCUITS["word_count"], history)


LEFT = [(k, a) for k in (0, 1, 2, None) for a in ("x", "y")]
RIGHT = [(k, b) for k in (0, 1, 2) for b in ("p", "q")]


@PROPERTY
@given(
    histories(
        left=st.lists(any_changes(LEFT), min_size=1, max_size=6),
        right=st.lists(any_changes(RIGHT), min_size=1, max_size=6),
    )
)
def test_join(history: History) -> None:
    run_and_compare(NAMED_CIRCUITS["join"], history)


# --- upserts ------------------------------------------------------------------------------------
WATERMARKS = st.one_of(st.none(), st.integers(0, 5))


def _pick(options: tuple[Any, ...], *seed: Any) -> Any:
    """A value determined by ``seed``, so that equal (key, watermark) give equal rows.

    (``zlib.crc32``, not ``hash``: string hashes change between processes, and hypothesis
    must replay an example exactly.)
    """
    return options[zlib.crc32(repr(seed).encode()) % len(options)]


@st.composite
def customer_rows(draw: st.DrawFn) -> dict[str, Any]:
    cust, ts, noise = draw(st.integers(1, 3)), draw(WATERMARKS), draw(st.integers(0, 9))
    seed = (cust, ts, noise if noise == 0 else 1)
    return {
        "cust_id": cust,
        "region": _pick(("EU", "US", None), "region", *seed),
        "ts": ts,
        "deleted": _pick((None, False, False, True), "deleted", *seed),
    }


@st.composite
def order_rows(draw: st.DrawFn) -> dict[str, Any]:
    order, ts, noise = draw(st.integers(1, 4)), draw(WATERMARKS), draw(st.integers(0, 9))
    seed = (order, ts, noise if noise == 0 else 1)
    row = {
        "order_id": order,
        "cust_id": _pick((1, 2, 3, None), "cust", *seed),
        "amount": _pick((None, 0, 3, 7, 12), "amount", *seed),
        "ts": ts,
    }
    deleted_at = _pick((None, None, None, 9), "deleted", *seed)
    if deleted_at is not None:
        row["deleted_at"] = deleted_at
    return row


@PROPERTY
@given(
    histories(
        customers=st.lists(st.lists(customer_rows(), max_size=3), min_size=1, max_size=6),
        orders=st.lists(st.lists(order_rows(), max_size=4), min_size=1, max_size=6),
    )
)
def test_orders(history: History) -> None:
    run_and_compare(NAMED_CIRCUITS["orders"], history)


@st.composite
def account_rows(draw: st.DrawFn) -> dict[str, Any]:
    account, noise = draw(st.integers(1, 3)), draw(st.integers(0, 9))
    major, minor = draw(st.one_of(st.none(), st.integers(0, 2))), draw(WATERMARKS)
    seed = (account, major, minor, noise if noise == 0 else 1)
    return {
        "id": account,
        "status": _pick(("open", "frozen", "DELETED", None), "status", *seed),
        "balance": _pick((None, 0, 10, -5), "balance", *seed),
        "wm_major": major,
        "wm_minor": minor,
    }


@PROPERTY
@given(histories(accounts=st.lists(st.lists(account_rows(), max_size=4), min_size=1, max_size=7)))
def test_accounts(history: History) -> None:
    run_and_compare(NAMED_CIRCUITS["accounts"], history)


# --- custom circuits ------------------------------------------------------------------------------
ITEMS = [(g, v) for g in ("a", "b", None) for v in (None, -2, 0, 5)]


@PROPERTY
@given(
    st.integers(1, 6).flatmap(
        lambda epochs: histories(
            items=st.lists(any_changes(ITEMS), min_size=epochs, max_size=epochs),
            bag=valid_changes(ITEMS, epochs),
        )
    )
)
def test_aggregates(history: History) -> None:
    run_and_compare(aggregates_circuit, history)


def temporal_circuit() -> Circuit:
    """The general linear operator (explode, a temporal window), flat_map and root delays."""
    c = Circuit("temporal")
    events = c.zset_source(
        "events", {"id": "bigint", "start": "bigint", "stop": "bigint", "n": "bigint"}
    )
    window = events.join_function(
        emit({"id": col("id"), "n": col("n")}, epoch=col("start")),
        emit({"id": col("id"), "n": col("n")}, weight=-1, epoch=col("stop")),
    )
    c.view("window", window)
    c.view("window_counts", window.aggregate(by="n", events=count()))
    c.view(
        "exploded",
        events.join_function(
            emit({"id": col("id")}, weight=col("n")),
            emit({"id": col("id") * 100}, weight=2, when=col("id") % 2 == 0),
        ),
    )
    c.view("expanded", events.flat_map("i", sequence(lit(1), col("n"))).select("id", "i"))
    c.view("previous", events.delay())
    c.view("changes", events.minus(events.delay()).distinct())
    c.view("two_back", events.delay().delay().select("id").distinct())
    return c


EVENTS = [
    (i, start, stop, n)
    for i in (1, 2)
    for start, stop in ((0, 2), (1, 3), (2, None), (None, 1), (3, 1), (0, 0))
    for n in (None, -1, 0, 2)
]


@PROPERTY
@given(histories(events=st.lists(any_changes(EVENTS, 4), min_size=1, max_size=6)))
def test_temporal_and_delay(history: History) -> None:
    run_and_compare(temporal_circuit, history)


def loops_with_time_circuit() -> Circuit:
    """A loop with a temporal emit inside (doubling visible from epoch n % 3), and a loop
    whose body reads the previous iteration through ``delay``."""
    c = Circuit("loops_with_time")
    numbers = c.zset_source("numbers", {"n": "bigint"})
    doubling = numbers.iterate(
        lambda x: (
            numbers.plus(
                x.join_function(
                    emit({"n": col("n") * 2}, epoch=if_else(col("n") > 0, col("n") % 3, 0))
                )
            )
            .filter(col("n") <= 40)
            .distinct()
        ),
        name="late_doubling",
    )
    stepping = numbers.iterate(
        lambda x: numbers.plus(x.delay().select(n=col("n") + 7)).filter(col("n") < 30).distinct(),
        name="delayed_steps",
    )
    c.view("doubling", doubling)
    c.view("stepping", stepping)
    return c


POSITIVE = [(n,) for n in range(1, 25)]


@PROPERTY
@given(histories(numbers=st.lists(any_changes(POSITIVE, 3), min_size=1, max_size=5)))
def test_loops_with_time(history: History) -> None:
    run_and_compare(loops_with_time_circuit, history)


@PROPERTY
@given(histories(numbers=st.lists(any_changes(POSITIVE, 3), min_size=1, max_size=5)))
def test_loops_with_time_every_time(history: History) -> None:
    run_and_compare_every_time(loops_with_time_circuit, history)


def nested_circuit() -> Circuit:
    """Reachability that, in each outer step, closes over ``a`` edges (an inner loop) and then
    takes one ``b`` edge: together, reachability over ``a`` and ``b``."""
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


@st.composite
def two_graph_history(draw: st.DrawFn) -> History:
    epochs = draw(st.integers(2, 5))
    a = draw(valid_changes(EDGE, epochs, first=(2, 6), later=(0, 1)))
    b = draw(valid_changes(EDGE, epochs, first=(1, 3), later=(0, 1)))
    roots = draw(valid_changes(ROOT, epochs, first=(1, 1), later=(0, 1)))
    return [{"a": x, "b": y, "roots": r} for x, y, r in zip(a, b, roots, strict=True)]


# Regression: the explicit example is the nested-loop correction that arrives at the
# least upper bound of two other prefixes.
@GRAPHS
@given(two_graph_history())
@example(NESTED_BUG_HISTORY)
def test_nested_loops(history: History) -> None:
    run_and_compare(nested_circuit, history)


@PROPERTY
@given(two_graph_history())
@example(NESTED_BUG_HISTORY)
def test_nested_loops_every_time(history: History) -> None:
    run_and_compare_every_time(nested_circuit, history)


def test_nested_loop_correction_from_the_lub_of_other_prefixes() -> None:
    """Minimal reproduction: the inner loop at prefix (1, 1) stops at iteration 0.

    Epoch 0: the outer loop reaches s at iteration 1 (one b hop from r); inside outer
    iteration 1 the inner loop reaches d at inner iteration 1 and x at 2, so the inner
    join reads d from its variable at (0, 1, 1). Epoch 1 deletes the a edge d->x: it
    enters the inner join at (1, 0, 0). The join owes -(d, x) at their least upper bound
    (1, 1, 1), but nothing at all happens at prefix (1, 1), so the inner loop stops at
    (1, 1, 0) and x stays reachable.

    Fix: a key is pending at prefix p when, among its updates (all ports) at times whose
    first len(p) coordinates are <= p, every coordinate of p is hit exactly; the pending
    depth is then the deepest such update's next coordinate (``_candidate_keys``'s rule,
    applied to the prefix).
    """
    circuit = nested_circuit()
    engine = ReferenceEngine(circuit)
    engine.step(NESTED_BUG_HISTORY[0])
    step = engine.step(NESTED_BUG_HISTORY[1])
    expected = ZSet([(("r",), 1), (("s",), 1), (("d",), 1)])
    assert full_refresh(circuit, NESTED_BUG_HISTORY)["reach"] == expected
    assert step.views["reach"] == expected


@PROPERTY
@given(two_graph_history())
def test_nested_loops_oracle(history: History) -> None:
    circuit = nested_circuit()
    edges = accumulate(history, "a") + accumulate(history, "b")
    roots = accumulate(history, "roots")
    expected = reach_from(edges.rows(), (r for (r,) in roots.rows()))
    assert full_refresh(circuit, history)["reach"] == ZSet(((n,), 1) for n in expected)


# --- the two traps (ARCHITECTURE.md) ---------------------------------------------------------
def test_deleting_an_edge_into_a_cycle() -> None:
    """a->b, b->c, c->b, root a; deleting a->b leaves b and c holding each other up."""
    history: History = [
        {"edges": [(("a", "b"), 1), (("b", "c"), 1), (("c", "b"), 1)], "roots": [(("a",), 1)]},
        {"edges": [(("a", "b"), -1)]},
        {"edges": [(("a", "b"), 1)]},
    ]
    expected = [{"a", "b", "c"}, {"a"}, {"a", "b", "c"}]
    circuit = NAMED_CIRCUITS["reachability"]()
    engine = ReferenceEngine(circuit)
    for epoch, batches in enumerate(history):
        want = ZSet(((n,), 1) for n in expected[epoch])
        assert full_refresh(circuit, history, epoch)["reach"] == want
        assert engine.step(batches).views["reach"] == want, f"epoch {epoch}"


CHAIN: History = [
    {"edges": [(("a", "b"), 1), (("b", "c"), 1), (("c", "d"), 1)], "roots": [(("a",), 1)]},
    {"edges": [(("c", "d"), -1)]},
]


def test_too_early_stop_chain_has_an_empty_iteration_before_the_correction() -> None:
    """The shape of the trap: deleting c->d changes nothing at iteration 1 of epoch 1.

    The loop's result holds {a, b} at (0, 0), adds c at (0, 1) and d at (0, 2); the join
    reads c from the loop variable at (0, 2). At epoch 1 the edge change enters at (1, 0),
    where key c is not yet reached, so iteration 1 sees no change anywhere in the loop;
    the correction for key c (and so d's retraction) is due at (1, 2).
    """
    circuit = NAMED_CIRCUITS["reachability"]()
    refresh = FullRefresh(circuit, CHAIN)
    result = circuit.scopes[1].result
    # Per-iteration collections of the loop's result: equal at iterations 0 and 1 of both
    # epochs, different from iteration 2 on.
    for i in (0, 1):
        assert refresh.collection(result, (1, i)) == refresh.collection(result, (0, i))
    assert refresh.collection(result, (0, 2)) != refresh.collection(result, (1, 2))
    assert refresh.views(1)["reach"] == ZSet([(("a",), 1), (("b",), 1), (("c",), 1)])


def test_too_early_stop_after_an_empty_iteration() -> None:
    """The engine must not stop at (1, 1): d is still owed its retraction at (1, 2).

    Regression: the pending-depth check once looked for deeper history only in the
    trace of the join port that changed (the edges), not in the other port (reach,
    where c sits at iteration 2), and kept d reachable.
    """
    circuit = NAMED_CIRCUITS["reachability"]()
    engine = ReferenceEngine(circuit)
    engine.step(CHAIN[0])
    step = engine.step(CHAIN[1])
    assert step.views["reach"] == ZSet([(("a",), 1), (("b",), 1), (("c",), 1)])
    (report,) = step.loops
    assert report.delta_sizes[:3] == [0, 0, 1]  # quiet until d's retraction at (1, 2)


def test_too_early_stop_with_nothing_at_iteration_zero() -> None:
    """An epoch with no input at all, whose loop still owes output at iteration 2.

    Doubling n becomes visible at epoch 1 once n >= 4, so at epoch 0 the loop reaches
    4 and schedules 8 at (1, 2). Epoch 1 has no input and nothing at iterations 0 or 1;
    stopping at the first empty iteration would miss 8, 16 and 32.
    """
    c = Circuit("late")
    numbers = c.zset_source("numbers", {"n": "bigint"})
    out = numbers.iterate(
        lambda x: (
            numbers.plus(
                x.join_function(emit({"n": col("n") * 2}, epoch=if_else(col("n") >= 4, 1, 0)))
            )
            .filter(col("n") <= 50)
            .distinct()
        )
    )
    c.view("v", out)
    history: History = [{"numbers": [((1,), 1)]}, {}, {}]
    expected = [{1, 2, 4}, {1, 2, 4, 8, 16, 32}, {1, 2, 4, 8, 16, 32}]
    engine = ReferenceEngine(c)
    for epoch, batches in enumerate(history):
        want = ZSet(((n,), 1) for n in expected[epoch])
        assert full_refresh(c, history, epoch)["v"] == want
        step = engine.step(batches)
        assert step.views["v"] == want, f"epoch {epoch}"
        if epoch == 1:
            (report,) = step.loops
            assert report.delta_sizes[:2] == [0, 0]  # nothing at iterations 0 and 1
            assert report.iterations > 2
