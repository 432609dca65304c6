"""The worked examples of the operator specs, as data-driven tests.

Seed 003 (the DBSP runtime spec) writes Z-sets as ``{element, time, weight}``
triples and traces as ``{key, value, time, weight}`` 4-tuples, with ``nil`` for
"no time" in outputs. Here elements are Python tuples, atoms are strings,
times are tuples (``0`` is ``(0,)``, ``{1, 1}`` is ``(1, 1)``) and ``nil`` outputs
are plain ``ZSet`` values. A linear operator is applied to each time's batch
separately, so for the examples whose inputs carry times the data is split by
time, the operator applied to each slice, and the slices compared.

Seed 001 (Differential Dataflow's general linear operator) supplies the
``join_function`` examples: the names collection, the ``x`` copies of ``2x``
example from the ``join_function`` doc comment, explode and temporal filters,
and fusion with ``followed_by``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dbspark.core import timestamps
from dbspark.core.aggregates import count_rows
from dbspark.core.operators import (
    MIN_TIME,
    Delay,
    DelayTrace,
    aggregate,
    consolidate,
    delay,
    distinct,
    distinct_at,
    distinct_incremental,
    distinct_trace,
    explode_logic,
    filter_,
    filter_logic,
    flat_map_logic,
    followed_by,
    incremental_join,
    index_with,
    inspect,
    join_function,
    join_stream,
    join_trace,
    map_,
    map_logic,
    minus,
    negate,
    plus,
    temporal_filter_logic,
    trace_append,
    untimed_trace_append,
)
from dbspark.core.timestamps import Time
from dbspark.core.trace import Trace, trace_of
from dbspark.core.zset import ZSet

Triple = tuple[Any, Any, int]


def as_time(t: Any) -> Time:
    return t if isinstance(t, tuple) else (t,)


def untimed(triples: Iterable[Triple]) -> ZSet:
    """A seed Z-set whose times are all ``nil`` (or irrelevant) as a ``ZSet``."""
    return ZSet((element, weight) for element, _time, weight in triples)


def by_time(triples: Iterable[Triple]) -> dict[Time, ZSet]:
    """A seed Z-set split into one batch per time (empty batches dropped)."""
    groups: dict[Time, list[tuple[Any, int]]] = defaultdict(list)
    for element, time, weight in triples:
        groups[as_time(time)].append((element, weight))
    batches = {t: ZSet(items) for t, items in groups.items()}
    return {t: z for t, z in batches.items() if z}


def per_time(op: Callable[[ZSet], ZSet], triples: Iterable[Triple]) -> dict[Time, ZSet]:
    """Apply a linear operator to each time's batch."""
    results = {t: op(z) for t, z in by_time(triples).items()}
    return {t: z for t, z in results.items() if z}


def seed_trace(quads: Iterable[tuple[Any, Any, Any, int]]) -> Trace:
    """A seed trace of ``{key, value, time, weight}`` rows: ``(key, value)`` at ``time``."""
    return trace_of(((key, value), as_time(time), weight) for key, value, time, weight in quads)


def updates_of(trace: Trace) -> set[tuple[Any, Time, int]]:
    return set(trace.updates())


# --- seed 003: one example per operator ---------------------------------------------------------


def test_aggregate_count() -> None:
    indexed = untimed([((1, "foo"), 0, 1), ((1, "bar"), 0, 1), ((2, "baz"), 0, 1)])
    expected = untimed([((1, 2), None, 1), ((2, 1), None, 1)])
    assert aggregate(count_rows(), indexed) == expected
    # any callable over the group's (value, weight) pairs works too
    assert aggregate(lambda group: sum(w for _, w in group), indexed) == expected


def test_consolidate() -> None:
    # The seed writes "{0, 1, 0, 1}." and "{2, 4, 0 1}"; read as {key, value, time, weight}.
    trace = seed_trace(
        [
            (0, 0, 0, 1),
            (0, 0, 0, -1),
            (0, 1, 0, 1),
            (0, 1, 0, 1),
            (1, 2, 0, 2),
            (1, 3, 0, 1),
            (1, 3, 0, -1),
            (1, 4, 0, -1),
            (2, 2, 0, 1),
            (2, 4, 0, 1),
        ]
    )
    expected = untimed(
        [
            ((0, 1), None, 2),
            ((1, 2), None, 2),
            ((1, 4), None, -1),
            ((2, 2), None, 1),
            ((2, 4), None, 1),
        ]
    )
    assert consolidate(trace) == expected


