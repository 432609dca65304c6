"""The Spark tier: a unit of work run as Spark plans over the warehouse.

The same interface as the local tier (``engine/local/tier.py``): frames from rows,
key-pruned reads, bucketed writes, gathered keys, the ingest fingerprint. Units whose
input is too large for this process run here; so do full refresh and verification.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from dbspark.core.types import Schema
from dbspark.engine.spark.compile import struct_type
from dbspark.storage.catalog import BatchRecord
from dbspark.storage.warehouse import DEFAULT_BUCKETS, KeySet, Warehouse

Fields = Sequence[tuple[str, str]]


def spark_struct(fields: Fields) -> Any:
    """The Spark schema of a collection: user columns nullable, reserved ones not."""
    user = Schema(tuple((n, t) for n, t in fields if not n.startswith("__")))
    return struct_type(user, extra=[(n, t) for n, t in fields if n.startswith("__")])


class SparkTier:
    name = "spark"

    def __init__(
        self, spark: SparkSession, warehouse: Warehouse, *, buckets: int = DEFAULT_BUCKETS
    ) -> None:
        self.spark = spark
        self.warehouse = warehouse
        self.buckets = buckets

    def frame(self, rows: Sequence[Sequence[Any]], fields: Fields) -> DataFrame:
        """Rows (tuples in ``fields`` order) as a DataFrame, for small constant data."""
        return self.spark.createDataFrame([tuple(row) for row in rows], spark_struct(fields))

    def empty(self, fields: Fields) -> DataFrame:
        return self.frame([], fields)

    def checkpoint(self, frame: DataFrame) -> DataFrame:
        return frame.localCheckpoint()

    def read(
        self,
        records: Sequence[BatchRecord],
        fields: Fields,
        *,
        keys: KeySet | None = None,
        bucket_by: Sequence[str] | None = None,
    ) -> DataFrame:
        return self.warehouse.read(
            self.spark, records, spark_struct(fields), keys=keys, bucket_by=bucket_by
        )

    def gather_keys(
        self, keys: DataFrame, bucket_counts: Sequence[int] = (DEFAULT_BUCKETS,)
    ) -> KeySet:
        return self.warehouse.gather_keys(keys, bucket_counts)

    def write(
        self,
        frame: DataFrame,
        circuit: str,
        collection: str,
        kind: str,
        time: Sequence[int],
        fields: Fields,
        *,
        bucket_by: Sequence[str] | None = None,
        driver_rows: int = 0,
    ) -> BatchRecord | None:
        del fields  # a Spark frame carries its types
        return self.warehouse.write(
            frame,
            circuit,
            collection,
            kind,
            time,
            bucket_by=bucket_by,
            buckets=self.buckets,
            driver_rows=driver_rows,
        )
