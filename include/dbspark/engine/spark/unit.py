"""A unit of work and what it writes.

A unit is one stage at one root time, or one loop iteration. It runs on one tier (the
local one in this process, or Spark), writes each output as fresh Parquet files, reads
its own uncommitted outputs where later work in the unit needs them, and registers all
of them in ONE catalog transaction with its run record. A unit killed at any point so
leaves only unregistered files, and a retried one recomputes the same result.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame

from dbspark.core.columns import time_columns
from dbspark.core.timestamps import Time
from dbspark.engine.dialect import dialect_of
from dbspark.engine.local.tier import LocalTier
from dbspark.engine.spark.tier import SparkTier
from dbspark.storage.catalog import BatchRecord, Catalog

#: A delta as a frame of either tier, or None when it is known to be empty.
Frame = DataFrame | Any | None

Tier = LocalTier | SparkTier


class Unit:
    """One unit of work: the tier it runs on and the files it wrote, not yet registered
    in the catalog. It writes every output, reads what it wrote before committing, and
    commits all of it at once.

    ``driver_rows`` > 0 says a Spark unit's batches are probably small, so the warehouse
    writes them from the driver (``Warehouse.write``)."""

    def __init__(self, tier: Tier, catalog: Catalog, circuit: str, driver_rows: int = 0) -> None:
        self.tier = tier
        self.catalog = catalog
        self.circuit = circuit
        self.records: list[BatchRecord] = []
        self.driver_rows = driver_rows
        # The committed batches this unit may read, by (collection, kind): what units
        # before it committed, which nothing changes while it runs. One catalog query
        # on first use instead of one per read (a loop iteration reads dozens).
        self._committed: dict[tuple[str, str], list[BatchRecord]] | None = None

    def write(
        self,
        frame: Any,
        collection: str,
        kind: str,
        t: Time,
        fields: Sequence[tuple[str, str]],
        *,
        bucket_by: Sequence[str] | None = None,
    ) -> BatchRecord | None:
        """Write one output with the unit's tier and keep its record for the commit (None:
        the frame was empty). A Spark unit may write from the driver (``driver_rows``)."""
        names = [name for name, _ in fields]
        known = self.known_rows(frame)
        if known is not None and known.column_names == names:
            # Rows the driver holds as they are to be stored: written with no job.
            record = self.tier.write_table(
                known, self.circuit, collection, kind, t, bucket_by=bucket_by
            )
        else:
            options = {} if isinstance(self.tier, LocalTier) else {"driver_rows": self.driver_rows}
            record = self.tier.write(
                frame, self.circuit, collection, kind, t, fields, bucket_by=bucket_by, **options
            )
        if record is not None:
            self.records.append(record)
        return record

    def write_at(
        self,
        delta: Any,
        collection: str,
        kind: str,
        t: Time,
        fields: Sequence[tuple[str, str]],
        *,
        bucket_by: Sequence[str] | None = None,
    ) -> BatchRecord | None:
        """Write ``delta`` (no time columns) stored with the time columns of ``t``
        (``fields`` includes them), as ``write`` does; rows the driver holds already
        (``known_rows``) are written from there, with no Spark job."""
        known = self.known_rows(delta)
        times = set(time_columns(len(t)))
        if known is not None and known.column_names == [n for n, _ in fields if n not in times]:
            return self.write_table(known, collection, kind, t, bucket_by=bucket_by)
        return self.write(with_time(delta, t), collection, kind, t, fields, bucket_by=bucket_by)

    def write_table(
        self,
        table: pa.Table,
        collection: str,
        kind: str,
        t: Time,
        *,
        bucket_by: Sequence[str] | None = None,
    ) -> BatchRecord | None:
        """Write rows the driver holds (with the time columns of ``t`` added) as they are,
        in the warehouse's layout, with no Spark job; keep the record for the commit."""
        for i, (name, value) in enumerate(zip(time_columns(len(t)), t, strict=True)):
            kind_of = pa.int64() if i == 0 else pa.int32()
            table = table.append_column(name, pa.array([value] * table.num_rows, kind_of))
        record = self.tier.write_table(
            table, self.circuit, collection, kind, t, bucket_by=bucket_by
        )
        if record is not None:
            self.records.append(record)
        return record

    def known_rows(self, frame: Any) -> pa.Table | None:
        """The rows of ``frame`` when a Spark unit's driver holds them already (a whole
        read of batches it wrote from the driver; ``SparkTier.known_rows``), so writing
        them again costs no Spark job. None on the local tier, whose frames are rows."""
        return self.tier.known_rows(frame) if isinstance(self.tier, SparkTier) else None

    def discard(self) -> None:
        """Remove every file the unit wrote (it will not commit: bad input, say)."""
        for record in self.records:
            self.tier.warehouse.delete(record)
        self.records.clear()

    def batches(
        self, collection: str, kind: str, predicate: Callable[[Time], bool]
    ) -> list[BatchRecord]:
        """The batches of ``collection`` this unit may read at the times ``predicate``
        accepts: committed ones and its own, not yet committed."""
        pending = [r for r in self.records if r.collection == collection and r.kind == kind]
        return [
            r for r in [*self._committed_of(collection, kind), *pending] if predicate(tuple(r.time))
        ]

    def commit(self, name: str, t: Time, **options: Any) -> None:
        """Register every batch written, with the unit's run record, in one transaction."""
        self.catalog.commit(self.circuit, name, t, self.records, **options)

    def _committed_of(self, collection: str, kind: str) -> list[BatchRecord]:
        if self._committed is None:
            self._committed = {}
            for record in self.catalog.operator_batches(self.circuit):
                self._committed.setdefault((record.collection, record.kind), []).append(record)
        return self._committed.get((collection, kind), [])


def with_time(df: Any, t: Time) -> Any:
    """``df`` with the time columns of ``t`` (missing ones added, existing ones set)."""
    F = dialect_of(df).F
    for i, (name, value) in enumerate(zip(time_columns(len(t)), t, strict=True)):
        df = df.withColumn(name, F.lit(value).cast("bigint" if i == 0 else "int"))
    return df


def records_rows(records: Iterable[BatchRecord]) -> int:
    return sum(r.rows for r in records)