def test_consolidate_sums_across_times() -> None:
    trace = trace_of([("x", (0,), 1), ("x", (3,), 2), ("y", (1,), 1), ("y", (2,), -1)])
    assert consolidate(trace) == ZSet({"x": 3})


def test_distinct() -> None:
    batch = [(0, 0, 1), (1, 0, 2), (2, 0, -1), (3, 0, 0)]
    assert per_time(distinct, batch) == by_time([(0, 0, 1), (1, 0, 1)])


IS_POSITIVE = [(0, 0, 1), (1, 0, 2), (2, 1, -3)]


def test_filter() -> None:
    def is_positive(x: int) -> bool:
        return x >= 1

    assert per_time(lambda z: filter_(is_positive, z), IS_POSITIVE) == by_time(
        [(1, 0, 2), (2, 1, -3)]
    )


def test_index_with() -> None:
    def key_function(edge: tuple[int, int, int]) -> int:
        src, _dst, _cost = edge
        return src

    edges = [((0, 1, 1), 0, 1), ((1, 2, 1), 1, 1), ((1, 3, 2), 1, -1)]
    expected = [
        ((0, (0, 1, 1)), 0, 1),
        ((1, (1, 2, 1)), 1, 1),
        ((1, (1, 3, 2)), 1, -1),
    ]
    assert per_time(lambda z: index_with(key_function, z), edges) == by_time(expected)


def test_inspect_returns_input_and_calls_back() -> None:
    seen: list[ZSet] = []
    z = untimed([(0, 1, 1), (1, 1, 1)])
    assert inspect(seen.append, z) == z
    assert seen == [ZSet({0: 1, 1: 1})]


def test_map_as_written_in_the_seed_is_the_filter_example() -> None:
    # The seed's "map" section repeats the filter example verbatim.
    assert per_time(lambda z: filter_(lambda x: x >= 1, z), IS_POSITIVE) == by_time(
        [(1, 0, 2), (2, 1, -3)]
    )


def test_map() -> None:
    assert per_time(lambda z: map_(lambda x: x * 10, z), IS_POSITIVE) == by_time(
        [(0, 0, 1), (10, 0, 2), (20, 1, -3)]
    )


def test_map_merges_rows_that_collide() -> None:
    batch = [(0, 0, 1), (1, 0, 2), (2, 0, -3), (3, 0, -2)]
    # 0 and 2 both map to 0 (1 - 3), 1 and 3 to 1 (2 - 2: cancelled)
    assert per_time(lambda z: map_(lambda x: x % 2, z), batch) == by_time([(0, 0, -2)])


def test_negate() -> None:
    batch = [(0, 0, 1), (1, 0, -1), (2, 0, -2)]
    assert per_time(negate, batch) == by_time([(0, 0, -1), (1, 0, 1), (2, 0, 2)])


PLUS_MINUS_A = untimed([(0, 0, 1), (1, 0, 1), (2, 0, 2), (3, 0, 1)])
PLUS_MINUS_B = untimed([(0, 0, 1), (1, 0, -1), (2, 0, 1)])


def test_minus() -> None:
    assert minus(PLUS_MINUS_A, PLUS_MINUS_B) == untimed([(1, 0, 2), (2, 0, 1), (3, 0, 1)])


def test_plus() -> None:
    assert plus(PLUS_MINUS_A, PLUS_MINUS_B) == untimed([(0, 0, 2), (2, 0, 3), (3, 0, 1)])


# --- seed 003: distinct_trace over (epoch, iteration) -------------------------------------------

B00 = [(0, (0, 0), 1), (2, (0, 0), 1), (3, (0, 0), -1)]
B01 = [(5, (0, 1), 1)]
B10 = [(5, (1, 0), 1)]
B11 = [(0, (1, 1), 1), (1, (1, 1), 1), (2, (1, 1), -1), (3, (1, 1), 1), (4, (1, 1), -1)]

# t01 = insert_trace(t00, b00), t10 = insert_trace(t01, b01), t11 = insert_trace(t10, b10):
# the trace passed at each time holds the batches processed before it, in that order.
DISTINCT_TRACE_CASES = [
    ((0, 0), B00, [], [(0, None, 1), (2, None, 1)]),
    ((0, 1), B01, B00, [(5, None, 1)]),
    ((1, 0), B10, B00 + B01, [(5, None, 1)]),
    ((1, 1), B11, B00 + B01 + B10, [(1, None, 1), (2, None, -1), (5, None, -1)]),
]


