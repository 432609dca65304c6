"""The warehouse: immutable Parquet batches in a directory tree, written and read by Spark.

Layout (one directory per batch, unique per write, never rewritten)::

    <root>/<circuit>/<collection>/<kind>/t=<time joined by _>/<uuid>/
        part-*.parquet                      an unbucketed batch
        __bucket=<b>/part-*.parquet         a bucketed batch: one folder (one file) per bucket

A bucketed batch adds ``__bucket = pmod(xxhash64(key columns), buckets)`` (Spark's own
hash, on write and on read, so both sides agree on every platform) and stores each
bucket as one file sorted by the key columns. A read for a few keys computes their
buckets with the same expression and opens only those buckets' folders, then
semi-joins the rows on the keys. ``__bucket`` never appears in what a read returns.

Writes go to a fresh path each time and are registered in the catalog afterwards (see
``catalog``): an unregistered directory is garbage from a crashed or retried task.
The root is a local (or shared, mounted) directory: the driver lists bucket folders and
reads Parquet footers with pyarrow.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import reduce
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from dbspark.storage.catalog import KINDS, BatchRecord, _check_name
from dbspark.storage.driver_plans import listed_on_driver, one_job

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType

BUCKET_COLUMN = "__bucket"
DEFAULT_BUCKETS = 16
#: A keyed read broadcasts its keys to the scan when there are at most this many.
BROADCAST_KEYS = 100_000
#: Keys known on the driver, up to this many, prune a Spark read by a literal ``IN``
#: list instead of a broadcast semi-join: a filter inside the scan's own job, where a
#: broadcast is a job of its own, and on one column Parquet can skip row groups by it.
LITERAL_KEYS = 4_096
#: Batches written from the driver whose rows stay known by path (newest last).
DRIVER_WRITTEN_KEPT = 64
#: A loop's trace (its time carries an iteration) is written, bucket by bucket, in row
#: groups of at most this many rows. Its rows are sorted by key, so each group covers a
#: narrow key range, and a local read for the few keys an iteration touched decodes only
#: the groups whose statistics admit one of them (``engine/local/row_groups.py``). At
#: W2, 1M edges, ±10 edges, by an engine keeping nothing resident: one group a file
#: decoded 10.8 MB of column chunks in a 0.37-0.63 s epoch, 2,048 rows a group 1.8 MB
#: in 0.29-0.33 s, the stored bytes unchanged. Other traces keep one group a file: an
#: epoch reads them once, for all its keys, which touch most groups of a large file
#: (W1's 0.1%: 1,500 keys in 6M rows), and at 2,048 rows a 6M-row trace took 4x as
#: long to scan with DuckDB and 2.4x to decode whole, and stored 30% more.
KEYED_GROUP_ROWS = 2048


def group_rows_for(time: Sequence[int]) -> int | None:
    """The row group size of a bucket file of a batch at ``time``: ``KEYED_GROUP_ROWS``
    for a loop's trace, None (the writer's default: one group) for any other."""
    return KEYED_GROUP_ROWS if len(time) > 1 else None


def bucket_expr(columns: Sequence[str], buckets: int) -> Column:
    """``pmod(xxhash64(columns), buckets)`` as INT: the bucket of a row's key."""
    from pyspark.sql import functions as F

    if not columns:
        raise ValueError("bucketing needs at least one key column")
    if buckets < 1:
        raise ValueError(f"buckets must be positive, got {buckets}")
    return F.pmod(F.xxhash64(*[F.col(c) for c in columns]), F.lit(buckets)).cast("int")


def bucketed(df: DataFrame, bucket_by: Sequence[str], buckets: int) -> DataFrame:
    """``df`` with ``__bucket`` added and hash-partitioned by it into ``buckets`` partitions:
    every bucket in exactly one partition, so one file per bucket folder on write."""
    missing = [c for c in bucket_by if c not in df.columns]
    if missing:
        raise ValueError(f"bucket columns {missing} are not in {df.columns}")
    return df.withColumn(BUCKET_COLUMN, bucket_expr(bucket_by, buckets)).repartition(
        buckets, BUCKET_COLUMN
    )


