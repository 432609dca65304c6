"""Aggregate functions over one group of a Z-set.

An aggregate sees a group as ``(value, weight)`` pairs: the value of its input
column in each distinct row of the group (``None`` for SQL NULL), and the row's
accumulated weight (its multiplicity). The result follows SQL: NULL inputs are
ignored by every aggregate except ``count()`` of whole rows, and an aggregate
over no non-NULL value is NULL.

Aggregates are not linear, so the engines recompute them only for the groups
that a delta touches, from the group's accumulated contents.

User-defined aggregates are pure functions of the group's multiset of values;
``udf`` expands multiplicities so the function sees one value per copy, in
sorted order, which keeps it deterministic.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal, localcontext
from typing import Any

from dbspark.core.types import EXACT, at_scale, is_decimal

Group = Sequence[tuple[Any, int]]


@dataclass(frozen=True)
class Aggregate:
    """An aggregate function: a name for plans and logs, and its evaluation."""

    kind: str
    evaluate: Callable[[Group], Any]
    result_type: str | None = None  # None: same as the input column

    def __call__(self, group: Group) -> Any:
        return self.evaluate(group)


def _non_null(group: Group) -> list[tuple[Any, int]]:
    return [(v, w) for v, w in group if v is not None and w != 0]


def _count_rows(group: Group) -> int:
    return sum(w for _, w in group)


def _count_values(group: Group) -> int:
    return sum(w for _, w in _non_null(group))


def _sum(group: Group) -> Any:
    present = _non_null(group)
    if not present:
        return None
    with localcontext(EXACT):  # exact: Python's default context rounds at 28 digits
        return sum(v * w for v, w in present)


def _min(group: Group) -> Any:
    present = [v for v, w in _non_null(group) if w > 0]
    return min(present) if present else None


def _max(group: Group) -> Any:
    present = [v for v, w in _non_null(group) if w > 0]
    return max(present) if present else None


def _average(result_type: str) -> Callable[[Group], Any]:
    """The mean; over decimals exact, then rounded half away from zero to the scale of
    ``result_type`` (Spark's AVG of a DECIMAL(p, s) keeps s + 4 digits)."""
    exact = is_decimal(result_type)

    def evaluate(group: Group) -> Any:
        present = _non_null(group)
        count = sum(w for _, w in present)
        if count == 0:
            return None
        with localcontext(EXACT):
            total = sum(v * w for v, w in present)
            return at_scale(Decimal(total) / count, result_type) if exact else total / count

    return evaluate


def count_rows() -> Aggregate:
    """``COUNT(*)``: the group's total multiplicity."""
    return Aggregate("count", _count_rows, "bigint")


def count_values() -> Aggregate:
    """``COUNT(col)``: multiplicity of the rows whose value is not NULL."""
    return Aggregate("count", _count_values, "bigint")


def sum_values() -> Aggregate:
    return Aggregate("sum", _sum)


def min_value() -> Aggregate:
    return Aggregate("min", _min)


def max_value() -> Aggregate:
    return Aggregate("max", _max)


def avg_value(result_type: str = "double") -> Aggregate:
    return Aggregate("avg", _average(result_type), result_type)


def user_defined(fn: Callable[[list[Any]], Any], result_type: str, name: str = "udf") -> Aggregate:
    """Wrap a pure function of the group's values (one per copy, sorted, NULLs kept)."""

    def evaluate(group: Group) -> Any:
        expanded: list[Any] = []
        for value, weight in group:
            if weight < 0:
                raise ValueError(f"user-defined aggregate {name} saw a negative multiplicity")
            expanded.extend([value] * weight)
        expanded.sort(key=lambda v: (v is not None, v))
        return fn(expanded)

    return Aggregate(name, evaluate, result_type)
