"""Both tiers' compiled expressions agree with the reference compiler, row for row.

Every expression is evaluated over one small table (NULLs, negatives, zero divisors,
padded and numeric strings, booleans): by ``dbspark.engine.reference.compile`` in
Python, and by each tier's compiler: ``dbspark.engine.spark.compile`` in Spark and
``dbspark.engine.local.compile`` in DuckDB (the ``tier`` fixture runs each test on
both). Many expressions go into one ``select`` so the whole file costs a handful of
Spark jobs.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F

from dbspark.circuit.expressions import (
    Call,
    Cast,
    Expr,
    ExpressionError,
    array,
    call,
    coalesce,
    col,
    concat,
    if_else,
    infer_type,
    like,
    lit,
    sequence,
    split,
)
from dbspark.core.types import Schema
from dbspark.engine.local import compile as local_compile
from dbspark.engine.local.frame import LocalSession
from dbspark.engine.reference import compile as reference
from dbspark.engine.spark import compile as spark_compile
from dbspark.engine.spark.frames import frame_to_zset, zset_to_frame

SCHEMA = Schema.of(
    {
        "i": "bigint",
        "j": "bigint",
        "d": "double",
        "e": "double",
        "s": "string",
        "t": "string",
        "b": "boolean",
        "c": "boolean",
    },
    what="test table",
)

NAN = float("nan")
ROWS: list[tuple[Any, ...]] = [
    (7, 3, 2.5, 0.5, "abc", ",", True, False),
    (-7, 3, -2.5, 0.0, "a,b,,c", ",", False, True),
    (7, -3, 0.0, -0.0, " 12 ", "b", None, True),
    (-7, -3, -0.0, 1e-5, "1_0", "1_0", True, None),
    (0, 0, 1e16, 12345678.0, "", "", False, False),
    (None, 5, None, 4.0, None, "x", None, None),
    (5, None, 3.0, None, "yes", None, True, True),
    (1, 0, NAN, 1.0, "  No\t", "NO", False, True),
    (-1, 2, 0.1, NAN, "ß straße", "ΣΑΣ", True, False),
    (20, 1, -1.5e-7, -20.0, "\u00a07\u2003", "+7", None, False),
    (3, 20, 123.456, 0.3, "nan", "-1.5e2", False, None),
    (-20, -1, -1e17, 2.0, "3.5", "1e3", True, True),
    (2, 2, 100.0, 0.001, "a  b ", "0x10", False, False),
]


def same(a: Any, b: Any) -> bool:
    """Equal values, with NaN equal to NaN, -0.0 distinct from 0.0, arrays as tuples."""
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        if not isinstance(a, (list, tuple)) or not isinstance(b, (list, tuple)):
            return False
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, float) or isinstance(b, float):
        x, y = float(a), float(b)
        if math.isnan(x) or math.isnan(y):
            return math.isnan(x) and math.isnan(y)
        return x == y and math.copysign(1, x) == math.copysign(1, y)
    return type(a) is type(b) and a == b


class SparkTier:
    name = "spark"
    compiler = spark_compile

    def __init__(self, spark: Any) -> None:
        self.spark = spark

    def frame(self, rows: Sequence[tuple[Any, ...]], schema: Schema) -> Any:
        return self.spark.createDataFrame(list(rows), spark_compile.struct_type(schema))


class LocalTier:
    name = "local"
    compiler = local_compile

    def __init__(self, session: LocalSession) -> None:
        self.session = session

    def frame(self, rows: Sequence[tuple[Any, ...]], schema: Schema) -> Any:
        import pyarrow as pa

        from dbspark.engine.local.frame import duck_type

        columns = list(zip(*rows, strict=True)) if rows else [() for _ in schema.names]
        types = {"bigint": pa.int64(), "double": pa.float64(), "string": pa.string()}
        types["boolean"] = pa.bool_()
        table = pa.table(
            {
                name: pa.array(list(values), types[kind])
                for (name, kind), values in zip(schema.fields, columns, strict=True)
            }
        )
        assert duck_type("bigint") == "BIGINT"
        return self.session.frame(table)


@pytest.fixture(scope="module")
def local_session() -> Any:
    session = LocalSession()
    yield session
    session.close()


@pytest.fixture(params=["spark", "local"])
def tier(request: Any) -> Any:
    """Each tier's compiler, with a way to make a frame of rows for it."""
    if request.param == "spark":
        return SparkTier(request.getfixturevalue("spark"))
    return LocalTier(request.getfixturevalue("local_session"))


