"""Circuit expressions computed in Arrow (engine/local/compile_arrow.py) against DuckDB.

Every compiled local column carries its SQL and, where Arrow's answer is certain, an
Arrow computation. Random expressions over random tables (NULLs, extremes, every type
the local tier stores) are run both ways: the Arrow computation, when it gives an
answer, must equal DuckDB's for the column's own SQL, value for value and type for
type. A few shapes must be computed in Arrow (the benchmarks' filters and projections)
and a few must be left to DuckDB.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import duckdb
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dbspark.circuit.expressions import Expr, coalesce, col, if_else, lit
from dbspark.core.types import Schema
from dbspark.engine.local.compile import compile_predicate, compile_typed, register

SCHEMA = Schema.of(
    {"a": "bigint", "b": "bigint", "s": "string", "f": "boolean", "d": "date", "x": "double"},
    what="test",
)
INTS = st.one_of(
    st.none(), st.integers(-5, 5), st.sampled_from([2**62, -(2**63), 2**63 - 1, 2**31])
)
DAYS = st.one_of(st.none(), st.dates(dt.date(1969, 12, 1), dt.date(1970, 2, 1)))


@st.composite
def tables(draw) -> pa.Table:
    rows = draw(st.integers(0, 6))

    def column(values, kind):
        return pa.array([draw(values) for _ in range(rows)], kind)

    return pa.table(
        {
            "a": column(INTS, pa.int64()),
            "b": column(INTS, pa.int64()),
            "s": column(
                st.one_of(st.none(), st.sampled_from(["", "B", "BUILDING", "é"])), pa.string()
            ),
            "f": column(st.one_of(st.none(), st.booleans()), pa.bool_()),
            "d": column(DAYS, pa.date32()),
            "x": column(st.one_of(st.none(), st.floats(allow_nan=True)), pa.float64()),
        }
    )


def integers() -> st.SearchStrategy[Expr]:
    leaves = st.one_of(
        st.sampled_from([col("a"), col("b")]), INTS.filter(lambda v: v is not None).map(lit)
    )
    return st.recursive(
        leaves,
        lambda inner: st.one_of(
            st.tuples(inner, inner, st.sampled_from("+-*")).map(
                lambda t: {"+": t[0] + t[1], "-": t[0] - t[1], "*": t[0] * t[1]}[t[2]]
            ),
            inner.map(lambda e: -e),
            st.tuples(inner, inner).map(lambda t: coalesce(t[0], t[1])),
        ),
        max_leaves=4,
    )


def conditions() -> st.SearchStrategy[Expr]:
    ints = integers()
    compare = st.sampled_from(["==", "!=", "<", "<=", ">", ">="])

    def comparison(op, left, right):
        return {
            "==": left == right,
            "!=": left != right,
            "<": left < right,
            "<=": left <= right,
            ">": left > right,
            ">=": left >= right,
        }[op]

    leaves = st.one_of(
        st.builds(comparison, compare, ints, ints),
        st.builds(
            comparison, compare, st.just(col("s")), st.sampled_from(["B", "BUILDING"]).map(lit)
        ),
        st.builds(comparison, compare, st.just(col("d")), st.just(lit(dt.date(1970, 1, 1)))),
        st.builds(comparison, compare, st.just(col("x")), st.just(lit(1.5))),
        st.just(col("f")),
        st.sampled_from([col("a").is_null(), col("s").is_not_null(), col("x").is_null()]),
    )
    return st.recursive(
        leaves,
        lambda inner: st.one_of(
            st.tuples(inner, inner).map(lambda t: t[0] & t[1]),
            st.tuples(inner, inner).map(lambda t: t[0] | t[1]),
            inner.map(lambda e: ~e),
        ),
        max_leaves=5,
    )


def values() -> st.SearchStrategy[Expr]:
    return st.one_of(
        integers(),
        conditions(),
        st.builds(if_else, conditions(), integers(), integers()),
        st.builds(if_else, conditions(), st.just(col("s")), st.just(lit("z"))),
        st.sampled_from(
            [col("s"), col("d"), col("x"), col("a") / col("b"), col("a").cast("string")]
        ),
    )


def duckdb_column(table: pa.Table, sql: str) -> pa.ChunkedArray | None:
    """The column's SQL run by DuckDB over ``table``; None when DuckDB raises (overflow)."""
    connection = duckdb.connect()
    connection.execute("SET TimeZone = 'UTC'")
    register(connection)
    connection.register("t", table)
    try:
        return connection.sql(f"SELECT {sql} AS v FROM t").to_arrow_table().column("v")
    except duckdb.Error:
        return None
    finally:
        connection.close()


