"""User-defined aggregates on Spark: pure Python functions of a group's values.

A user-defined aggregate is an arbitrary Python function, so it has no Spark
expression to compile to. Spark gathers each group's ``(value, multiplicity)``
pairs with ``collect_list``; the driver expands the multiplicities, sorts, and
calls the function exactly as the reference engine does
(``dbspark.core.aggregates.user_defined``), so every engine gives the same
answer. The results go back to Spark as a small frame joined on the group keys.

Why the driver and not a Python UDF on the executors: the incremental engine
only ever evaluates the groups a delta touched (that is what makes it
incremental), so the data is small; and a driver-side call needs neither the
user's module on the executors nor a Python worker behind a Spark Connect
server. Full refresh evaluates every group the same way; it is the oracle, not
the hot path.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from dbspark.circuit.types import Schema
from dbspark.core.aggregates import user_defined
from dbspark.engine.spark.compile import struct_type
from dbspark.engine.spark.frames import from_spark_value, to_spark_value


@dataclass(frozen=True)
class UserAggregateColumn:
    """One user-defined aggregate to evaluate from one gathered list column."""

    gathered: str  # an array<struct<v, w>> column made by ``gather``
    output: str  # the result column's name
    function: Callable[[list[Any]], Any]
    value_type: str  # the aggregated expression's type
    result_type: str  # the declared result type
    name: str  # the aggregate's name in the circuit, for error messages


def gather(value: Column, weight: Column) -> Column:
    """Aggregate expression: the group's ``(value, weight)`` pairs, zero weights left out."""
    pair = F.struct(value.alias("v"), weight.cast("bigint").alias("w"))
    return F.collect_list(F.when(weight != 0, pair))


def evaluate(
    groups: DataFrame,
    keys: Sequence[str],
    key_schema: Schema,
    columns: Sequence[UserAggregateColumn],
) -> DataFrame:
    """Apply each function to each group's gathered values, on the driver.

    ``groups`` holds ``keys`` and every ``gathered`` column. The result holds the
    keys renamed ``__k0, __k1, ...`` (to join back without clashes) and one column
    per ``output``; an empty gathered list (the group is absent there) gives NULL
    without calling the function, since a function need not accept no values.
    """
    spark = groups.sparkSession
    apply = _applier(columns)
    rows = [
        (*(record[k] for k in keys), *apply(record))
        for record in groups.select(*keys, *(c.gathered for c in columns)).collect()
    ]
    fields = [(f"__k{i}", key_schema.type_of(k)) for i, k in enumerate(keys)]
    fields += [(c.output, c.result_type) for c in columns]
    return spark.createDataFrame(rows, struct_type(Schema(tuple(fields))))


def evaluate_collected(groups: DataFrame, columns: Sequence[UserAggregateColumn]) -> DataFrame:
    """``groups`` with each ``gathered`` column replaced by its ``output``, as a frame of
    the collected rows: one Spark job reads the groups, the driver applies the functions
    (as ``evaluate`` does), and whatever uses the result needs neither the groups' lineage
    again nor a join back on the keys."""
    from pyspark.sql.types import StructType

    spark = groups.sparkSession
    apply = _applier(columns)
    gathered = {c.gathered for c in columns}
    kept = [f for f in groups.schema.fields if f.name not in gathered]
    rows = [(*(record[f.name] for f in kept), *apply(record)) for record in groups.collect()]
    outputs = struct_type(Schema(tuple((c.output, c.result_type) for c in columns)))
    return spark.createDataFrame(rows, StructType([*kept, *outputs.fields]))


def _applier(columns: Sequence[UserAggregateColumn]) -> Callable[[Any], list[Any]]:
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
            group = [(from_spark_value(p["v"], column.value_type), p["w"]) for p in pairs]
            results.append(to_spark_value(aggregate(group), column.result_type))
        return results

    return apply


def attach(grouped: DataFrame, computed: DataFrame, keys: Sequence[str]) -> DataFrame:
    """Join ``evaluate``'s results back onto ``grouped`` by the group keys (NULL-safe)."""
    if not keys:
        return grouped.crossJoin(computed)
    condition = None
    for index, key in enumerate(keys):
        term = F.col(key).eqNullSafe(F.col(f"__k{index}"))
        condition = term if condition is None else condition & term
    joined = grouped.join(computed, on=condition, how="inner")
    return joined.drop(*(f"__k{i}" for i in range(len(keys))))