@dataclass(frozen=True)
class KeySet:
    """Keys for pruned reads, gathered once with the buckets they fall in.

    A stateful operator reads several traces for the same keys (both sides of a join,
    each port's history); gathering the keys to the driver once (one small Spark job)
    lets every such read pick its bucket files without a job of its own, and gives the
    semi-joins a local relation to broadcast. ``buckets`` maps a bucket count to the
    buckets holding the keys; None means every bucket (too many keys to gather).
    ``table`` holds the distinct keys on the driver when they were gathered there (a
    Spark read then filters by them as literals, see ``LITERAL_KEYS``).
    """

    frame: DataFrame
    buckets: Mapping[int, frozenset[int]] | None
    rows: int | None
    table: pa.Table | None = None

    def renamed(self, names: Sequence[str]) -> KeySet:
        """The same keys under other column names (one join side's keys as the other's):
        the buckets stay valid, since the hash depends on values and types, not names."""
        columns = [self.frame[c].alias(n) for c, n in zip(self.frame.columns, names, strict=True)]
        table = None if self.table is None else self.table.rename_columns(list(names))
        return KeySet(self.frame.select(*columns), self.buckets, self.rows, table)


def known_keys(frame: DataFrame, table: pa.Table, bucket_counts: Sequence[int]) -> KeySet:
    """A key set the driver already holds (``table``, distinct, as ``frame`` in Spark):
    its buckets are computed here, as Spark would (``storage/buckets.py``), with no job."""
    from dbspark.storage.buckets import bucket_ids

    columns = [table.column(c) for c in table.column_names]
    buckets = {
        n: frozenset(np.unique(bucket_ids(columns, n)).tolist()) if table.num_rows else frozenset()
        for n in bucket_counts
    }
    return KeySet(frame, buckets, table.num_rows, table)


def time_dir(time: Sequence[int]) -> str:
    if not time:
        raise ValueError("a time needs at least one coordinate (the epoch)")
    return "t=" + "_".join(str(int(x)) for x in time)


