"""Compile circuit expressions to DuckDB SQL for the local tier.

The target is the reference engine's meaning (``dbspark.engine.reference.compile``),
which the Spark compiler (``engine/spark/compile.py``) also follows, so a unit gives
the same rows whichever tier runs it. DuckDB agrees with that meaning on most of SQL:
NULL propagation, three-valued logic, NaN equal to NaN and above every double, -0.0
equal to 0.0, ``%`` with the dividend's sign, and a DOUBLE written as Python's
``repr`` writes it. What it spells differently is spelled out here:

* ``/`` is always DOUBLE and NULL for a zero divisor, ``%`` NULL for a zero divisor;
* ``greatest``/``least`` over DOUBLEs fold left to right as Python's ``max``/``min``
  do (NaN is only picked when it comes first);
* casts from strings accept Python's syntax only (``1_000``, ``inf``, ``nan``; the
  text stripped of Unicode whitespace), and booleans the reference's words;
  ``concat`` and ``||`` give NULL when any part is NULL;
* ``lower``/``upper`` of non-ASCII text go through Python's ``str.lower``/``upper``
  (DuckDB maps ``ß`` and the final sigma differently); ASCII stays in SQL;
* ``split`` is ``string_split`` (literal separator, empty parts kept) and ``sequence``
  counts down when stop < start.

The same differences from the reference as the Spark compiler's remain: BIGINT
overflow is an error, and numbers beyond BIGINT cast to NULL.
"""

from __future__ import annotations

from collections.abc import Mapping

import duckdb
import pyarrow as pa

from dbspark.circuit.expressions import (
    ARITHMETIC,
    COMPARISON,
    LOGICAL,
    NULL_TYPE,
    BinaryOp,
    Call,
    Cast,
    Expr,
    Literal,
    UnaryOp,
    infer_type,
    output_type,
    unify,
)
from dbspark.circuit.expressions import Column as ColumnRef
from dbspark.circuit.types import (
    BIGINT,
    BOOLEAN,
    DOUBLE,
    STRING,
    Schema,
    array_of,
    is_array,
)
from dbspark.engine.local.frame import LocalColumn, duck_type, quote, sql_literal

BIGINT_MIN = -(2**63)
BIGINT_MAX = 2**63 - 1

#: Python's ``str.isspace`` characters, as an RE2 character class.
_WS = (
    r"[\t\n\x{0b}\x{0c}\r\x{1c}-\x{1f} \x{85}\x{a0}\x{1680}\x{2000}-\x{200a}"
    r"\x{2028}\x{2029}\x{202f}\x{205f}\x{3000}]"
)
_INT_SYNTAX = r"^[+-]?[0-9](_?[0-9])*$"
_FLOAT_SYNTAX = (
    r"^[+-]?(([0-9](_?[0-9])*)(\.([0-9](_?[0-9])*)?)?|\.[0-9](_?[0-9])*)"
    r"([eE][+-]?[0-9](_?[0-9])*)?$"
)
_TRUE_WORDS = ("true", "t", "yes", "y", "1")
_FALSE_WORDS = ("false", "f", "no", "n", "0")
_ASCII = r"^[\x{00}-\x{7f}]*$"

#: Python functions the SQL calls (registered once per connection by ``register``).
LOWER, UPPER = "dbspark_py_lower", "dbspark_py_upper"


def register(connection: duckdb.DuckDBPyConnection) -> None:
    """Make the Python string functions the compiled SQL may call known to DuckDB."""

    def mapped(method: str):
        def apply(values: pa.Array) -> pa.Array:
            return pa.array(
                [None if v is None else getattr(v, method)() for v in values.to_pylist()],
                pa.string(),
            )

        return apply

    for name, method in ((LOWER, "lower"), (UPPER, "upper")):
        connection.create_function(
            name, mapped(method), ["VARCHAR"], "VARCHAR", type="arrow", side_effects=False
        )


# --- entry points ------------------------------------------------------------------------


def compile_expr(expr: Expr, schema: Schema) -> LocalColumn:
    """A column computing ``expr`` over rows of ``schema``."""
    infer_type(expr, schema, "local compile")
    sql, _ = _Compiler(schema).compile(expr)
    return LocalColumn(sql)


