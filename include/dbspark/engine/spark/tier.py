"""The Spark tier: a unit of work run as Spark plans over the warehouse.

The same interface as the local tier (``engine/local/tier.py``): frames from rows,
key-pruned reads, bucketed writes, gathered keys, the ingest fingerprint. Units whose
input is too large for this process run here; so do full refresh and verification.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from dbspark.core.columns import time_columns
from dbspark.core.timestamps import Time
from dbspark.core.types import Schema
from dbspark.engine.spark.compile import struct_type
from dbspark.storage.catalog import BatchRecord
from dbspark.storage.warehouse import DEFAULT_BUCKETS, KeySet, Warehouse, known_keys

Fields = Sequence[tuple[str, str]]


def spark_struct(fields: Fields) -> Any:
    """The Spark schema of a collection: user columns nullable, reserved ones not."""
    user = Schema(tuple((n, t) for n, t in fields if not n.startswith("__")))
    return struct_type(user, extra=[(n, t) for n, t in fields if n.startswith("__")])


#: Frames whose rows the driver holds or can read itself (a whole read of small
#: batches, ``SparkTier.read``): how to get those rows, given the most rows worth getting.
#: Writing such a frame again (``SparkTier.write``) then needs no job.
_KNOWN_ROWS: weakref.WeakKeyDictionary[Any, Callable[[int], pa.Table | None]] = (
    weakref.WeakKeyDictionary()
)


def known_rows(frame: Any, limit: int) -> pa.Table | None:
    """The rows of ``frame`` if the driver holds them or can read them itself, at most
    ``limit`` rows of them (see ``_KNOWN_ROWS``); else None."""
    try:
        load = _KNOWN_ROWS.get(frame)
    except TypeError:  # not weakly referenceable: no Spark frame
        return None
    return None if load is None else load(limit)


def with_known_time(frame: Any, result: Any, t: Time) -> None:
    """``result`` is ``frame`` with the time columns of ``t`` set (``unit.with_time``:
    existing ones replaced in place, others appended): if the driver can get ``frame``'s
    rows, it can get ``result``'s too."""
    try:
        load = _KNOWN_ROWS.get(frame)
    except TypeError:
        return
    if load is None:
        return

    def timed(limit: int) -> pa.Table | None:
        table = load(limit)
        if table is None:
            return None
        for i, (name, value) in enumerate(zip(time_columns(len(t)), t, strict=True)):
            column = pa.array([value] * table.num_rows, pa.int64() if i == 0 else pa.int32())
            if name in table.column_names:
                table = table.set_column(table.column_names.index(name), name, column)
            else:
                table = table.append_column(name, column)
        return table

    _KNOWN_ROWS[result] = timed


def _arrow_type(data_type: Any) -> pa.DataType | None:
    """The Arrow type Spark collects ``data_type`` as, for the types whose rows are
    compared exactly here; None for the others (their frames stay unknown)."""
    from pyspark.sql import types as T

    exact = {
        T.LongType: pa.int64(),
        T.IntegerType: pa.int32(),
        T.StringType: pa.string(),
        T.BooleanType: pa.bool_(),
        T.DoubleType: pa.float64(),
        T.DateType: pa.date32(),
    }
    for kind, arrow in exact.items():
        if isinstance(data_type, kind):
            return arrow
    return None