class Warehouse:
    """A directory of Parquet batches (see the module docstring for the layout)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        # Batches never change, so a column's maximum is read from their footers once.
        self._maxima: dict[tuple[str, str], int | None] = {}
        # ... and the rows of one written from the driver are known without a read.
        self._driver_written: dict[str, pa.Table] = {}

    def __repr__(self) -> str:
        return f"Warehouse({str(self.root)!r})"

    # --- paths -------------------------------------------------------------------------
    def new_path(self, circuit: str, collection: str, kind: str, time: Sequence[int]) -> str:
        """A fresh, unique batch path relative to the root (nothing is created)."""
        _check_name(circuit, "circuit")
        _check_name(collection, "collection")
        if kind not in KINDS:
            raise ValueError(f"batch kind must be one of {KINDS}, got {kind!r}")
        return f"{circuit}/{collection}/{kind}/{time_dir(time)}/{uuid.uuid4().hex}"

    def abspath(self, rel: str) -> Path:
        return self.root / rel

    def uri(self, rel: str) -> str:
        return spark_path(self.abspath(rel))

    # --- writing -----------------------------------------------------------------------
    def write(
        self,
        df: DataFrame,
        circuit: str,
        collection: str,
        kind: str,
        time: Sequence[int],
        *,
        bucket_by: Sequence[str] | None = None,
        buckets: int = DEFAULT_BUCKETS,
        prebucketed: bool = False,
        driver_rows: int = 0,
    ) -> BatchRecord | None:
        """Write ``df`` as a new batch; the record to commit, or None if ``df`` is empty.

        With ``bucket_by``, rows are hash-partitioned into ``buckets`` folders by their
        key columns, one file per folder, sorted by the key within it. ``prebucketed``
        says ``df`` already went through :func:`bucketed` with the same ``bucket_by`` and
        ``buckets`` (so work done on it per bucket, e.g. an aggregation by key, needed
        no shuffle of its own).

        ``driver_rows`` > 0 says the batch is probably small: its rows are collected (as
        Arrow, bucket ids computed by Spark) and written by the driver, one file per
        bucket, the same layout. Spark's own write of a few rows costs 0.3 to 0.8 s (a
        task per bucket, the commit protocol); this costs one collect. Past
        ``driver_rows`` rows Spark writes the batch after all, recomputing ``df``.
        """
        rel = self.new_path(circuit, collection, kind, time)
        target = self.abspath(rel)
        if BUCKET_COLUMN in df.columns and not (bucket_by and prebucketed):
            raise ValueError(f"{BUCKET_COLUMN} is reserved for the warehouse's bucketing")
        written = None
        if driver_rows > 0:
            written = self._write_from_driver(
                df, target, bucket_by, buckets, prebucketed, driver_rows, group_rows_for(time)
            )
        if written is None:
            _write_with_spark(df, target, bucket_by, buckets, prebucketed, group_rows_for(time))
        record = self._record(rel, circuit, collection, kind, time, buckets if bucket_by else 0)
        if record is None:
            shutil.rmtree(target, ignore_errors=True)
        elif written is not None:
            self._remember(rel, written)
        return record

    def write_arrow(
        self,
        table: pa.Table,
        circuit: str,
        collection: str,
        kind: str,
        time: Sequence[int],
        *,
        bucket_by: Sequence[str] | None = None,
        buckets: int = DEFAULT_BUCKETS,
    ) -> BatchRecord | None:
        """Write rows the driver holds as a new batch in the same layout as ``write``
        (bucket ids computed as Spark computes them, ``storage/buckets.py``), with no
        Spark job; None if ``table`` is empty."""
        if table.num_rows == 0:
            return None
        if BUCKET_COLUMN in table.column_names:
            raise ValueError(f"{BUCKET_COLUMN} is reserved for the warehouse's bucketing")
        rel = self.new_path(circuit, collection, kind, time)
        target = self.abspath(rel)
        if bucket_by:
            from dbspark.storage.buckets import bucket_ids

            ids = bucket_ids([table.column(c) for c in bucket_by], buckets)
            table = table.append_column(BUCKET_COLUMN, pa.array(ids, pa.int32()))
        try:
            write_files(table, target, bucket_by, group_rows_for(time))
        except BaseException:
            shutil.rmtree(target, ignore_errors=True)
            raise
        self._remember(rel, table.drop_columns([BUCKET_COLUMN]) if bucket_by else table)
        return self._record(rel, circuit, collection, kind, time, buckets if bucket_by else 0)

    def _record(
        self, rel: str, circuit: str, collection: str, kind: str, time: Sequence[int], buckets: int
    ) -> BatchRecord | None:
        """The record of the batch written at ``rel`` (rows and bytes from its files);
        None when it holds no row."""
        rows, size = parquet_stats(self.abspath(rel))
        if rows == 0:
            return None
        return BatchRecord(
            circuit=circuit,
            collection=collection,
            kind=kind,
            time=tuple(int(x) for x in time),
            path=rel,
            rows=rows,
            bytes=size,
            buckets=buckets,
        )

    def _remember(self, rel: str, table: pa.Table) -> None:
        self._driver_written[rel] = table
        while len(self._driver_written) > DRIVER_WRITTEN_KEPT:
            del self._driver_written[next(iter(self._driver_written))]

    def _write_from_driver(
        self,
        df: DataFrame,
        target: Path,
        bucket_by: Sequence[str] | None,
        buckets: int,
        prebucketed: bool,
        driver_rows: int,
        group_rows: int | None,
    ) -> pa.Table | None:
        """Write ``df`` with pyarrow if it has at most ``driver_rows`` rows: the rows
        written (without ``__bucket``); None if it has more."""
        if bucket_by and not prebucketed:
            df = df.withColumn(BUCKET_COLUMN, bucket_expr(bucket_by, buckets))
        with one_job(df.sparkSession):
            table = df.limit(driver_rows + 1).toArrow()
        if table.num_rows > driver_rows:
            return None
        if table.num_rows:
            write_files(table, target, bucket_by, group_rows)
        return table.drop_columns([BUCKET_COLUMN]) if bucket_by else table

    def driver_written(self, record: BatchRecord) -> pa.Table | None:
        """The rows of a batch this warehouse wrote from the driver, if it still knows
        them (a batch never changes, so they are its rows)."""
        return self._driver_written.get(record.path)

    def delete(self, record: BatchRecord) -> None:
        """Remove an (uncommitted) batch's files, e.g. after losing a commit race."""
        shutil.rmtree(self.abspath(record.path), ignore_errors=True)

    # --- reading -----------------------------------------------------------------------
    def gather_keys(
        self, keys: DataFrame, bucket_counts: Sequence[int] = (DEFAULT_BUCKETS,)
    ) -> KeySet:
        """Collect the distinct rows of ``keys`` (all its columns) and their buckets in one
        Spark job; past ``BROADCAST_KEYS`` rows they stay distributed (checkpointed) and
        every bucket is read."""
        columns = list(keys.columns)
        distinct = keys.distinct()
        labelled = distinct.select(
            *columns, *[bucket_expr(columns, n).alias(f"__b{n}") for n in bucket_counts]
        )
        # As Arrow: a TIMESTAMP comes back as the instant it is (a Row's is a naive local
        # time), so the keys can go back to Spark as literals unchanged.
        gathered = labelled.limit(BROADCAST_KEYS + 1).toArrow()
        if gathered.num_rows > BROADCAST_KEYS:
            return KeySet(distinct.localCheckpoint(), None, None)
        table = gathered.select(columns)
        spark = keys.sparkSession
        rows = list(zip(*table.to_pydict().values(), strict=True))
        frame = spark.createDataFrame(rows, keys.schema)
        buckets = {n: frozenset(gathered.column(f"__b{n}").to_pylist()) for n in bucket_counts}
        return KeySet(frame, buckets, table.num_rows, table)

    def read(
        self,
        spark: SparkSession,
        records: Sequence[BatchRecord],
        schema: StructType,
        *,
        keys: DataFrame | KeySet | None = None,
        bucket_by: Sequence[str] | None = None,
    ) -> DataFrame:
        """The union of ``records`` as one DataFrame of ``schema``.

        With ``keys`` (a DataFrame of key columns, ``bucket_by`` by default its columns),
        only the rows whose key is among ``keys`` (NULL-safe equality), and of bucketed
        batches only the buckets of those keys are opened. ``keys`` is evaluated twice
        (once on the driver for its buckets, once in the semi-join): cache it if it is
        expensive. It is broadcast when it has at most ``BROADCAST_KEYS`` rows. A
        ``KeySet`` (``gather_keys``) already knows its buckets and costs no job here.
        """
        schema = _without_bucket(schema)
        key_cols: list[str] = []
        wanted: dict[int, set[int]] = {}
        n_keys: int | None = None
        literal: Column | None = None
        if keys is not None:
            gathered = keys if isinstance(keys, KeySet) else None
            frame = gathered.frame if gathered else keys
            key_cols = list(bucket_by or frame.columns)
            missing = [c for c in key_cols if c not in schema.fieldNames()]
            if missing:
                raise ValueError(f"key columns {missing} are not in the schema {schema}")
            counts = {r.buckets for r in records if r.buckets}
            same_types = all(frame.schema[c].dataType == schema[c].dataType for c in key_cols)
            keys = frame.select(*[frame[c].cast(schema[c].dataType).alias(c) for c in key_cols])
            if gathered is not None and gathered.buckets is None:
                wanted, n_keys = {n: set(range(n)) for n in counts}, None
            elif gathered is not None and same_types and counts <= set(gathered.buckets):
                wanted = {n: set(gathered.buckets[n]) for n in counts}
                n_keys = gathered.rows
            else:  # the hash depends on the type: other types need their own lookup
                wanted, n_keys = self.key_buckets(keys, key_cols, counts)
            if gathered is not None and gathered.table is not None:
                literal = key_predicate(gathered.table, key_cols, schema)

        paths: list[str] = []
        for r in records:
            d = self.abspath(r.path)
            if not d.is_dir():
                raise FileNotFoundError(
                    f"batch {r.id} of {r.circuit}/{r.collection} at {list(r.time)} is "
                    f"registered but its directory {d} is missing"
                )
            if r.buckets:
                for b in _bucket_dirs(d):
                    if keys is None or int(b.name.split("=", 1)[1]) in wanted[r.buckets]:
                        paths.append(spark_path(b))
            else:
                paths.append(spark_path(d))
        if not paths:
            return spark.createDataFrame([], schema)
        with listed_on_driver(spark, len(paths)):
            df = spark.read.schema(schema).parquet(*paths)
        if literal is not None:
            return df.where(literal)
        if keys is not None:
            small = n_keys is not None and n_keys <= BROADCAST_KEYS
            df = semi_join(df, keys.distinct(), key_cols, broadcast=small)
        return df

    def column_max(self, record: BatchRecord, column: str) -> int | None:
        """The largest value of the integer ``column`` in a batch, from its Parquet
        footers' statistics (no Spark job); None when some footer has none for it."""
        cache_key = (record.path, column)
        if cache_key not in self._maxima:
            self._maxima[cache_key] = _footer_max(self.abspath(record.path), column)
        return self._maxima[cache_key]

    def key_buckets(
        self, keys: DataFrame, key_cols: Sequence[str], bucket_counts: set[int]
    ) -> tuple[dict[int, set[int]], int | None]:
        """For each bucket count, the buckets holding ``keys``, and how many key rows
        there are (one small Spark job; none when no batch is bucketed)."""
        from pyspark.sql import functions as F

        counts = sorted(bucket_counts)
        if not counts:
            return {}, None
        row = keys.agg(
            F.count(F.lit(1)).alias("n"),
            *[F.collect_set(bucket_expr(key_cols, n)).alias(f"b{n}") for n in counts],
        ).first()
        if row is None:
            return {n: set() for n in counts}, 0
        return {n: set(row[f"b{n}"] or []) for n in counts}, int(row["n"])