def compile_typed(expr: Expr, schema: Schema) -> tuple[LocalColumn, str]:
    """``expr`` cast to its stored type (``output_type``), and that type."""
    target = output_type(infer_type(expr, schema, "local compile"))
    sql, kind = _Compiler(schema).compile(expr)
    return LocalColumn(_cast_sql(_coerce(sql, kind, target), target)), target


def compile_projection(columns: Mapping[str, Expr], schema: Schema) -> list[LocalColumn]:
    return [compile_typed(expr, schema)[0].alias(name) for name, expr in columns.items()]


def compile_predicate(expr: Expr, schema: Schema) -> LocalColumn:
    """True only where ``expr`` is true (NULL counts as false)."""
    sql, kind = _Compiler(schema).compile(expr)
    if kind == NULL_TYPE:
        return LocalColumn("FALSE")
    return LocalColumn(f"coalesce({sql}, FALSE)")


# --- the compiler ------------------------------------------------------------------------


class _Compiler:
    def __init__(self, schema: Schema) -> None:
        self.schema = schema

    def compile(self, expr: Expr) -> tuple[str, str]:
        """``(sql, type)``; the type is the reference's inferred type (``null`` possible)."""
        if isinstance(expr, ColumnRef):
            return quote(expr.name), self.schema.type_of(expr.name)
        if isinstance(expr, Literal):
            return _literal(expr.value)
        if isinstance(expr, UnaryOp):
            return self._unary(expr)
        if isinstance(expr, BinaryOp):
            return self._binary(expr)
        if isinstance(expr, Cast):
            inner, kind = self.compile(expr.operand)
            return cast_sql(inner, kind, expr.to), expr.to
        if isinstance(expr, Call):
            return self._call(expr)
        raise TypeError(f"cannot compile {expr!r} for the local tier")

    def _unary(self, expr: UnaryOp) -> tuple[str, str]:
        inner, kind = self.compile(expr.operand)
        if expr.op == "neg":
            if kind == NULL_TYPE:
                return _null(BIGINT), BIGINT
            return f"(- {inner})", kind
        if expr.op == "not":
            return f"(NOT {_coerce(inner, kind, BOOLEAN)})", BOOLEAN
        if expr.op == "is_null":
            return ("TRUE" if kind == NULL_TYPE else f"({inner} IS NULL)"), BOOLEAN
        if expr.op == "is_not_null":
            return ("FALSE" if kind == NULL_TYPE else f"({inner} IS NOT NULL)"), BOOLEAN
        raise TypeError(f"unknown unary operator {expr.op}")

    def _binary(self, expr: BinaryOp) -> tuple[str, str]:
        left, left_type = self.compile(expr.left)
        right, right_type = self.compile(expr.right)
        op = expr.op
        if op in LOGICAL:
            a, b = _coerce(left, left_type, BOOLEAN), _coerce(right, right_type, BOOLEAN)
            return f"({a} {'AND' if op == 'and' else 'OR'} {b})", BOOLEAN
        common = unify(left_type, right_type)
        if common is None:
            raise TypeError(f"cannot apply {op} to {left_type} and {right_type}")
        if op in COMPARISON:
            if common == NULL_TYPE:
                return _null(BOOLEAN), BOOLEAN
            a, b = _coerce(left, left_type, common), _coerce(right, right_type, common)
            sql_op = {"==": "=", "!=": "<>"}.get(op, op)
            return f"({a} {sql_op} {b})", BOOLEAN
        if op not in ARITHMETIC:
            raise TypeError(f"unknown binary operator {op}")
        result_type = DOUBLE if op == "/" else (BIGINT if common == NULL_TYPE else common)
        if common == NULL_TYPE:
            return _null(result_type), result_type
        a, b = _coerce(left, left_type, common), _coerce(right, right_type, common)
        if op == "/":
            return (
                f"(CASE WHEN {b} = 0 THEN NULL ELSE CAST({a} AS DOUBLE) / CAST({b} AS DOUBLE) END)",
                DOUBLE,
            )
        if op == "%":
            return f"(CASE WHEN {b} = 0 THEN NULL ELSE {a} % {b} END)", result_type
        return f"({a} {op} {b})", result_type

    def _call(self, expr: Call) -> tuple[str, str]:
        name = expr.function
        compiled = [self.compile(a) for a in expr.args]
        if name in ("coalesce", "greatest", "least", "array"):
            common = NULL_TYPE
            for _, kind in compiled:
                merged = unify(common, kind)
                if merged is None:
                    raise TypeError(f"{name} mixes {common} and {kind}")
                common = merged
            if name == "array":
                element = BIGINT if common == NULL_TYPE else common
                items = [_coerce(c, k, element) for c, k in compiled]
                return f"CAST([{', '.join(items)}] AS {duck_type(array_of(element))})", array_of(
                    element
                )
            if common == NULL_TYPE:
                return _null(BIGINT), NULL_TYPE
            present = [_coerce(c, k, common) for c, k in compiled if k != NULL_TYPE]
            if name == "coalesce":
                return (present[0] if len(present) == 1 else f"coalesce({', '.join(present)})"), (
                    common
                )
            return _extremum(name, present, common), common
        if name == "if_else":
            (cond, cond_type), (then, then_type), (other, other_type) = compiled
            common = unify(then_type, other_type)
            if common is None:
                raise TypeError(f"if_else branches have types {then_type} and {other_type}")
            target = BIGINT if common == NULL_TYPE else common
            then_c, other_c = _coerce(then, then_type, target), _coerce(other, other_type, target)
            if cond_type == NULL_TYPE:
                return other_c, common
            return f"(CASE WHEN {cond} THEN {then_c} ELSE {other_c} END)", common
        if name in ("lower", "upper", "length"):
            ((arg, kind),) = compiled
            result = BIGINT if name == "length" else STRING
            if kind == NULL_TYPE:
                return _null(result), result
            if name == "length":
                return f"CAST(length({arg}) AS BIGINT)", BIGINT
            python = LOWER if name == "lower" else UPPER
            return (
                f"(CASE WHEN regexp_matches({arg}, '{_ASCII}') THEN {name}({arg}) "
                f"ELSE {python}({arg}) END)",
                STRING,
            )
        if name == "abs":
            ((arg, kind),) = compiled
            return f"abs({arg})", kind
        if name == "concat":
            if any(kind == NULL_TYPE for _, kind in compiled):
                return _null(STRING), STRING
            parts = [cast_sql(c, kind, STRING) for c, kind in compiled]
            return f"({' || '.join(parts)})", STRING
        if name == "sequence":
            (start, start_type), (stop, stop_type) = compiled
            if NULL_TYPE in (start_type, stop_type):
                return _null(array_of(BIGINT)), array_of(BIGINT)
            a, b = f"CAST({start} AS BIGINT)", f"CAST({stop} AS BIGINT)"
            step = f"(CASE WHEN {b} >= {a} THEN 1 ELSE -1 END)"
            return f"generate_series({a}, {b}, {step})", array_of(BIGINT)
        if name == "split":
            (text, text_type), _ = compiled
            if text_type == NULL_TYPE:
                return _null(array_of(STRING)), array_of(STRING)
            separator = expr.args[1]
            if not (
                isinstance(separator, Literal)
                and isinstance(separator.value, str)
                and separator.value
            ):
                raise TypeError(
                    f"split needs a non-empty literal string separator, got {separator!r}"
                )
            return f"string_split({text}, {sql_literal(separator.value)})", array_of(STRING)
        raise TypeError(f"unknown function {name}")


