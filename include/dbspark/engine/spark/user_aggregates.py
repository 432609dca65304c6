"""User-defined aggregates on Spark (see ``engine/user_aggregates.py`` for the rule).

The user's functions run on the driver, which holds the circuit's code (executors of a
shared cluster need not). The touched groups' gathered values come to it one partition
at a time (``toLocalIterator``), each group reduced to its result row before the next
partition is fetched: the driver holds one partition of gathered values and one result
row per group, never every group's values at once. The results go back to Spark as a
small frame, or joined on the group keys. Full refresh evaluates every group the same
way; it is the oracle, not the hot path.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from pyspark.sql import Column, DataFrame, Row
from pyspark.sql import functions as F

from dbspark.core.types import Schema
from dbspark.engine import user_aggregates as generic
from dbspark.engine.spark.compile import struct_type
from dbspark.engine.user_aggregates import UserAggregateColumn

__all__ = ["UserAggregateColumn", "attach", "evaluate", "evaluate_collected", "gather"]


def gather(value: Column, weight: Column) -> Column:
    """Aggregate expression: the group's ``(value, weight)`` pairs, zero weights left out."""
    return generic.gather(F, value, weight)


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
    apply = generic.applier(columns)
    rows = [
        (*(record[k] for k in keys), *apply(record))
        for record in _streamed(groups.select(*keys, *(c.gathered for c in columns)))
    ]
    fields = [(f"__k{i}", key_schema.type_of(k)) for i, k in enumerate(keys)]
    fields += [(c.output, c.result_type) for c in columns]
    return spark.createDataFrame(rows, struct_type(Schema(tuple(fields))))


def evaluate_collected(groups: DataFrame, columns: Sequence[UserAggregateColumn]) -> DataFrame:
    """``groups`` with each ``gathered`` column replaced by its ``output``, as a frame of
    the collected rows: the driver reads the groups a partition at a time and applies the
    functions (as ``evaluate`` does), and whatever uses the result needs neither the
    groups' lineage again nor a join back on the keys."""
    from pyspark.sql.types import StructType

    spark = groups.sparkSession
    apply = generic.applier(columns)
    gathered = {c.gathered for c in columns}
    kept = [f for f in groups.schema.fields if f.name not in gathered]
    rows = [(*(record[f.name] for f in kept), *apply(record)) for record in _streamed(groups)]
    outputs = struct_type(Schema(tuple((c.output, c.result_type) for c in columns)))
    return spark.createDataFrame(rows, StructType([*kept, *outputs.fields]))


def _streamed(groups: DataFrame) -> Iterator[Row]:
    """The rows of ``groups``, fetched a partition at a time (no partition fetched ahead)."""
    return groups.toLocalIterator(prefetchPartitions=False)


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