def write_files(
    table: pa.Table,
    target: Path,
    bucket_by: Sequence[str] | None,
    group_rows: int | None = None,
) -> list[tuple[Path, pa.Table]]:
    """Write ``table`` into the new directory ``target`` as Spark lays a batch out: one
    file, or (``bucket_by`` given, ``table`` carrying ``__bucket``) one file per bucket
    folder, sorted by bucket and then by key, in row groups of ``group_rows`` rows
    (None: pyarrow's default). Returns each file with the rows it holds
    (without ``__bucket``), for a caller that keeps them decoded.

    Keys Arrow cannot order (arrays) keep their order within a bucket: the order speeds
    reads up, no reader relies on it.
    """
    target.mkdir(parents=True)
    name = f"part-00000-{uuid.uuid4().hex}.parquet"
    if not bucket_by:
        pq.write_table(table, target / name)
        return [(target / name, table)]
    try:
        order = [(BUCKET_COLUMN, "ascending"), *[(c, "ascending") for c in bucket_by]]
        table = table.sort_by(order)
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid):
        table = table.sort_by([(BUCKET_COLUMN, "ascending")])
    ids = table.column(BUCKET_COLUMN).to_numpy()
    table = table.drop_columns([BUCKET_COLUMN])
    # Sorted by bucket, each bucket is one slice: its bounds are where the id changes.
    bounds = (np.flatnonzero(np.diff(ids)) + 1).tolist()
    written = []
    for start, end in zip([0, *bounds], [*bounds, len(ids)], strict=True):
        folder = target / f"{BUCKET_COLUMN}={int(ids[start])}"
        folder.mkdir()
        part = table.slice(start, end - start)
        pq.write_table(part, folder / name, row_group_size=group_rows)
        written.append((folder / name, part))
    return written