def evaluate_both(tier: Any, exprs: Sequence[Expr]) -> list[str]:
    """Mismatches between the reference and the tier for every expression on every row."""
    data = [(index, *row) for index, row in enumerate(ROWS)]
    frame = tier.frame(data, Schema((("rid", "bigint"), *SCHEMA.fields)))
    columns = [tier.compiler.compile_expr(e, SCHEMA).alias(f"x{k}") for k, e in enumerate(exprs)]
    got = sorted(frame.select("rid", *columns).collect(), key=lambda r: r["rid"])
    problems = []
    for k, expr in enumerate(exprs):
        fn = reference.compile_expr(expr, SCHEMA)
        for row, record in zip(ROWS, got, strict=True):
            want, have = fn(row), record[f"x{k}"]
            if not same(want, have):
                problems.append(f"{expr!r} on {row!r}: reference {want!r}, {tier.name} {have!r}")
    return problems


def check(tier: Any, exprs: Sequence[Expr]) -> None:
    problems = evaluate_both(tier, exprs)
    assert not problems, f"{len(problems)} mismatches:\n" + "\n".join(problems[:30])


i, j, d, e, s, t, b, c = (col(n) for n in SCHEMA.names)

HAND: list[Expr] = [
    # arithmetic, NULL propagation, division and remainder by zero, dividend's sign
    i + j,
    i - j,
    i * j,
    -i,
    i / j,
    i % j,
    d / e,
    d % e,
    i % e,
    d + i,
    i * 2.5,
    lit(None) + i,
    lit(None) / lit(None),
    lit(7) % lit(-3),
    lit(-7.5) % lit(2.0),
    call("abs", i),
    call("abs", d),
    # comparisons, including NaN (Python's rules) and -0.0 vs 0.0
    i == j,
    i != j,
    i < j,
    i >= j,
    d == e,
    d != e,
    d < e,
    d <= e,
    d > e,
    d >= e,
    d == i,
    s < t,
    s == t,
    b < c,
    b == c,
    lit(None) == i,
    # three-valued logic
    b & c,
    b | c,
    ~b,
    (i > 0) & c,
    (i > 0) | lit(None),
    lit(None) & lit(False),
    i.is_null(),
    s.is_not_null(),
    lit(None).is_null(),
    # conditionals
    if_else(b, i, j),
    if_else(b, d, e),
    if_else(lit(None), s, t),
    if_else(b, lit(None), s),
    coalesce(i, j, 0),
    coalesce(d, e),
    coalesce(lit(None), s, t),
    coalesce(lit(None), lit(None)),
    call("greatest", i, j),
    call("least", i, j, lit(None)),
    call("greatest", d, e),
    call("least", d, e),
    call("greatest", e, d, lit(1.0)),
    call("least", lit(None), e, d),
    call("greatest", s, t),
    call("least", b, c),
    # strings
    call("lower", s),
    call("upper", s),
    call("upper", t),
    call("lower", t),
    call("length", s),
    call("length", lit(None)),
    concat(s, t),
    concat(s, "-", i, "-", d, "-", b),
    concat(d),
    concat(e, lit(None)),
    # casts: NULL on failure, Python's syntax
    s.cast("bigint"),
    t.cast("bigint"),
    s.cast("double"),
    t.cast("double"),
    s.cast("boolean"),
    t.cast("boolean"),
    d.cast("bigint"),
    e.cast("bigint"),
    d.cast("string"),
    e.cast("string"),
    (d / e).cast("string"),
    d.cast("boolean"),
    i.cast("boolean"),
    i.cast("double"),
    i.cast("string"),
    b.cast("bigint"),
    b.cast("double"),
    b.cast("string"),
    lit(None).cast("string"),
    lit("1_000").cast("bigint"),
    lit("1__0").cast("bigint"),
    lit("1.5d").cast("double"),
    lit(".5").cast("double"),
    lit("5.").cast("double"),
    lit("1.e5").cast("double"),
    lit("-iNfInItY").cast("double"),
    lit("+nan").cast("double"),
    lit("1e400").cast("double"),
    lit(" t ").cast("boolean"),
    lit(-9.223372036854775808e18).cast("bigint"),
    lit(9.2e18).cast("bigint"),
    lit(float("inf")).cast("string"),
    lit(float("-inf")).cast("bigint"),
    # arrays (flat_map's producers)
    array(i, j, lit(None)),
    array(d, e),
    array(s),
    sequence(i, j),
    sequence(j, i),
    sequence(lit(None), i),
    split(s, ","),
    split(s, " "),
    split(s, "b"),
    split(s, "\\E"),
    split(s, "."),
    split(s, "||"),
    split(t, ","),
    # LIKE: % and _ count characters (not bytes) and match newlines, as in Spark
    like(s, "a%"),
    like(s, "%b_"),
    like(s, "_"),
    like(s, "%.%"),
    like(t, "%"),
    like(t, "_%_"),
    like(lit(None), "x%"),
    ~like(s, "%a%"),
]


