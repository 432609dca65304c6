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

from collections.abc import Mapping, Sequence
from typing import Any

import duckdb
import pyarrow as pa

from dbspark.circuit.expressions import (
    NULL_TYPE,
    Column,
    Expr,
    infer_type,
    like_regex,
    output_type,
)
from dbspark.core.temporal import DATE_SYNTAX, TIMESTAMP_SYNTAX
from dbspark.core.types import (
    BIGINT,
    BOOLEAN,
    DATE,
    DOUBLE,
    STRING,
    TIMESTAMP,
    Schema,
    array_of,
    decimal_parts,
    is_array,
    is_decimal,
)
from dbspark.engine.expression_compiler import (
    BIGINT_MIN,
    DECIMAL_SYNTAX,
    FALSE_WORDS,
    PYTHON_FLOAT_SYNTAX,
    PYTHON_INT_SYNTAX,
    TRUE_WORDS,
    ExpressionCompiler,
    widens,
)
from dbspark.engine.local import in_arrow
from dbspark.engine.local.compile_arrow import ArrowCompiler, when_true
from dbspark.engine.local.frame import LocalColumn, duck_type, quote, sql_literal
from dbspark.engine.local.frame import col as frame_column

#: Python's ``str.isspace`` characters, as an RE2 character class.
_WS = (
    r"[\t\n\x{0b}\x{0c}\r\x{1c}-\x{1f} \x{85}\x{a0}\x{1680}\x{2000}-\x{200a}"
    r"\x{2028}\x{2029}\x{202f}\x{205f}\x{3000}]"
)
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
    arrow, _ = ArrowCompiler(schema).compile(expr)
    return LocalColumn(sql, arrow=arrow)


def compile_typed(expr: Expr, schema: Schema) -> tuple[LocalColumn, str]:
    """``expr`` cast to its stored type (``output_type``), and that type."""
    target = output_type(infer_type(expr, schema, "local compile"))
    compiler = _Compiler(schema)
    sql, kind = compiler.compile(expr)
    if isinstance(expr, Column) and kind == target != NULL_TYPE:
        # The same SQL, as a column a frame over Arrow can also pick without a query
        # (a projection that renames or keeps a column, as most do).
        return frame_column(expr.name).cast(target), target
    arrow_compiler = ArrowCompiler(schema)
    arrow, _ = arrow_compiler.compile(expr)
    arrow = arrow_compiler.typed(arrow, kind, target)
    return LocalColumn(compiler.typed(sql, kind, target), arrow=arrow), target


def compile_projection(columns: Mapping[str, Expr], schema: Schema) -> list[LocalColumn]:
    return [compile_typed(expr, schema)[0].alias(name) for name, expr in columns.items()]


def compile_predicate(expr: Expr, schema: Schema) -> LocalColumn:
    """True only where ``expr`` is true (NULL counts as false)."""
    sql, kind = _Compiler(schema).compile(expr)
    if kind == NULL_TYPE:
        return LocalColumn("FALSE", arrow=in_arrow.literal(False))
    arrow, _ = ArrowCompiler(schema).compile(expr)
    return LocalColumn(f"coalesce({sql}, FALSE)", arrow=when_true(arrow))


# --- the compiler: DuckDB SQL for what ``ExpressionCompiler`` decides ----------------------