def _write_with_spark(
    df: DataFrame,
    target: Path,
    bucket_by: Sequence[str] | None,
    buckets: int,
    prebucketed: bool,
    group_rows: int | None = None,
) -> None:
    if bucket_by:
        out = df if prebucketed else bucketed(df, bucket_by, buckets)
        out = out.sortWithinPartitions(BUCKET_COLUMN, *bucket_by)
        # "error" (= errorifexists): the one spelling Spark Connect's client accepts too.
        writer = out.write.mode("error")
        if group_rows:  # row groups as pyarrow writes them: either tier's files alike
            writer = writer.option("parquet.block.row.count.limit", str(group_rows))
        writer.partitionBy(BUCKET_COLUMN).parquet(spark_path(target))
    else:
        df.write.mode("error").parquet(spark_path(target))


def spark_path(path: Path) -> str:
    """A local path as Spark/Hadoop expect it: ``file:`` + the path, not percent-encoded
    (``Path.as_uri`` would turn ``t=3`` into ``t%3D3``, which Hadoop keeps literally)."""
    return "file://" + str(path)


def semi_join(
    df: DataFrame, keys: DataFrame, key_cols: Sequence[str], *, broadcast: bool = False
) -> DataFrame:
    """Rows of ``df`` whose key (NULL-safe) equals some row of ``keys``."""
    from pyspark.sql import functions as F

    if broadcast:
        keys = F.broadcast(keys)
    left, right = df.alias("__data"), keys.alias("__keys")

    cond = reduce(
        lambda a, b: a & b,
        [F.col(f"__data.{c}").eqNullSafe(F.col(f"__keys.{c}")) for c in key_cols],
    )
    return left.join(right, cond, "left_semi")


