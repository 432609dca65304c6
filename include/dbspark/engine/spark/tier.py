"""The Spark tier: a unit of work run as Spark plans over the warehouse.

The same interface as the local tier (``engine/local/tier.py``): frames from rows,
key-pruned reads, bucketed writes, gathered keys, the ingest fingerprint. Units whose
input is too large for this process run here; so do full refresh and verification.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from dbspark.core.types import Schema
from dbspark.engine.local.tier import arrow_table
from dbspark.engine.spark.compile import struct_type
from dbspark.storage.catalog import BatchRecord
from dbspark.storage.warehouse import DEFAULT_BUCKETS, KeySet, Warehouse, known_keys

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
        # Frames read whole from driver-written batches, and those rows (``known_rows``).
        self._known_rows: weakref.WeakKeyDictionary[DataFrame, pa.Table] = (
            weakref.WeakKeyDictionary()
        )

    def frame(self, rows: Sequence[Sequence[Any]], fields: Fields) -> DataFrame:
        """Rows (tuples in ``fields`` order) as a DataFrame, for small constant data."""
        return self.spark.createDataFrame([tuple(row) for row in rows], spark_struct(fields))

    def empty(self, fields: Fields) -> DataFrame:
        return self.known_frame(arrow_table([], fields), fields)

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
        frame = self.warehouse.read(
            self.spark, records, spark_struct(fields), keys=keys, bucket_by=bucket_by
        )
        if keys is None:
            rows = self._driver_rows_of(records, [name for name, _ in fields])
            if rows is not None:
                self._known_rows[frame] = rows
        return frame

    def known_frame(self, table: pa.Table, fields: Fields) -> DataFrame:
        """Rows the driver computed (``table``, with ``fields``' columns) as a frame whose
        rows stay known (``known_rows``): a local relation, read by no job."""
        table = table.select([name for name, _ in fields])
        frame = self.spark.createDataFrame(table, spark_struct(fields))
        self._known_rows[frame] = table
        return frame

    def known_rows(self, frame: Any) -> pa.Table | None:
        """The rows ``frame`` holds when the driver has them: ``frame`` is a whole read of
        batches written from the driver (``read``). Writing such a frame again, with
        other time columns (a loop variable's fed-back delta arranged for the next
        iteration), needs no Spark job to bring its rows back."""
        return self._known_rows.get(frame)

    def _driver_rows_of(
        self, records: Sequence[BatchRecord], names: Sequence[str]
    ) -> pa.Table | None:
        tables = []
        for record in records:
            table = self.warehouse.driver_written(record)
            if table is None or not set(names) <= set(table.column_names):
                return None
            tables.append(table.select(list(names)))
        if not tables:
            return None
        try:
            return pa.concat_tables(tables)
        except pa.ArrowInvalid:  # types differ between batches: let Spark reconcile them
            return None

    def gather_keys(
        self, keys: DataFrame, bucket_counts: Sequence[int] = (DEFAULT_BUCKETS,)
    ) -> KeySet:
        return self.warehouse.gather_keys(keys, bucket_counts)

    def written_keys(
        self,
        parts: Sequence[tuple[Sequence[BatchRecord], Sequence[str]]],
        fields: Fields,
        bucket_counts: Sequence[int] = (DEFAULT_BUCKETS,),
    ) -> KeySet | None:
        """The distinct keys of batches written from the driver, with no Spark job: each
        part is some batches and their key columns, taken as ``fields`` (the key set's
        names and types). None when a batch's rows are not known here (Spark wrote it,
        or it is no longer kept) or Arrow cannot group the keys: gather them then."""
        names = [name for name, _ in fields]
        tables = []
        for records, key_columns in parts:
            for record in records:
                table = self.warehouse.driver_written(record)
                if table is None:
                    return None
                tables.append(table.select(list(key_columns)).rename_columns(names))
        if not tables:
            return None
        try:
            keys = pa.concat_tables(tables).group_by(names).aggregate([]).select(names)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            return None
        rows = list(zip(*keys.to_pydict().values(), strict=True))
        frame = self.spark.createDataFrame(rows, spark_struct(fields))
        return known_keys(frame, keys, bucket_counts)

    def write_table(
        self,
        table: pa.Table,
        circuit: str,
        collection: str,
        kind: str,
        time: Sequence[int],
        *,
        bucket_by: Sequence[str] | None = None,
    ) -> BatchRecord | None:
        return self.warehouse.write_arrow(
            table, circuit, collection, kind, time, bucket_by=bucket_by, buckets=self.buckets
        )

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
