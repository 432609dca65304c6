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

import os
import shutil
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import reduce
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow.compute as pc
import pyarrow.parquet as pq

from dbspark.storage.catalog import KINDS, BatchRecord, _check_name

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType

BUCKET_COLUMN = "__bucket"
DEFAULT_BUCKETS = 16
#: A keyed read broadcasts its keys to the scan when there are at most this many.
BROADCAST_KEYS = 100_000


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
    """

    frame: DataFrame
    buckets: Mapping[int, frozenset[int]] | None
    rows: int | None

    def renamed(self, names: Sequence[str]) -> KeySet:
        """The same keys under other column names (one join side's keys as the other's):
        the buckets stay valid, since the hash depends on values and types, not names."""
        columns = [self.frame[c].alias(n) for c, n in zip(self.frame.columns, names, strict=True)]
        return KeySet(self.frame.select(*columns), self.buckets, self.rows)


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
        small = driver_rows > 0 and self._write_from_driver(
            df, target, bucket_by, buckets, prebucketed, driver_rows
        )
        if not small:
            _write_with_spark(df, target, bucket_by, buckets, prebucketed)
        rows, size = parquet_stats(target)
        if rows == 0:
            shutil.rmtree(target, ignore_errors=True)
            return None
        return BatchRecord(
            circuit=circuit,
            collection=collection,
            kind=kind,
            time=tuple(int(x) for x in time),
            path=rel,
            rows=rows,
            bytes=size,
            buckets=buckets if bucket_by else 0,
        )

    def _write_from_driver(
        self,
        df: DataFrame,
        target: Path,
        bucket_by: Sequence[str] | None,
        buckets: int,
        prebucketed: bool,
        driver_rows: int,
    ) -> bool:
        """Write ``df`` with pyarrow if it has at most ``driver_rows`` rows; False if not."""
        if bucket_by and not prebucketed:
            df = df.withColumn(BUCKET_COLUMN, bucket_expr(bucket_by, buckets))
        table = df.limit(driver_rows + 1).toArrow()
        if table.num_rows > driver_rows:
            return False
        if table.num_rows == 0:
            return True
        target.mkdir(parents=True)
        name = f"part-00000-{uuid.uuid4().hex}.parquet"
        if not bucket_by:
            pq.write_table(table, target / name)
            return True
        table = table.sort_by(
            [(BUCKET_COLUMN, "ascending"), *[(c, "ascending") for c in bucket_by]]
        )
        ids = table.column(BUCKET_COLUMN)
        for bucket in pc.unique(ids).to_pylist():
            rows = table.filter(pc.equal(ids, bucket)).drop_columns([BUCKET_COLUMN])
            folder = target / f"{BUCKET_COLUMN}={bucket}"
            folder.mkdir()
            pq.write_table(rows, folder / name)
        return True

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
        rows = labelled.limit(BROADCAST_KEYS + 1).collect()
        if len(rows) > BROADCAST_KEYS:
            return KeySet(distinct.localCheckpoint(), None, None)
        spark = keys.sparkSession
        frame = spark.createDataFrame([tuple(r[c] for c in columns) for r in rows], keys.schema)
        buckets = {n: frozenset(r[f"__b{n}"] for r in rows) for n in bucket_counts}
        return KeySet(frame, buckets, len(rows))

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
        df = spark.read.schema(schema).parquet(*paths)
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


def _write_with_spark(
    df: DataFrame,
    target: Path,
    bucket_by: Sequence[str] | None,
    buckets: int,
    prebucketed: bool,
) -> None:
    if bucket_by:
        out = df if prebucketed else bucketed(df, bucket_by, buckets)
        out = out.sortWithinPartitions(BUCKET_COLUMN, *bucket_by)
        # "error" (= errorifexists): the one spelling Spark Connect's client accepts too.
        out.write.mode("error").partitionBy(BUCKET_COLUMN).parquet(spark_path(target))
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