@pytest.mark.parametrize(("time", "batch", "history", "expected"), DISTINCT_TRACE_CASES)
def test_distinct_trace(
    time: Time, batch: list[Triple], history: list[Triple], expected: list[Triple]
) -> None:
    assert distinct_trace(untimed(batch), trace_of(history), time) == untimed(expected)


@pytest.mark.parametrize(("time", "batch", "history", "expected"), DISTINCT_TRACE_CASES)
def test_distinct_at_agrees_on_the_seed_example(
    time: Time, batch: list[Triple], history: list[Triple], expected: list[Triple]
) -> None:
    assert distinct_at(trace_of(history + batch), time) == untimed(expected)


def test_distinct_trace_corrects_a_row_with_no_input_now() -> None:
    # The "second class" of rows: 5 changed at (0, 1) and at (1, 0) and has no
    # input at (1, 1), yet distinct must retract it there (it was counted twice).
    history = trace_of(B00 + B01 + B10)
    assert distinct_trace(ZSet(), history, (1, 1)) == ZSet({5: -1})


def test_distinct_trace_ignores_updates_not_below_the_time() -> None:
    # At (1, 0), the update to 5 at (0, 1) is not visible (incomparable), nor is anything later.
    history = trace_of(B00 + B01 + [(7, (2, 0), 1), (8, (1, 3), 1)])
    assert distinct_trace(untimed(B10), history, (1, 0)) == ZSet({5: 1})


def test_distinct_trace_accumulates_to_distinct_of_the_input() -> None:
    everything = trace_of(B00 + B01 + B10 + B11)
    for time in [(0, 0), (0, 1), (1, 0), (1, 1)]:
        deltas = ZSet()
        for s in [(0, 0), (0, 1), (1, 0), (1, 1)]:
            if timestamps.less_equal(s, time):
                deltas = deltas + distinct_at(everything, s)
        assert deltas == distinct(everything.accumulate(time))


# --- seed 003: joins ----------------------------------------------------------------------------


def join_fun(key: Any, v1: Any, v2: Any) -> Any:
    return (key, (v1, v2))


def test_join_stream() -> None:
    a = untimed([(("a", 1), 0, 1), (("b", 2), 0, 2), (("c", 2), 0, 1)])
    b = untimed([(("a", 1), 0, 1), (("b", 3), 0, 1), (("b", 4), 0, -1)])
    expected = [(("a", (1, 1)), None, 1), (("b", (2, 3)), None, 2), (("b", (2, 4)), None, -2)]
    assert join_stream(join_fun, a, b) == untimed(expected)


JOIN_TRACE_ZSET = [
    (("a", 0), 0, 1),
    (("a", 0), 0, -1),
    (("a", 1), 0, 1),
    (("b", 2), 0, 2),
    (("c", 2), 0, 1),
]
JOIN_TRACE_TRACE = [
    ("a", 1, 0, 1),
    ("b", -3, 0, -1),
    ("b", 3, 0, 1),
    ("b", 4, 0, -1),
    ("c", 4, 0, 1),
]


def test_join_trace() -> None:
    # The seed's expected rows are flat {key, v1, v2} although its join_fun builds
    # {key, {v1, v2}}; a flat join function reproduces the listed output exactly.
    def flat(key: Any, v1: Any, v2: Any) -> Any:
        return (key, v1, v2)

    expected = [
        (("a", 1, 1), None, 1),
        (("b", 2, -3), None, -2),
        (("b", 2, 3), None, 2),
        (("b", 2, 4), None, -2),
        (("c", 2, 4), None, 1),
    ]
    result = join_trace(flat, untimed(JOIN_TRACE_ZSET), seed_trace(JOIN_TRACE_TRACE))
    assert result == untimed(expected)


def test_join_trace_with_the_seeds_join_fun() -> None:
    result = join_trace(join_fun, untimed(JOIN_TRACE_ZSET), seed_trace(JOIN_TRACE_TRACE))
    assert result == ZSet(
        {
            ("a", (1, 1)): 1,
            ("b", (2, -3)): -2,
            ("b", (2, 3)): 2,
            ("b", (2, 4)): -2,
            ("c", (2, 4)): 1,
        }
    )