# --- pieces ------------------------------------------------------------------------------


def _null(type_name: str) -> str:
    return f"CAST(NULL AS {duck_type(type_name)})"


def _literal(value: object) -> tuple[str, str]:
    if value is None:
        return "NULL", NULL_TYPE
    if isinstance(value, bool):
        return sql_literal(value), BOOLEAN
    if isinstance(value, int):
        if not BIGINT_MIN <= value <= BIGINT_MAX:
            raise ValueError(f"literal {value} does not fit in a BIGINT")
        return f"CAST({value} AS BIGINT)", BIGINT
    if isinstance(value, float):
        return sql_literal(value), DOUBLE
    if isinstance(value, str):
        return sql_literal(value), STRING
    raise TypeError(f"unsupported literal {value!r}")


def _coerce(sql: str, kind: str, target: str) -> str:
    """``sql`` (of type ``kind``) as ``target``: NULL literals typed, BIGINT widened."""
    if kind == target or target == NULL_TYPE:
        return sql
    if kind == NULL_TYPE:
        return _null(target)
    if kind == BIGINT and target == DOUBLE:
        return f"CAST({sql} AS DOUBLE)"
    if is_array(kind) and is_array(target):
        return f"CAST({sql} AS {duck_type(target)})"
    return sql


def _cast_sql(sql: str, target: str) -> str:
    """A typed cast that only changes how a value is stored (the types already agree)."""
    return sql if target == NULL_TYPE else f"CAST({sql} AS {duck_type(target)})"


