"""Compile circuit expressions to Python closures over row tuples.

The closures follow SQL (and Spark) semantics, so that the reference engine
and the Spark engine agree on every row: NULL (``None``) propagates through
arithmetic and comparisons, ``AND``/``OR`` are three-valued, a filter keeps a
row only when its predicate is true, division and remainder by zero give
NULL (Spark's ``try_divide``/``try_mod``), and ``%`` takes the sign of the
dividend.

Operands meet in their common type (``unify``) before they are compared or combined,
as Spark casts them: a DECIMAL next to a DOUBLE becomes a float, a DATE next to a
TIMESTAMP its midnight UTC. Decimal arithmetic is exact in Python's ``decimal`` with
ample precision, then rounded half away from zero to the result's scale (Spark's
``ROUND_HALF_UP``); a result that does not fit its type is an error, as in Spark's ANSI
mode.
"""

from __future__ import annotations

import datetime as dt
import math
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from decimal import ROUND_DOWN, Decimal, InvalidOperation
from typing import Any

from dbspark.circuit.aggregations import Aggregation
from dbspark.circuit.expressions import (
    BinaryOp,
    Call,
    Cast,
    Column,
    Expr,
    Literal,
    UnaryOp,
    decimal_arithmetic,
    infer_type,
    like_regex,
    unify,
)
from dbspark.core import aggregates
from dbspark.core import operators as ops
from dbspark.core.temporal import parse_date, parse_timestamp
from dbspark.core.types import (
    BIGINT,
    BOOLEAN,
    DATE,
    DOUBLE,
    EXACT,
    STRING,
    TIMESTAMP,
    Schema,
    is_decimal,
    rounded_decimal,
)
from dbspark.engine.expression_compiler import DECIMAL_SYNTAX

RowFunction = Callable[[tuple], Any]


def _order_key(value: Any) -> tuple[int, Any]:
    """Spark orders NaN above every other double and treats NaN = NaN as true."""
    if isinstance(value, float) and math.isnan(value):
        return (1, 0.0)
    return (0, value)


def _comparison(test: Callable[[Any, Any], bool]) -> Callable[[Any, Any], bool]:
    return lambda a, b: test(_order_key(a), _order_key(b))


_COMPARE = {
    "==": _comparison(operator.eq),
    "!=": _comparison(operator.ne),
    "<": _comparison(operator.lt),
    "<=": _comparison(operator.le),
    ">": _comparison(operator.gt),
    ">=": _comparison(operator.ge),
}


_UTC = dt.UTC


class DecimalOverflow(ArithmeticError):
    """A decimal result does not fit its type (Spark's ANSI mode raises the same)."""


def compile_expr(expr: Expr, schema: Schema) -> RowFunction:
    """A function from a row of ``schema`` to the expression's value.

    A value is held as its type says (``conform``): a DOUBLE-typed expression gives a
    float even from a BIGINT branch (as in Spark, where the branch is widened), a
    DECIMAL a ``Decimal`` at the type's scale.
    """
    fn = _compile_node(expr, schema)
    kind = infer_type(expr, schema, "compile")
    if kind in (DOUBLE, TIMESTAMP) or is_decimal(kind):
        return lambda row: conform(fn(row), kind)
    return fn


def conform(value: Any, type_name: str) -> Any:
    """A value of a narrower type (an int, a decimal, a date) as ``type_name`` holds it."""
    if value is None:
        return None
    if type_name == DOUBLE:
        return float(value)
    if type_name == TIMESTAMP and not isinstance(value, dt.datetime):
        return dt.datetime(value.year, value.month, value.day, tzinfo=_UTC)
    if is_decimal(type_name):
        result = rounded_decimal(value, type_name)
        if result is None:
            raise DecimalOverflow(f"{value} does not fit {type_name.upper()}")
        return result
    return value


