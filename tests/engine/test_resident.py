"""Resident files: a key's rows found by the index equal a filter of the whole file.

The index is the fast path of every key lookup of a long-lived engine, so each case is
checked against the plain answer (Arrow's ``is_in`` over the whole table): sorted and
unsorted files, NULL keys on either side, duplicate values, every searchable type, and
the types that fall back to a hash match. The store's budget and least-recently-used
order are checked too, and the engine-level tests (``test_spark_properties.py``, the
``local`` tier) run every operator through it against the reference engine.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dbspark.engine.local.resident import (
    KeyProbe,
    ResidentFile,
    ResidentFiles,
    default_resident_bytes,
)


def expected_rows(table: pa.Table, column: str, wanted: pa.Array) -> pa.Table:
    values = table.column(column)
    return table.filter(pc.is_in(values, value_set=wanted.cast(values.type), skip_nulls=False))


@settings(max_examples=150, deadline=None)
@given(
    values=st.lists(st.one_of(st.none(), st.integers(-20, 20)), max_size=60),
    wanted=st.lists(st.one_of(st.none(), st.integers(-25, 25)), max_size=12),
    presorted=st.booleans(),
    distinct=st.booleans(),
)
def test_integer_index_finds_exactly_the_rows_of_a_filter(
    values: list, wanted: list, presorted: bool, distinct: bool
) -> None:
    """Also with a probe said to hold each key once, whose codes are sorted, not
    deduplicated."""
    if presorted:
        values = sorted(v for v in values if v is not None) + [None] * values.count(None)
    if distinct:
        wanted = list(dict.fromkeys(wanted))
    table = pa.table({"k": pa.array(values, pa.int64()), "row": pa.array(range(len(values)))})
    # Another width: cast to the column's.
    probe = KeyProbe(pa.array(wanted, pa.int32()), distinct=distinct)
    got = ResidentFile(table).rows_with("k", probe)
    assert got.to_pylist() == expected_rows(table, "k", pa.array(wanted, pa.int64())).to_pylist()


@pytest.mark.parametrize(
    ("kind", "values", "wanted"),
    [
        (pa.date32(), [dt.date(2026, 1, d) for d in (5, 1, 3, 3)], [dt.date(2026, 1, 3)]),
        (
            pa.timestamp("us", tz="UTC"),
            [dt.datetime(2026, 1, 1, h, tzinfo=dt.UTC) for h in (0, 9, 4)],
            [dt.datetime(2026, 1, 1, 9, tzinfo=dt.UTC), dt.datetime(2027, 1, 1, tzinfo=dt.UTC)],
        ),
        (pa.string(), ["b", None, "a", "b"], ["b", None]),
        (pa.decimal128(10, 2), [Decimal("1.50"), Decimal("2.00")], [Decimal("2.00")]),
        (pa.float64(), [1.5, float("nan"), -2.0], [float("nan"), 1.5]),
    ],
    ids=["date", "timestamp", "string", "decimal", "double"],
)
def test_every_key_type_is_found(kind: pa.DataType, values: list, wanted: list) -> None:
    table = pa.table({"k": pa.array(values, kind), "row": pa.array(range(len(values)))})
    got = ResidentFile(table).rows_with("k", KeyProbe(pa.array(wanted, kind)))
    expected = expected_rows(table, "k", pa.array(wanted, kind))
    assert got.column("row").to_pylist() == expected.column("row").to_pylist()  # NaN != NaN
    assert got.num_rows > 0


def test_a_file_of_many_chunks_is_searched_as_one() -> None:
    chunks = [pa.table({"k": pa.array(np.arange(i * 100, (i + 1) * 100))}) for i in range(5)]
    table = pa.concat_tables(chunks)
    assert table.column("k").num_chunks == 5
    resident = ResidentFile(table)
    got = resident.rows_with("k", KeyProbe(pa.array([0, 199, 499, 500])))
    assert got.column("k").to_pylist() == [0, 199, 499]


ORIGINS = st.one_of(st.none(), st.sampled_from(["EWR", "JFK", "LGA", "ß"]))
HOURS = st.one_of(st.none(), st.integers(0, 5))
KEY_PAIRS = st.lists(st.tuples(ORIGINS, HOURS), max_size=40)


@settings(max_examples=150, deadline=None)
@given(
    stored=KEY_PAIRS,
    wanted=st.lists(st.tuples(ORIGINS, HOURS), max_size=10),
    distinct=st.booleans(),
)
def test_a_composite_index_finds_exactly_the_rows_of_every_key_column(
    stored: list, wanted: list, distinct: bool
) -> None:
    """A key that leads with a column of few values (``origin``) is matched on all its
    columns at once, NULL equal to NULL, with nothing left for the caller to check."""
    if distinct:
        wanted = list(dict.fromkeys(wanted))
    origins, hours = (list(c) for c in zip(*stored, strict=True)) if stored else ([], [])
    table = pa.table(
        {
            "origin": pa.array(origins, pa.string()),
            "hour": pa.array(hours, pa.int64()),
            "row": pa.array(range(len(stored))),
        }
    )
    w_origins, w_hours = (list(c) for c in zip(*wanted, strict=True)) if wanted else ([], [])
    probe = KeyProbe(
        pa.array(w_origins, pa.string()), pa.array(w_hours, pa.int32()), distinct=distinct
    )
    resident = ResidentFile(table)
    got = resident.rows_with(("origin", "hour"), probe)
    assert resident.covers(("origin", "hour"))
    expected = [i for i, key in enumerate(stored) if key in set(wanted)]
    assert got.column("row").to_pylist() == expected


def test_a_float_key_column_is_left_to_the_caller() -> None:
    """Codes stop at a float column (NaN, -0.0): the index covers the columns before it,
    and the rows it finds hold every match."""
    table = pa.table({"k": pa.array([1, 1, 2, 2]), "v": pa.array([0.0, 1.5, 0.0, float("nan")])})
    resident = ResidentFile(table)
    assert not resident.covers(("k", "v")) and resident.covers("k")
    got = resident.rows_with(("k", "v"), KeyProbe(pa.array([2]), pa.array([-0.0])))
    assert got.column("k").to_pylist() == [2, 2]


@settings(max_examples=100, deadline=None)
@given(
    keys=st.lists(st.integers(-50, 50), unique=True, max_size=40),
    wanted=st.lists(st.one_of(st.none(), st.integers(-60, 60)), max_size=12),
    shuffle=st.randoms(),
)
def test_a_file_of_unique_keys_is_searched_once_per_probe(
    keys: list, wanted: list, shuffle: Any
) -> None:
    """Where no key occurs twice (one search per probe key), every match and no other row
    is found, in file order, whatever the file's order, the empty file included."""
    shuffle.shuffle(keys)
    table = pa.table({"k": pa.array(keys, pa.int64()), "row": pa.array(range(len(keys)))})
    resident = ResidentFile(table)
    index = resident.index("k")
    assert index is not None and index.unique
    got = resident.rows_with("k", KeyProbe(pa.array(wanted, pa.int64())))
    assert got.to_pylist() == expected_rows(table, "k", pa.array(wanted, pa.int64())).to_pylist()


