"""The benchmark's views as plain Spark queries over the sources' current tables.

The same views as the circuits of :mod:`benchmarks.circuits`, written as a user without
dbspark writes them (Q3 is the SQL text the circuit compiles): one query over tables
that hold one row per key (the live version of each upserted row, without ``ts`` and
``deleted``). Two baselines run them, so both compute exactly this: the warm batch
(``benchmarks/workloads/warm_batch.py``) over Parquet copies of the current tables, and
the Spark Declarative Pipelines projects (``benchmarks/pipelines``) over their temporary
views of the landed upserts.

A query takes the current tables by source name and returns the view: one row per group,
the circuit's columns in its order (the maintained view has the same rows, each with
``__w`` = 1).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from benchmarks.circuits import LOW_VISIBILITY
from dbspark.examples import tpch as tpch_examples

#: The current tables by source name.
Tables = Mapping[str, DataFrame]
#: A view's query over the current tables.
Query = Callable[[Tables], DataFrame]


def select_of(statement: str) -> str:
    """The query of one ``CREATE [MATERIALIZED] VIEW name AS query;`` statement."""
    found = re.search(
        r"CREATE\s+(?:MATERIALIZED\s+)?VIEW\s+\w+\s+AS\s+(.*?);?\s*$",
        statement,
        re.IGNORECASE | re.DOTALL,
    )
    if found is None:
        raise ValueError(f"not one CREATE VIEW statement: {statement[:80]!r}")
    return found.group(1)


#: TPC-H Q3 as written (``dbspark/examples/tpch/q3.sql``), the text W1's circuit compiles.
Q3_SQL = select_of(tpch_examples.query_text("q3"))


def q3(tables: Tables) -> DataFrame:
    """TPC-H Q3 without ORDER BY/LIMIT, the SQL text ``circuits.tpch_q3()`` compiles, run
    by Spark SQL over the current tables (each a temporary view under its source name)."""
    for name, frame in tables.items():
        frame.createOrReplaceTempView(name)
    return next(iter(tables.values())).sparkSession.sql(Q3_SQL)


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