def _compile_node(expr: Expr, schema: Schema) -> RowFunction:
    if isinstance(expr, Column):
        index = schema.index_of(expr.name)
        return lambda row: row[index]
    if isinstance(expr, Literal):
        value = expr.value
        return lambda row: value
    if isinstance(expr, UnaryOp):
        return _compile_unary(expr, compile_expr(expr.operand, schema))
    if isinstance(expr, BinaryOp):
        left, right = compile_expr(expr.left, schema), compile_expr(expr.right, schema)
        left_type = infer_type(expr.left, schema, "compile")
        right_type = infer_type(expr.right, schema, "compile")
        if decimal_arithmetic(expr, left_type, right_type) is not None:
            return _compile_decimal(expr.op, left, right)
        common = unify(left_type, right_type)
        if common is not None and common != left_type:
            left = _conformed(left, common)
        if common is not None and common != right_type:
            right = _conformed(right, common)
        return _compile_binary(expr.op, left, right)
    if isinstance(expr, Cast):
        inner = compile_expr(expr.operand, schema)
        target, source = expr.to, infer_type(expr.operand, schema, "compile")
        return lambda row: cast_value(inner(row), target, source)
    if isinstance(expr, Call):
        args = [compile_expr(a, schema) for a in expr.args]
        if expr.function in ("greatest", "least"):
            common = infer_type(expr, schema, "compile")
            args = [_conformed(a, common) for a in args]
        return _compile_call(expr.function, args)
    raise TypeError(f"cannot compile {expr!r}")


def _conformed(fn: RowFunction, type_name: str) -> RowFunction:
    return lambda row: conform(fn(row), type_name)


_DECIMAL_OPS = {"+": EXACT.add, "-": EXACT.subtract, "*": EXACT.multiply}


def _compile_decimal(op: str, left: RowFunction, right: RowFunction) -> RowFunction:
    # ``compile_expr`` rounds the exact result to the result type's scale.
    apply = _DECIMAL_OPS[op]

    def evaluate(row: tuple) -> Any:
        a, b = left(row), right(row)
        return None if a is None or b is None else apply(a, b)

    return evaluate


def compile_predicate(expr: Expr, schema: Schema) -> Callable[[tuple], bool]:
    """A filter: true only when the predicate is true (NULL drops the row)."""
    fn = compile_expr(expr, schema)
    return lambda row: fn(row) is True


def compile_projection(columns: dict[str, Expr], schema: Schema) -> Callable[[tuple], tuple]:
    fns = [compile_expr(e, schema) for e in columns.values()]
    return lambda row: tuple(fn(row) for fn in fns)


def emits_logic(emits: Sequence[Mapping[str, Any]], schema: Schema) -> ops.Logic:
    """The circuit's general linear operator as a logic of ``core.operators.join_function``:
    for each emit whose ``when`` holds and whose ``weight`` is neither NULL nor zero, the
    projected row with that weight, from the beginning of time, or from the epoch its
    ``epoch`` expression names (a NULL epoch never arrives)."""
    compiled = [
        (
            compile_projection(e["columns"], schema),
            compile_expr(e["weight"], schema),
            None if e["epoch"] is None else compile_expr(e["epoch"], schema),
            None if e["when"] is None else compile_predicate(e["when"], schema),
        )
        for e in emits
    ]

    def logic(row: tuple) -> list[tuple[tuple, tuple, int]]:
        out = []
        for project, weight_of, epoch_of, when in compiled:
            if when is not None and not when(row):
                continue
            factor = weight_of(row)
            if not factor:  # NULL or zero
                continue
            if epoch_of is None:
                out.append((project(row), ops.MIN_TIME, factor))
                continue
            emitted = epoch_of(row)
            if emitted is not None:
                out.append((project(row), (emitted,), factor))
        return out

    return logic


def key_function(columns: Sequence[str], schema: Schema) -> RowFunction:
    """A row's values of ``columns``, as a tuple (a join's or an aggregate's key)."""
    index = [schema.index_of(c) for c in columns]
    return lambda row: tuple(row[i] for i in index)


