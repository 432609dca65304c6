"""Non-linear operators: distinct and aggregate, and their incremental forms.

``distinct`` maps a Z-set to the set of its rows with positive weight (each at
weight 1); ``aggregate`` maps an indexed Z-set to one ``(key, value)`` row per
key. Neither is linear, so the change of the output cannot be computed from
the change of the input alone: it needs the accumulated input (the trace).

Incremental rule, one clock. If ``F`` acts on each row (distinct) or each key
(aggregate) independently, the change of ``F``'s output when ``delta`` is
added to the accumulated input ``S`` is ``F(S + delta) - F(S)``, and only the
rows or keys that ``delta`` touches can contribute. ``distinct_incremental``
and ``aggregate_incremental`` read the trace for those rows or keys only.

Incremental rule, nested clocks. Outputs are *deltas*: the output stream at
time ``t`` is whatever must be added so that, summed over all ``s <= t``, it
equals ``F`` of the input accumulated at ``t``. In the product order this is
the finite difference of ``F ∘ accumulate`` over the corners of the unit cube
below ``t``:

    out(t) = Σ over subsets S of the coordinates of (-1)^|S| · F(acc(t - Σ_{j∈S} e_j))

where corners with a negative coordinate are left out. ``difference_at``
computes exactly this for any ``F`` and any depth; ``distinct_at`` is its
instance for ``distinct``. For a time ``(e, i)`` inside a loop the four corners
give ``distinct_trace``'s formula: with ``w1``, ``w2``, ``w3`` the row's weights
at times ``(< e, < i)``, ``(< e, i)`` and ``(e, < i)`` and ``w`` its weight in the
current batch,

    out = [D(w1 + w2 + w3 + w) - D(w1 + w3)] - [D(w1 + w2) - D(w1)]

with ``D(x) = 1 if x > 0 else 0``. A row that has *no* update at ``(e, i)`` can
still have a non-zero output there, namely when both ``w2`` and ``w3`` are
non-zero: it changed in an earlier epoch at iteration ``i`` and earlier in this
epoch. ``distinct_trace`` therefore examines those rows as well as the batch's,
and an engine must schedule such rows as pending work even when the input at
``(e, i)`` is empty.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Hashable
from typing import Any

from dbspark.core.aggregates import Aggregate
from dbspark.core.timestamps import Time, box_corners
from dbspark.core.trace import Trace
from dbspark.core.zset import Row, ZSet

AggregateFn = Aggregate | Callable[[list[tuple[Any, int]]], Any]


# --- distinct -----------------------------------------------------------------------------------


def distinct(z: ZSet) -> ZSet:
    """Every row with positive weight, at weight 1; the others are dropped."""
    return z.positive_part()


def distinct_incremental(batch: ZSet, trace: Trace) -> ZSet:
    """The change of ``distinct`` when ``batch`` is added to the input summed in ``trace``.

    ``trace`` holds the input accumulated so far, as updates at any times (they
    are all summed); it must not include ``batch``. Only the rows of ``batch`` can
    change, so only their history is read.
    """
    rows = set(batch.rows())
    old = _totals(trace, lambda row: row in rows)
    return ZSet((row, _step(old[row], old[row] + weight)) for row, weight in batch.items())


def distinct_trace(batch: ZSet, trace: Trace, time: Time) -> ZSet:
    """The output delta of ``distinct`` at ``time = (epoch, iteration)`` inside a loop.

    ``batch`` is the input delta at ``time``; ``trace`` holds the input's other
    updates. Updates in ``trace`` at ``time`` itself or at times not below it
    are ignored (the batch is the input at ``time``; the rest is not yet
    visible). Rows of the batch are examined, and so are rows with non-zero
    weight both at ``(< epoch, iteration)`` and at ``(epoch, < iteration)``,
    which may need a correction although their input at ``time`` is empty.
    """
    if len(time) != 2:
        raise ValueError(f"distinct_trace needs an (epoch, iteration) time, got {time}")
    epoch, iteration = time
    w1: dict[Row, int] = defaultdict(int)  # times (< epoch, < iteration)
    w2: dict[Row, int] = defaultdict(int)  # times (< epoch, == iteration)
    w3: dict[Row, int] = defaultdict(int)  # times (== epoch, < iteration)
    for row, t, weight in trace.updates():
        if len(t) != 2:
            raise ValueError(f"distinct_trace needs (epoch, iteration) times, found {t}")
        t_epoch, t_iteration = t
        if t_epoch < epoch and t_iteration < iteration:
            w1[row] += weight
        elif t_epoch < epoch and t_iteration == iteration:
            w2[row] += weight
        elif t_epoch == epoch and t_iteration < iteration:
            w3[row] += weight
    candidates = set(batch.rows()) | {row for row, w in w2.items() if w and w3.get(row, 0)}
    out: list[tuple[Row, int]] = []
    for row in candidates:
        a1 = w1.get(row, 0)
        a12 = a1 + w2.get(row, 0)
        a13 = a1 + w3.get(row, 0)
        a1234 = a12 + w3.get(row, 0) + batch.weight(row)
        delta_old = _step(a1, a12)  # what the earlier epochs did at this iteration
        delta_new = _step(a13, a1234)  # what this epoch does at this iteration
        out.append((row, delta_new - delta_old))
    return ZSet(out)


def distinct_at(trace: Trace, time: Time) -> ZSet:
    """The output delta of ``distinct`` at ``time`` of any depth; ``trace`` is the whole input.

    Unlike ``distinct_trace``, the input's update at ``time`` itself is read from
    ``trace``. This is the reference definition; it accumulates the trace at up
    to ``2 ** len(time)`` corners.
    """
    return difference_at(distinct, trace, time)


def difference_at(op: Callable[[ZSet], ZSet], trace: Trace, time: Time) -> ZSet:
    """The output delta at ``time`` of the non-linear operator ``op`` over the input ``trace``.

    The finite difference of ``op(trace.accumulate(s))`` over the corners
    ``s = time - Σ_{j∈S} e_j``; a corner with a negative coordinate contributes
    nothing. Summed over all times ``s <= t`` these deltas give
    ``op(trace.accumulate(t))``.
    """
    total = ZSet()
    for sign, corner in box_corners(time):
        total = total + op(trace.accumulate(corner)).scale(sign)
    return total


# --- aggregate ----------------------------------------------------------------------------------


def aggregate(agg_fn: AggregateFn, indexed: ZSet) -> ZSet:
    """One ``(key, agg_fn(group))`` row per key of ``indexed``, at weight 1.

    ``agg_fn`` is an ``Aggregate`` or any function of the group's
    ``[(value, weight)]`` list, which it receives in a deterministic order.
    Keys whose group is empty (all weights cancelled) have no row.
    """
    return ZSet(
        ((key, agg_fn(_ordered(group))), 1) for key, group in indexed.group_by_key().items()
    )


def aggregate_incremental(agg_fn: AggregateFn, batch: ZSet, trace: Trace) -> ZSet:
    """The change of ``aggregate`` when ``batch`` is added to the indexed input summed in ``trace``.

    Only the keys of ``batch`` are recomputed: each such key's old row is
    retracted and its new row inserted (they cancel when the value is unchanged).
    """
    keys = {key for (key, _value), _w in batch.items()}  # type: ignore[misc]
    old = _totals(trace, lambda row: row[0] in keys)  # type: ignore[index]
    old_z = ZSet(old)
    return aggregate(agg_fn, old_z + batch) - aggregate(agg_fn, old_z)


# --- helpers ------------------------------------------------------------------------------------


def _step(before: int, after: int) -> int:
    """The change of ``D(x) = [x > 0]`` from ``before`` to ``after``: -1, 0 or +1."""
    return int(after > 0) - int(before > 0)


def _totals(trace: Trace, wanted: Callable[[Row], bool]) -> dict[Row, int]:
    """Weights of the wanted rows summed over all times of ``trace``.

    A scan: ``Trace`` does not expose which key function its index uses, so the
    operators cannot look keys up in it safely.
    """
    totals: dict[Row, int] = defaultdict(int)
    for row, _time, weight in trace.updates():
        if wanted(row):
            totals[row] += weight
    return totals


def _ordered(group: dict[Hashable, int]) -> list[tuple[Any, int]]:
    """A group's ``(value, weight)`` pairs in a deterministic order (NULLs first)."""
    items = list(group.items())
    try:
        return sorted(items, key=lambda vw: (vw[0] is not None, vw[0]))
    except TypeError:
        return sorted(items, key=lambda vw: repr(vw[0]))
