"""Algebraic laws of the core: times, antichains, traces, Z-sets, and the operators.

Every law is checked by brute force on small grids of times, so a failure
points at the law rather than at an example someone happened to write down.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dbspark.core import timestamps
from dbspark.core.aggregates import Aggregate, count_rows, max_value, sum_values
from dbspark.core.antichain import Antichain
from dbspark.core.operators import (
    DelayTrace,
    aggregate,
    aggregate_incremental,
    consolidate,
    difference_at,
    distinct,
    distinct_at,
    distinct_incremental,
    distinct_trace,
    filter_,
    filter_logic,
    flat_map,
    flat_map_logic,
    incremental_join,
    index_with,
    join_function,
    join_stream,
    map_,
    map_logic,
    negate,
    trace_append,
)
from dbspark.core.timestamps import Time
from dbspark.core.trace import Trace, trace_of
from dbspark.core.zset import ZSet

SETTINGS = settings(max_examples=150, deadline=None)
HI = 3  # coordinates drawn from 0..HI; grids go one further so upper bounds exist


def times(depth: int, hi: int = HI) -> st.SearchStrategy[Time]:
    return st.tuples(*[st.integers(0, hi)] * depth)


def grid(depth: int, hi: int = HI + 1) -> list[Time]:
    return list(itertools.product(range(hi + 1), repeat=depth))


@st.composite
def same_depth(draw: st.DrawFn, count: int) -> tuple[Time, ...]:
    depth = draw(st.integers(1, 3))
    return tuple(draw(times(depth)) for _ in range(count))


@st.composite
def time_sets(draw: st.DrawFn, max_size: int = 5) -> tuple[int, list[Time], list[Time]]:
    """A depth and two lists of times of that depth."""
    depth = draw(st.integers(1, 3))
    a = draw(st.lists(times(depth), max_size=max_size))
    b = draw(st.lists(times(depth), max_size=max_size))
    return depth, a, b


le = timestamps.less_equal


# --- timestamps ---------------------------------------------------------------------------------


@SETTINGS
@given(same_depth(3))
def test_product_order_is_a_partial_order(abc: tuple[Time, Time, Time]) -> None:
    a, b, c = abc
    assert le(a, a)
    if le(a, b) and le(b, a):
        assert a == b
    if le(a, b) and le(b, c):
        assert le(a, c)
    assert timestamps.less_than(a, b) == (le(a, b) and a != b)
    assert timestamps.comparable(a, b) == (le(a, b) or le(b, a))


@SETTINGS
@given(same_depth(2))
def test_join_is_the_least_upper_bound(ab: tuple[Time, Time]) -> None:
    a, b = ab
    j = timestamps.join(a, b)
    assert le(a, j) and le(b, j)
    for c in grid(len(a)):
        if le(a, c) and le(b, c):
            assert le(j, c)


@SETTINGS
@given(same_depth(2))
def test_meet_is_the_greatest_lower_bound(ab: tuple[Time, Time]) -> None:
    a, b = ab
    m = timestamps.meet(a, b)
    assert le(m, a) and le(m, b)
    for c in grid(len(a)):
        if le(c, a) and le(c, b):
            assert le(c, m)


@SETTINGS
@given(same_depth(3))
def test_lattice_laws(abc: tuple[Time, Time, Time]) -> None:
    a, b, c = abc
    join, meet = timestamps.join, timestamps.meet
    assert join(a, b) == join(b, a) and meet(a, b) == meet(b, a)
    assert join(join(a, b), c) == join(a, join(b, c))
    assert meet(meet(a, b), c) == meet(a, meet(b, c))
    assert join(a, meet(a, b)) == a and meet(a, join(a, b)) == a
    assert timestamps.join_all([a, b, c]) == join(a, join(b, c))


@SETTINGS
@given(same_depth(2))
def test_enter_and_leave(ab: tuple[Time, Time]) -> None:
    a, b = ab
    assert timestamps.leave(timestamps.enter(a)) == a
    assert le(timestamps.enter(a), timestamps.enter(b)) == le(a, b)


def test_times_of_different_depths_do_not_compare() -> None:
    with pytest.raises(ValueError):
        timestamps.less_equal((0,), (0, 0))
    with pytest.raises(ValueError):
        timestamps.join((0,), (0, 0))


# --- antichains ---------------------------------------------------------------------------------


def minimal(ts: Iterable[Time]) -> set[Time]:
    ts = set(ts)
    return {t for t in ts if not any(timestamps.less_than(s, t) for s in ts)}


@SETTINGS
@given(time_sets())
def test_antichain_keeps_the_minimal_elements(case: tuple[int, list[Time], list[Time]]) -> None:
    _, ts, _ = case
    chain = Antichain()
    for t in ts:
        beaten = any(le(e, t) for e in chain)
        assert chain.insert(t) == (not beaten)
    assert set(chain.elements) == minimal(ts)
    assert len(chain.elements) == len(set(chain.elements))
    for x, y in itertools.combinations(chain.elements, 2):
        assert not timestamps.comparable(x, y)


@SETTINGS
@given(time_sets())
def test_antichain_comparisons_match_brute_force(case: tuple[int, list[Time], list[Time]]) -> None:
    depth, ts, _ = case
    chain = Antichain(ts)
    for t in grid(depth):
        assert chain.less_equal(t) == any(le(s, t) for s in ts)
        assert chain.less_than(t) == any(timestamps.less_than(s, t) for s in ts)


@SETTINGS
@given(time_sets())
def test_antichain_meet_is_the_union_of_upper_sets(
    case: tuple[int, list[Time], list[Time]],
) -> None:
    depth, ts, us = case
    a, b = Antichain(ts), Antichain(us)
    both = a.meet(b)
    for t in grid(depth):
        assert both.less_equal(t) == (a.less_equal(t) or b.less_equal(t))
    assert both.dominates(a) and both.dominates(b)


@SETTINGS
@given(time_sets())
def test_antichain_dominates_is_inclusion_of_upper_sets(
    case: tuple[int, list[Time], list[Time]],
) -> None:
    depth, ts, us = case
    a, b = Antichain(ts), Antichain(us)
    included = all(a.less_equal(t) for t in grid(depth) if b.less_equal(t))
    assert a.dominates(b) == included


@SETTINGS
@given(time_sets(), st.data())
def test_advance_preserves_comparisons_beyond_the_frontier(
    case: tuple[int, list[Time], list[Time]], data: st.DataObject
) -> None:
    depth, frontier_times, _ = case
    frontier = Antichain(frontier_times)
    t = data.draw(times(depth))
    advanced = frontier.advance(t)
    assert le(t, advanced)
    assert frontier.advance(advanced) == advanced
    beyond = [s for s in grid(depth) if frontier.less_equal(s)]
    for s in beyond:
        assert le(t, s) == le(advanced, s)
    if frontier.is_empty():
        assert advanced == t  # nothing can be asked any more; times are left alone
        return
    # it is the greatest such time: anything that also compares like t is below it
    for other in grid(depth):
        if all(le(t, s) == le(other, s) for s in beyond):
            assert le(other, advanced)


# --- traces -------------------------------------------------------------------------------------

ROWS = st.sampled_from(["a", "b", "c"])
WEIGHTS = st.integers(-3, 3)


@st.composite
def traces_and_frontiers(draw: st.DrawFn) -> tuple[int, list, Antichain]:
    depth = draw(st.integers(1, 3))
    updates = draw(st.lists(st.tuples(ROWS, times(depth), WEIGHTS), max_size=12))
    frontier = Antichain(draw(st.lists(times(depth), max_size=3)))
    return depth, updates, frontier


@SETTINGS
@given(traces_and_frontiers())
def test_compaction_keeps_every_answer_beyond_the_frontier(
    case: tuple[int, list, Antichain],
) -> None:
    depth, updates, frontier = case
    trace = trace_of(updates)
    before = {s: trace.accumulate(s) for s in grid(depth)}
    size_before = len(trace)
    total_before = consolidate(trace)
    trace.compact(frontier)
    assert len(trace) <= size_before
    assert consolidate(trace) == total_before
    for s, accumulated in before.items():
        if frontier.less_equal(s):
            assert trace.accumulate(s) == accumulated


@SETTINGS
@given(traces_and_frontiers())
def test_keyed_trace_reads_by_key(case: tuple[int, list, Antichain]) -> None:
    depth, updates, _ = case
    pairs = [((row, i % 2), t, w) for i, (row, t, w) in enumerate(updates)]
    keyed = trace_of(pairs, key_of=lambda r: r[0])
    plain = trace_of(pairs)
    for s in grid(depth, hi=2):
        assert keyed.accumulate(s) == plain.accumulate(s)
        only_a = plain.accumulate(s).filter(lambda r: r[0] == "a")
        assert keyed.accumulate(s, keys=["a"]) == only_a


# --- Z-sets -------------------------------------------------------------------------------------

ZSETS = st.lists(st.tuples(st.integers(0, 5), WEIGHTS), max_size=8).map(ZSet)


@SETTINGS
@given(ZSETS, ZSETS, ZSETS)
def test_zsets_form_an_abelian_group(a: ZSet, b: ZSet, c: ZSet) -> None:
    zero = ZSet()
    assert (a + b) + c == a + (b + c)
    assert a + b == b + a
    assert a + zero == a == zero + a
    assert a + (-a) == zero
    assert a - b == a + (-b)
    assert -(a + b) == (-a) + (-b)
    negated = -a
    assert -negated == a


@SETTINGS
@given(ZSETS, ZSETS, st.integers(-3, 3), st.integers(-3, 3))
def test_zset_scaling_is_a_module_action(a: ZSet, b: ZSet, m: int, n: int) -> None:
    assert (a + b).scale(n) == a.scale(n) + b.scale(n)
    assert a.scale(m + n) == a.scale(m) + a.scale(n)
    assert a.scale(m).scale(n) == a.scale(m * n)
    assert a.scale(1) == a and a.scale(0) == ZSet() and a.scale(-1) == -a


@SETTINGS
@given(st.lists(st.tuples(st.integers(0, 5), WEIGHTS), max_size=8))
def test_zsets_stay_consolidated(items: list[tuple[int, int]]) -> None:
    z = ZSet(items)
    assert all(w != 0 for _, w in z.items())
    for row in {r for r, _ in items}:
        assert z.weight(row) == sum(w for r, w in items if r == row)
    assert z == ZSet(reversed(items)) and hash(z) == hash(ZSet(reversed(items)))


# --- operator laws ------------------------------------------------------------------------------

LINEAR_OPERATORS = [
    lambda z: map_(lambda x: x // 2, z),
    lambda z: filter_(lambda x: x % 3 != 0, z),
    lambda z: flat_map(lambda x: range(x % 3), z),
    negate,
    lambda z: index_with(lambda x: x % 2, z),
]


@SETTINGS
@given(ZSETS, ZSETS, st.sampled_from(range(len(LINEAR_OPERATORS))))
def test_linear_operators_are_linear(a: ZSet, b: ZSet, which: int) -> None:
    op = LINEAR_OPERATORS[which]
    assert op(a + b) == op(a) + op(b)
    assert op(-a) == -op(a)
    assert op(ZSet()) == ZSet()


INDEXED = st.lists(
    st.tuples(st.tuples(st.integers(0, 2), st.integers(0, 3)), WEIGHTS), max_size=8
).map(ZSet)


def pair(key: int, v1: int, v2: int) -> tuple[int, int, int]:
    return (key, v1, v2)


@SETTINGS
@given(INDEXED, INDEXED, INDEXED)
def test_join_stream_is_bilinear(a1: ZSet, a2: ZSet, b: ZSet) -> None:
    assert join_stream(pair, a1 + a2, b) == join_stream(pair, a1, b) + join_stream(pair, a2, b)
    assert join_stream(pair, b, a1 + a2) == join_stream(pair, b, a1) + join_stream(pair, b, a2)


@SETTINGS
@given(st.lists(st.tuples(INDEXED, INDEXED), max_size=5))
def test_incremental_join_tracks_the_full_join(steps: list[tuple[ZSet, ZSet]]) -> None:
    a_trace, b_trace = Trace(), Trace()
    a_delay, b_delay = DelayTrace(), DelayTrace()
    a_total, b_total, out = ZSet(), ZSet(), ZSet()
    for epoch, (a, b) in enumerate(steps):
        a_trace = trace_append(a_trace, a, (epoch,))
        b_trace = trace_append(b_trace, b, (epoch,))
        out = out + incremental_join(pair, a, b, a_delay.step(a_trace), b_delay.step(b_trace))
        a_total, b_total = a_total + a, b_total + b
        assert out == join_stream(pair, a_total, b_total)


@SETTINGS
@given(st.lists(ZSETS, max_size=6))
def test_distinct_incremental_tracks_distinct(steps: list[ZSet]) -> None:
    trace, out = Trace(), ZSet()
    for epoch, batch in enumerate(steps):
        out = out + distinct_incremental(batch, trace)
        trace = trace_append(trace, batch, (epoch,))
        assert out == distinct(consolidate(trace))


@SETTINGS
@given(st.lists(INDEXED, max_size=6), st.sampled_from([count_rows, sum_values, max_value]))
def test_aggregate_incremental_tracks_aggregate(
    steps: list[ZSet], make: Callable[[], Aggregate]
) -> None:
    agg = make()
    trace, out = Trace(), ZSet()
    for epoch, batch in enumerate(steps):
        out = out + aggregate_incremental(agg, batch, trace)
        trace = trace_append(trace, batch, (epoch,))
        assert out == aggregate(agg, consolidate(trace))


NESTED_UPDATES = {
    depth: st.lists(st.tuples(st.integers(0, 4), times(depth, hi=2), WEIGHTS), max_size=12)
    for depth in (1, 2, 3)
}


@SETTINGS
@given(st.sampled_from([1, 2, 3]).flatmap(lambda d: NESTED_UPDATES[d]))
def test_distinct_at_deltas_accumulate_to_distinct(updates: list) -> None:
    if not updates:
        return
    trace = trace_of(updates)
    depth = len(updates[0][1])
    points = grid(depth, hi=3)
    deltas = {t: distinct_at(trace, t) for t in points}
    for t in points:
        total = ZSet()
        for s in points:
            if le(s, t):
                total = total + deltas[s]
        assert total == distinct(trace.accumulate(t))


@SETTINGS
@given(NESTED_UPDATES[2])
def test_distinct_trace_agrees_with_distinct_at(updates: list) -> None:
    everything = trace_of(updates)
    for t in grid(2, hi=3):
        batch = everything.at(t)
        others = trace_of(u for u in everything.updates() if u[1] != t)  # later times too
        assert distinct_trace(batch, others, t) == distinct_at(everything, t)


@SETTINGS
@given(NESTED_UPDATES[2])
def test_difference_at_of_aggregate_accumulates_to_aggregate(updates: list) -> None:
    indexed = trace_of(((row % 2, row), t, w) for row, t, w in updates)

    def count(z: ZSet) -> ZSet:
        return aggregate(count_rows(), z)

    points = grid(2, hi=3)
    deltas = {t: difference_at(count, indexed, t) for t in points}
    for t in points:
        total = ZSet()
        for s in points:
            if le(s, t):
                total = total + deltas[s]
        assert total == count(indexed.accumulate(t))


@SETTINGS
@given(NESTED_UPDATES[2], NESTED_UPDATES[2])
def test_join_function_is_linear_and_matches_the_linear_operators(a: list, b: list) -> None:
    logic = map_logic(lambda x: x // 2)
    both = join_function(logic, a + b)
    separate = trace_of([*join_function(logic, a).updates(), *join_function(logic, b).updates()])
    assert set(both.updates()) == set(separate.updates())
    source = trace_of(a)
    for logic, op in [
        (map_logic(lambda x: x // 2), lambda z: map_(lambda x: x // 2, z)),
        (filter_logic(lambda x: x > 1), lambda z: filter_(lambda x: x > 1, z)),
        (flat_map_logic(range), lambda z: flat_map(range, z)),
    ]:
        out = join_function(logic, source)
        for t in source.times():
            assert out.at(t) == op(source.at(t))
