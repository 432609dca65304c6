"""The local tier: a unit of work run in this process with DuckDB, on the warehouse's files.

An epoch whose input is small runs every unit here: no Spark session, no JVM, no job.
The storage is the Spark tier's, byte for byte in layout: a read opens the same
Parquet batches (only the buckets of the keys it wants, with Spark's own bucket hash
from ``storage/buckets.py``), and a write produces the same bucketed, key-sorted
folders, so either tier continues where the other stopped. Frames are
``LocalFrame``s; the kernels run on them through the local dialect.

Every column written is cast to the type the circuit declares, whatever DuckDB
computed it as (a sum of BIGINT is a HUGEINT there), so a batch reads back the same
on both tiers.
"""

from __future__ import annotations

import functools
import os
import shutil
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from dbspark.core.columns import WEIGHT
from dbspark.core.types import Schema
from dbspark.core.zset import ZSet
from dbspark.engine.batches import fingerprint_text
from dbspark.engine.local import in_arrow
from dbspark.engine.local.dialect import arrow_type, semi_join
from dbspark.engine.local.frame import LocalFrame, LocalSession, duck_type, quote
from dbspark.engine.local.resident import KeyProbe, ResidentFile, ResidentFiles
from dbspark.engine.local.row_groups import GroupedFile, wanted_values
from dbspark.engine.values import from_column_value, to_column_value
from dbspark.storage.buckets import bucket_ids, xxhash64
from dbspark.storage.catalog import BatchRecord
from dbspark.storage.warehouse import (
    BUCKET_COLUMN,
    DEFAULT_BUCKETS,
    KeySet,
    Warehouse,
    _bucket_dirs,
    group_rows_for,
    known_keys,
    parquet_files,
    write_files,
)

#: ``(name, type)`` of every column of a collection, reserved ones included.
Fields = Sequence[tuple[str, str]]

#: A keyed batch of at most this many rows is one key-sorted file, not a folder per
#: bucket: sixteen small files cost more to write and to open than one read in full,
#: and the resident index holds a batch as one entry either way. Measured at W1
#: SF 1 (session 20): 4,096 rows wrote 48 files a 0.1% epoch and 93 at 1%, 65,536 rows
#: 18 and 33, and the epochs took 0.35-0.42 s against 0.46-0.56 s and 0.70 s against
#: 1.05 s; at 262,144 the 1% epoch was slower again (0.81 s), sorting and probing one
#: large file. Compaction buckets a merge larger than this.
SMALL_BATCH_ROWS = 65_536
#: Batches this tier wrote, kept in memory by path for reading back (the newest few).
_WRITTEN_KEPT = 64
#: A second read of batches holding at most this many rows decodes their files into
#: memory and keeps them for the rest of the epoch; a first or a larger one is scanned
#: by DuckDB, streaming.
CACHED_READ_ROWS = 2_000_000
#: At most this much decoded data is kept per epoch.
CACHED_BYTES = 1 << 30
#: Batch listings kept (a registered batch's files never change).
_LISTINGS_KEPT = 10_000


class ReadMeter:
    """The bytes this process's local reads decoded from Parquet: the compressed column
    chunks of the columns read, in the row groups read. A read that decodes row groups
    itself (a whole file, or the groups a keyed read needs: ``row_groups.py``) notes
    exactly those; a DuckDB scan notes every group of its files, since its semi-join
    pushes no filter that could skip one. Footers are not counted. The local tier's
    counterpart of Spark's executor input bytes, for the benchmarks.

    Off unless ``enabled``: a read then only notes its files, columns and groups, and the
    sizes come from the files' footers when ``take`` is called, outside the timed work.
    """

    def __init__(self) -> None:
        self.enabled = False
        self._pending: list[tuple[list[str], frozenset[str], tuple[int, ...] | None]] = []
        self._chunk_bytes: dict[str, list[dict[str, int]]] = {}

    def note(
        self, files: list[str], columns: Iterable[str], groups: Sequence[int] | None = None
    ) -> None:
        """``columns`` of ``files`` were read: of the row groups ``groups`` (None: all)."""
        if self.enabled:
            chosen = None if groups is None else tuple(groups)
            self._pending.append((files, frozenset(columns), chosen))

    def take(self) -> int:
        """The bytes read since the last call."""
        total = 0
        for files, columns, groups in self._pending:
            for file in files:
                sizes = self._chunk_bytes.get(file)
                if sizes is None:
                    sizes = self._chunk_bytes[file] = _column_chunk_bytes(file)
                for group in range(len(sizes)) if groups is None else groups:
                    total += sum(n for column, n in sizes[group].items() if column in columns)
        self._pending.clear()
        return total


