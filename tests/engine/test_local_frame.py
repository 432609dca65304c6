"""A local frame over an Arrow table derives what it can in Arrow, with DuckDB's answer.

``LocalFrame`` skips the DuckDB query for a pick, rename, exact cast, typed literal,
``distinct``, filter, grouped or global aggregate, union, equi-join and the kernels'
corner stacking of Arrow tables (``engine/local/in_arrow.py``). Each pipeline here is
built twice: over frames that hold their Arrow tables (every step Arrow can take is
taken there), and over frames that only name the same tables (every step is DuckDB
SQL). The two must agree in rows and types, and the first must not have run a query.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dbspark.engine.local import frame as F
from dbspark.engine.local import in_arrow
from dbspark.engine.local.frame import LocalFrame, LocalSession

SMALL_INTS = st.one_of(st.none(), st.integers(-3, 3))
TEXT = st.one_of(st.none(), st.sampled_from(["a", "b", "", "ß"]))
ROWS = st.lists(st.tuples(SMALL_INTS, TEXT, st.booleans()), max_size=12)
WEIGHTS = st.one_of(st.none(), st.integers(-3, 3), st.sampled_from([2**40, -(2**40)]))
WEIGHTED = st.lists(st.tuples(SMALL_INTS, TEXT, WEIGHTS), max_size=14)


@pytest.fixture(scope="module")
def session() -> Any:
    session = LocalSession()
    yield session
    session.close()


def _table(rows: list[tuple], third: tuple[str, pa.DataType]) -> pa.Table:
    """Columns ``k`` (int32) and ``s`` (string), then ``third``."""
    columns = list(zip(*rows, strict=True)) if rows else [(), (), ()]
    kinds = [("k", pa.int32()), ("s", pa.string()), third]
    return pa.table(
        {
            name: pa.array(list(values), kind)
            for (name, kind), values in zip(kinds, columns, strict=True)
        }
    )


def _flagged(rows: list[tuple]) -> pa.Table:
    return _table(rows, ("b", pa.bool_()))


def _weighted(rows: list[tuple]) -> pa.Table:
    return _table(rows, ("w", pa.int64()))


def _query_only(session: LocalSession, table: pa.Table) -> LocalFrame:
    """A frame that names ``table`` for DuckDB but does not hold it: nothing derived
    from it is computed in Arrow."""
    frame = session.frame(table)
    frame.table = None
    return frame


def _same(session: LocalSession, build: Callable[..., LocalFrame], *tables: pa.Table) -> None:
    """``build`` over the tables computed in Arrow equals it computed by DuckDB."""
    shortcut = build(*(session.frame(t) for t in tables))
    assert shortcut.table is not None, f"no Arrow shortcut for {shortcut.query()}"
    queried = build(*(_query_only(session, t) for t in tables))
    assert queried.table is None
    got, want = shortcut.table, queried.toArrow()
    assert got.schema == want.schema
    # repr: a struct's value is a dict, which cannot be counted as it stands
    assert Counter(map(repr, got.to_pylist())) == Counter(map(repr, want.to_pylist()))


@settings(max_examples=25, deadline=None, derandomize=True)
@given(ROWS)
def test_picks_casts_and_literals_match_duckdb(session: LocalSession, rows: list[tuple]) -> None:
    table = _flagged(rows)
    _same(
        session,
        lambda frame: frame.select(
            F.col("k").cast("bigint").alias("k64"),  # an integer widened
            F.col("s").cast("string"),  # a cast to the type it has
            F.col("b").alias("flag"),
            F.lit(7).cast("bigint").alias("__epoch"),
            F.lit(None).cast("int").alias("nothing"),
            F.lit("x").cast("string").alias("tag"),
        ),
        table,
    )
    _same(session, lambda frame: frame.withColumn("__iter", F.lit(2).cast("int")), table)
    _same(session, lambda frame: frame.select("*", F.lit(True).cast("boolean").alias("t")), table)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(ROWS)
def test_distinct_matches_duckdb(session: LocalSession, rows: list[tuple]) -> None:
    table = _flagged(rows)
    _same(session, lambda frame: frame.distinct(), table)
    _same(session, lambda frame: frame.select("s", "k").distinct(), table)


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


@settings(max_examples=40, deadline=None, derandomize=True)
@given(WEIGHTED)
def test_filters_match_duckdb(session: LocalSession, rows: list[tuple]) -> None:
    conditions = [
        lambda: F.col("k") > 0,
        lambda: (F.col("k") == 1) | F.col("s").isNull(),  # NULL OR TRUE is TRUE
        lambda: ~(F.col("s") == "a") & (F.col("w") != 0),  # NOT NULL is NULL: the row goes
        lambda: ~((F.col("k") > 0) & (F.col("s") == "a")),  # NULL AND FALSE is FALSE
        lambda: F.col("k").eqNullSafe(F.col("w")),
        lambda: (F.col("k") + 1) * 2 >= F.col("w"),
        lambda: F.col("s").isNotNull() & (F.col("s") < "b"),
    ]
    for condition in conditions:
        _same(session, lambda frame, c=condition: frame.where(c()), _weighted(rows))


DAYS = st.one_of(st.none(), st.dates(dt.date(1992, 1, 1), dt.date(1999, 12, 31)))
PRICES = st.one_of(st.none(), st.decimals(-100, 100, places=2))
INSTANTS = st.one_of(
    st.none(),
    st.datetimes(dt.datetime(1990, 1, 1), dt.datetime(2030, 1, 1)).map(
        lambda d: d.replace(tzinfo=dt.UTC)
    ),
)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(st.lists(st.tuples(DAYS, PRICES, PRICES, INSTANTS), max_size=12))
def test_typed_columns_compare_and_cast_to_their_own_type_in_arrow(
    session: LocalSession, rows: list[tuple]
) -> None:
    """DATE, TIMESTAMP and DECIMAL columns (decimals of one type: Arrow compares their
    unscaled integers) are compared, tested NULL-safe and cast to the type they have in
    Arrow, with DuckDB's answer: what the SQL front end's filters and an upsert's check
    of a TPC-H batch ask of them."""
    kinds = [
        ("d", pa.date32()),
        ("p", pa.decimal128(15, 2)),
        ("q", pa.decimal128(15, 2)),
        ("t", pa.timestamp("us", tz="UTC")),
    ]
    columns = list(zip(*rows, strict=True)) if rows else [(), (), (), ()]
    table = pa.table({n: pa.array(list(v), k) for (n, k), v in zip(kinds, columns, strict=True)})
    # A DATE literal as the circuit's compilers give it (SQL text, Arrow scalar).
    day = F.LocalColumn(
        "CAST('1995-03-15' AS DATE)",
        arrow=in_arrow.constant(pa.scalar(dt.date(1995, 3, 15), pa.date32())),
    )
    conditions = [
        lambda: F.col("d") < day,
        lambda: F.col("d").cast("date") >= day,
        lambda: F.col("p") < F.col("q"),
        lambda: F.col("p").eqNullSafe(F.col("q")),
        lambda: ~(F.col("p") == F.col("q")) | F.col("d").isNull(),
        lambda: F.col("t").cast("timestamp") <= F.col("t"),
    ]
    for condition in conditions:
        _same(session, lambda frame, c=condition: frame.where(c()), table)
    _same(
        session,
        lambda frame: frame.select(
            F.col("d").cast("date").alias("d"),
            F.col("p").cast("decimal(15,2)").alias("p"),
            F.col("t").cast("timestamp").alias("t"),
        ),
        table,
    )
    # To a decimal type that holds every value as it is: exact, so Arrow's.
    _same(
        session,
        lambda frame: frame.select(
            F.col("p").cast("decimal(16,2)").alias("wider"),
            F.col("q").cast("decimal(20,5)").alias("finer"),
        ),
        table,
    )
    frame = session.frame(table)
    assert frame.select(F.col("p").cast("decimal(15,1)")).table is None  # rounds: DuckDB's
    mixed = session.frame(
        pa.table(
            {
                "p": pa.array([Decimal("1.50")], pa.decimal128(15, 2)),
                "r": pa.array([Decimal("1.5")], pa.decimal128(15, 1)),
            }
        )
    )
    assert mixed.where(F.col("p") == F.col("r")).table is None  # two scales: DuckDB's


WIDE_PRICES = st.one_of(
    PRICES,
    st.sampled_from([Decimal("9999999999999.99"), Decimal("-9999999999999.99")]),
)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    st.lists(
        st.tuples(st.integers(0, 3), WIDE_PRICES, WIDE_PRICES, st.sampled_from([1, -1, 2, 10**12])),
        max_size=12,
    )
)
def test_decimal_arithmetic_and_sums_match_duckdb(session: LocalSession, rows: list[tuple]) -> None:
    """Decimal products and sums (an aggregate's weighted total of TPC-H's revenue) in
    Arrow, exact, with DuckDB's types; where DuckDB's own type overflows (it raises),
    the step is left to DuckDB."""
    kinds = [
        ("k", pa.int64()),
        ("p", pa.decimal128(15, 2)),
        ("q", pa.decimal128(15, 2)),
        ("w", pa.int64()),
    ]
    columns = list(zip(*rows, strict=True)) if rows else [(), (), (), ()]
    table = pa.table({n: pa.array(list(v), k) for (n, k), v in zip(kinds, columns, strict=True)})
    small = table.filter(pa.compute.less(pa.compute.abs(table.column("w")), 100))

    def totals(frame: LocalFrame) -> LocalFrame:
        value = F.col("p") * F.col("q")
        weighted = F.when(value.isNotNull(), value * F.col("w"))
        return frame.groupBy("k").agg(
            F.sum(weighted).cast("decimal(38,4)").alias("total"),
            F.sum("p").cast("decimal(38,2)").alias("plain"),
        )

    def projected(frame: LocalFrame) -> LocalFrame:
        return frame.select(
            (F.col("p") + F.col("q")).alias("s"),
            (F.col("p") - F.col("w")).alias("d"),
            (F.col("p") * F.col("w")).alias("m"),
        )

    for build in (totals, projected):
        shortcut = build(session.frame(small))
        queried = build(_query_only(session, small))
        try:
            want = queried.toArrow()
        except Exception:  # DuckDB's product type overflows: then Arrow must not answer
            assert shortcut.table is None
            continue
        _same(session, build, small)
        assert shortcut.table.schema == want.schema
    # A product of two 13-digit prices leaves DuckDB's DECIMAL(18,4): its error, not Arrow's.
    big = pa.table(
        {
            n: pa.array([v], k)
            for (n, k), v in zip(kinds, (0, *[Decimal("9999999999999.99")] * 2, 1), strict=True)
        }
    )
    assert session.frame(big).select((F.col("p") * F.col("q")).alias("x")).table is None


@settings(max_examples=40, deadline=None, derandomize=True)
@given(WEIGHTED)
def test_aggregates_and_cases_match_duckdb(session: LocalSession, rows: list[tuple]) -> None:
    table = _weighted(rows)

    def grouped(frame: LocalFrame) -> LocalFrame:
        flagged = F.when(F.col("w") > 0, F.lit(1)).when(F.col("w") < 0, -1).otherwise(F.lit(0))
        return frame.groupBy("k", "s").agg(
            F.sum("w").cast("bigint").alias("total"),
            F.count("w").alias("n"),
            F.count(F.lit(1)).alias("rows"),
            F.max(flagged).alias("flag"),
            F.min("s").alias("least"),
            F.max(F.when(F.col("w") != 0, F.col("k"))).alias("top"),  # no ELSE: NULL
        )

    _same(session, grouped, table)
    _same(
        session,
        lambda frame: frame.agg(
            F.sum("w").cast("bigint").alias("total"), F.max("k").alias("top"), F.count("s")
        ),
        table,
    )  # one row, even over no rows
    _same(session, lambda frame: frame.unionByName(frame.where(F.col("k") > 0)), table)


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

    def renamed(frame: LocalFrame) -> LocalFrame:
        return frame.select(F.col("k").alias("lk"), F.col("s").alias("ls"), F.col("w").alias("lw"))

    conditions = [
        lambda: F.col("lk") == F.col("w"),  # int32 against int64
        lambda: (F.col("ls") == F.col("s")) & F.col("lk").eqNullSafe(F.col("k")),
    ]
    for condition in conditions:
        for how in ("inner", "left", "left_semi"):
            _same(
                session,
                lambda lhs, rhs, c=condition, h=how: renamed(lhs).join(rhs, c(), h),
                _weighted(left),
                _weighted(right),
            )

    def aliased(lhs: LocalFrame, rhs: LocalFrame) -> LocalFrame:
        keys = rhs.select("k", "s").distinct()
        return lhs.alias("__data").join(
            keys.alias("__keys"),
            F.col("__data.k").eqNullSafe(F.col("__keys.k"))
            & F.col("__data.s").eqNullSafe(F.col("__keys.s")),
            "left_semi",
        )

    _same(session, aliased, _weighted(left), _weighted(right))


@settings(max_examples=25, deadline=None, derandomize=True)
@given(WEIGHTED)
def test_exploded_corners_match_duckdb(session: LocalSession, rows: list[tuple]) -> None:
    """The kernels' stacking: a row per corner from ``explode(array(struct(...)))``, its
    fields read back, and a sign picked per corner with ``element_at``."""
    table = _weighted(rows)

    def stacked(frame: LocalFrame) -> LocalFrame:
        corners = F.array(
            F.struct(F.lit(0).alias("corner"), F.col("w").alias("w")),
            F.struct(F.lit(1).alias("corner"), (F.col("w") * 2).alias("w")),
        )
        return frame.select("k", F.explode(corners).alias("__c"))

    def fields(frame: LocalFrame) -> LocalFrame:
        return stacked(frame).select(
            "k", F.col("__c.corner").alias("corner"), F.col("__c.w").alias("w")
        )

    def signed(frame: LocalFrame) -> LocalFrame:
        sign = F.element_at(F.array(F.lit(1), F.lit(-1)), F.col("corner") + 1)
        return fields(frame).select("k", (F.col("w") * sign).alias("w"))

    for build in (stacked, fields, signed):
        _same(session, build, table)
    _same(
        session,
        lambda frame: frame.select("*", F.explode(F.array(F.lit(0), F.lit(1))).alias("i")),
        table,
    )


@st.composite
def _ranked_rows(draw: Any) -> list[tuple]:
    """Rows (k, s, w) whose marks ``w`` never tie within a partition (k, s), so the
    numbering is determined; at most one NULL mark per partition."""
    rows = draw(st.lists(st.tuples(SMALL_INTS, TEXT), max_size=14))
    marks = draw(st.permutations(range(len(rows))))
    seen_null: set[tuple] = set()
    out = []
    for (k, s), mark in zip(rows, marks, strict=True):
        null = draw(st.booleans()) and (k, s) not in seen_null
        if null:
            seen_null.add((k, s))
        out.append((k, s, None if null else mark - 5))
    return out


@settings(max_examples=40, deadline=None, derandomize=True)
@given(_ranked_rows())
def test_row_numbers_match_duckdb(session: LocalSession, rows: list[tuple]) -> None:
    """The upsert's freshest row per key: ``row_number()`` over a partition ordered by a
    mark descending with NULLs last, then rank 1, with the tombstone's ``coalesce``."""
    table = _weighted(rows)

    def numbered(frame: LocalFrame, *order: Any) -> LocalFrame:
        window = F.Window.partitionBy("k", "s").orderBy(*order)
        return frame.withColumn("r", F.row_number().over(window))

    _same(session, lambda frame: numbered(frame, F.col("w").desc_nulls_last()), table)
    _same(session, lambda frame: numbered(frame, F.col("w")), table)
    _same(
        session,
        lambda frame: (
            numbered(frame, F.col("w").desc_nulls_last())
            .where(F.col("r") == 1)
            .drop("r")
            .withColumn("t", F.coalesce(F.col("k") == F.lit(1), F.lit(False)))
        ),
        table,
    )