class _Compiler(ExpressionCompiler[str]):
    def typed(self, column: str, kind: str, target: str) -> str:
        # Also store the declared type (a BIGINT sum may be a HUGEINT in DuckDB).
        coerced = self.coerce(column, kind, target)
        return coerced if target == NULL_TYPE else f"CAST({coerced} AS {duck_type(target)})"

    def column(self, name: str) -> str:
        return quote(name)

    def constant(self, value: Any) -> str:
        return sql_literal(value)

    def typed_constant(self, value: Any, kind: str) -> str:
        if kind == BIGINT:
            return f"CAST({value} AS BIGINT)"
        if kind == DATE:
            return f"CAST('{value.isoformat()}' AS DATE)"
        if kind == TIMESTAMP:
            return f"CAST('{value.isoformat()}' AS TIMESTAMPTZ)"
        if is_decimal(kind):
            return f"CAST('{value}' AS {duck_type(kind)})"
        return sql_literal(value)  # a float literal is already a DOUBLE

    def untyped_null(self) -> str:
        return "NULL"

    def null(self, kind: str) -> str:
        return _null(kind)

    def coerce(self, column: str, kind: str, target: str) -> str:
        if kind == target or target == NULL_TYPE:
            return column
        if kind == NULL_TYPE:
            return _null(target)
        if kind == BIGINT and target == DOUBLE:
            return f"CAST({column} AS DOUBLE)"
        if is_array(kind) and is_array(target):
            return f"CAST({column} AS {duck_type(target)})"
        if widens(kind, target):
            return self.convert(column, kind, target)
        return column

    def convert(self, column: str, kind: str, target: str) -> str:
        return _convert(column, kind, target)

    def negate(self, column: str) -> str:
        return f"(- {column})"

    def logical_not(self, column: str) -> str:
        return f"(NOT {column})"

    def is_null(self, column: str) -> str:
        return f"({column} IS NULL)"

    def is_not_null(self, column: str) -> str:
        return f"({column} IS NOT NULL)"

    def logical(self, op: str, a: str, b: str) -> str:
        return f"({a} {'AND' if op == 'and' else 'OR'} {b})"

    def compare(self, op: str, a: str, b: str) -> str:
        return f"({a} {_SQL_COMPARE.get(op, op)} {b})"

    def arithmetic(self, op: str, a: str, b: str) -> str:
        return f"({a} {op} {b})"

    def decimal_arithmetic(self, op: str, operands: Sequence[tuple[str, str]], result: str) -> str:
        # DuckDB keeps a product of two narrow decimals narrow (and overflows): widen the
        # operands to 38 digits, compute exactly, and let the cast round half away from
        # zero (failing when the value does not fit).
        a, b = (f"CAST({sql} AS DECIMAL(38,{decimal_parts(kind)[1]}))" for sql, kind in operands)
        return f"CAST(({a} {op} {b}) AS {duck_type(result)})"

    def divide(self, a: str, b: str) -> str:
        return f"(CASE WHEN {b} = 0 THEN NULL ELSE CAST({a} AS DOUBLE) / CAST({b} AS DOUBLE) END)"

    def remainder(self, a: str, b: str) -> str:
        return f"(CASE WHEN {b} = 0 THEN NULL ELSE {a} % {b} END)"

    def array(self, items: Sequence[str], element: str) -> str:
        return f"CAST([{', '.join(items)}] AS {duck_type(array_of(element))})"

    def coalesce(self, values: Sequence[str]) -> str:
        return f"coalesce({', '.join(values)})"

    def extremum(self, name: str, values: Sequence[str], kind: str) -> str:
        if kind != DOUBLE:
            return f"{name}({', '.join(values)})"
        beats = "x > best" if name == "greatest" else "x < best"
        step = (
            f"lambda best, x: CASE WHEN x IS NULL THEN best "
            f"WHEN best IS NULL OR ({beats} AND NOT isnan(x) AND NOT isnan(best)) THEN x "
            "ELSE best END"
        )
        return f"list_reduce([{', '.join(values)}], {step})"

    def if_else(self, condition: str, then: str, otherwise: str) -> str:
        return f"(CASE WHEN {condition} THEN {then} ELSE {otherwise} END)"

    def string_function(self, name: str, text: str) -> str:
        if name == "length":
            return f"CAST(length({text}) AS BIGINT)"
        python = LOWER if name == "lower" else UPPER
        return (
            f"(CASE WHEN regexp_matches({text}, '{_ASCII}') THEN {name}({text}) "
            f"ELSE {python}({text}) END)"
        )

    def absolute(self, column: str) -> str:
        return f"abs({column})"

    def concat(self, parts: Sequence[str]) -> str:
        return f"({' || '.join(parts)})"

    def sequence(self, start: str, stop: str) -> str:
        a, b = f"CAST({start} AS BIGINT)", f"CAST({stop} AS BIGINT)"
        return f"generate_series({a}, {b}, (CASE WHEN {b} >= {a} THEN 1 ELSE -1 END))"

    def split(self, text: str, separator: str) -> str:
        return f"string_split({text}, {sql_literal(separator)})"

    def like(self, text: str, pattern: str) -> str:
        # RE2 (DuckDB's regexps) reads characters, as Spark's LIKE does; DuckDB's own
        # LIKE has no default escape character.
        regex = sql_literal("(?s)" + like_regex(pattern))
        return f"regexp_full_match({text}, {regex})"


