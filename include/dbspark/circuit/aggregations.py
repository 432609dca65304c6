"""Aggregations a user asks for in ``Stream.aggregate``.

These are specifications (what to aggregate, over which expression); the
engines map them to implementations: ``dbspark.core.aggregates`` in the
reference engine, Spark's native aggregate functions in the Spark engine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dbspark.circuit.expressions import (
    Expr,
    decimal_avg_type,
    decimal_sum_type,
    infer_type,
    wrap,
)
from dbspark.core.types import BIGINT, DOUBLE, Schema, is_decimal, is_numeric, normalize_type


@dataclass(frozen=True, eq=False)
class Aggregation:
    kind: str  # count | sum | min | max | avg | udf
    expr: Expr | None = None  # None: count(*)
    function: Callable[[list[Any]], Any] | None = None
    declared_type: str | None = None

    def result_type(self, schema: Schema, where: str) -> str:
        if self.expr is None:
            return BIGINT
        input_type = infer_type(self.expr, schema, where)
        if self.kind == "count":
            return BIGINT
        if self.kind in ("sum", "avg") and not is_numeric(input_type):
            raise TypeError(f"{where}: {self.kind} needs a number, got {input_type}")
        if self.kind == "avg":
            return decimal_avg_type(input_type) if is_decimal(input_type) else DOUBLE
        if self.kind == "sum" and is_decimal(input_type):
            return decimal_sum_type(input_type)
        if self.kind == "udf":
            assert self.declared_type is not None
            return self.declared_type
        return input_type


def count(expr: Any = None) -> Aggregation:
    """``count()`` counts rows; ``count(col("x"))`` counts rows where x is not NULL."""
    return Aggregation("count", None if expr is None else wrap(expr))


def sum_(expr: Any) -> Aggregation:
    return Aggregation("sum", wrap(expr))


def min_(expr: Any) -> Aggregation:
    return Aggregation("min", wrap(expr))


def max_(expr: Any) -> Aggregation:
    return Aggregation("max", wrap(expr))


def avg(expr: Any) -> Aggregation:
    return Aggregation("avg", wrap(expr))


def udf(function: Callable[[list[Any]], Any], expr: Any, result_type: str) -> Aggregation:
    """A user-defined aggregate: a *pure* function of the group's values (one per copy, sorted)."""
    return Aggregation("udf", wrap(expr), function, normalize_type(result_type))