def test_join_trace_sums_the_trace_over_all_times() -> None:
    trace = trace_of([(("k", 1), (0,), 1), (("k", 1), (5,), 1), (("k", 2), (2,), 1)])
    trace.insert_update(("k", 2), (3,), -1)
    assert join_trace(join_fun, ZSet({("k", "x"): 3}), trace) == ZSet({("k", ("x", 1)): 6})


def test_incremental_join_as_the_seed_composes_it() -> None:
    """join_stream(a, b) + join_trace(a, z1_trace(b)) + join_trace(flipped, b, z1_trace(a))."""
    a_deltas = [untimed(JOIN_TRACE_ZSET), ZSet({("b", 9): 1, ("a", 1): -1}), ZSet({("c", 7): 2})]
    b_deltas = [
        ZSet({("a", 1): 1, ("b", 3): 1}),
        ZSet({("b", 3): -1, ("c", 4): 1}),
        ZSet({("b", 5): 1}),
    ]
    a_trace, b_trace = Trace(), Trace()
    a_delay, b_delay = DelayTrace(), DelayTrace()
    a_total, b_total, out_total = ZSet(), ZSet(), ZSet()
    for epoch, (a, b) in enumerate(zip(a_deltas, b_deltas, strict=True)):
        a_trace = trace_append(a_trace, a, (epoch,))
        b_trace = trace_append(b_trace, b, (epoch,))
        a_before, b_before = a_delay.step(a_trace), b_delay.step(b_trace)
        out_total = out_total + incremental_join(join_fun, a, b, a_before, b_before)
        a_total, b_total = a_total + a, b_total + b
        assert out_total == join_stream(join_fun, a_total, b_total)


# --- seed 003: distinct_incremental -------------------------------------------------------------

DISTINCT_INCREMENTAL_BATCH = [(0, None, 2), (2, None, 1), (3, None, -1)]


@pytest.mark.parametrize(
    ("trace", "expected"),
    [
        ([(0, 0, 1)], [(2, None, 1)]),
        ([(2, 1, 1), (3, 1, 1)], [(0, None, 1), (3, None, -1)]),
        ([(0, 2, -1)], [(0, None, 1), (2, None, 1)]),
    ],
)
def test_distinct_incremental(trace: list[Triple], expected: list[Triple]) -> None:
    history = trace_of((row, as_time(t), w) for row, t, w in trace)
    assert distinct_incremental(untimed(DISTINCT_INCREMENTAL_BATCH), history) == untimed(expected)


# --- seed 003: delay and trace appends ----------------------------------------------------------


def test_delay_outputs_the_previous_input() -> None:
    inputs = [ZSet({1: 1}), ZSet({2: 1}), ZSet(), ZSet({3: -1})]
    assert list(delay(inputs)) == [ZSet(), ZSet({1: 1}), ZSet({2: 1}), ZSet()]
    state = Delay()
    assert state.step(ZSet({"x": 1})) == ZSet()
    assert state.peek() == ZSet({"x": 1})


def test_delay_trace_hands_back_snapshots() -> None:
    trace = trace_of([("x", (0,), 1)])
    state = DelayTrace()
    assert len(state.step(trace)) == 0
    trace.insert_update("y", (1,), 1)  # mutating the input later must not leak
    previous = state.step(trace)
    assert updates_of(previous) == {("x", (0,), 1)}


def test_trace_append_returns_a_new_trace() -> None:
    before = trace_of([("x", (0,), 1)])
    after = trace_append(before, ZSet({"x": -1, "y": 2}), (1,))
    assert updates_of(before) == {("x", (0,), 1)}
    assert updates_of(after) == {("x", (0,), 1), ("x", (1,), -1), ("y", (1,), 2)}
    assert after.accumulate((1,)) == ZSet({"y": 2})


def test_untimed_trace_append_records_at_the_minimal_time() -> None:
    trace = untimed_trace_append(Trace(), ZSet({"x": 1}))
    trace = untimed_trace_append(trace, ZSet({"x": 1, "y": -1}))
    assert updates_of(trace) == {("x", MIN_TIME, 2), ("y", MIN_TIME, -1)}
    assert consolidate(trace) == ZSet({"x": 2, "y": -1})
    assert distinct_incremental(ZSet({"y": 2}), trace) == ZSet({"y": 1})