def test_windows_over_floats_run_the_query(session: LocalSession) -> None:
    table = pa.table({"k": pa.array([1, 1], pa.int64()), "v": [0.0, float("nan")]})
    window = F.Window.partitionBy("k").orderBy(F.col("v").desc_nulls_last())
    assert session.frame(table).withColumn("r", F.row_number().over(window)).table is None


FLOATS = st.one_of(
    st.none(), st.sampled_from([1.5, 2.0, 0.0, -0.0, float("nan"), float("inf"), -1e300])
)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.lists(st.tuples(SMALL_INTS, TEXT, FLOATS), max_size=12))
def test_doubles_group_in_arrow_only_without_nan_or_negative_zero(
    session: LocalSession, rows: list[tuple]
) -> None:
    """Grouping by a double, DISTINCT over one and its max/min: in Arrow only when no
    value is NaN (SQL's NaN equals itself and orders above all) or -0.0 (SQL's equals
    0.0); then the answer is DuckDB's, else the query runs."""
    table = _table(rows, ("v", pa.float64()))
    plain = not any(
        v is not None and (v != v or (v == 0.0 and str(v).startswith("-"))) for *_, v in rows
    )
    builds = [
        lambda frame: frame.distinct(),
        lambda frame: frame.groupBy("v").agg(F.count("k").alias("n")),
        lambda frame: frame.groupBy("k").agg(F.max("v").alias("hi"), F.min("v").alias("lo")),
        lambda frame: frame.agg(F.max("v").alias("hi")),
    ]
    for build in builds:
        if plain:
            _same(session, build, table)
        else:
            assert build(session.frame(table)).table is None
