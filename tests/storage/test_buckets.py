"""``storage/buckets.py`` computes Spark's ``xxhash64`` and bucket ids without Spark.

A bucketed batch written by one tier is read by the other, so the bucket a key lands in
must be the same number whoever computes it. Random rows of every column type (NULLs,
NaN, -0.0, non-ASCII text, arrays with NULL elements, dates, instants, narrow and wide
decimals) are hashed by Spark and by NumPy.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F

from dbspark.storage.buckets import bucket_ids, xxhash64
from dbspark.storage.warehouse import bucket_expr

ROW = st.tuples(
    st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)),
    st.one_of(st.none(), st.text(max_size=12)),
    st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True)),
    st.one_of(st.none(), st.booleans()),
    st.one_of(st.none(), st.lists(st.one_of(st.none(), st.integers(-50, 50)), max_size=4)),
    st.one_of(st.none(), st.integers(-(2**31), 2**31 - 1)),
    st.one_of(st.none(), st.dates()),
    st.one_of(
        st.none(),
        st.datetimes(dt.datetime(1900, 1, 1), dt.datetime(2200, 1, 1), timezones=st.just(dt.UTC)),
    ),
    st.one_of(st.none(), st.decimals(-(10**8), 10**8, places=2)),
    st.one_of(st.none(), st.decimals(-(10**25), 10**25, places=5)),
)
SCHEMA = (
    "a bigint, s string, d double, b boolean, xs array<bigint>, i int, day date, "
    "at timestamp, m decimal(10,2), w decimal(30,5)"
)
ARROW = {
    "a": pa.int64(),
    "s": pa.string(),
    "d": pa.float64(),
    "b": pa.bool_(),
    "xs": pa.list_(pa.int64()),
    "i": pa.int32(),
    "day": pa.date32(),
    "at": pa.timestamp("us", tz="UTC"),
    "m": pa.decimal128(10, 2),
    "w": pa.decimal128(30, 5),
}
KEYS = [
    ["a"],
    ["s"],
    ["d"],
    ["b"],
    ["xs"],
    ["i"],
    ["a", "s"],
    ["s", "d", "b", "i"],
    ["day"],
    ["at"],
    ["m"],
    ["w"],
    ["day", "m", "w", "at"],
]


@settings(
    max_examples=3,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(st.lists(ROW, min_size=1, max_size=120))
def test_hash_and_buckets_are_sparks(spark: Any, rows: list[tuple]) -> None:
    rows = [
        *rows,
        (0, "", -0.0, False, [], 0, dt.date(1970, 1, 1), None, Decimal("0.00"), Decimal(0)),
        (1, "ß", float("nan"), True, [None, 3], -1, None, None, Decimal("-1.28"), Decimal(-128)),
    ]
    frame = spark.createDataFrame(rows, SCHEMA)
    columns = [F.xxhash64(*keys).alias(f"h{n}") for n, keys in enumerate(KEYS)]
    columns += [bucket_expr(keys, 16).alias(f"b{n}") for n, keys in enumerate(KEYS)]
    got = frame.select(*columns).collect()
    table = pa.table(
        {name: pa.array([r[i] for r in rows], kind) for i, (name, kind) in enumerate(ARROW.items())}
    )
    for n, keys in enumerate(KEYS):
        arrays = [table.column(k) for k in keys]
        assert list(xxhash64(arrays)) == [r[f"h{n}"] for r in got], keys
        assert list(bucket_ids(arrays, 16)) == [r[f"b{n}"] for r in got], keys


def test_a_sliced_decimal_column_hashes_as_its_rows() -> None:
    """Narrow decimals are hashed from the array's data buffer: a slice (an offset into
    it), a NULL slot and every Arrow decimal width give each row its own value's hash."""
    values = [Decimal("-12.34"), None, Decimal("99999999.99"), Decimal("0.01"), Decimal("-0.00")]
    whole = pa.array(values, pa.decimal128(10, 2))
    expected = [xxhash64([pa.array([v], pa.decimal128(10, 2))])[0] for v in values]
    assert list(xxhash64([whole.slice(2, 3)])) == expected[2:]
    for kind in (pa.decimal64(10, 2), pa.decimal256(10, 2)):
        assert list(xxhash64([pa.array(values, kind).slice(1)])) == expected[1:]


def test_strings_hash_as_xxh64_of_their_bytes_at_every_length() -> None:
    """Strings are hashed vectorised, rows of one byte length together: each equals the
    reference XXH64 of its UTF-8 bytes with its own seed, at lengths around every step
    of the algorithm (4- and 8-byte lanes, 32-byte stripes), in a slice, with NULLs."""
    import numpy as np
    import xxhash

    from dbspark.storage.buckets import _hash_column

    texts = [None, "", "ß", "中😀", *("x" * n for n in range(1, 80)), "a" * 33 + "é"]
    seeds = np.array([(7919 * i) ** 3 % 2**64 for i in range(len(texts))], dtype=np.uint64)
    for kind in (pa.string(), pa.large_string()):
        column = pa.array(["pad", *texts], kind).slice(1)
        with np.errstate(over="ignore"):
            got = list(_hash_column(column, seeds))
        want = [
            int(seed) if t is None else xxhash.xxh64_intdigest(t.encode(), int(seed))
            for t, seed in zip(texts, seeds, strict=True)
        ]
        assert got == want
