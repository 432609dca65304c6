"""Custom circuits shared by the engine property tests (reference and Spark).

The Spark suite runs the reference suite's circuits against the reference engine; a
circuit that one suite needs in a variant is defined here, once.
"""

from __future__ import annotations

from dbspark.circuit.aggregations import avg, count, max_, min_, sum_, udf
from dbspark.circuit.builder import Circuit
from dbspark.circuit.expressions import col


def aggregates_circuit(*, with_udf: bool = True) -> Circuit:
    """Every built-in aggregate per group and globally (no group keys); with ``with_udf``
    also a user-defined aggregate over a second source, ``bag``."""
    c = Circuit("aggregates")
    items = c.zset_source("items", {"g": "string", "v": "bigint"})
    c.view(
        "per_group",
        items.aggregate(
            by="g",
            n=count(),
            n_v=count(col("v")),
            total=sum_(col("v")),
            low=min_(col("v")),
            high=max_(col("v")),
            mean=avg(col("v")),
        ),
    )
    c.view("overall", items.aggregate(n=count(), total=sum_(col("v")), high=max_(col("v"))))
    if with_udf:
        bag = c.zset_source("bag", {"g": "string", "v": "bigint"})
        listing = udf(lambda vs: ",".join(map(str, vs)), col("v"), "string")
        c.view("listed", bag.aggregate(by="g", values=listing, n=count()))
    return c


def builtin_aggregates_circuit() -> Circuit:
    """``aggregates_circuit`` without the user-defined aggregate (and its source ``bag``)."""
    return aggregates_circuit(with_udf=False)
