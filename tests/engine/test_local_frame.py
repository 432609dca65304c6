"""A local frame over an Arrow table derives what it can in Arrow, with DuckDB's answer.

``LocalFrame`` skips the DuckDB query for a pick, rename, exact cast, typed literal,
``distinct``, filter, grouped or global aggregate and union of Arrow tables
(``engine/local/in_arrow.py``). Each case here is computed both ways, the shortcut and
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
    # repr: a struct's value is a dict, which cannot be counted as it stands
    assert Counter(map(repr, shortcut.to_pylist())) == Counter(map(repr, queried.to_pylist()))


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


WEIGHTS = st.one_of(st.none(), st.integers(-3, 3), st.sampled_from([2**40, -(2**40)]))
WEIGHTED = st.lists(st.tuples(SMALL_INTS, TEXT, WEIGHTS), max_size=14)


def _weighted(rows: list[tuple]) -> pa.Table:
    columns = list(zip(*rows, strict=True)) if rows else [(), (), ()]
    return pa.table(
        {
            "k": pa.array(list(columns[0]), pa.int32()),
            "s": pa.array(list(columns[1]), pa.string()),
            "w": pa.array(list(columns[2]), pa.int64()),
        }
    )


@settings(max_examples=40, deadline=None, derandomize=True)
@given(WEIGHTED)
def test_filters_match_duckdb(session: LocalSession, rows: list[tuple]) -> None:
    frame = session.frame(_weighted(rows))
    conditions = [
        F.col("k") > 0,
        (F.col("k") == 1) | F.col("s").isNull(),  # NULL OR TRUE is TRUE
        ~(F.col("s") == "a") & (F.col("w") != 0),  # NOT NULL is NULL: the row goes
        F.col("k").eqNullSafe(F.col("w")),
        (F.col("k") + 1) * 2 >= F.col("w"),
        F.col("s").isNotNull() & (F.col("s") < "b"),
    ]
    for condition in conditions:
        _same(*_both_ways(frame.where(condition)))


@settings(max_examples=40, deadline=None, derandomize=True)
@given(WEIGHTED)
def test_aggregates_and_cases_match_duckdb(session: LocalSession, rows: list[tuple]) -> None:
    frame = session.frame(_weighted(rows))
    flagged = F.when(F.col("w") > 0, F.lit(1)).when(F.col("w") < 0, -1).otherwise(F.lit(0))
    grouped = frame.groupBy("k", "s").agg(
        F.sum("w").cast("bigint").alias("total"),
        F.count("w").alias("n"),
        F.count(F.lit(1)).alias("rows"),
        F.max(flagged).alias("flag"),
        F.min("s").alias("least"),
        F.max(F.when(F.col("w") != 0, F.col("k"))).alias("top"),  # no ELSE: NULL
    )
    _same(*_both_ways(grouped))
    everything = frame.agg(
        F.sum("w").cast("bigint").alias("total"), F.max("k").alias("top"), F.count("s")
    )
    _same(*_both_ways(everything))  # one row, even over no rows
    _same(*_both_ways(frame.unionByName(frame.where(F.col("k") > 0))))


def test_what_arrow_could_get_wrong_runs_the_query(session: LocalSession) -> None:
    """An uncast sum (DuckDB's is a HUGEINT), a sum that could leave int64, float
    comparisons and an overflowing product are left to DuckDB."""
    table = pa.table(
        {"k": pa.array([1, 1], pa.int64()), "w": pa.array([2**62, 2**62]), "v": [0.0, -0.0]}
    )
    frame = session.frame(table)
    assert frame.groupBy("k").agg(F.sum("w").alias("t")).table is None
    assert frame.groupBy("k").agg(F.sum("w").cast("bigint").alias("t")).table is None
    assert frame.where(F.col("v") == 0.0).table is None
    assert frame.where(F.col("w") * 4 > 0).table is None  # overflows int64: DuckDB's call


@settings(max_examples=40, deadline=None, derandomize=True)
@given(WEIGHTED, WEIGHTED)
def test_joins_match_duckdb(session: LocalSession, left: list[tuple], right: list[tuple]) -> None:
    """Inner, left outer and semi-joins on plain and NULL-safe equalities (NULL keys on
    both sides, duplicates, an integer key of two widths), by name and by alias."""
    lhs = session.frame(_weighted(left)).select(
        F.col("k").alias("lk"), F.col("s").alias("ls"), F.col("w").alias("lw")
    )
    rhs = session.frame(_weighted(right))
    plain = F.col("lk") == F.col("w")  # int32 against int64
    both = (F.col("ls") == F.col("s")) & F.col("lk").eqNullSafe(F.col("k"))
    for condition in (plain, both):
        for how in ("inner", "left", "left_semi"):
            _same(*_both_ways(lhs.join(rhs, condition, how)))
    keys = rhs.select("k", "s").distinct()
    aliased = (
        session.frame(_weighted(left))
        .alias("__data")
        .join(
            keys.alias("__keys"),
            F.col("__data.k").eqNullSafe(F.col("__keys.k"))
            & F.col("__data.s").eqNullSafe(F.col("__keys.s")),
            "left_semi",
        )
    )
    _same(*_both_ways(aliased))


@settings(max_examples=25, deadline=None, derandomize=True)
@given(WEIGHTED)
def test_exploded_corners_match_duckdb(session: LocalSession, rows: list[tuple]) -> None:
    """The kernels' stacking: a row per corner from ``explode(array(struct(...)))``, its
    fields read back, and a sign picked per corner with ``element_at``."""
    frame = session.frame(_weighted(rows))
    stacked = frame.select(
        "k",
        F.explode(
            F.array(
                F.struct(F.lit(0).alias("corner"), F.col("w").alias("w")),
                F.struct(F.lit(1).alias("corner"), (F.col("w") * 2).alias("w")),
            )
        ).alias("__c"),
    )
    _same(*_both_ways(stacked))
    fields = stacked.select("k", F.col("__c.corner").alias("corner"), F.col("__c.w").alias("w"))
    _same(*_both_ways(fields))
    signs = F.array(F.lit(1), F.lit(-1))
    signed = fields.select("k", (F.col("w") * F.element_at(signs, F.col("corner") + 1)).alias("w"))
    _same(*_both_ways(signed))
    _same(*_both_ways(frame.select("*", F.explode(F.array(F.lit(0), F.lit(1))).alias("i"))))
