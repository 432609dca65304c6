"""Upsert semantics for the baselines: the live rows of a folder of upsert batches.

Imported by both SDP projects' transformations (the CLI's Python process has the
repository on its path, set by ``benchmarks/sdp.py``) and by the warm batch
(``benchmarks/workloads/warm_batch.py``), which writes these rows out as a user's
current tables.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F


def current(spark: SparkSession, landing: str, source: str, *key: str) -> DataFrame:
    """The live rows of ``source``, landed as ``<landing>/<source>/epoch=<e>/*.parquet``
    (see :func:`live_rows`)."""
    return live_rows(spark.read.parquet(f"{landing}/{source}"), *key)


def live_rows(landed: DataFrame, *key: str) -> DataFrame:
    """The live rows of upsert batches read with their ``epoch`` (the folder's partition
    column): per key the row with the greatest ``ts`` (NULL smallest; on a tie the later
    epoch's), unless its ``deleted`` is true. The upsert columns and ``epoch`` are
    dropped."""
    latest_first = Window.partitionBy(*key).orderBy(
        F.col("ts").desc_nulls_last(), F.col("epoch").desc()
    )
    ranked = landed.withColumn("__rank", F.row_number().over(latest_first))
    live = (F.col("__rank") == 1) & ~F.coalesce(F.col("deleted"), F.lit(False))
    return ranked.where(live).drop("__rank", "epoch", "ts", "deleted")
