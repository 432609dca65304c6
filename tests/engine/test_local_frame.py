"""A local frame over an Arrow table derives what it can in Arrow, with DuckDB's answer.

``LocalFrame`` skips the DuckDB query for a pick, rename, exact cast, typed literal or
``distinct`` of an Arrow table. Each case here is computed both ways, the shortcut and
the same frame's query run by DuckDB, and must agree in rows and types.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dbspark.engine.local import frame as F
from dbspark.engine.local.frame import LocalFrame, LocalSession

SMALL_INTS = st.one_of(st.none(), st.integers(-3, 3))
TEXT = st.one_of(st.none(), st.sampled_from(["a", "b", "", "ß"]))
ROWS = st.lists(st.tuples(SMALL_INTS, TEXT, st.booleans()), max_size=12)


@pytest.fixture(scope="module")
def session() -> Any:
    session = LocalSession()
    yield session
    session.close()


def _table(rows: list[tuple]) -> pa.Table:
    columns = list(zip(*rows, strict=True)) if rows else [(), (), ()]
    return pa.table(
        {
            "k": pa.array(list(columns[0]), pa.int32()),
            "s": pa.array(list(columns[1]), pa.string()),
            "b": pa.array(list(columns[2]), pa.bool_()),
        }
    )


def _both_ways(frame: LocalFrame) -> tuple[pa.Table, pa.Table]:
    """The frame's table as derived in Arrow, and its query's answer from DuckDB."""
    assert frame.table is not None, f"no Arrow shortcut for {frame.query()}"
    by_query = LocalFrame(frame.session, frame.source, frame.columns, frame.tables)
    return frame.table, by_query.toArrow()


def _same(shortcut: pa.Table, queried: pa.Table) -> None:
    assert shortcut.schema == queried.schema
    assert Counter(zip(*shortcut.to_pydict().values(), strict=True)) == Counter(
        zip(*queried.to_pydict().values(), strict=True)
    )


@settings(max_examples=25, deadline=None, derandomize=True)
@given(ROWS)
def test_picks_casts_and_literals_match_duckdb(session: LocalSession, rows: list[tuple]) -> None:
    frame = session.frame(_table(rows))
    derived = frame.select(
        F.col("k").cast("bigint").alias("k64"),  # an integer widened
        F.col("s").cast("string"),  # a cast to the type it has
        F.col("b").alias("flag"),
        F.lit(7).cast("bigint").alias("__epoch"),
        F.lit(None).cast("int").alias("nothing"),
        F.lit("x").cast("string").alias("tag"),
    )
    _same(*_both_ways(derived))
    _same(*_both_ways(frame.withColumn("__iter", F.lit(2).cast("int"))))
    _same(*_both_ways(frame.select("*", F.lit(True).cast("boolean").alias("t"))))


@settings(max_examples=25, deadline=None, derandomize=True)
@given(ROWS)
def test_distinct_matches_duckdb(session: LocalSession, rows: list[tuple]) -> None:
    frame = session.frame(_table(rows))
    _same(*_both_ways(frame.distinct()))
    _same(*_both_ways(frame.select("s", "k").distinct()))


def test_inexact_casts_and_floats_run_the_query(session: LocalSession) -> None:
    """A cast whose meaning Arrow and DuckDB could differ on, and a DISTINCT over
    floats (NaN, -0.0), are left to DuckDB."""
    table = pa.table({"k": pa.array([1, 2], pa.int64()), "v": pa.array([0.0, -0.0])})
    frame = session.frame(table)
    assert frame.select(F.col("k").cast("int")).table is None  # narrowing
    assert frame.select(F.col("v").cast("bigint")).table is None  # float to integer
    assert frame.select(F.lit(1.5).cast("bigint")).table is None
    assert frame.select(F.lit(2**40).cast("int")).table is None  # out of range
    values = frame.select("v").distinct()
    assert values.table is None
    assert values.toArrow().num_rows == 1  # 0.0 = -0.0 in SQL
