"""DATE, TIMESTAMP and DECIMAL: both tiers' compiled expressions agree with the reference.

One small table (dates, instants with and without a fraction of a second, decimals of
two scales, text that parses or does not) goes through each tier's compiler and the
reference compiler, as ``test_spark_compile.py`` does for the other types. The values
are compared exactly: a decimal's digits and an instant's microseconds.
"""

from __future__ import annotations

import datetime as dt
import re
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest

from dbspark.circuit.expressions import (
    Expr,
    ExpressionError,
    coalesce,
    col,
    concat,
    infer_type,
    lit,
)
from dbspark.core.types import Schema, normalize_type, python_value_fits
from dbspark.engine.local import compile as local_compile
from dbspark.engine.local.dialect import arrow_type
from dbspark.engine.local.frame import LocalSession
from dbspark.engine.reference import compile as reference
from dbspark.engine.reference.compile import DecimalOverflow
from dbspark.engine.spark import compile as spark_compile
from dbspark.engine.values import from_column_value

UTC = dt.UTC
SCHEMA = Schema.of(
    {
        "day": "date",
        "at": "timestamp",
        "price": "decimal(15,2)",
        "rate": "decimal(5,4)",
        "n": "bigint",
        "x": "double",
        "text": "string",
    },
    what="typed table",
)
ROWS: list[tuple[Any, ...]] = [
    (
        dt.date(2026, 1, 2),
        dt.datetime(2026, 1, 2, 10, 30, tzinfo=UTC),
        Decimal("10.50"),
        Decimal("0.0500"),
        3,
        0.5,
        " 2026-01-05T10:00:00.25+01:00 ",
    ),
    (
        dt.date(1999, 12, 31),
        dt.datetime(1999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
        Decimal("-2.25"),
        Decimal("-0.1250"),
        -7,
        -1.5,
        "12.345",
    ),
    (dt.date(2024, 2, 29), None, Decimal("0.00"), None, 0, 2.675, "2024-02-30"),
    (None, dt.datetime(1970, 1, 1, tzinfo=UTC), None, Decimal("9.9999"), None, None, None),
    (
        dt.date(2026, 3, 1),
        dt.datetime(2026, 3, 1, 0, 0, 0, 500000, tzinfo=UTC),
        Decimal("9999999999999.99"),
        Decimal("1.0000"),
        2,
        1e-7,
        "  -0.005e2\t",
    ),
]

day, at, price, rate, n, x, text = (col(name) for name in SCHEMA.names)

HAND: list[Expr] = [
    # decimal arithmetic: Spark's result types, exact, rounded half away from zero
    price + rate,
    price - n,
    price * rate,
    price * (lit(1) - rate),
    price * n,
    -price,
    price + lit(Decimal("0.005")),
    price * lit(Decimal("1.5")),
    price + x,
    price * 2.0,
    # comparisons meet in the common type
    price > n,
    price == lit(Decimal("10.5")),
    rate < x,
    day < at,
    day == lit(dt.date(2026, 1, 2)),
    at >= lit(dt.datetime(2026, 1, 2, 10, 30, tzinfo=UTC)),
    coalesce(price, n),
    coalesce(day, at),
    # casts
    price.cast("bigint"),
    rate.cast("bigint"),
    price.cast("double"),
    price.cast("string"),
    rate.cast("string"),
    price.cast("decimal(5,1)"),
    rate.cast("decimal(3,2)"),
    price.cast("boolean"),
    n.cast("decimal(3,1)"),
    x.cast("decimal(10,2)"),
    text.cast("decimal(10,2)"),
    text.cast("date"),
    text.cast("timestamp"),
    day.cast("string"),
    at.cast("string"),
    day.cast("timestamp"),
    at.cast("date"),
    concat(lit("on "), day),
    lit("2026-01-02").cast("date") == day,
    lit("2026-01-02 10:30:00Z").cast("timestamp") == at,
]


def normalized(value: Any) -> Any:
    """A tier's value as the reference holds it (Spark's rows give naive local times)."""
    if isinstance(value, dt.datetime):
        return from_column_value(value, "timestamp")
    return value


def same(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, Decimal) or isinstance(b, Decimal):
        return isinstance(a, Decimal) and isinstance(b, Decimal) and str(a) == str(b)
    return type(a) is type(b) and a == b


@pytest.fixture(scope="module")
def local_session() -> Any:
    session = LocalSession()
    yield session
    session.close()


def frame_of(tier: str, request: Any, schema: Schema, rows: list[tuple[Any, ...]]) -> Any:
    if tier == "spark":
        spark = request.getfixturevalue("spark")
        return spark.createDataFrame(rows, spark_compile.struct_type(schema))
    columns = list(zip(*rows, strict=True))
    table = pa.table(
        {
            name: pa.array(list(values), arrow_type(kind))
            for (name, kind), values in zip(schema.fields, columns, strict=True)
        }
    )
    return request.getfixturevalue("local_session").frame(table)


@pytest.mark.parametrize("tier", ["spark", "local"])
def test_hand_table(tier: str, request: Any) -> None:
    compiler = spark_compile if tier == "spark" else local_compile
    schema = Schema((("rid", "bigint"), *SCHEMA.fields))
    frame = frame_of(tier, request, schema, [(k, *row) for k, row in enumerate(ROWS)])
    columns = [compiler.compile_typed(e, SCHEMA)[0].alias(f"x{k}") for k, e in enumerate(HAND)]
    got = sorted(frame.select("rid", *columns).collect(), key=lambda r: r["rid"])
    problems = []
    for k, expr in enumerate(HAND):
        fn = reference.compile_expr(expr, SCHEMA)
        kind = infer_type(expr, SCHEMA, "test")
        for row, record in zip(ROWS, got, strict=True):
            want, have = fn(row), normalized(record[f"x{k}"])
            if not same(want, have):
                problems.append(f"{expr!r} ({kind}) on {row!r}: reference {want!r}, {have!r}")
    assert not problems, f"{len(problems)} mismatches:\n" + "\n".join(problems[:30])


def test_decimal_result_types_follow_spark(spark: Any) -> None:
    """Our result types are the ones Spark SQL gives the same expressions."""
    wide = Schema.of({"a": "decimal(38,10)", "b": "decimal(38,10)"}, what="t")
    cases = [
        (price + rate, SCHEMA, "price + rate"),
        (price * rate, SCHEMA, "price * rate"),
        # An integer literal counts its own digits; a BIGINT column is DECIMAL(20,0).
        (price * (lit(1) - rate), SCHEMA, "price * (1 - rate)"),
        (price - n, SCHEMA, "price - n"),
        (price + x, SCHEMA, "price + x"),
        (coalesce(price, n), SCHEMA, "coalesce(price, n)"),
        (-rate, SCHEMA, "-rate"),
        # Past 38 digits Spark keeps the whole part and at least 6 fraction digits.
        (col("a") * col("b"), wide, "a * b"),
        (col("a") + col("b"), wide, "a + b"),
    ]
    for expr, schema, sql in cases:
        columns = ", ".join(f"CAST(NULL AS {kind.upper()}) AS {name}" for name, kind in schema)
        spark_says = spark.sql(f"SELECT typeof({sql}) FROM (SELECT {columns})").first()[0]
        assert infer_type(expr, schema, "t") == spark_says, sql


def test_refused_operations_name_the_types() -> None:
    for expr, message in [
        (price / rate, "/ of DECIMAL"),
        (price % n, "% of DECIMAL"),
        (day + 1, "cannot apply + to date"),
        (day.cast("bigint"), "cannot cast date to bigint"),
        (n.cast("timestamp"), "cannot cast bigint to timestamp"),
        (day == text, "cannot apply == to date and string"),
    ]:
        with pytest.raises(ExpressionError, match=re.escape(message)):
            infer_type(expr, SCHEMA, "t")


@pytest.mark.parametrize("tier", ["spark", "local"])
def test_decimal_overflow_is_an_error_everywhere(tier: str, request: Any) -> None:
    """Spark's ANSI mode raises where a decimal result does not fit; so do the others."""
    schema = Schema.of({"a": "decimal(38,0)"}, what="t")
    biggest = Decimal("9" * 38)
    expr = col("a") + col("a")
    assert reference.compile_expr(col("a") - col("a"), schema)((biggest,)) == 0
    with pytest.raises(DecimalOverflow):
        reference.compile_expr(expr, schema)((biggest,))
    compiler = spark_compile if tier == "spark" else local_compile
    frame = frame_of(tier, request, schema, [(biggest,)])
    with pytest.raises(Exception, match=r"(?i)overflow|out of range|cannot be represented"):
        frame.select(compiler.compile_expr(expr, schema).alias("y")).collect()


def test_type_names_and_values() -> None:
    assert normalize_type("DECIMAL(10, 2)") == "decimal(10,2)"
    assert normalize_type("numeric") == "decimal(10,0)"
    assert normalize_type("TIMESTAMP") == "timestamp"
    for bad in ("decimal(39,2)", "decimal(5,6)", "decimal(0,0)"):
        with pytest.raises(TypeError, match="DECIMAL"):
            normalize_type(bad)
    assert python_value_fits(Decimal("10.5"), "decimal(10,2)")
    assert not python_value_fits(Decimal("10.555"), "decimal(10,2)")
    assert not python_value_fits(Decimal("123456789.00"), "decimal(10,2)")
    assert not python_value_fits(dt.datetime(2026, 1, 1), "timestamp")  # naive: no instant
    assert python_value_fits(dt.datetime(2026, 1, 1, tzinfo=UTC), "timestamp")
    assert not python_value_fits(dt.datetime(2026, 1, 1, tzinfo=UTC), "date")
    with pytest.raises(TypeError, match="timezone-aware"):
        lit(dt.datetime(2026, 1, 1))
