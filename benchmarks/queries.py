"""The benchmark's views as plain Spark DataFrame code over the sources' current tables.

The same views as the circuits of :mod:`benchmarks.circuits`, written as a user without
dbspark writes them: one query over tables that hold one row per key (the live version
of each upserted row, without ``ts`` and ``deleted``). Two baselines run them, so both
compute exactly this: the warm batch (``benchmarks/workloads/warm_batch.py``) over
Parquet copies of the current tables, and the Spark Declarative Pipelines projects
(``benchmarks/pipelines``) over their temporary views of the landed upserts.

A query takes the current tables by source name and returns the view: one row per group,
the circuit's columns in its order (the maintained view has the same rows, each with
``__w`` = 1).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from benchmarks.circuits import LOW_VISIBILITY, Q3_DATE, Q3_SEGMENT

#: The current tables by source name.
Tables = Mapping[str, DataFrame]
#: A view's query over the current tables.
Query = Callable[[Tables], DataFrame]


def q3(tables: Tables) -> DataFrame:
    """TPC-H Q3 without ORDER BY/LIMIT, as ``circuits.tpch_q3()``: per unshipped order of a
    BUILDING customer placed before 1995-03-15, the revenue in 1/100 cents."""
    customers = tables["customer"].where(F.col("c_mktsegment") == Q3_SEGMENT).select("c_custkey")
    orders = (
        tables["orders"]
        .where(F.col("o_orderdate") < Q3_DATE)
        .select("o_orderkey", "o_custkey", "o_orderdate", "o_shippriority")
    )
    lines = (
        tables["lineitem"]
        .where(F.col("l_shipdate") > Q3_DATE)
        .select(
            "l_orderkey",
            (F.col("l_extendedprice_cents") * (100 - F.col("l_discount_pct"))).alias("revenue"),
        )
    )
    joined = customers.join(orders, customers.c_custkey == orders.o_custkey).join(
        lines, orders.o_orderkey == lines.l_orderkey
    )
    return joined.groupBy("o_orderkey", "o_orderdate", "o_shippriority").agg(
        F.sum("revenue").alias("revenue")
    )


def per_carrier_month(tables: Tables) -> DataFrame:
    """As ``circuits.flights()``'s view: flights with their plane and departure weather,
    per carrier and month. The joins are inner joins, so flights without a tail number
    (NULL) or without a known plane or weather hour drop out."""
    flights = tables["flights"].select(
        "flight_id", "month", "carrier", "tailnum", "origin", "time_hour", "arr_delay", "distance"
    )
    planes = tables["planes"].select("tailnum", "seats")
    weather = tables["weather"].select("origin", "time_hour", "visib")
    enriched = flights.join(planes, on="tailnum").join(weather, on=["origin", "time_hour"])
    return enriched.groupBy("carrier", "month").agg(
        F.count(F.lit(1)).alias("flights"),
        F.sum("arr_delay").alias("arr_delay_minutes"),
        F.sum("seats").alias("seats"),
        F.max("distance").alias("longest"),
        # NULL visibility is not low: if_else's condition is false, as in dbspark.
        F.sum(F.when(F.col("visib") < LOW_VISIBILITY, 1).otherwise(0)).alias("low_visibility"),
    )


def routes(tables: Tables) -> DataFrame:
    """As ``circuits.flights()``'s view: the distinct routes of every live flight."""
    # Not .distinct(): Spark Connect (the SDP side) plans a Deduplicate by analyzing its
    # input at once, and a pipeline's views do not resolve until the graph runs
    # (TABLE_OR_VIEW_NOT_FOUND). Both plan to the same aggregate.
    return tables["flights"].groupBy("origin", "dest").count().select("origin", "dest")


#: Each circuit's views as queries, by view name.
TPCH_Q3: dict[str, Query] = {"q3": q3}
FLIGHTS: dict[str, Query] = {"per_carrier_month": per_carrier_month, "routes": routes}