# --- seed 001: the general linear operator ------------------------------------------------------

NAMES = [("frank", (6,), 1), ("frank", (8,), 1), ("david", (8,), 1), ("frank", (9,), -2)]


def test_names_through_map_with_length() -> None:
    out = join_function(map_logic(lambda x: (x, len(x))), NAMES)
    assert updates_of(out) == {
        (("frank", 5), (6,), 1),
        (("frank", 5), (8,), 1),
        (("david", 5), (8,), 1),
        (("frank", 5), (9,), -2),
    }
    assert out.accumulate((7,)) == ZSet({("frank", 5): 1})
    assert out.accumulate((8,)) == ZSet({("frank", 5): 2, ("david", 5): 1})
    assert out.accumulate((9,)) == ZSet({("david", 5): 1})


def test_names_map_agrees_with_map_on_each_time() -> None:
    out = join_function(map_logic(lambda x: (x, len(x))), NAMES)
    assert by_time(out.updates()) == per_time(lambda z: map_(lambda x: (x, len(x)), z), NAMES)


def copies_of_double(x: int) -> list[tuple[int, Time, int]]:
    """From the join_function doc comment: x copies of 2x from time 3x until 4x."""
    return [(2 * x, (3 * x,), x), (2 * x, (4 * x,), -x)]


def test_join_function_doc_example() -> None:
    out = join_function(copies_of_double, [(x, (0,), 1) for x in range(10)])
    assert out.accumulate((0,)) == ZSet()  # x = 0 contributes 0 copies
    assert out.accumulate((3,)) == ZSet({2: 1})
    assert out.accumulate((9,)) == ZSet({6: 3})
    assert out.accumulate((12,)) == ZSet({8: 4})
    assert out.accumulate((24,)) == ZSet({14: 7, 16: 8})
    assert out.accumulate((36,)) == ZSet()
    for t in range(40):
        expected = ZSet({2 * x: x for x in range(10) if 3 * x <= t < 4 * x})
        assert out.accumulate((t,)) == expected


def test_join_function_joins_input_times_with_logic_times() -> None:
    # x = 2 arrives only at time 7: its copies exist from max(7, 6) = 7 until 8.
    out = join_function(copies_of_double, [(2, (7,), 1)])
    assert updates_of(out) == {(4, (7,), 2), (4, (8,), -2)}


def test_explode_multiplies_diffs_including_negative_ones() -> None:
    counts = [
        (("apple", 3), (0,), 1),
        (("pear", 2), (0,), 1),
        (("apple", 3), (1,), -1),  # retract three apples at once
        (("plum", -2), (1,), 1),  # a positive record exploding into a negative one
        (("plum", -2), (2,), -1),  # and its retraction, which is positive again
    ]
    out = join_function(explode_logic(lambda kc: [(kc[0], kc[1])]), counts)
    assert updates_of(out) == {
        ("apple", (0,), 3),
        ("pear", (0,), 2),
        ("apple", (1,), -3),
        ("plum", (1,), -2),
        ("plum", (2,), 2),
    }
    assert out.accumulate((1,)) == ZSet({"pear": 2, "plum": -2})
    assert out.accumulate((2,)) == ZSet({"pear": 2})


def test_temporal_filter() -> None:
    # rows (name, start, end) are visible at epochs start <= t < end
    logic = temporal_filter_logic(lambda r: (r[1],), lambda r: (r[2],))
    events = [
        (("a", 2, 5), (0,), 1),
        (("b", 1, 3), (2,), 1),  # arrives late: visible from 2 until 3
        (("c", 4, 4), (0,), 1),  # empty interval: never visible
        (("d", 6, 2), (0,), 1),  # upper below lower: never visible
        (("e", 1, 9), (0,), 1),
        (("e", 1, 9), (4,), -1),  # deleted at 4: visible from 1 until 4
    ]
    out = join_function(logic, events)
    assert updates_of(out) == {
        (("a", 2, 5), (2,), 1),
        (("a", 2, 5), (5,), -1),
        (("b", 1, 3), (2,), 1),
        (("b", 1, 3), (3,), -1),
        (("e", 1, 9), (1,), 1),
        (("e", 1, 9), (4,), -1),
    }
    source = trace_of(events)
    for t in range(12):
        visible = filter_(lambda r, t=t: r[1] <= t < r[2], source.accumulate((t,)))
        assert out.accumulate((t,)) == visible


