"""TPC-H Q3 (without ORDER BY/LIMIT) over the landed upserts, as SDP views.

The same view as ``benchmarks.circuits.tpch_q3()``: per unshipped order of a BUILDING
customer placed before 1995-03-15, the revenue in 1/100 cents. Each source is a folder
of upsert batches (``<landing>/<source>/epoch=<e>/*.parquet``): per key the row with
the greatest ``ts`` wins, and a winning row with ``deleted`` true removes the key.

The ``spark-pipelines`` CLI imports this file with ``spark`` set to its session; every
run recomputes the materialized view from all landed files.
"""

import os

from pyspark import pipelines as dp
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from benchmarks.pipelines.upserts import current

spark: SparkSession = globals()["spark"]  # injected by the spark-pipelines CLI

#: Where the upserts land (set by benchmarks/sdp.py for the CLI process).
LANDING = os.environ["DBSPARK_BENCH_LANDING"]
#: As in benchmarks/circuits.py: 1995-03-15 in days since 1970-01-01, and the segment.
Q3_DATE = 9204
Q3_SEGMENT = "BUILDING"


@dp.temporary_view
def customer_current() -> DataFrame:
    return current(spark, LANDING, "customer", "c_custkey")


@dp.temporary_view
def orders_current() -> DataFrame:
    return current(spark, LANDING, "orders", "o_orderkey")


@dp.temporary_view
def lineitem_current() -> DataFrame:
    return current(spark, LANDING, "lineitem", "l_orderkey", "l_linenumber")


@dp.materialized_view
def q3() -> DataFrame:
    customers = (
        spark.read.table("customer_current")
        .where(F.col("c_mktsegment") == Q3_SEGMENT)
        .select("c_custkey")
    )
    orders = (
        spark.read.table("orders_current")
        .where(F.col("o_orderdate") < Q3_DATE)
        .select("o_orderkey", "o_custkey", "o_orderdate", "o_shippriority")
    )
    lines = (
        spark.read.table("lineitem_current")
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
