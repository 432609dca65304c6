"""The general linear operator ``join_function(logic)`` and the logics that build it.

A *logic* maps one input row to a small update stream of its own: an iterable
of ``(row2, time2, weight2)`` triples. Think of it as a (never materialized)
collection ``{(row, row2)}`` whose history is given by ``logic(row)``; the
operator is the equijoin of the input with that collection on ``row``,
projected onto ``row2``.

Incremental rule: an input update ``(row, t, w)`` produces, for every
``(row2, t2, w2)`` in ``logic(row)``, the output update
``(row2, join(t, t2), w · w2)``, where ``join`` is the least upper bound of
times (the coordinate-wise maximum). That is the join rule for two update
streams with one side fixed, so the operator is linear in its input and needs
no state: it runs on each delta as it arrives.

map, filter and flat_map are the logics whose updates hold from the beginning
of time with weight +1; ``explode`` lets the logic choose the weights (possibly
negative, which turns insertions into retractions); a temporal filter chooses
the times, so a row appears at ``lower(row)`` and is retracted at
``upper(row)``.

Times. A logic does not know how deeply nested its input is, so it may emit
times with *fewer* coordinates than the input's; they are read as padded with
zeros on the right (the way an outer time enters a nested scope). In
particular ``MIN_TIME == ()`` is the least time of every depth, and
``join(t, MIN_TIME) == t``. A logic must not emit a time *deeper* than its input.

Fusion. ``followed_by(l1, l2)`` is a single logic equivalent to running
``join_function(l1)`` and then ``join_function(l2)``: it enumerates ``l1(row)``
and, for each result, ``l2`` of it, joining the two times and multiplying the
two weights. Because ``join`` is associative and weights multiply associatively,
``join_function(followed_by(l1, l2), u)`` equals
``join_function(l2, join_function(l1, u))`` after consolidation. An engine uses
this to run a whole chain of linear operators as one pass.

``join_function`` returns a ``Trace``: the output is a consolidated multiset of
timed updates, ready to be accumulated at a time, appended to another trace or
fed to the next ``join_function``.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator
from typing import Any

from dbspark.core.operators._time import MIN_TIME, join_padded, pad
from dbspark.core.timestamps import Time
from dbspark.core.trace import Trace, Update
from dbspark.core.zset import Row

Logic = Callable[[Any], Iterable[Update]]

__all__ = [
    "MIN_TIME",
    "Logic",
    "explode_logic",
    "filter_logic",
    "flat_map_logic",
    "followed_by",
    "join_function",
    "map_logic",
    "temporal_filter_logic",
]


def join_function(
    logic: Logic,
    updates: Trace | Iterable[Update],
    key_of: Callable[[Row], Hashable] | None = None,
) -> Trace:
    """Apply the general linear operator defined by ``logic`` to timed updates.

    ``updates`` is a trace or any iterable of ``(row, time, weight)``. The result
    is a new trace (indexed by ``key_of`` if given) holding, consolidated, every
    ``(row2, join(time, time2), weight · weight2)`` for ``(row2, time2, weight2)`` in
    ``logic(row)``.
    """
    source = updates.updates() if isinstance(updates, Trace) else updates
    out = Trace(key_of)
    for row, time, weight in source:
        for row2, time2, weight2 in logic(row):
            if not isinstance(time2, tuple):
                raise TypeError(f"logic emitted time {time2!r} for {row!r}; times are tuples")
            if len(time2) > len(time):
                raise ValueError(
                    f"logic emitted time {time2} for {row!r}, deeper than the input time {time}"
                )
            out.insert_update(row2, join_padded(time, time2), weight * weight2)
    return out


def map_logic(fn: Callable[[Any], Row]) -> Logic:
    """``map(fn)``: the row ``fn(row)``, present from the beginning of time."""

    def logic(row: Any) -> list[Update]:
        return [(fn(row), MIN_TIME, 1)]

    return logic


def filter_logic(pred: Callable[[Any], bool]) -> Logic:
    """``filter(pred)``: the row itself if ``pred`` holds, otherwise nothing."""

    def logic(row: Any) -> list[Update]:
        return [(row, MIN_TIME, 1)] if pred(row) else []

    return logic


def flat_map_logic(fn: Callable[[Any], Iterable[Row]]) -> Logic:
    """``flat_map(fn)``: each row ``fn`` yields, once per occurrence."""

    def logic(row: Any) -> list[Update]:
        return [(value, MIN_TIME, 1) for value in fn(row)]

    return logic


def explode_logic(fn: Callable[[Any], Iterable[tuple[Row, int]]]) -> Logic:
    """``explode(fn)``: ``fn`` yields ``(value, diff)`` pairs; ``diff`` may be negative."""

    def logic(row: Any) -> list[Update]:
        return [(value, MIN_TIME, diff) for value, diff in fn(row)]

    return logic


def temporal_filter_logic(
    lower: Callable[[Any], Time] | None,
    upper: Callable[[Any], Time] | None,
) -> Logic:
    """Keep each row at the times ``t`` with ``lower(row) <= t`` and not ``upper(row) <= t``.

    The row is inserted at ``lower(row)`` and retracted at ``join(lower(row), upper(row))``.
    For totally ordered times with ``lower < upper`` the retraction is at
    ``upper(row)``, as usual; the join keeps the accumulated weight at 0 or 1
    when the interval is empty (``upper <= lower``: nothing is emitted) or when
    the bounds are incomparable in the product order. ``None`` leaves that side
    unbounded.
    """

    def logic(row: Any) -> list[Update]:
        start = MIN_TIME if lower is None else lower(row)
        if upper is None:
            return [(row, start, 1)]
        stop = join_padded(start, upper(row))
        if stop == pad(start, len(stop)):
            return []
        return [(row, start, 1), (row, stop, -1)]

    return logic


def followed_by(first: Logic, second: Logic, *rest: Logic) -> Logic:
    """One logic that does ``first``, then ``second`` (then each of ``rest``)."""
    if rest:
        return followed_by(followed_by(first, second), *rest)

    def fused(row: Any) -> Iterator[Update]:
        for row1, time1, weight1 in first(row):
            for row2, time2, weight2 in second(row1):
                yield row2, join_padded(time1, time2), weight1 * weight2

    return fused