def test_temporal_filter_with_one_sided_bounds() -> None:
    after = join_function(temporal_filter_logic(lambda r: (r,), None), [(3, (1,), 1)])
    assert updates_of(after) == {(3, (3,), 1)}
    before = join_function(temporal_filter_logic(None, lambda r: (r,)), [(3, (1,), 1)])
    assert updates_of(before) == {(3, (1,), 1), (3, (3,), -1)}


def test_logic_times_are_padded_to_the_input_depth() -> None:
    # A temporal filter on the epoch alone, applied inside a loop: (2,) reads as (2, 0).
    logic = temporal_filter_logic(lambda r: (2,), lambda r: (4,))
    out = join_function(logic, [("x", (0, 3), 1)])
    assert updates_of(out) == {("x", (2, 3), 1), ("x", (4, 3), -1)}
    # MIN_TIME joins with any input time, even a time of depth 0 (untimed data)
    assert updates_of(join_function(map_logic(str), [(1, (), 1)])) == {("1", (), 1)}
    with pytest.raises(ValueError, match="deeper"):
        join_function(lambda r: [(r, (1, 1), 1)], [("x", (0,), 1)])


BOUND = st.integers(0, 3)


@settings(max_examples=200, deadline=None)
@given(
    bounds=st.tuples(st.tuples(BOUND, BOUND), st.tuples(BOUND, BOUND)),
    arrivals=st.lists(st.tuples(st.tuples(BOUND, BOUND), st.integers(-2, 2)), max_size=4),
)
def test_temporal_filter_in_the_product_order(
    bounds: tuple[Time, Time], arrivals: list[tuple[Time, int]]
) -> None:
    """With incomparable bounds the row is visible at t >= lower unless t >= upper."""
    lower, upper = bounds
    updates = [("r", t, w) for t, w in arrivals]
    out = join_function(temporal_filter_logic(lambda _: lower, lambda _: upper), updates)
    source = trace_of(updates)
    for t in [(e, i) for e in range(5) for i in range(5)]:
        inside = timestamps.less_equal(lower, t) and not timestamps.less_equal(upper, t)
        expected = source.accumulate(t) if inside else ZSet()
        assert out.accumulate(t) == expected


# --- seed 001: fusion with followed_by ----------------------------------------------------------

SAMPLE_LOGICS = [
    map_logic(lambda x: x + 1),
    map_logic(lambda x: x // 2),
    filter_logic(lambda x: x % 2 == 0),
    flat_map_logic(lambda x: [x, x + 1, x]),
    explode_logic(lambda x: [(x, -1), (2 * x, 2)]),
    temporal_filter_logic(lambda x: (x % 3,), lambda x: (x % 5,)),
    temporal_filter_logic(lambda x: (x % 2, x % 3), lambda x: (1, 2)),
    lambda x: [(x - 1, (x % 4, 1), x % 3 - 1)],
]

UPDATES = st.lists(
    st.tuples(st.integers(-4, 6), st.tuples(BOUND, BOUND), st.integers(-3, 3)), max_size=8
)


@settings(max_examples=300, deadline=None)
@given(
    chain=st.lists(st.sampled_from(range(len(SAMPLE_LOGICS))), min_size=2, max_size=4),
    updates=UPDATES,
)
def test_followed_by_is_applying_one_logic_after_the_other(
    chain: list[int], updates: list[tuple[int, Time, int]]
) -> None:
    first, *rest = [SAMPLE_LOGICS[i] for i in chain]
    staged = join_function(first, updates)
    for logic in rest:
        staged = join_function(logic, staged)
    fused = join_function(followed_by(first, *rest), updates)
    assert updates_of(fused) == updates_of(staged)


@settings(max_examples=100, deadline=None)
@given(updates=UPDATES)
def test_fused_map_filter_flat_map_agree_with_the_linear_operators(
    updates: list[tuple[int, Time, int]],
) -> None:
    logic = followed_by(
        map_logic(lambda x: x * 3), filter_logic(lambda x: x > 0), flat_map_logic(range)
    )
    expected = per_time(
        lambda z: z.map(lambda x: x * 3).filter(lambda x: x > 0).flat_map(range), updates
    )
    assert by_time(join_function(logic, updates).updates()) == expected