def _column_chunk_bytes(file: str) -> list[dict[str, int]]:
    """Each row group's compressed bytes by top-level column."""
    metadata = pq.read_metadata(file)
    groups = []
    for group in range(metadata.num_row_groups):
        row_group = metadata.row_group(group)
        sizes: dict[str, int] = {}
        for index in range(row_group.num_columns):
            chunk = row_group.column(index)
            name = chunk.path_in_schema.split(".", 1)[0]
            sizes[name] = sizes.get(name, 0) + chunk.total_compressed_size
        groups.append(sizes)
    return groups


#: Every local read of this process reports to this meter.
READS = ReadMeter()


def arrow_schema(fields: Fields) -> pa.Schema:
    return _arrow_schema(tuple((name, kind) for name, kind in fields))


@functools.lru_cache(maxsize=1024)
def _arrow_schema(fields: tuple[tuple[str, str], ...]) -> pa.Schema:
    return pa.schema([(name, arrow_type(kind)) for name, kind in fields])


def arrow_table(rows: Iterable[Sequence[Any]], fields: Fields) -> pa.Table:
    """Rows (tuples in ``fields`` order, values of the columns' types: checked input or
    an engine's own results) as an Arrow table."""
    rows = list(rows)
    columns = list(zip(*rows, strict=True)) if rows else [() for _ in fields]
    return pa.table(
        {
            name: _arrow_array(values, kind)
            for (name, kind), values in zip(fields, columns, strict=True)
        },
        schema=arrow_schema(fields),
    )


def _arrow_array(values: Sequence[Any], kind: str) -> pa.Array:
    # Arrow converts ints in DOUBLE columns and tuples in arrays itself; values it takes
    # another way go through the per-value conversion.
    try:
        return pa.array(values, arrow_type(kind))
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError):
        return pa.array([to_column_value(v, kind) for v in values], arrow_type(kind))