def test_probe_values_outside_an_integer_range_find_nothing() -> None:
    """A probe far outside the file's range (where subtracting the minimum would wrap)
    matches no row."""
    table = pa.table({"k": pa.array([10, 11, None], pa.int64())})
    resident = ResidentFile(table)
    probe = KeyProbe(pa.array([-(2**63), 2**63 - 1, 9, 12], pa.int64()))
    assert resident.rows_with("k", probe).num_rows == 0
    assert resident.rows_with("k", KeyProbe(pa.array([None, 11], pa.int64()))).num_rows == 2


def test_the_store_keeps_within_its_budget_least_recently_used_first(tmp_path: Path) -> None:
    paths = []
    for i in range(3):
        path = tmp_path / f"f{i}.parquet"
        pq.write_table(pa.table({"k": pa.array(np.arange(1000) + i * 1000)}), path)
        paths.append(str(path))
    one = ResidentFile(pq.read_table(paths[0])).nbytes
    store = ResidentFiles(budget=2 * one + one // 2)
    store.load(paths[0])
    store.load(paths[1])
    assert store.get(paths[0]) is not None  # now the most recently used
    store.load(paths[2])
    assert paths[0] in store and paths[2] in store and paths[1] not in store
    assert store.nbytes <= store.budget
    assert store.loads == 3


def test_a_store_without_budget_keeps_nothing(tmp_path: Path) -> None:
    path = tmp_path / "f.parquet"
    pq.write_table(pa.table({"k": [1, 2]}), path)
    store = ResidentFiles(budget=0)
    assert not store.enabled
    assert store.keep(str(path), pq.read_table(path)) is None
    assert len(store) == 0


def test_the_budget_setting_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DBSPARK_RESIDENT_BYTES", "1024")
    assert default_resident_bytes() == 1024
    monkeypatch.setenv("DBSPARK_RESIDENT_BYTES", "lots")
    with pytest.raises(ValueError, match="DBSPARK_RESIDENT_BYTES must be a whole number"):
        default_resident_bytes()
    monkeypatch.setenv("DBSPARK_RESIDENT_BYTES", "-1")
    with pytest.raises(ValueError, match="0 or more"):
        default_resident_bytes()
