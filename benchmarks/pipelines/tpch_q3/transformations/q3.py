"""TPC-H Q3 (without ORDER BY/LIMIT) over the landed upserts, as SDP views.

The same view as ``benchmarks.circuits.tpch_q3()``: per unshipped order of a BUILDING
customer placed before 1995-03-15, the revenue in 1/100 cents. Each source is a folder
of upsert batches (``<landing>/<source>/epoch=<e>/*.parquet``): per key the row with
the greatest ``ts`` wins, and a winning row with ``deleted`` true removes the key. The
query itself is ``benchmarks.queries.q3``, which the warm batch runs too.

The ``spark-pipelines`` CLI imports this file with ``spark`` set to its session; every
run recomputes the materialized view from all landed files.
"""

import os

from pyspark import pipelines as dp
from pyspark.sql import DataFrame, SparkSession

from benchmarks import queries
from benchmarks.pipelines.upserts import current

spark: SparkSession = globals()["spark"]  # injected by the spark-pipelines CLI

#: Where the upserts land (set by benchmarks/sdp.py for the CLI process).
LANDING = os.environ["DBSPARK_BENCH_LANDING"]
SOURCES = ("customer", "orders", "lineitem")


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
    return queries.q3({source: spark.read.table(f"{source}_current") for source in SOURCES})