def _as_fields(table: pa.Table, struct: Any) -> pa.Table | None:
    """``table``'s columns in the order of the Spark schema ``struct``, if each has the
    Arrow type Spark would give it; else None."""
    names = struct.fieldNames()
    if not set(names) <= set(table.column_names):
        return None
    table = table.select(names)
    for field, column in zip(struct.fields, table.columns, strict=True):
        expected = _arrow_type(field.dataType)
        if expected is None or not (
            column.type == expected
            or (expected == pa.string() and column.type == pa.large_string())
        ):
            return None
    return table


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
        """The union of ``records`` (deferred ones read as their frames). A whole read of
        batches the driver wrote is known by its rows (``known_rows``)."""
        struct = spark_struct(fields)
        frame = self.warehouse.read(self.spark, records, struct, keys=keys, bucket_by=bucket_by)
        if keys is None and records and not any(self.warehouse.pending(r) for r in records):
            _KNOWN_ROWS[frame] = functools.partial(self._rows_of, tuple(records), struct)
        return frame

    def _rows_of(self, records: Sequence[BatchRecord], struct: Any, limit: int) -> pa.Table | None:
        """The rows of ``records`` as ``struct``, from the driver's memory (batches it
        wrote) or read here with pyarrow when they are at most ``limit`` rows; None when
        there are more, or a column's type is not one compared exactly (``_as_fields``)."""
        known = [self.warehouse.driver_written(r) for r in records]
        if sum(r.rows for r, t in zip(records, known, strict=True) if t is None) > limit:
            return None
        tables = []
        for record, table in zip(records, known, strict=True):
            if table is None:
                table = self.warehouse.read_on_driver(record)
            shaped = None if table is None else _as_fields(table, struct)
            if shaped is None:
                return None
            tables.append(shaped)
        try:
            return pa.concat_tables(tables)
        except pa.ArrowInvalid:
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
        deferred = []
        for records, key_columns in parts:
            for record in records:
                table = self.warehouse.driver_written(record)
                if table is not None:
                    tables.append(table.select(list(key_columns)).rename_columns(names))
                    continue
                frame = self.warehouse.pending_frame(record)
                if frame is None:
                    return None
                deferred.append(frame.select(*key_columns).toDF(*names))
        if deferred:
            return self._deferred_keys(tables, deferred, fields)
        if not tables:
            return None
        try:
            keys = pa.concat_tables(tables).group_by(names).aggregate([]).select(names)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            return None
        rows = list(zip(*keys.to_pydict().values(), strict=True))
        frame = self.spark.createDataFrame(rows, spark_struct(fields))
        return known_keys(frame, keys, bucket_counts)

    def _deferred_keys(
        self, tables: Sequence[pa.Table], deferred: Sequence[DataFrame], fields: Fields
    ) -> KeySet:
        """Keys some of which are in deferred batches, not computed yet: no job may run
        before the unit's one collect (``flush``), so a read for them reads every row
        (``KeySet.everything``)."""
        struct = spark_struct(fields)
        frames = [
            frame.select(*[frame[f.name].cast(f.dataType) for f in struct]) for frame in deferred
        ]
        if tables:
            known = pa.concat_tables(tables)
            rows = list(zip(*known.to_pydict().values(), strict=True))
            frames.insert(0, self.spark.createDataFrame(rows, struct))
        union = frames[0]
        for frame in frames[1:]:
            union = union.unionByName(frame)
        return KeySet(union.distinct(), None, None, everything=True)

    def flush(
        self, records: Sequence[BatchRecord], extras: Mapping[str, DataFrame] | None = None
    ) -> tuple[dict[str, BatchRecord | None], dict[str, pa.Table]]:
        """Write the deferred ``records`` after one job that also collects ``extras``."""
        return self.warehouse.flush(self.spark, records, extras)

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
        defer: bool = False,
    ) -> BatchRecord | None:
        """Write ``frame``. With ``driver_rows``, a frame whose rows the driver holds
        (``known_rows``) is written by pyarrow with no job, and ``defer`` leaves any
        other for ``flush``."""
        del fields  # a Spark frame carries its types
        if driver_rows > 0:
            table = known_rows(frame, driver_rows)
            if table is not None:
                return self.write_table(table, circuit, collection, kind, time, bucket_by=bucket_by)
        return self.warehouse.write(
            frame,
            circuit,
            collection,
            kind,
            time,
            bucket_by=bucket_by,
            buckets=self.buckets,
            driver_rows=driver_rows,
            defer=defer,
        )
