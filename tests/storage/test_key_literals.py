"""Key-pruned Spark reads by a literal IN list: the same rows as the semi-join on ``<=>``.

Keys the driver holds (``KeySet.table``) filter a read as SQL literals instead of a
broadcast semi-join. Every literal type is written as Spark SQL text, so each is checked
here against the semi-join on the same batch: NULL keys, quotes, backslashes, ``${...}``
(which Spark's parser would substitute), non-ASCII text, instants, dates and decimals,
on one key column and on several.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
from pyspark.sql.types import (
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from dbspark.storage import Warehouse
from dbspark.storage.warehouse import KeySet, key_predicate

SCHEMA = StructType(
    [
        StructField("b", LongType(), True),
        StructField("s", StringType(), True),
        StructField("d", DateType(), True),
        StructField("ts", TimestampType(), True),
        StructField("m", DecimalType(12, 2), True),
        StructField("f", BooleanType(), True),
        StructField("i", IntegerType(), True),
        StructField("x", DoubleType(), True),
        StructField("v", LongType(), True),
        StructField("__w", LongType(), False),
    ]
)

UTC = dt.UTC
STRINGS = ["plain", "it's", "back\\slash", "${env:HOME}", "${spark.app.name}", "é😀", "", "a\nb"]


def _rows() -> list[tuple]:
    rows = []
    for n in range(40):
        rows.append(
            (
                None if n % 11 == 0 else n % 7,
                None if n % 13 == 0 else STRINGS[n % len(STRINGS)],
                None if n % 9 == 0 else dt.date(1999 + n % 3, 1 + n % 12, 1 + n % 28),
                None
                if n % 10 == 0
                else dt.datetime(2026, 3, 29, n % 4, 30, 0, 123456 * (n % 2), tzinfo=UTC),
                None if n % 8 == 0 else Decimal(n % 5) * Decimal("10.25") - Decimal("20.00"),
                None if n % 6 == 0 else n % 2 == 0,
                None if n % 12 == 0 else -(n % 3),
                float(n % 4) if n % 4 else (-0.0 if n % 8 else float("nan")),
                n,
                1,
            )
        )
    return rows


KEY_SETS = [["b"], ["s"], ["d"], ["ts"], ["m"], ["f"], ["i"], ["s", "d", "ts", "m"], ["b", "i"]]


@pytest.mark.parametrize("key_cols", KEY_SETS, ids=["+".join(k) for k in KEY_SETS])
def test_literal_keys_read_what_the_semi_join_reads(
    spark, warehouse: Warehouse, key_cols: list[str]
) -> None:
    rows = _rows()
    batch = spark.createDataFrame(rows, SCHEMA)
    record = warehouse.write(batch, "c", "t", "trace", (0,), bucket_by=key_cols, buckets=4)
    assert record is not None
    # Every third row's key, NULLs among them, and a key no row has.
    wanted = spark.createDataFrame(rows[::3], SCHEMA).select(*key_cols)
    gathered = warehouse.gather_keys(wanted)
    assert gathered.table is not None

    def read(keys: KeySet) -> list[tuple]:
        frame = warehouse.read(spark, [record], SCHEMA, keys=keys, bucket_by=key_cols)
        return sorted((r["v"] for r in frame.collect()), key=repr)

    literal = read(gathered)
    semi = read(KeySet(gathered.frame, gathered.buckets, gathered.rows))  # no table: semi-join
    assert literal == semi
    assert len(literal) >= len(rows) // 3
    plan = warehouse.read(spark, [record], SCHEMA, keys=gathered, bucket_by=key_cols)
    assert "Join" not in plan._jdf.queryExecution().executedPlan().toString()


def test_floats_and_too_many_keys_keep_the_semi_join(spark, warehouse: Warehouse) -> None:
    table = spark.createDataFrame([(1.0,), (-0.0,), (float("nan"),)], "x double").toArrow()
    assert key_predicate(table, ["x"], SCHEMA) is None
    many = spark.range(5000).toArrow().rename_columns(["b"])
    assert key_predicate(many, ["b"], SCHEMA) is None
    assert key_predicate(many.slice(0, 10), ["b"], SCHEMA) is not None