def key_predicate(keys: pa.Table, key_cols: Sequence[str], schema: StructType) -> Column | None:
    """Rows whose key (NULL-safe) is a row of ``keys`` (named ``key_cols``), as a literal
    ``IN`` list; None when there are more than ``LITERAL_KEYS`` keys or a key column's
    type is compared differently by ``IN`` than by the semi-join's ``<=>`` (floats: NaN
    and -0.0; nested types). The list is SQL text, parsed once by Spark: a literal made
    through the Column API costs a round trip to the JVM each."""
    from pyspark.sql import functions as F

    if keys.num_rows > LITERAL_KEYS:
        return None
    types = [schema[c].dataType for c in key_cols]
    if not all(_literal_type(t) for t in types):
        return None
    if keys.num_rows == 0:
        return F.lit(False)
    values = [keys.column(i).to_pylist() for i in range(len(key_cols))]
    names = [_quoted(c) for c in key_cols]
    if len(key_cols) == 1:
        present = [v for v in values[0] if v is not None]
        found = (
            f"{names[0]} IN ({', '.join(sql_literal(v, types[0]) for v in present)})"
            if present
            else "FALSE"
        )
        # IN never matches NULL; the semi-join's <=> does.
        if len(present) < len(values[0]):
            found = f"({found}) OR {names[0]} IS NULL"
        return F.expr(found)
    # Tuples compare field by field with NULL equal to NULL, as <=> does.
    rows = (
        "(" + ", ".join(sql_literal(v, t) for v, t in zip(row, types, strict=True)) + ")"
        for row in zip(*values, strict=True)
    )
    return F.expr(f"({', '.join(names)}) IN ({', '.join(rows)})")