def test_hand_table(tier: Any) -> None:
    check(tier, HAND)


def test_split_needs_a_non_empty_literal_separator() -> None:
    with pytest.raises(ValueError):
        split(s, "")
    for bad in (Call("split", (s, lit(""))), Call("split", (s, t)), Call("split", (s, lit(None)))):
        for compiler in (spark_compile, local_compile):
            with pytest.raises(ExpressionError):
                compiler.compile_expr(bad, SCHEMA)


def test_out_of_range_casts_to_bigint_are_null(tier: Any) -> None:
    """Documented difference: the reference returns Python integers beyond BIGINT (which no
    engine can store); both tiers return NULL instead of saturating at the BIGINT bounds."""
    exprs = [lit(1e19).cast("bigint"), lit(2.0**63).cast("bigint"), lit(str(2**63)).cast("bigint")]
    frame = tier.frame([(1,)], Schema((("one", "bigint"),)))
    columns = [tier.compiler.compile_expr(x, SCHEMA).alias(f"x{k}") for k, x in enumerate(exprs)]
    assert list(frame.select(*columns).collect()[0]) == [None, None, None]
    assert reference.compile_expr(exprs[1], SCHEMA)(ROWS[0]) == 2**63


def test_projection_casts_to_declared_types_and_predicate_drops_null(spark: Any) -> None:
    frame = zset_to_frame(spark, [(row, 1) for row in ROWS], SCHEMA)
    projected = frame.select(
        *spark_compile.compile_projection(
            {"n": lit(None), "m": coalesce(i, d), "flag": b & c, "s": s}, SCHEMA
        ),
        "__w",
    )
    assert [(f.name, f.dataType.simpleString()) for f in projected.schema.fields] == [
        ("n", "bigint"),
        ("m", "double"),
        ("flag", "boolean"),
        ("s", "string"),
        ("__w", "bigint"),
    ]
    predicate = (i > 0) & c
    kept = frame.where(spark_compile.compile_predicate(predicate, SCHEMA))
    keep = reference.compile_predicate(predicate, SCHEMA)
    out = Schema((*SCHEMA.fields,))
    assert frame_to_zset(kept, out) == frame_to_zset(frame, out).filter(keep)


def test_literals_have_sql_types(spark: Any) -> None:
    frame = spark.range(1).select(
        spark_compile.compile_expr(lit(1), SCHEMA).alias("a"),
        spark_compile.compile_expr(lit(1.5), SCHEMA).alias("b"),
        spark_compile.compile_expr(lit("x"), SCHEMA).alias("c"),
        spark_compile.compile_expr(lit(True), SCHEMA).alias("d"),
        spark_compile.compile_expr(lit(1) / lit(2), SCHEMA).alias("e"),
    )
    assert [f.dataType.simpleString() for f in frame.schema.fields] == [
        "bigint",
        "double",
        "string",
        "boolean",
        "double",
    ]
    with pytest.raises(ValueError, match="BIGINT"):
        spark_compile.compile_expr(lit(2**63), SCHEMA)