class LocalTier:
    """Frames, reads and writes of the local tier over one warehouse."""

    name = "local"

    def __init__(
        self,
        warehouse: Warehouse,
        session: LocalSession | None = None,
        *,
        buckets: int = DEFAULT_BUCKETS,
        resident_bytes: int = 0,
    ) -> None:
        self.warehouse = warehouse
        self.session = session or LocalSession()
        self.buckets = buckets
        # With a budget, every file read or written stays decoded across epochs (see
        # resident.py); without one, a process keeps only what one epoch reads twice.
        self.resident = ResidentFiles(resident_bytes)
        # A registered batch's files, by batch path: a batch never changes once written.
        self._listings: OrderedDict[str, list[str]] = OrderedDict()
        # A unit reads back what it has just written (the delta it stored, the input it
        # arranged): those batches are served from memory instead of their files.
        self._written: dict[str, pa.Table] = {}
        # Files read in this epoch, decoded: a loop's iterations read the same trace
        # slices again and again (files never change once written).
        self._files: dict[str, pa.Table] = {}
        self._files_bytes = 0
        self._seen: set[str] = set()
        # Files a keyed read took row groups from, in this epoch (their decoded groups
        # count in ``_files_bytes``).
        self._grouped: dict[str, GroupedFile] = {}

    def forget_files(self) -> None:
        """At an epoch's start and end: drop what one epoch kept (resident files stay,
        their indexes now counted against the budget)."""
        self._files.clear()
        self._grouped.clear()
        self._files_bytes = 0
        self._seen.clear()
        self.resident.settle()

    # frames --------------------------------------------------------------------------
    def frame(self, rows: Iterable[Sequence[Any]], fields: Fields) -> LocalFrame:
        return self.session.frame(arrow_table(rows, fields))

    def from_arrow(self, table: pa.Table) -> LocalFrame:
        return self.session.frame(table)

    def empty(self, fields: Fields) -> LocalFrame:
        return self.frame([], fields)

    def checkpoint(self, frame: LocalFrame) -> LocalFrame:
        return frame.localCheckpoint()

    def zset(self, frame: LocalFrame, schema: Schema) -> ZSet:
        """Collect a frame of ``schema``'s columns (and ``__w``) as a Z-set."""
        return table_zset(frame.toArrow(), schema)

    # reading -------------------------------------------------------------------------
    def read(
        self,
        records: Sequence[BatchRecord],
        fields: Fields,
        *,
        keys: KeySet | None = None,
        bucket_by: Sequence[str] | None = None,
    ) -> LocalFrame:
        """The union of ``records`` with ``fields``; with ``keys``, only rows whose key
        (NULL-safe) is among them, opening only those keys' bucket files."""
        fields = [(n, t) for n, t in fields if n != BUCKET_COLUMN]
        key_cols = list(bucket_by or (keys.frame.columns if keys else []))
        if keys is None and len(records) == 1 and records[0].path in self._written:
            table = self._written[records[0].path]
            if table.schema.names == [n for n, _ in fields]:
                return self.session.frame(_conform(table, fields))
        files: list[str] = []
        file_buckets: list[int] = []  # each file's batch's bucket count (0: unbucketed)
        touched: list[BatchRecord] = []  # the batches holding some wanted bucket
        for record in records:
            wanted = None
            if keys is not None and record.buckets and keys.buckets is not None:
                wanted = keys.buckets.get(record.buckets)
                if wanted is None:  # keys gathered for another bucket count
                    wanted = set(_buckets_of(keys, record.buckets))
            listed = self._files_of(record, wanted)
            files.extend(listed)
            file_buckets.extend([record.buckets] * len(listed))
            if listed:
                touched.append(record)
        if not files:
            return self.empty(fields)
        if self.resident.enabled:
            resident = self._resident_read(touched, fields, keys, key_cols)
            if resident is not None:
                return resident
        kept = None
        loop = any(len(r.time) > 1 for r in records)
        if sum(r.rows for r in records) <= CACHED_READ_ROWS and (self._read_before(files) or loop):
            if keys is not None and loop:
                # A loop's traces are written in small row groups (``group_rows_for``):
                # an iteration's few keys need a few of them. Other batches are one
                # group a file, decoded whole.
                kept = self._kept_groups(files, file_buckets, fields, keys, key_cols[0])
            if kept is None:
                kept = self._kept_files(files, fields)
        if kept is not None and keys is not None and len(key_cols) == 1:
            # One key column, rows in memory: pick the keys' rows with a hash lookup here
            # instead of handing every row of the buckets to DuckDB's semi-join.
            wanted = keys.frame.toArrow().column(0).cast(kept.schema.field(key_cols[0]).type)
            return self.session.frame(kept.filter(pc.is_in(kept.column(key_cols[0]), wanted)))
        frame = self.session.frame(kept) if kept is not None else self._scan(files, fields)
        if keys is None:
            return frame
        return semi_join(frame, self._typed_keys(keys, fields, key_cols).distinct(), key_cols)

    def _files_of(
        self, record: BatchRecord, buckets: set[int] | frozenset[int] | None
    ) -> list[str]:
        """The files of ``record`` (of the given buckets only, when it is bucketed)."""
        listing = self._listings.get(record.path)
        if listing is None:
            folder = self.warehouse.abspath(record.path)
            if not folder.is_dir():
                raise FileNotFoundError(
                    f"batch {record.id} of {record.circuit}/{record.collection} at "
                    f"{list(record.time)} is registered but its directory {folder} is missing"
                )
            if record.buckets:
                listing = [f for bucket in _bucket_dirs(folder) for f in parquet_files(bucket)]
            else:
                listing = parquet_files(folder)
            self._listings[record.path] = listing
            if len(self._listings) > _LISTINGS_KEPT:
                self._listings.popitem(last=False)
        if not record.buckets or buckets is None:
            return listing
        return [f for f in listing if _bucket_of(f) in buckets]

    def _resident_read(
        self,
        records: Sequence[BatchRecord],
        fields: Fields,
        keys: KeySet | None,
        key_cols: list[str],
    ) -> LocalFrame | None:
        """The read answered from resident batches (decoding those not yet kept), keys
        found by each batch's index; None when a batch does not fit or lacks a column.
        A batch is one entry whatever its files: a bucketed batch searched file by file
        cost a probe per bucket, sixteen where one does."""
        names = [n for n, _ in fields]
        loaded: list[ResidentFile] = []
        for record in records:
            resident = self._resident_batch(record)
            if resident is None or not set(names) <= set(resident.table.column_names):
                return None
            loaded.append(resident)
        if keys is None:
            parts = [f.table for f in loaded]
        else:
            types = [arrow_type(dict(fields)[k]) for k in key_cols]
            # A key set's table holds its keys once each (``KeySet``).
            wanted_keys = keys.table if keys.table is not None else keys.frame.toArrow()
            probe = KeyProbe(
                *[wanted_keys.column(i).cast(t) for i, t in enumerate(types)],
                distinct=keys.table is not None,
            )
            # The key columns too: a partial index leaves some for the semi-join below.
            wanted = list(dict.fromkeys([*names, *key_cols]))
            parts = [f.rows_with(key_cols, probe, wanted) for f in loaded]
        frame = self.session.frame(
            pa.concat_tables([_conform(part.select(names), fields) for part in parts])
        )
        if keys is None or all(f.covers(key_cols) for f in loaded):
            return frame
        # An index matched only the leading key columns; the rest are checked here.
        return semi_join(frame, self._typed_keys(keys, fields, key_cols).distinct(), key_cols)

    def _resident_batch(self, record: BatchRecord) -> ResidentFile | None:
        """The resident entry of ``record``: all its files' rows together (decoded now if
        not yet kept); None when it is larger than the whole budget, or its files'
        schemas differ."""

        def read() -> pa.Table | None:
            files = self._files_of(record, None)
            tables = [pq.read_table(f) for f in files]
            for file, table in zip(files, tables, strict=True):
                READS.note([file], table.column_names)
            try:
                return pa.concat_tables(tables)
            except pa.ArrowInvalid:
                return None

        return self.resident.load(str(self.warehouse.abspath(record.path)), read)

    def _typed_keys(self, keys: KeySet, fields: Fields, key_cols: list[str]) -> LocalFrame:
        types = dict(fields)
        return keys.frame.select(
            *[
                keys.frame[c].cast(types[k]).alias(k)
                for c, k in zip(keys.frame.columns, key_cols, strict=True)
            ]
        )

    def warm(self, traces: Iterable[tuple[BatchRecord, Sequence[str]]]) -> int:
        """Decode the files of each batch into the resident store now, indexed by its key
        columns, and run the connection's costly first query; returns the bytes
        resident after."""
        self.session.prepare()
        for record, key_columns in traces:
            resident = self._resident_batch(record)  # None: larger than the whole budget
            if resident is not None and key_columns:
                resident.index(key_columns)
        self.resident.settle()
        return self.resident.nbytes

    def _read_before(self, files: list[str]) -> bool:
        """Whether this epoch read any of ``files`` before (noting them as read now). A
        first read is a DuckDB scan that keeps nothing (for a few keys it costs half of
        decoding the files); a file read again is decoded once and kept for the rest of
        the epoch. (A loop's traces, whose times carry an iteration, are kept from their
        first read: the next iteration reads them again.)"""
        again = any(f in self._seen for f in files)
        self._seen.update(files)
        return again

    def _kept_files(self, files: list[str], fields: Fields) -> pa.Table | None:
        """``files`` decoded (from memory when this epoch read them before), with
        ``fields``; None when they do not fit in memory or lack a column."""
        names = [n for n, _ in fields]
        tables = []
        for file in files:
            table = self._files.get(file)
            if table is None:
                table = pq.read_table(file)
                if self._files_bytes + table.nbytes > CACHED_BYTES:
                    return None
                self._files[file] = table
                self._files_bytes += table.nbytes
                READS.note([file], table.column_names)  # decoded whole, kept for the epoch
            if not set(names) <= set(table.column_names):
                return None
            tables.append(_conform(table.select(names), fields))
        return pa.concat_tables(tables)

    def _kept_groups(
        self,
        files: list[str],
        file_buckets: list[int],
        fields: Fields,
        keys: KeySet,
        key_column: str,
    ) -> pa.Table | None:
        """The rows of ``files`` in the row groups that may hold ``keys`` (by the leading
        key column's statistics, each file tested with the keys of its own bucket: see
        ``row_groups.py``), decoded groups kept for the rest of the epoch; None when they
        do not fit in memory or lack a column. ``key_column`` is the files' name of the
        keys' first column. The caller still matches the keys."""
        names = [n for n, _ in fields]
        key_table = keys.table if keys.table is not None else keys.frame.toArrow()
        leading = key_table.column(0)
        # The buckets of the keys, as the files were chosen by (``_buckets_of``).
        ids: dict[int, np.ndarray] = {}
        tables = []
        for file, buckets in zip(files, file_buckets, strict=True):
            whole = self._files.get(file)
            if whole is not None:  # decoded whole by an earlier read of this epoch
                if not set(names) <= set(whole.column_names):
                    return None
                tables.append(_conform(whole.select(names), fields))
                continue
            grouped = self._grouped.get(file)
            if grouped is None:
                grouped = self._grouped[file] = GroupedFile(file)
            if not set(names) <= set(grouped.column_names):
                return None
            if buckets:
                if buckets not in ids:
                    ids[buckets] = _key_bucket_ids(key_table, buckets)
                mine = pa.array(ids[buckets] == _bucket_of(file))
                wanted = wanted_values(leading.filter(mine))
            else:
                wanted = wanted_values(leading)
            groups = grouped.needed(key_column, wanted)
            parts, new = grouped.read(groups)
            if new:
                decoded = zip(groups, parts, strict=True)
                self._files_bytes += sum(part.nbytes for g, part in decoded if g in new)
                READS.note([file], grouped.column_names, new)
                if self._files_bytes > CACHED_BYTES:
                    return None
            tables.extend(_conform(part.select(names), fields) for part in parts)
        if not tables:
            return arrow_schema(fields).empty_table()
        return pa.concat_tables(tables)

    def _scan(self, files: list[str], fields: Fields) -> LocalFrame:
        """A lazy DuckDB scan of ``files`` (columns matched by name, cast to ``fields``)."""
        READS.note(files, (n for n, _ in fields))
        listing = ", ".join("'" + f.replace("'", "''") + "'" for f in files)
        columns = ", ".join(f"CAST({quote(n)} AS {duck_type(t)}) AS {quote(n)}" for n, t in fields)
        query = (
            f"SELECT {columns} FROM read_parquet([{listing}], "
            "hive_partitioning = false, union_by_name = true)"
        )
        return self.session.sql(query, [n for n, _ in fields])

    def gather_keys(
        self, keys: LocalFrame, bucket_counts: Sequence[int] = (DEFAULT_BUCKETS,)
    ) -> KeySet:
        """The distinct rows of ``keys`` kept as an Arrow table, with their buckets."""
        table = keys.distinct().toArrow()
        return known_keys(self.session.frame(table), table, bucket_counts)

    # writing -------------------------------------------------------------------------
    def write(
        self,
        frame: LocalFrame,
        circuit: str,
        collection: str,
        kind: str,
        time: Sequence[int],
        fields: Fields,
        *,
        bucket_by: Sequence[str] | None = None,
    ) -> BatchRecord | None:
        """Write ``frame`` (cast to ``fields``) as a new batch; None if it is empty."""
        table = _conform(frame.toArrow(), fields)
        record = self.write_table(table, circuit, collection, kind, time, bucket_by=bucket_by)
        if record is not None:
            self._written[record.path] = table
            while len(self._written) > _WRITTEN_KEPT:
                del self._written[next(iter(self._written))]
        return record

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
        if table.num_rows == 0:
            return None
        rel = self.warehouse.new_path(circuit, collection, kind, time)
        target = self.warehouse.abspath(rel)
        bucketed = bool(bucket_by) and table.num_rows > SMALL_BATCH_ROWS
        try:
            if bucketed:
                ids = bucket_ids([table.column(c) for c in bucket_by], self.buckets)
                table = table.append_column(BUCKET_COLUMN, pa.array(ids, pa.int32()))
                written = write_files(table, target, bucket_by, group_rows_for(time))
                table = table.drop_columns([BUCKET_COLUMN])
            else:
                if bucket_by:
                    table = _sorted(table, bucket_by)
                written = write_files(table, target, None)
            self.resident.keep(str(target), pa.concat_tables([part for _, part in written]))
        except BaseException:
            shutil.rmtree(target, ignore_errors=True)
            raise
        size = sum(os.path.getsize(file) for file, _ in written)
        return BatchRecord(
            circuit=circuit,
            collection=collection,
            kind=kind,
            time=tuple(int(x) for x in time),
            path=rel,
            rows=table.num_rows,
            bytes=size,
            buckets=self.buckets if bucketed else 0,
        )

    # ingest --------------------------------------------------------------------------
    def fingerprint(self, frame: LocalFrame) -> str:
        """The multiset hash of ``frame``'s rows that the Spark tier's
        ``frame_fingerprint`` gives (count, and the sum of Spark's ``xxhash64`` of every
        column, sorted by name, and of the row's NULL pattern)."""
        return table_fingerprint(frame.toArrow())


