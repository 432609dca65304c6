"""User-defined aggregates: pure Python functions of a group's values, on the driver.

A user-defined aggregate is an arbitrary Python function, so no tier can compile it.
The tier gathers each touched group's ``(value, multiplicity)`` pairs with
``collect_list`` (``gather``); the driver expands the multiplicities, sorts, and calls
the function exactly as the reference engine does
(``dbspark.core.aggregates.user_defined``), so every engine gives the same answer.

Why the driver and not a UDF inside the engine: the incremental engine only ever
evaluates the groups a delta touched, so the data is small; and a driver-side call
needs neither the user's module on Spark's executors nor a Python worker behind a
Spark Connect server. How the results become a frame again is the tier's
(``Dialect.evaluate_user_aggregates``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from dbspark.core.aggregates import user_defined
from dbspark.engine.values import from_column_value, to_column_value


@dataclass(frozen=True)
class UserAggregateColumn:
    """One user-defined aggregate to evaluate from one gathered list column."""

    gathered: str  # an array<struct<v, w>> column made by ``gather``
    output: str  # the result column's name
    function: Callable[[list[Any]], Any]
    value_type: str  # the aggregated expression's type
    result_type: str  # the declared result type
    name: str  # the aggregate's name in the circuit, for error messages


def gather(F: ModuleType, value: Any, weight: Any) -> Any:
    """Aggregate expression: the group's ``(value, weight)`` pairs, zero weights left out."""
    pair = F.struct(value.alias("v"), weight.cast("bigint").alias("w"))
    return F.collect_list(F.when(weight != 0, pair))


def applier(columns: Sequence[UserAggregateColumn]) -> Callable[[Any], list[Any]]:
    """A function from a collected group row to each column's result: the user's
    function over the gathered (value, multiplicity) pairs, NULL for an empty list."""
    aggregates = [
        (column, user_defined(column.function, column.result_type, column.name))
        for column in columns
    ]

    def apply(record: Any) -> list[Any]:
        results = []
        for column, aggregate in aggregates:
            pairs = record[column.gathered]
            if not pairs:
                results.append(None)
                continue
            group = [(from_column_value(p["v"], column.value_type), p["w"]) for p in pairs]
            results.append(to_column_value(aggregate(group), column.result_type))
        return results

    return apply
