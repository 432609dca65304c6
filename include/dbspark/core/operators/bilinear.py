"""Bilinear operators: the equijoin of two indexed Z-sets.

An indexed Z-set holds ``(key, value)`` rows. ``join_stream`` pairs every row of
one side with every row of the other that has the same key, builds the output
row with ``join_fn(key, v1, v2)`` and multiplies the weights. The join is
linear in each argument separately (bilinear):
``(a1 + a2) ⋈ b = a1 ⋈ b + a2 ⋈ b`` and likewise on the right.

Incremental rule: write ``A`` and ``B`` for everything seen strictly before
now and ``a``, ``b`` for the deltas that arrive now. Then

    (A + a) ⋈ (B + b) - A ⋈ B  =  a ⋈ b  +  a ⋈ B  +  A ⋈ b

so the change of the output needs the two deltas and the two histories, never
the old output. ``join_trace`` is the ``a ⋈ B`` term: a delta against a trace,
summing the trace over all of its times; ``incremental_join`` adds the three
terms, swapping the value arguments of ``join_fn`` for ``A ⋈ b`` so that the
output rows have the same shape in all three. Only the keys present in a delta
are looked up in the other side's history, so the work follows the delta.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Hashable
from typing import Any

from dbspark.core.trace import Trace
from dbspark.core.zset import Row, ZSet

JoinFn = Callable[[Any, Any, Any], Row]


def join_stream(join_fn: JoinFn, a: ZSet, b: ZSet) -> ZSet:
    """``a ⋈ b`` on the key: ``join_fn(key, v1, v2)`` with weight ``w1 · w2`` per matching pair."""
    left = a.group_by_key()
    right = b.group_by_key()
    out: list[tuple[Row, int]] = []
    for key in left.keys() & right.keys():
        for v1, w1 in left[key].items():
            for v2, w2 in right[key].items():
                out.append((join_fn(key, v1, v2), w1 * w2))
    return ZSet(out)


def join_trace(join_fn: JoinFn, zset: ZSet, trace: Trace) -> ZSet:
    """``zset ⋈ consolidate(trace)``, reading only the trace's rows whose key is in ``zset``.

    ``trace`` holds ``(key, value)`` rows; every update counts whatever its time.
    """
    keys = {key for (key, _value), _w in zset.items()}  # type: ignore[misc]
    return join_stream(join_fn, zset, _history_for_keys(trace, keys))


def incremental_join(join_fn: JoinFn, a: ZSet, b: ZSet, a_trace: Trace, b_trace: Trace) -> ZSet:
    """The change of ``A ⋈ B`` when deltas ``a`` and ``b`` arrive.

    ``a_trace`` and ``b_trace`` hold the updates seen *strictly before* ``a`` and
    ``b`` (the delayed traces).
    """

    def flipped(key: Any, v2: Any, v1: Any) -> Row:
        return join_fn(key, v1, v2)

    return (
        join_stream(join_fn, a, b)
        + join_trace(join_fn, a, b_trace)
        + join_trace(flipped, b, a_trace)
    )


def _history_for_keys(trace: Trace, keys: set[Hashable]) -> ZSet:
    """The trace summed over all times, restricted to ``(key, value)`` rows with a key in ``keys``.

    This scans the trace: ``Trace`` does not say which key function it is indexed
    by, so its per-key index cannot be used safely here.
    """
    totals: dict[Row, int] = defaultdict(int)
    if keys:
        for row, _time, weight in trace.updates():
            if row[0] in keys:  # type: ignore[index]
                totals[row] += weight
    return ZSet(totals)