def join_output(right_values: Sequence[str], right_schema: Schema) -> Callable[..., tuple]:
    """The join's output row for ``join_stream``: the left row, then ``right_values``."""
    index = [right_schema.index_of(v) for v in right_values]
    return lambda _key, left, right: (*left, *(right[i] for i in index))


def group_values(
    aggregations: Mapping[str, Aggregation], schema: Schema
) -> Callable[[list[tuple[tuple, int]]], tuple]:
    """A group's aggregate values, one per aggregation, from its ``(row, weight)``
    pairs (the function ``core.operators.aggregate`` applies per key)."""
    compiled = [_aggregation(a, schema) for a in aggregations.values()]
    return lambda members: tuple(
        fn([(value_of(row), w) for row, w in members]) for value_of, fn in compiled
    )


def _aggregation(
    aggregation: Aggregation, schema: Schema
) -> tuple[RowFunction, Callable[[list[tuple[Any, int]]], Any]]:
    """The value to aggregate and the function over ``(value, weight)`` pairs, per kind."""
    if aggregation.expr is None:  # count(): every row counts, with its multiplicity
        return (lambda row: None), aggregates.count_rows()
    value_of = compile_expr(aggregation.expr, schema)
    functions: dict[str, Callable[[], aggregates.Aggregate]] = {
        "count": aggregates.count_values,
        "sum": aggregates.sum_values,
        "min": aggregates.min_value,
        "max": aggregates.max_value,
    }
    if aggregation.kind == "udf":
        assert aggregation.function is not None and aggregation.declared_type is not None
        return value_of, aggregates.user_defined(aggregation.function, aggregation.declared_type)
    if aggregation.kind == "avg":
        return value_of, aggregates.avg_value(aggregation.result_type(schema, "aggregate"))
    return value_of, functions[aggregation.kind]()


def _negate(value: Any) -> Any:
    return EXACT.minus(value) if isinstance(value, Decimal) else -value


def _absolute(value: Any) -> Any:
    return EXACT.abs(value) if isinstance(value, Decimal) else abs(value)


def _compile_unary(expr: UnaryOp, inner: RowFunction) -> RowFunction:
    if expr.op == "neg":
        return lambda row: None if (v := inner(row)) is None else _negate(v)
    if expr.op == "not":
        return lambda row: None if (v := inner(row)) is None else not v
    if expr.op == "is_null":
        return lambda row: inner(row) is None
    if expr.op == "is_not_null":
        return lambda row: inner(row) is not None
    raise TypeError(f"unknown unary operator {expr.op}")


def _sql_and(a: Any, b: Any) -> Any:
    if a is False or b is False:
        return False
    if a is None or b is None:
        return None
    return True


def _sql_or(a: Any, b: Any) -> Any:
    if a is True or b is True:
        return True
    if a is None or b is None:
        return None
    return False


def _divide(a: Any, b: Any) -> Any:
    return None if b == 0 else a / b


def _remainder(a: Any, b: Any) -> Any:
    if b == 0:
        return None
    if isinstance(a, float) or isinstance(b, float):
        return math.fmod(a, b)
    result = abs(a) % abs(b)
    return -result if a < 0 else result


_ARITHMETIC = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": _divide,
    "%": _remainder,
}


def _compile_binary(op: str, left: RowFunction, right: RowFunction) -> RowFunction:
    if op == "and":
        return lambda row: _sql_and(left(row), right(row))
    if op == "or":
        return lambda row: _sql_or(left(row), right(row))
    fn = _COMPARE.get(op) or _ARITHMETIC.get(op)
    if fn is None:
        raise TypeError(f"unknown binary operator {op}")

    def apply(row: tuple) -> Any:
        a, b = left(row), right(row)
        if a is None or b is None:
            return None
        return fn(a, b)

    return apply


def _sequence(start: Any, stop: Any) -> list[int] | None:
    if start is None or stop is None:
        return None
    step = 1 if stop >= start else -1
    return list(range(start, stop + step, step))