def _extremum(name: str, values: list[str], kind: str) -> str:
    """greatest/least skipping NULLs; over DOUBLEs a left fold with Python's comparisons."""
    if len(values) == 1:
        return values[0]
    if kind != DOUBLE:
        return f"{name}({', '.join(values)})"
    beats = "x > best" if name == "greatest" else "x < best"
    step = (
        f"lambda best, x: CASE WHEN x IS NULL THEN best "
        f"WHEN best IS NULL OR ({beats} AND NOT isnan(x) AND NOT isnan(best)) THEN x "
        "ELSE best END"
    )
    return f"list_reduce([{', '.join(values)}], {step})"


def cast_sql(sql: str, kind: str, target: str) -> str:
    """The reference's ``cast_value`` (NULL on failure) from ``kind`` to ``target``."""
    if kind == NULL_TYPE:
        return _null(target)
    if is_array(kind) or is_array(target):
        if kind == target:
            return sql
        raise TypeError(f"the local tier cannot cast {kind} to {target}")
    if kind == target:
        return sql
    if target == STRING:
        if kind == BOOLEAN:
            return f"(CASE WHEN {sql} THEN 'true' WHEN NOT {sql} THEN 'false' END)"
        return f"CAST({sql} AS VARCHAR)"  # BIGINT digits; DOUBLE as Python's repr
    if target == BIGINT:
        if kind == STRING:
            text = _strip(sql)
            return (
                f"(CASE WHEN regexp_matches({text}, '{_INT_SYNTAX}') "
                f"THEN TRY_CAST(replace({text}, '_', '') AS BIGINT) END)"
            )
        if kind == DOUBLE:
            # Python's int() truncates; NaN, infinities and values past BIGINT give NULL.
            return (
                f"(CASE WHEN {sql} >= CAST({float(BIGINT_MIN)!r} AS DOUBLE) "
                f"AND {sql} < CAST({2.0**63!r} AS DOUBLE) THEN CAST(trunc({sql}) AS BIGINT) END)"
            )
        return f"CAST({sql} AS BIGINT)"  # BOOLEAN -> 0/1
    if target == DOUBLE:
        if kind == STRING:
            return _parse_float(_strip(sql))
        return f"CAST({sql} AS DOUBLE)"
    if target == BOOLEAN:
        if kind == STRING:
            word = f"lower({_strip(sql)})"
            trues = ", ".join(sql_literal(w) for w in _TRUE_WORDS)
            falses = ", ".join(sql_literal(w) for w in _FALSE_WORDS)
            return (
                f"(CASE WHEN {word} IN ({trues}) THEN TRUE "
                f"WHEN {word} IN ({falses}) THEN FALSE END)"
            )
        zero = "CAST(0 AS DOUBLE)" if kind == DOUBLE else "0"
        return f"({sql} <> {zero})"  # bool(x): NaN is true
    raise TypeError(f"cannot cast to {target}")


def _strip(sql: str) -> str:
    return f"regexp_replace({sql}, '^{_WS}+|{_WS}+$', '', 'g')"


def _parse_float(text: str) -> str:
    word = f"lower({text})"
    unsigned = f"regexp_replace({word}, '^[+-]', '')"
    negative = f"starts_with({word}, '-')"
    return (
        f"(CASE WHEN {unsigned} = 'nan' THEN CAST('nan' AS DOUBLE) "
        f"WHEN {unsigned} IN ('inf', 'infinity') AND {negative} THEN CAST('-inf' AS DOUBLE) "
        f"WHEN {unsigned} IN ('inf', 'infinity') THEN CAST('inf' AS DOUBLE) "
        f"WHEN regexp_matches({text}, '{_FLOAT_SYNTAX}') "
        f"THEN TRY_CAST(replace({text}, '_', '') AS DOUBLE) END)"
    )