#: Doubles whose text Python's repr and a tier's cast to STRING must agree on.
DOUBLES = st.lists(
    st.one_of(
        st.floats(allow_nan=True, allow_infinity=True),
        st.floats(min_value=-1e6, max_value=1e6).map(lambda x: round(x, 3)),
        st.integers(min_value=-(2**60), max_value=2**60).map(float),
    ),
    min_size=150,
    max_size=150,
)


@settings(max_examples=3, deadline=None, derandomize=True)
@given(DOUBLES)
def test_double_to_string_is_pythons_repr(spark: Any, values: list[float]) -> None:
    frame = spark.createDataFrame([(v,) for v in values], "d double")
    got = frame.select(spark_compile.python_float_repr(F.col("d"))).collect()
    mismatches = [(v, r[0]) for v, r in zip(values, got, strict=True) if repr(v) != r[0]]
    assert not mismatches


def test_local_literals_and_projection_have_declared_types(local_session: Any) -> None:
    import pyarrow as pa

    tier = LocalTier(local_session)
    frame = tier.frame([(1,)], Schema((("one", "bigint"),)))
    literals = frame.select(
        *local_compile.compile_projection(
            {"a": lit(1), "b": lit(1.5), "c": lit("x"), "d": lit(True), "e": lit(1) / lit(2)},
            SCHEMA,
        )
    ).toArrow()
    assert literals.schema.types == [
        pa.int64(),
        pa.float64(),
        pa.string(),
        pa.bool_(),
        pa.float64(),
    ]
    with pytest.raises(ValueError, match="BIGINT"):
        local_compile.compile_expr(lit(2**63), SCHEMA)
    rows = tier.frame([(*row, 1) for row in ROWS], Schema((*SCHEMA.fields, ("__w", "bigint"))))
    projected = rows.select(
        *local_compile.compile_projection(
            {"n": lit(None), "m": coalesce(i, d), "flag": b & c, "s": s}, SCHEMA
        ),
        "__w",
    ).toArrow()
    assert projected.schema.names == ["n", "m", "flag", "s", "__w"]
    assert projected.schema.types == [pa.int64(), pa.float64(), pa.bool_(), pa.string(), pa.int64()]
    predicate = (i > 0) & c
    kept = rows.where(local_compile.compile_predicate(predicate, SCHEMA)).collect()
    keep = reference.compile_predicate(predicate, SCHEMA)
    assert sorted(repr(tuple(r)[:-1]) for r in kept) == sorted(repr(r) for r in ROWS if keep(r))


@settings(max_examples=3, deadline=None, derandomize=True)
@given(DOUBLES)
def test_local_double_to_string_is_pythons_repr(values: list[float]) -> None:
    session = LocalSession()
    try:
        frame = LocalTier(session).frame([(v,) for v in values], Schema((("d", "double"),)))
        to_text = local_compile.compile_expr(col("d").cast("string"), Schema((("d", "double"),)))
        got = frame.select(to_text.alias("text")).collect()
    finally:
        session.close()
    mismatches = [(v, r[0]) for v, r in zip(values, got, strict=True) if repr(v) != r[0]]
    assert not mismatches


# --- generated expression trees ------------------------------------------------------------

KINDS = ("bigint", "double", "string", "boolean")
STRING_LITERALS = ("a", "", " 3 ", "x,y", "True", "2.5", "ß", "-0")


def leaves(kind: str) -> st.SearchStrategy[Expr]:
    columns = {"bigint": [i, j], "double": [d, e], "string": [s, t], "boolean": [b, c]}[kind]
    literal = {
        "bigint": st.integers(-20, 20),
        "double": st.sampled_from([0.0, -0.0, 0.5, -2.25, 3.0, 1e-3, NAN, 7.125]),
        "string": st.sampled_from(STRING_LITERALS),
        "boolean": st.booleans(),
    }[kind]
    return st.one_of(
        st.sampled_from(columns), literal.map(lit), st.just(lit(None)), st.sampled_from(columns)
    )