def _greatest(values: list[Any]) -> Any:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def _least(values: list[Any]) -> Any:
    present = [v for v in values if v is not None]
    return min(present) if present else None


def _concat(values: list[Any]) -> Any:
    if any(v is None for v in values):
        return None
    return "".join(cast_value(v, STRING) for v in values)


def _compile_call(name: str, args: list[RowFunction]) -> RowFunction:
    def values(row: tuple) -> list[Any]:
        return [a(row) for a in args]

    if name == "coalesce":
        return lambda row: next((v for v in values(row) if v is not None), None)
    if name == "if_else":
        cond, then, otherwise = args
        return lambda row: then(row) if cond(row) is True else otherwise(row)
    if name in ("lower", "upper", "length", "abs"):
        unary = {"lower": str.lower, "upper": str.upper, "length": len, "abs": _absolute}[name]
        (arg,) = args
        return lambda row: None if (v := arg(row)) is None else unary(v)
    if name == "concat":
        return lambda row: _concat(values(row))
    if name == "greatest":
        return lambda row: _greatest(values(row))
    if name == "least":
        return lambda row: _least(values(row))
    if name == "array":
        return lambda row: tuple(values(row))
    if name == "sequence":
        start, stop = args
        return lambda row: _sequence(start(row), stop(row))
    if name == "like":
        text, pattern = args
        matcher = re.compile(like_regex(pattern(())), re.DOTALL)
        return lambda row: None if (v := text(row)) is None else bool(matcher.fullmatch(v))
    if name == "split":
        text, separator = args
        return lambda row: None if (v := text(row)) is None else v.split(separator(row))
    raise TypeError(f"unknown function {name}")


def cast_value(value: Any, target: str, source: str | None = None) -> Any:
    """Casts between the scalar types, NULL on failure (Spark's ``try_cast``). BIGINT,
    DOUBLE and BOOLEAN read Python's syntax from strings; DATE, TIMESTAMP and DECIMAL
    read ISO forms and are written as Spark writes them (``source``, the value's type,
    gives a DECIMAL's scale when it is written as a string)."""
    if value is None:
        return None
    try:
        if target == STRING:
            return _to_string(value, source)
        if is_decimal(target):
            if isinstance(value, str):
                text = value.strip()
                return rounded_decimal(text, target) if re.match(DECIMAL_SYNTAX, text) else None
            return rounded_decimal(int(value) if isinstance(value, bool) else value, target)
        if target == DATE:
            if isinstance(value, str):
                return parse_date(value)
            return value.date() if isinstance(value, dt.datetime) else value
        if target == TIMESTAMP:
            if isinstance(value, str):
                return parse_timestamp(value)
            return conform(value, TIMESTAMP)
        if target == BIGINT:
            if isinstance(value, str):
                return int(value.strip())
            if isinstance(value, Decimal):
                whole = int(value.to_integral_value(rounding=ROUND_DOWN))
                return whole if -(2**63) <= whole < 2**63 else None
            return int(value)
        if target == DOUBLE:
            return float(value)
        if target == BOOLEAN:
            if isinstance(value, str):
                lowered = value.strip().lower()
                if lowered in ("true", "t", "yes", "y", "1"):
                    return True
                if lowered in ("false", "f", "no", "n", "0"):
                    return False
                return None
            return bool(value)
    except (ValueError, OverflowError, InvalidOperation):
        return None
    raise TypeError(f"cannot cast to {target}")


def _to_string(value: Any, source: str | None) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Decimal):
        if source is not None and is_decimal(source):
            value = rounded_decimal(value, source)
        return format(value, "f")
    if isinstance(value, dt.datetime):
        text = value.astimezone(_UTC).strftime("%Y-%m-%d %H:%M:%S")
        fraction = f"{value.microsecond:06d}".rstrip("0")
        return f"{text}.{fraction}" if fraction else text
    if isinstance(value, dt.date):
        return value.isoformat()
    return str(value)
