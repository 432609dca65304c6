"""The sources of TPC-H Q3 as SDP temporary views of the landed upserts.

Each source is a folder of upsert batches (``<landing>/<source>/epoch=<e>/*.parquet``):
per key the row with the greatest ``ts`` wins, and a winning row with ``deleted`` true
removes the key. The views take the sources' names, so the materialized view ``q3`` is
Q3's SQL text as written (``dbspark/examples/tpch/q3.sql``, the text W1's circuit
compiles and the warm batch runs): ``benchmarks/sdp.py`` writes it into the project's
copy as ``q3.sql``.

The ``spark-pipelines`` CLI imports this file with ``spark`` set to its session; every
run recomputes the materialized view from all landed files.
"""

import os

from pyspark import pipelines as dp
from pyspark.sql import DataFrame, SparkSession

from benchmarks.pipelines.upserts import current

spark: SparkSession = globals()["spark"]  # injected by the spark-pipelines CLI

#: Where the upserts land (set by benchmarks/sdp.py for the CLI process).
LANDING = os.environ["DBSPARK_BENCH_LANDING"]


@dp.temporary_view(name="customer")
def customer() -> DataFrame:
    return current(spark, LANDING, "customer", "c_custkey")


@dp.temporary_view(name="orders")
def orders() -> DataFrame:
    return current(spark, LANDING, "orders", "o_orderkey")


@dp.temporary_view(name="lineitem")
def lineitem() -> DataFrame:
    return current(spark, LANDING, "lineitem", "l_orderkey", "l_linenumber")
