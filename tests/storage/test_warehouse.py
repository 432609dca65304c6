"""Parquet batches through Spark: layout, round trips, empty reads, and pruning by key."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

from dbspark.storage import BatchRecord, Catalog, Warehouse
from dbspark.storage import warehouse as warehouse_module
from dbspark.storage.warehouse import BUCKET_COLUMN, bucket_expr, spark_path

SCHEMA = StructType(
    [
        StructField("k", LongType(), True),
        StructField("v", StringType(), True),
        StructField("__epoch", LongType(), False),
        StructField("__w", LongType(), False),
    ]
)


def rows_of(df) -> list[tuple]:
    return sorted((tuple(r) for r in df.collect()), key=repr)


# Spark writes the batch; the driver writes it (few rows); the driver is asked to but the
# batch has too many rows for it, so Spark writes it after all. One layout for all three.
WRITERS = pytest.mark.parametrize(
    "driver_rows", [0, 5000, 100], ids=["spark", "driver", "too-big-for-the-driver"]
)


@WRITERS
def test_unbucketed_round_trip_keeps_schema_and_nulls(
    spark, warehouse: Warehouse, driver_rows: int
) -> None:
    data = [(1, "a", 0, 1), (2, None, 0, -1), (None, "z", 0, 2)]
    data += [(k, f"v{k}", 0, 1) for k in range(10, 210 if driver_rows == 100 else 20)]
    df = spark.createDataFrame(data, SCHEMA)
    rec = warehouse.write(df, "c", "n1.delta", "delta", (0,), driver_rows=driver_rows)
    assert rec is not None
    assert rec.rows == len(data) and rec.bytes > 0 and rec.buckets == 0 and rec.id is None
    assert rec.path.startswith("c/n1.delta/delta/t=0/")
    assert (warehouse.root / rec.path).is_dir()

    back = warehouse.read(spark, [rec], SCHEMA)
    assert back.schema.fieldNames() == SCHEMA.fieldNames()
    assert rows_of(back) == rows_of(df)


def test_every_write_gets_a_fresh_path(spark, warehouse: Warehouse) -> None:
    df = spark.createDataFrame([(1, "a", 3, 1)], SCHEMA)
    a = warehouse.write(df, "c", "n", "trace", (3, 2))
    b = warehouse.write(df, "c", "n", "trace", (3, 2))
    assert a and b and a.path != b.path
    assert a.path.startswith("c/n/trace/t=3_2/")
    assert rows_of(warehouse.read(spark, [a, b], SCHEMA)) == [(1, "a", 3, 1)] * 2


@pytest.mark.parametrize("driver_rows", [0, 5000], ids=["spark", "driver"])
def test_empty_writes_and_reads(spark, warehouse: Warehouse, driver_rows: int) -> None:
    empty = spark.createDataFrame([], SCHEMA)
    assert warehouse.write(empty, "c", "n", "delta", (0,), driver_rows=driver_rows) is None
    bucketed = warehouse.write(
        empty, "c", "n", "trace", (0,), bucket_by=["k"], driver_rows=driver_rows
    )
    assert bucketed is None
    # Nothing is left behind for an empty batch.
    assert not any(p.is_file() for p in warehouse.root.rglob("*"))
    out = warehouse.read(spark, [], SCHEMA)
    assert out.schema == SCHEMA and out.count() == 0
    keys = spark.createDataFrame([(1,)], "k long")
    assert warehouse.read(spark, [], SCHEMA, keys=keys, bucket_by=["k"]).count() == 0


@WRITERS
def test_bucketed_layout_one_file_per_bucket_with_sparks_hash(
    spark, warehouse: Warehouse, driver_rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each bucket's file sorted by key, in one row group; a loop's trace (its time carries
    an iteration) in row groups of at most ``KEYED_GROUP_ROWS``."""
    monkeypatch.setattr(warehouse_module, "KEYED_GROUP_ROWS", 64)
    df = spark.range(2000).select(
        F.col("id").alias("k"),
        F.concat(F.lit("v"), F.col("id").cast("string")).alias("v"),
        F.lit(0).cast("long").alias("__epoch"),
        F.lit(1).cast("long").alias("__w"),
    )
    rec = warehouse.write(
        df, "c", "n", "trace", (0,), bucket_by=["k"], buckets=8, driver_rows=driver_rows
    )
    assert rec is not None and rec.buckets == 8 and rec.rows == 2000
    base = warehouse.root / rec.path
    dirs = sorted(p.name for p in base.iterdir() if p.is_dir())
    assert dirs == [f"{BUCKET_COLUMN}={b}" for b in range(8)]
    for b in range(8):
        files = list((base / f"{BUCKET_COLUMN}={b}").glob("*.parquet"))
        assert len(files) == 1, files
        ks = pq.read_table(files[0], columns=["k"]).column("k").to_pylist()
        assert ks and ks == sorted(ks)  # sorted by key within the bucket
        assert pq.read_metadata(files[0]).num_row_groups == 1
    # Folder b holds exactly the rows whose key Spark hashes to b (partition discovery
    # turns the folder names back into a column here).
    raw = spark.read.parquet(spark_path(base))
    assert raw.where(bucket_expr(["k"], 8) != F.col(BUCKET_COLUMN)).count() == 0
    back = warehouse.read(spark, [rec], SCHEMA)
    assert BUCKET_COLUMN not in back.columns
    assert back.count() == 2000
    # Which writer wrote it: Spark names its files part-<n>-<uuid>.c000.<codec>.parquet.
    by_spark = {".c000." in f.name for f in base.rglob("*.parquet")}
    assert by_spark == {driver_rows < 2000}
    loop = warehouse.write(
        df, "c", "n.in0", "trace", (0, 0), bucket_by=["k"], buckets=8, driver_rows=driver_rows
    )
    assert loop is not None
    for file in (warehouse.root / loop.path).rglob("*.parquet"):
        meta = pq.read_metadata(file)
        groups = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
        assert max(groups) <= 64 and len(groups) == -(-meta.num_rows // 64), groups


def test_read_for_a_few_keys_opens_only_their_buckets(spark, warehouse: Warehouse) -> None:
    n, buckets = 10_000, 16
    df = spark.range(n).select(
        (F.col("id") % 1000).alias("k"),
        F.col("id").cast("string").alias("v"),
        (F.col("id") % 3).alias("__epoch"),
        F.lit(1).cast("long").alias("__w"),
    )
    rec = warehouse.write(df, "c", "big", "trace", (0,), bucket_by=["k"], buckets=buckets)
    assert rec is not None
    all_files = warehouse.read(spark, [rec], SCHEMA).inputFiles()
    assert len(all_files) == buckets

    keys = spark.createDataFrame([(7,), (423,)], "k int")  # INT keys for a BIGINT column
    got = warehouse.read(spark, [rec], SCHEMA, keys=keys, bucket_by=["k"])
    # Spark's own account of what the scan reads: at most the two keys' buckets.
    files = got.inputFiles()
    assert 1 <= len(files) <= 2, files
    assert set(files) <= set(all_files)
    expected = rows_of(df.where(F.col("k").isin(7, 423)))
    assert len(expected) == 20
    assert rows_of(got) == expected

    # The same through the executed plan's metrics: the scan read at most 2 of 16 files.
    assert files_read_by_scans(got) <= 2


def files_read_by_scans(df) -> int:
    """Run ``df`` and add up the "number of files read" metric of its Parquet scans."""
    df.collect()
    scans = []

    def walk(node) -> None:
        name = node.getClass().getSimpleName()
        if name == "AdaptiveSparkPlanExec":
            walk(node.executedPlan())  # the final plan, after adaptive execution
        elif name.endswith("QueryStageExec"):
            walk(node.plan())
        else:
            if name == "FileSourceScanExec":
                scans.append(node)
            children = node.children().iterator()
            while children.hasNext():
                walk(children.next())

    walk(df._jdf.queryExecution().executedPlan())
    assert scans, df._jdf.queryExecution().executedPlan().toString()
    return sum(s.metrics().apply("numFiles").value() for s in scans)


def test_keyed_read_mixes_bucketed_and_plain_batches_and_null_keys(
    spark, warehouse: Warehouse
) -> None:
    a = warehouse.write(
        spark.createDataFrame([(1, "a", 0, 1), (2, "b", 0, 1), (None, "n", 0, 1)], SCHEMA),
        "c",
        "t",
        "trace",
        (0,),
        bucket_by=["k"],
        buckets=4,
    )
    b = warehouse.write(
        spark.createDataFrame([(1, "a", 1, -1), (3, "c", 1, 1), (None, "m", 1, 1)], SCHEMA),
        "c",
        "t",
        "delta",
        (1,),
    )
    c = warehouse.write(
        spark.createDataFrame([(2, "bb", 2, 1)], SCHEMA),
        "c",
        "t",
        "trace",
        (2,),
        bucket_by=["k"],
        buckets=8,
    )
    assert a and b and c
    keys = spark.createDataFrame([(1,), (None,), (1,)], "k long")
    got = warehouse.read(spark, [a, b, c], SCHEMA, keys=keys, bucket_by=["k"])
    assert rows_of(got) == sorted(
        [(1, "a", 0, 1), (None, "n", 0, 1), (1, "a", 1, -1), (None, "m", 1, 1)], key=repr
    )
    assert rows_of(warehouse.read(spark, [a, b, c], SCHEMA)) == rows_of(
        spark.createDataFrame(
            [
                (1, "a", 0, 1),
                (2, "b", 0, 1),
                (None, "n", 0, 1),
                (1, "a", 1, -1),
                (3, "c", 1, 1),
                (None, "m", 1, 1),
                (2, "bb", 2, 1),
            ],
            SCHEMA,
        )
    )
    none = spark.createDataFrame([(99,)], "k long")
    assert warehouse.read(spark, [a, b, c], SCHEMA, keys=none, bucket_by=["k"]).count() == 0


def test_a_registered_batch_whose_files_are_gone_is_an_error(spark, warehouse: Warehouse) -> None:
    rec = BatchRecord("c", "t", "trace", (0,), "c/t/trace/t=0/missing", rows=1, bytes=1, id=5)
    with pytest.raises(FileNotFoundError, match="registered but its directory"):
        warehouse.read(spark, [rec], SCHEMA)


def test_names_that_are_not_plain_directory_names_are_refused(warehouse: Warehouse) -> None:
    for bad in ("", "..", "a/b"):
        with pytest.raises(ValueError):
            warehouse.new_path("c", bad, "trace", (0,))
    with pytest.raises(ValueError):
        warehouse.new_path("c", "n", "bogus", (0,))


def test_catalog_for_warehouse_lives_beside_the_batches(warehouse_path: Path) -> None:
    cat = Catalog.for_warehouse(warehouse_path)
    assert cat.engine.url.database == str(warehouse_path.resolve() / "catalog.db")
    cat.close()
