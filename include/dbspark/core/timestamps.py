"""Times: tuples of non-negative integers under the product partial order.

The root clock is the epoch, a time of one coordinate ``(e,)``. Each nested
fixed-point scope adds one coordinate, so a time inside a loop is
``(epoch, iteration)`` and inside a loop inside a loop ``(epoch, i, j)``.

Two times compare only when every coordinate agrees on the direction:
``(1, 0)`` and ``(0, 1)`` are incomparable. That is what lets changes from a
new epoch and changes from a deeper iteration flow independently, and why an
operator can owe output at a time where none of its inputs changed (their
least upper bound).
"""

from __future__ import annotations

from collections.abc import Iterable

Time = tuple[int, ...]


def less_equal(a: Time, b: Time) -> bool:
    """Product order: ``a <= b`` in every coordinate."""
    _check_same_depth(a, b)
    return all(x <= y for x, y in zip(a, b, strict=True))


def less_than(a: Time, b: Time) -> bool:
    """Strictly below in the product order."""
    return a != b and less_equal(a, b)


def comparable(a: Time, b: Time) -> bool:
    return less_equal(a, b) or less_equal(b, a)


def join(a: Time, b: Time) -> Time:
    """Least upper bound: the coordinate-wise maximum."""
    _check_same_depth(a, b)
    return tuple(max(x, y) for x, y in zip(a, b, strict=True))


def meet(a: Time, b: Time) -> Time:
    """Greatest lower bound: the coordinate-wise minimum."""
    _check_same_depth(a, b)
    return tuple(min(x, y) for x, y in zip(a, b, strict=True))


def join_all(times: Iterable[Time]) -> Time:
    result: Time | None = None
    for t in times:
        result = t if result is None else join(result, t)
    if result is None:
        raise ValueError("join_all of no times")
    return result


def box_corners(t: Time) -> list[tuple[int, Time]]:
    """``(sign, t - 1_S)`` for every subset ``S`` of coordinates, sign ``(-1)^|S|``,
    skipping corners with a negative coordinate.

    A function ``g`` of accumulated input changes at ``t`` by the sum of
    ``sign * g(corner)``: the inclusion-exclusion (finite difference) over the unit
    box below ``t`` that every stateful operator's incremental rule rests on.
    """
    result = []
    for mask in range(1 << len(t)):
        corner = tuple(c - ((mask >> j) & 1) for j, c in enumerate(t))
        if min(corner) >= 0:
            result.append((-1 if mask.bit_count() % 2 else 1, corner))
    return result


def enter(t: Time) -> Time:
    """The time at which an outer update is seen inside a nested scope."""
    return (*t, 0)


def leave(t: Time) -> Time:
    """The outer time of a nested time: drop the innermost coordinate."""
    if len(t) < 2:
        raise ValueError(f"time {t} is not nested")
    return t[:-1]


def _check_same_depth(a: Time, b: Time) -> None:
    if len(a) != len(b):
        raise ValueError(f"times of different nesting depth: {a} and {b}")
