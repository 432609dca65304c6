"""Column expressions: the user's row-level logic, as data.

Expressions are trees that say *what* to compute, never *how*: each engine
compiles them (the reference engine to Python closures with SQL NULL
semantics, the Spark engine to native ``Column`` expressions), so that a
``map`` or ``filter`` runs inside Spark's optimizer with no Python UDF.

Build them with ``col``, ``lit`` and Python operators::

    (col("amount") * 2 > 10) & col("region").is_not_null()

``==`` builds an expression (as in PySpark), so expressions are hashed by
identity and cannot be used as booleans.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from dbspark.core.types import (
    BIGINT,
    BIGINT_AS_DECIMAL,
    BOOLEAN,
    DATE,
    DOUBLE,
    MAX_DECIMAL_PRECISION,
    STRING,
    TIMESTAMP,
    Schema,
    array_of,
    decimal_of,
    decimal_parts,
    element_type,
    is_array,
    is_decimal,
    is_numeric,
    is_temporal,
)

ARITHMETIC = ("+", "-", "*", "/", "%")
COMPARISON = ("==", "!=", "<", "<=", ">", ">=")
LOGICAL = ("and", "or")


class Expr:
    """Base of every expression node."""

    __hash__ = object.__hash__

    def children(self) -> tuple[Expr, ...]:
        return ()

    # arithmetic
    def __add__(self, other: Any) -> Expr:
        return BinaryOp("+", self, wrap(other))

    def __radd__(self, other: Any) -> Expr:
        return BinaryOp("+", wrap(other), self)

    def __sub__(self, other: Any) -> Expr:
        return BinaryOp("-", self, wrap(other))

    def __rsub__(self, other: Any) -> Expr:
        return BinaryOp("-", wrap(other), self)

    def __mul__(self, other: Any) -> Expr:
        return BinaryOp("*", self, wrap(other))

    def __rmul__(self, other: Any) -> Expr:
        return BinaryOp("*", wrap(other), self)

    def __truediv__(self, other: Any) -> Expr:
        return BinaryOp("/", self, wrap(other))

    def __mod__(self, other: Any) -> Expr:
        return BinaryOp("%", self, wrap(other))

    def __neg__(self) -> Expr:
        return UnaryOp("neg", self)

    # comparison
    def __eq__(self, other: Any) -> Expr:  # type: ignore[override]
        return BinaryOp("==", self, wrap(other))

    def __ne__(self, other: Any) -> Expr:  # type: ignore[override]
        return BinaryOp("!=", self, wrap(other))

    def __lt__(self, other: Any) -> Expr:
        return BinaryOp("<", self, wrap(other))

    def __le__(self, other: Any) -> Expr:
        return BinaryOp("<=", self, wrap(other))

    def __gt__(self, other: Any) -> Expr:
        return BinaryOp(">", self, wrap(other))

    def __ge__(self, other: Any) -> Expr:
        return BinaryOp(">=", self, wrap(other))

    # logic (SQL three-valued)
    def __and__(self, other: Any) -> Expr:
        return BinaryOp("and", self, wrap(other))

    def __or__(self, other: Any) -> Expr:
        return BinaryOp("or", self, wrap(other))

    def __invert__(self) -> Expr:
        return UnaryOp("not", self)

    def __bool__(self) -> bool:
        raise TypeError("an expression has no truth value; use & | ~ instead of and/or/not")

    def is_null(self) -> Expr:
        return UnaryOp("is_null", self)

    def is_not_null(self) -> Expr:
        return UnaryOp("is_not_null", self)

    def cast(self, type_name: str) -> Expr:
        from dbspark.core.types import normalize_type

        return Cast(self, normalize_type(type_name))


@dataclass(frozen=True, eq=False)
class Column(Expr):
    name: str

    def __repr__(self) -> str:
        return f"col({self.name!r})"


@dataclass(frozen=True, eq=False)
class Literal(Expr):
    value: Any

    def __repr__(self) -> str:
        return f"lit({self.value!r})"


@dataclass(frozen=True, eq=False)
class BinaryOp(Expr):
    op: str
    left: Expr
    right: Expr

    def children(self) -> tuple[Expr, ...]:
        return (self.left, self.right)

    def __repr__(self) -> str:
        return f"({self.left!r} {self.op} {self.right!r})"


@dataclass(frozen=True, eq=False)
class UnaryOp(Expr):
    op: str  # "neg" | "not" | "is_null" | "is_not_null"
    operand: Expr

    def children(self) -> tuple[Expr, ...]:
        return (self.operand,)

    def __repr__(self) -> str:
        return f"{self.op}({self.operand!r})"


@dataclass(frozen=True, eq=False)
class Cast(Expr):
    operand: Expr
    to: str

    def children(self) -> tuple[Expr, ...]:
        return (self.operand,)


@dataclass(frozen=True, eq=False)
class Call(Expr):
    """A named function from the fixed library below (never arbitrary Python)."""

    function: str
    args: tuple[Expr, ...]

    def children(self) -> tuple[Expr, ...]:
        return self.args

    def __repr__(self) -> str:
        return f"{self.function}({', '.join(map(repr, self.args))})"


FUNCTIONS = {
    # name: (minimum arity, maximum arity or None)
    "coalesce": (1, None),
    "if_else": (3, 3),
    "lower": (1, 1),
    "upper": (1, 1),
    "length": (1, 1),
    "concat": (1, None),
    "abs": (1, 1),
    "greatest": (1, None),
    "least": (1, None),
    # array producers, for flat_map
    "array": (1, None),
    "sequence": (2, 2),
    "split": (2, 2),
    # predicates
    "like": (2, 2),
}


def col(name: str) -> Column:
    """A column of the input row."""
    return Column(name)


def lit(value: Any) -> Literal:
    """A constant: int (BIGINT), float (DOUBLE), str (STRING), bool (BOOLEAN), ``date``
    (DATE), a timezone-aware ``datetime`` (TIMESTAMP, held in UTC), ``Decimal`` (DECIMAL
    with the literal's own digits, as Spark types ``12.50``) or None (NULL)."""
    if isinstance(value, dt.datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise TypeError(f"a TIMESTAMP literal needs a timezone-aware datetime, got {value!r}")
        return Literal(value.astimezone(dt.UTC))
    if isinstance(value, Decimal):
        decimalliteral_type(value)  # refuses NaN, infinities and more than 38 digits
        return Literal(value)
    if value is not None and not isinstance(value, (bool, int, float, str, dt.date)):
        raise TypeError(f"unsupported literal {value!r}")
    return Literal(value)


def decimalliteral_type(value: Decimal) -> str:
    """Spark's type for a decimal literal: as many digits as it is written with."""
    if not value.is_finite():
        raise TypeError(f"a DECIMAL literal must be finite, got {value}")
    _, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int)
    scale = max(-exponent, 0)
    precision = max(len(digits) + max(exponent, 0), scale, 1)
    if precision > MAX_DECIMAL_PRECISION:
        raise TypeError(f"the DECIMAL literal {value} has more than 38 digits")
    return decimal_of(precision, scale)


def wrap(value: Any) -> Expr:
    return value if isinstance(value, Expr) else lit(value)


def call(function: str, *args: Any) -> Call:
    if function not in FUNCTIONS:
        raise ValueError(f"unknown function {function!r}; known: {', '.join(sorted(FUNCTIONS))}")
    low, high = FUNCTIONS[function]
    if len(args) < low or (high is not None and len(args) > high):
        raise TypeError(f"{function} takes {low}..{high or 'n'} arguments, got {len(args)}")
    return Call(function, tuple(wrap(a) for a in args))


def coalesce(*args: Any) -> Call:
    return call("coalesce", *args)


def if_else(condition: Any, then: Any, otherwise: Any) -> Call:
    return call("if_else", condition, then, otherwise)


def concat(*args: Any) -> Call:
    return call("concat", *args)


def array(*args: Any) -> Call:
    return call("array", *args)


def sequence(start: Any, stop: Any) -> Call:
    """The integers from ``start`` to ``stop`` inclusive, downwards if stop < start."""
    return call("sequence", start, stop)


def split(text: Any, separator: str) -> Call:
    """Split a string on a literal, non-empty separator."""
    if not isinstance(separator, str) or not separator:
        raise ValueError(f"split needs a non-empty string separator, got {separator!r}")
    return call("split", text, lit(separator))


def like(text: Any, pattern: str) -> Call:
    """SQL's ``text LIKE pattern``: ``%`` matches any run of characters, ``_`` one
    character, and a backslash makes the next ``%``, ``_`` or backslash literal."""
    like_regex(pattern)  # a bad pattern is refused where it is written
    return call("like", text, lit(pattern))


def like_regex(pattern: str) -> str:
    """A ``LIKE`` pattern as a regular expression that must match the whole text (the
    syntax both Python's ``re`` and RE2 read; ``.`` must match newlines, as in Spark)."""
    parts = []
    escaped = False
    for char in pattern:
        if escaped:
            if char not in "%_\\":
                raise ValueError(
                    f"LIKE pattern {pattern!r}: the escape character must be followed by "
                    f"%, _ or \\, not {char!r}"
                )
            parts.append(re.escape(char))
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == "%":
            parts.append(".*")
        elif char == "_":
            parts.append(".")
        else:
            parts.append(re.escape(char))
    if escaped:
        raise ValueError(f"LIKE pattern {pattern!r} ends with the escape character")
    return "".join(parts)


def walk(expr: Expr) -> Iterator[Expr]:
    yield expr
    for child in expr.children():
        yield from walk(child)


def referenced_columns(expr: Expr) -> set[str]:
    return {node.name for node in walk(expr) if isinstance(node, Column)}


class ExpressionError(TypeError):
    """An expression does not fit the schema it is applied to."""


def infer_type(expr: Expr, schema: Schema, where: str) -> str:
    """The type of ``expr`` over rows of ``schema``; ``where`` names the operator in errors."""

    def fail(message: str) -> ExpressionError:
        return ExpressionError(f"{where}: {message} in {expr!r}")

    def visit(node: Expr) -> str:
        if isinstance(node, Column):
            if node.name not in schema:
                raise fail(f"unknown column {node.name!r} (columns: {', '.join(schema.names)})")
            return schema.type_of(node.name)
        if isinstance(node, Literal):
            return literal_type(node.value)
        if isinstance(node, Cast):
            source = visit(node.operand)
            if is_array(node.to):
                raise fail(f"cannot cast to {node.to}; casts are between scalar types")
            if not can_cast(source, node.to):
                raise fail(f"cannot cast {source} to {node.to}")
            return node.to
        if isinstance(node, UnaryOp):
            inner = visit(node.operand)
            if node.op == "neg":
                if not is_numeric(inner):
                    raise fail(f"cannot negate a {inner}")
                return inner
            if node.op == "not":
                _expect_boolean(inner, fail)
                return BOOLEAN
            return BOOLEAN
        if isinstance(node, BinaryOp):
            left, right = visit(node.left), visit(node.right)
            try:
                decimal = decimal_arithmetic(node, left, right)
            except TypeError as error:
                raise fail(str(error)) from None
            if decimal is not None:
                return decimal[2]
            return _binary_type(node.op, left, right, fail)
        if isinstance(node, Call):
            return _call_type(node, [visit(a) for a in node.args], fail)
        raise fail(f"unknown expression node {type(node).__name__}")

    return visit(expr)


NULL_TYPE = "null"


def literal_type(value: Any) -> str:
    """The type of a Python literal (``null`` for None)."""
    if value is None:
        return NULL_TYPE
    if isinstance(value, bool):
        return BOOLEAN
    if isinstance(value, int):
        return BIGINT
    if isinstance(value, float):
        return DOUBLE
    if isinstance(value, dt.datetime):
        return TIMESTAMP
    if isinstance(value, dt.date):
        return DATE
    if isinstance(value, Decimal):
        return decimalliteral_type(value)
    return STRING


def can_cast(source: str, target: str) -> bool:
    """Casts between scalar types that dbspark defines (Spark's, less the numeric <-> date
    and time conversions, which Spark's ANSI mode refuses or defines by the epoch)."""
    if source in (NULL_TYPE, target, STRING) or target == STRING:
        return True
    if is_array(source) or is_array(target):
        return False
    if is_temporal(target):
        return is_temporal(source)
    return not is_temporal(source)


def _expect_boolean(type_name: str, fail: Any) -> None:
    if type_name not in (BOOLEAN, NULL_TYPE):
        raise fail(f"expected a boolean, got {type_name}")


def unify(a: str, b: str) -> str | None:
    """The common type of two operands, or None if they do not mix: a DOUBLE absorbs every
    number, a BIGINT meets a DECIMAL as DECIMAL(20,0), two decimals widen to hold both
    (Spark's wider decimal type), and a DATE meets a TIMESTAMP as its midnight UTC."""
    if a == NULL_TYPE:
        return b
    if b == NULL_TYPE or a == b:
        return a
    if is_numeric(a) and is_numeric(b):
        if DOUBLE in (a, b):
            return DOUBLE
        return wider_decimal(as_decimal(a), as_decimal(b))
    if is_temporal(a) and is_temporal(b):
        return TIMESTAMP
    return None


def as_decimal(type_name: str, literal: Any = None) -> str:
    """The decimal an integer operand becomes next to a decimal: a BIGINT literal gets its
    own digits (as Spark types ``1`` in ``1 - discount``), a BIGINT column 20 digits."""
    if is_decimal(type_name):
        return type_name
    if type_name == BIGINT and isinstance(literal, int) and not isinstance(literal, bool):
        return decimalliteral_type(Decimal(literal))
    if type_name in (BIGINT, NULL_TYPE):
        return BIGINT_AS_DECIMAL
    raise TypeError(f"{type_name} is not an exact number")


def wider_decimal(a: str, b: str) -> str:
    (p1, s1), (p2, s2) = decimal_parts(a), decimal_parts(b)
    scale = max(s1, s2)
    whole = max(p1 - s1, p2 - s2)
    return decimal_of(min(whole + scale, MAX_DECIMAL_PRECISION), min(scale, MAX_DECIMAL_PRECISION))


def _bounded_decimal(precision: int, scale: int) -> str:
    """Spark's ``adjustPrecisionScale``: past 38 digits keep the whole part and give up
    fraction digits, down to 6 (or fewer if the exact result had fewer)."""
    if precision <= MAX_DECIMAL_PRECISION:
        return decimal_of(precision, scale)
    whole = precision - scale
    kept_scale = max(MAX_DECIMAL_PRECISION - whole, min(scale, 6))
    return decimal_of(MAX_DECIMAL_PRECISION, kept_scale)


def decimal_arithmetic(node: BinaryOp, left: str, right: str) -> tuple[str, str, str] | None:
    """For ``+ - *`` between exact numbers of which one is a DECIMAL: each operand's decimal
    type and the result's, by Spark's rules; None when no decimal is involved (or a DOUBLE
    is, which makes it DOUBLE arithmetic). ``/`` and ``%`` of decimals are refused."""
    if node.op not in ARITHMETIC:
        return None
    if not (is_decimal(left) or is_decimal(right)) or DOUBLE in (left, right):
        return None
    if node.op in ("/", "%"):
        raise TypeError(
            f"{node.op} of DECIMAL values is not supported yet; cast an operand to DOUBLE"
        )
    if not (is_numeric(left) or left == NULL_TYPE) or not (is_numeric(right) or right == NULL_TYPE):
        raise TypeError(f"cannot apply {node.op} to {left} and {right}")
    a = as_decimal(left, _literal_value(node.left))
    b = as_decimal(right, _literal_value(node.right))
    (p1, s1), (p2, s2) = decimal_parts(a), decimal_parts(b)
    if node.op == "*":
        result = _bounded_decimal(p1 + p2 + 1, s1 + s2)
    else:
        scale = max(s1, s2)
        result = _bounded_decimal(max(p1 - s1, p2 - s2) + scale + 1, scale)
    return a, b, result


def _literal_value(node: Expr) -> Any:
    return node.value if isinstance(node, Literal) else None


def decimal_sum_type(type_name: str) -> str:
    """Spark's type of ``SUM`` over a decimal: ten more digits."""
    precision, scale = decimal_parts(type_name)
    return decimal_of(min(precision + 10, MAX_DECIMAL_PRECISION), scale)


def decimal_avg_type(type_name: str) -> str:
    """Spark's type of ``AVG`` over a decimal: four more digits, all after the point."""
    precision, scale = decimal_parts(type_name)
    return decimal_of(
        min(precision + 4, MAX_DECIMAL_PRECISION), min(scale + 4, MAX_DECIMAL_PRECISION)
    )


def _binary_type(op: str, left: str, right: str, fail: Any) -> str:
    if op in LOGICAL:
        _expect_boolean(left, fail)
        _expect_boolean(right, fail)
        return BOOLEAN
    common = unify(left, right)
    if common is None:
        raise fail(f"cannot apply {op} to {left} and {right}")
    if op in COMPARISON:
        return BOOLEAN
    if op == "+" and common == STRING:
        raise fail("use concat() to join strings")
    if not is_numeric(common) and common != NULL_TYPE:
        raise fail(f"cannot apply {op} to {common}")
    if op == "/":
        return DOUBLE
    return BIGINT if common == NULL_TYPE else common


def _call_type(node: Call, args: list[str], fail: Any) -> str:
    name = node.function
    if name in ("coalesce", "greatest", "least"):
        result = NULL_TYPE
        for a in args:
            unified = unify(result, a)
            if unified is None:
                raise fail(f"{name} mixes {result} and {a}")
            result = unified
        return result
    if name == "if_else":
        _expect_boolean(args[0], fail)
        unified = unify(args[1], args[2])
        if unified is None:
            raise fail(f"if_else branches have types {args[1]} and {args[2]}")
        return unified
    if name in ("lower", "upper"):
        if args[0] not in (STRING, NULL_TYPE):
            raise fail(f"{name} needs a string")
        return STRING
    if name == "length":
        if args[0] not in (STRING, NULL_TYPE):
            raise fail("length needs a string")
        return BIGINT
    if name == "concat":
        return STRING
    if name == "abs":
        if not is_numeric(args[0]):
            raise fail("abs needs a number")
        return args[0]
    if name == "array":
        result = NULL_TYPE
        for a in args:
            unified = unify(result, a)
            if unified is None or is_array(a):
                raise fail(f"array elements mix {result} and {a}")
            if not _array_element_ok(unified):
                raise fail(f"arrays of {unified} are not supported")
            result = unified
        return array_of(BIGINT if result == NULL_TYPE else result)
    if name == "sequence":
        if any(a not in (BIGINT, NULL_TYPE) for a in args):
            raise fail("sequence needs bigint bounds")
        return array_of(BIGINT)
    if name == "split":
        if args[0] not in (STRING, NULL_TYPE):
            raise fail("split needs a string")
        separator = node.args[1]
        if not (
            isinstance(separator, Literal) and isinstance(separator.value, str) and separator.value
        ):
            raise fail("split needs a non-empty literal string separator")
        return array_of(STRING)
    if name == "like":
        if args[0] not in (STRING, NULL_TYPE):
            raise fail("like needs a string")
        pattern = node.args[1]
        if not (isinstance(pattern, Literal) and isinstance(pattern.value, str)):
            raise fail("like needs a literal string pattern")
        try:
            like_regex(pattern.value)
        except ValueError as error:
            raise fail(str(error)) from None
        return BOOLEAN
    raise fail(f"unknown function {name}")


def _array_element_ok(type_name: str) -> bool:
    return type_name in (BIGINT, DOUBLE, STRING, BOOLEAN, NULL_TYPE)


def output_type(type_name: str) -> str:
    """The type a column gets when an expression of this type is stored (NULL literal -> bigint)."""
    return BIGINT if type_name == NULL_TYPE else type_name


def array_element(type_name: str) -> str:
    return element_type(type_name)