@functools.cache
def trees(kind: str, depth: int) -> st.SearchStrategy[Expr]:
    if depth == 0:
        return leaves(kind)
    sub = {k: trees(k, depth - 1) for k in KINDS}
    options: list[st.SearchStrategy[Expr]] = [leaves(kind)]
    same_kind = sub[kind]
    if kind in ("bigint", "string", "boolean", "double"):
        options.append(st.tuples(sub["boolean"], same_kind, same_kind).map(lambda a: if_else(*a)))
        options.append(st.lists(same_kind, min_size=1, max_size=3).map(lambda a: coalesce(*a)))
        options.append(
            st.tuples(
                st.sampled_from(["greatest", "least"]), st.lists(same_kind, min_size=1, max_size=3)
            ).map(lambda a: call(a[0], *a[1]))
        )
    if kind == "bigint":
        options.append(
            st.tuples(st.sampled_from(["+", "-", "*", "%"]), same_kind, same_kind).map(
                lambda a: _binary(*a)
            )
        )
        options.append(typed(same_kind, kind).map(lambda x: -x))
        options.append(typed(same_kind, kind).map(lambda x: call("abs", x)))
        options.append(sub["string"].map(lambda x: call("length", x)))
        options.append(leaves("double").map(lambda x: x.cast("bigint")))
        options.append(sub["string"].map(lambda x: x.cast("bigint")))
        options.append(sub["boolean"].map(lambda x: x.cast("bigint")))
    elif kind == "double":
        number = st.one_of(sub["double"], sub["bigint"])
        options.append(
            st.tuples(
                st.sampled_from(["+", "-", "*", "/", "%"]), typed(sub["double"], kind), number
            ).map(lambda a: _binary(*a))
        )
        options.append(st.tuples(sub["bigint"], sub["bigint"]).map(lambda a: a[0] / a[1]))
        options.append(typed(same_kind, kind).map(lambda x: -x))
        options.append(typed(same_kind, kind).map(lambda x: call("abs", x)))
        options.append(sub["bigint"].map(lambda x: x.cast("double")))
        options.append(sub["string"].map(lambda x: x.cast("double")))
    elif kind == "string":
        options.append(same_kind.map(lambda x: call("lower", x)))
        options.append(same_kind.map(lambda x: call("upper", x)))
        anything = st.one_of(*(sub[k] for k in KINDS))
        options.append(st.lists(anything, min_size=1, max_size=3).map(lambda a: concat(*a)))
        options.append(st.one_of(sub["bigint"], sub["double"], sub["boolean"]).map(_to_string))
    else:
        for operand in ("bigint", "double", "string", "boolean"):
            options.append(
                st.tuples(
                    st.sampled_from(["==", "!=", "<", "<=", ">", ">="]), sub[operand], sub[operand]
                ).map(lambda a: _binary(*a))
            )
        options.append(st.tuples(sub["double"], sub["bigint"]).map(lambda a: a[0] < a[1]))
        options.append(
            st.tuples(st.sampled_from(["and", "or"]), same_kind, same_kind).map(
                lambda a: _binary(*a)
            )
        )
        options.append(same_kind.map(lambda x: ~x))
        anything = st.one_of(*(sub[k] for k in KINDS))
        options.append(anything.map(lambda x: x.is_null()))
        options.append(anything.map(lambda x: x.is_not_null()))
        options.append(st.one_of(sub["string"], sub["bigint"], sub["double"]).map(_to_boolean))
    return st.one_of(*options)


def typed(strategy: st.SearchStrategy[Expr], kind: str) -> st.SearchStrategy[Expr]:
    """Only expressions whose inferred type is ``kind`` (not a bare NULL)."""

    def fits(x: Expr) -> bool:
        try:
            return infer_type(x, SCHEMA, "generated") == kind
        except ExpressionError:
            return False

    return strategy.filter(fits)


def _binary(op: str, left: Expr, right: Expr) -> Expr:
    from dbspark.circuit.expressions import BinaryOp

    return BinaryOp(op, left, right)


def _to_string(x: Expr) -> Expr:
    return Cast(x, "string")


def _to_boolean(x: Expr) -> Expr:
    return Cast(x, "boolean")


EXPRESSIONS = st.lists(
    st.sampled_from(KINDS).flatmap(lambda kind: trees(kind, 3)), min_size=60, max_size=60
)


@settings(
    max_examples=4,
    deadline=None,
    derandomize=True,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
        # ``typed`` filters generated trees by their inferred type on purpose.
        HealthCheck.filter_too_much,
    ],
)
@given(EXPRESSIONS)
def test_generated_expressions_agree(tier: Any, exprs: list[Expr]) -> None:
    check(tier, exprs)