_SQL_COMPARE = {"==": "=", "!=": "<>"}


def _null(type_name: str) -> str:
    return f"CAST(NULL AS {duck_type(type_name)})"


def _convert(sql: str, kind: str, target: str) -> str:
    """``ExpressionCompiler.convert``: between two different scalar types."""
    if target in (DATE, TIMESTAMP) or is_decimal(target) or kind in (DATE, TIMESTAMP):
        return _convert_new_types(sql, kind, target)
    if is_decimal(kind):
        if target == BIGINT:  # truncated, as Spark's cast; NULL past the BIGINT range
            return f"TRY_CAST(trunc({sql}) AS BIGINT)"
        if target == BOOLEAN:
            return f"({sql} <> 0)"
        return f"CAST({sql} AS {duck_type(target)})"  # DOUBLE, or the digits as STRING
    if target == STRING:
        if kind == BOOLEAN:
            return f"(CASE WHEN {sql} THEN 'true' WHEN NOT {sql} THEN 'false' END)"
        if kind == DOUBLE:
            # As Python's repr, which has no sign on NaN (DuckDB writes a negated one '-nan').
            return f"(CASE WHEN isnan({sql}) THEN 'nan' ELSE CAST({sql} AS VARCHAR) END)"
        return f"CAST({sql} AS VARCHAR)"  # BIGINT digits
    if target == BIGINT:
        if kind == STRING:
            text = _strip(sql)
            return (
                f"(CASE WHEN regexp_matches({text}, '{PYTHON_INT_SYNTAX}') "
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
            trues = ", ".join(sql_literal(w) for w in TRUE_WORDS)
            falses = ", ".join(sql_literal(w) for w in FALSE_WORDS)
            return (
                f"(CASE WHEN {word} IN ({trues}) THEN TRUE "
                f"WHEN {word} IN ({falses}) THEN FALSE END)"
            )
        zero = "CAST(0 AS DOUBLE)" if kind == DOUBLE else "0"
        return f"({sql} <> {zero})"  # bool(x): NaN is true
    raise TypeError(f"cannot cast to {target}")


def _convert_new_types(sql: str, kind: str, target: str) -> str:
    """Casts to and from DATE, TIMESTAMP and DECIMAL."""
    if target == STRING:
        if kind == TIMESTAMP:  # Spark writes the fraction only when there is one
            text = f"strftime({sql}, '%Y-%m-%d %H:%M:%S.%f')"
            return f"rtrim(rtrim({text}, '0'), '.')"
        return f"CAST({sql} AS VARCHAR)"
    if kind == STRING:
        text = _strip(sql)
        syntax = {DATE: DATE_SYNTAX, TIMESTAMP: TIMESTAMP_SYNTAX}.get(target, DECIMAL_SYNTAX)
        value = text
        if target == DATE:  # the date part; Spark ignores what follows it
            value = f"regexp_extract({text}, '^[0-9]+-[0-9]+-[0-9]+')"
        return (
            f"(CASE WHEN regexp_matches({text}, '{syntax}') "
            f"THEN TRY_CAST({value} AS {duck_type(target)}) END)"
        )
    if is_decimal(target) and kind == DOUBLE:
        # Spark reads a double as its shortest decimal form (Python's repr), then rounds.
        as_text = _convert(sql, DOUBLE, STRING)
        return f"(CASE WHEN isfinite({sql}) THEN TRY_CAST({as_text} AS {duck_type(target)}) END)"
    if is_decimal(target) and kind == BOOLEAN:
        return f"TRY_CAST(CAST({sql} AS INTEGER) AS {duck_type(target)})"
    return f"TRY_CAST({sql} AS {duck_type(target)})"


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
        f"WHEN regexp_matches({text}, '{PYTHON_FLOAT_SYNTAX}') "
        f"THEN TRY_CAST(replace({text}, '_', '') AS DOUBLE) END)"
    )