def table_rows(table: pa.Table, schema: Schema) -> list[tuple]:
    """Each row of ``schema``'s columns of ``table``, in order, in the reference engine's
    values."""
    return [
        tuple(from_column_value(record[n], t) for n, t in schema.fields)
        for record in table.select(list(schema.names)).to_pylist()
    ]


def table_zset(table: pa.Table, schema: Schema) -> ZSet:
    """A table of ``schema``'s columns (and ``__w``; without it each row counts once) as
    a Z-set of the reference engine's values."""
    rows = table_rows(table, schema)
    if WEIGHT not in table.column_names:
        return ZSet((row, 1) for row in rows)
    return ZSet(zip(rows, table.column(WEIGHT).to_pylist(), strict=True))


def table_fingerprint(table: pa.Table) -> str:
    """``batches.fingerprint_text`` of the table, the row hashes summed with NumPy."""
    names = sorted(table.column_names)
    if table.num_rows:
        arrays = [table.column(n) for n in names]
        if any(a.null_count for a in arrays):
            pattern = pc.binary_join_element_wise(
                *[pc.cast(pc.cast(pc.is_null(a), pa.int32()), pa.string()) for a in arrays], ""
            )
        else:  # every row's pattern is all zeros
            pattern = in_arrow.repeated(pa.scalar("0" * len(arrays)), table.num_rows)
        hashes = xxhash64([*arrays, pattern])
        total = int(np.sum(hashes.astype(object)))
    else:
        total = 0
    return fingerprint_text(names, table.num_rows, total)