def check(table: pa.Table, sql: str, arrow) -> bool:
    """Arrow's answer, when it gives one, is DuckDB's; True when Arrow answered."""
    if arrow is None:
        return False
    found = arrow(table)
    if found is None:
        return False
    expected = duckdb_column(table, sql)
    if expected is None and table.num_rows == 0:
        # DuckDB folds constants before it looks at the rows: an overflow inside a
        # constant (-(-2^63)) raises over an empty table too, where no row computes it
        # and Arrow's empty column is the only answer there is.
        assert len(found) == 0, sql
        return True
    assert expected is not None, f"Arrow answered where DuckDB raises: {sql}"
    assert found.type == expected.type, sql
    # repr: NaN equals itself there, as in SQL
    assert repr(pa.chunked_array([found]).to_pylist()) == repr(expected.to_pylist()), sql
    return True


@settings(
    max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(table=tables(), expr=values())
def test_projected_columns_equal_duckdb(table: pa.Table, expr: Expr) -> None:
    column, _ = compile_typed(expr, SCHEMA)
    check(table, column.sql, column.arrow)


@settings(
    max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(table=tables(), expr=conditions())
def test_predicates_equal_duckdb(table: pa.Table, expr: Expr) -> None:
    predicate = compile_predicate(expr, SCHEMA)
    check(table, predicate.sql, predicate.arrow)


SAMPLE = pa.table(
    {
        "a": pa.array([1, None, 9204, 3], pa.int64()),
        "b": pa.array([5, 6, None, 0], pa.int64()),
        "s": pa.array(["BUILDING", None, "B", "é"], pa.string()),
        "f": pa.array([True, None, False, True], pa.bool_()),
        "d": pa.array([dt.date(1970, 1, 1), None, dt.date(1970, 1, 3), dt.date(1969, 12, 31)]),
        "x": pa.array([1.0, float("nan"), None, -0.0], pa.float64()),
    }
)


@pytest.mark.parametrize(
    "expr",
    [
        col("s") == "BUILDING",
        col("a") < 9204,
        (col("a") > 1) & ~col("f"),
        col("d") >= lit(dt.date(1970, 1, 2)),
        col("a").is_null() | (col("b") != 0),
    ],
)
def test_circuit_filters_run_in_arrow(expr: Expr) -> None:
    predicate = compile_predicate(expr, SCHEMA)
    assert check(SAMPLE, predicate.sql, predicate.arrow), predicate.sql


@pytest.mark.parametrize(
    "expr",
    [
        col("a") * (100 - col("b")),
        if_else(col("f"), col("a"), -col("b")),
        coalesce(col("a"), col("b"), 0),
        col("a") + 1,
    ],
)
def test_integer_projections_run_in_arrow(expr: Expr) -> None:
    column, _ = compile_typed(expr, SCHEMA)
    assert check(SAMPLE, column.sql, column.arrow), column.sql


@pytest.mark.parametrize(
    "expr",
    [
        col("x") > 0.5,  # NaN orders above every double in SQL, not in Arrow
        col("a") / col("b"),
        col("a").cast("string"),
        col("a") * (2**62),  # overflows: DuckDB's error, not Arrow's answer
    ],
)
def test_what_arrow_leaves_to_duckdb(expr: Expr) -> None:
    column, _ = compile_typed(expr, SCHEMA)
    assert not check(SAMPLE, column.sql, column.arrow), column.sql


def test_doubles_compare_in_arrow_without_nan() -> None:
    """W3's low-visibility flag: a double against a literal, -0.0 equal to 0.0 as in SQL."""
    table = SAMPLE.set_column(5, "x", pa.array([1.0, -0.0, None, 7.5], pa.float64()))
    for expr in (col("x") < 5.0, col("x") == 0.0, if_else(col("x") < 5.0, 1, 0)):
        column, _ = compile_typed(expr, SCHEMA)
        assert check(table, column.sql, column.arrow), column.sql


DECIMALS = Schema.of({"p": "decimal(15,2)", "q": "decimal(15,2)", "a": "bigint"}, what="test")
PRICES = st.one_of(
    st.none(),
    st.decimals(-100, 100, places=2),
    st.sampled_from([Decimal("9999999999999.99"), Decimal("-9999999999999.99")]),
)


@st.composite
def priced(draw) -> pa.Table:
    rows = draw(st.integers(0, 6))
    return pa.table(
        {
            "p": pa.array([draw(PRICES) for _ in range(rows)], pa.decimal128(15, 2)),
            "q": pa.array([draw(PRICES) for _ in range(rows)], pa.decimal128(15, 2)),
            "a": pa.array([draw(INTS) for _ in range(rows)], pa.int64()),
        }
    )


def decimal_values() -> st.SearchStrategy[Expr]:
    leaves = st.one_of(
        st.sampled_from([col("p"), col("q"), col("a")]),
        st.sampled_from([lit(1), lit(Decimal("0.05")), lit(Decimal("-12.345"))]),
    )
    return st.recursive(
        leaves,
        lambda inner: st.tuples(inner, inner, st.sampled_from("+-*")).map(
            lambda t: {"+": t[0] + t[1], "-": t[0] - t[1], "*": t[0] * t[1]}[t[2]]
        ),
        max_leaves=4,
    )


@settings(
    max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(table=priced(), expr=decimal_values())
def test_decimal_arithmetic_equals_duckdb(table: pa.Table, expr: Expr) -> None:
    """Spark's decimal arithmetic, exact and then cast to its result type: Arrow answers
    only where that cast neither rounds nor overflows, and then as DuckDB does."""
    column, _ = compile_typed(expr, DECIMALS)
    check(table, column.sql, column.arrow)


def test_tpch_revenue_runs_in_arrow() -> None:
    """Q3's ``l_extendedprice * (1 - l_discount)``, and a sum's rounding left to DuckDB."""
    table = pa.table(
        {
            "p": pa.array([Decimal("901.00"), None, Decimal("-0.01")], pa.decimal128(15, 2)),
            "q": pa.array([Decimal(d) for d in ("0.04", "0.10", "0.00")], pa.decimal128(15, 2)),
            "a": pa.array([1, 2, None], pa.int64()),
        }
    )
    revenue, kind = compile_typed(col("p") * (1 - col("q")), DECIMALS)
    assert kind == "decimal(32,4)"
    assert check(table, revenue.sql, revenue.arrow), revenue.sql
    assert check(table, *_sql_and_arrow(col("p") + col("a")))
    # DECIMAL(38,...) operands bound the product's type to 38 digits by dropping scale:
    # that rounds, which only the SQL does.
    wide = Schema.of({"p": "decimal(38,10)", "q": "decimal(38,10)"}, what="test")
    column, _ = compile_typed(col("p") * col("q"), wide)
    tiny = pa.table({n: pa.array([Decimal("1.0000000001")], pa.decimal128(38, 10)) for n in "pq"})
    assert not check(tiny, column.sql, column.arrow)


def _sql_and_arrow(expr: Expr) -> tuple[str, object]:
    column, _ = compile_typed(expr, DECIMALS)
    return column.sql, column.arrow