def _literal_type(data_type: object) -> bool:
    from pyspark.sql.types import (
        BooleanType,
        DateType,
        DecimalType,
        IntegerType,
        LongType,
        StringType,
        TimestampType,
    )

    exact = (BooleanType, DateType, DecimalType, IntegerType, LongType, StringType, TimestampType)
    return isinstance(data_type, exact)


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def sql_literal(value: object, data_type: object) -> str:
    """``value`` as a Spark SQL literal of ``data_type`` (one of ``_literal_type``'s)."""
    from pyspark.sql.types import (
        BooleanType,
        DateType,
        DecimalType,
        IntegerType,
        LongType,
        StringType,
    )

    if value is None:
        return f"CAST(NULL AS {data_type.simpleString()})"  # type: ignore[attr-defined]
    if isinstance(data_type, BooleanType):
        return "TRUE" if value else "FALSE"
    if isinstance(data_type, LongType):
        return f"{int(value)}L"  # type: ignore[call-overload]
    if isinstance(data_type, IntegerType):
        return str(int(value))  # type: ignore[call-overload]
    if isinstance(data_type, StringType):
        return "'" + "".join(map(_sql_char, str(value))) + "'"
    if isinstance(data_type, DateType):
        return f"DATE '{value.isoformat()}'"  # type: ignore[attr-defined]
    if isinstance(data_type, DecimalType):
        return f"CAST('{value:f}' AS {data_type.simpleString()})"
    # TIMESTAMP: the instant in microseconds (a naive value is UTC, as dbspark keeps it).
    assert isinstance(value, dt.datetime)
    instant = value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    return f"TIMESTAMP_MICROS({(instant - _EPOCH) // dt.timedelta(microseconds=1)})"


def _sql_char(char: str) -> str:
    """A character of a SQL string literal: letters, digits and spaces as they are, any
    other as a \\u escape (UTF-16, as Java strings are), so no quote, backslash or
    ``${...}`` (which Spark's parser substitutes) reaches the SQL text."""
    if char.isascii() and (char.isalnum() or char == " "):
        return char
    data = char.encode("utf-16-be")
    return "".join(f"\\u{data[i]:02x}{data[i + 1]:02x}" for i in range(0, len(data), 2))


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def parquet_files(path: Path) -> list[str]:
    """The Parquet files under ``path`` that a read sees (Spark's rule for hidden ones),
    in a stable order."""
    found = []
    for dirpath, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not _hidden(d))
        found.extend(
            os.path.join(dirpath, f)
            for f in sorted(files)
            if f.endswith(".parquet") and not _hidden(f)
        )
    return found


def parquet_stats(path: Path) -> tuple[int, int]:
    """(rows, bytes) of the Parquet files under ``path``, from their footers."""
    files = parquet_files(path)
    rows = sum(pq.read_metadata(f).num_rows for f in files)
    return rows, sum(os.path.getsize(f) for f in files)


def _footer_max(path: Path, column: str) -> int | None:
    """The maximum of ``column`` over the Parquet files under ``path`` from their row group
    statistics; None when a file lacks the column or a row group lacks statistics."""
    top: int | None = None
    for file in parquet_files(path):
        meta = pq.read_metadata(file)
        names = [meta.schema.column(i).path for i in range(meta.num_columns)]
        if column not in names:
            return None
        index = names.index(column)
        for g in range(meta.num_row_groups):
            group = meta.row_group(g)
            if group.num_rows == 0:
                continue
            stats = group.column(index).statistics
            if stats is None or not stats.has_min_max:
                return None
            top = int(stats.max) if top is None else max(top, int(stats.max))
    return top


def _hidden(name: str) -> bool:
    """Spark's rule for files and folders a read ignores (``_SUCCESS``, ``.crc``, ...)."""
    return name.startswith(".") or (name.startswith("_") and "=" not in name)


def _bucket_dirs(batch_dir: Path) -> list[Path]:
    prefix = BUCKET_COLUMN + "="
    return sorted(
        (p for p in batch_dir.iterdir() if p.is_dir() and p.name.startswith(prefix)),
        key=lambda p: int(p.name[len(prefix) :]),
    )


def _without_bucket(schema: StructType) -> StructType:
    from pyspark.sql.types import StructType

    if BUCKET_COLUMN not in schema.fieldNames():
        return schema
    return StructType([f for f in schema.fields if f.name != BUCKET_COLUMN])