def _conform(table: pa.Table, fields: Fields) -> pa.Table:
    """``table`` with exactly ``fields``, in order, cast to their declared types."""
    schema = arrow_schema(fields)
    if table.schema.equals(schema):  # a stored file read back: already as declared
        return table
    present = set(table.column_names)
    columns = []
    for field in schema:
        if field.name not in present:
            raise ValueError(f"column {field.name!r} missing from {table.column_names}")
        column = table.column(field.name)
        # Most columns already have their type (a small epoch conforms a thousand tables).
        columns.append(column if column.type == field.type else column.cast(field.type))
    return pa.Table.from_arrays(columns, schema=schema)


def _sorted(table: pa.Table, keys: Sequence[str]) -> pa.Table:
    try:
        return table.sort_by([(k, "ascending") for k in keys])
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid):
        return table


def _bucket_of(file: str) -> int:
    """The bucket of a file of a bucketed batch (its folder is ``__bucket=<n>``)."""
    folder = os.path.basename(os.path.dirname(file))
    return int(folder.split("=", 1)[1])


def _key_bucket_ids(table: pa.Table, buckets: int) -> np.ndarray:
    """The bucket of each key row of ``table`` (all its columns are the key)."""
    return bucket_ids([table.column(c) for c in table.column_names], buckets)


def _buckets_of(keys: KeySet, buckets: int) -> set[int]:
    return _table_buckets(keys.frame.toArrow(), buckets)


def _table_buckets(table: pa.Table, buckets: int) -> set[int]:
    if table.num_rows == 0:
        return set()
    ids = bucket_ids([table.column(c) for c in table.column_names], buckets)
    return {int(b) for b in np.unique(ids)}
