"""The typing half of compiling circuit expressions, shared by both tiers' compilers.

Compiling an expression means two things: deciding types (what a NULL literal becomes,
which side of a comparison widens, what ``/`` returns, the common type of ``coalesce``)
and writing the target's code. The first is the reference engine's semantics and is
the same for every target, so it lives here once. ``ExpressionCompiler`` walks the
tree, makes every typing decision, and asks its subclass only to *emit*: a column, a
literal, a comparison, a cast, a call. ``engine/spark/compile.py`` emits PySpark
``Column``s and ``engine/local/compile.py`` emits DuckDB SQL, as ibis's backends
each visit one shared expression layer.

The strings in ``PYTHON_*`` are the reference's cast syntax (Python's ``int()`` and
``float()`` accept these and nothing else), written as regular expressions that both
Java's and RE2's engines read the same way.
"""

from __future__ import annotations

import datetime as dt
from abc import ABC, abstractmethod
from collections.abc import Sequence
from decimal import Decimal
from typing import Any, Generic, TypeVar

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
    decimal_arithmetic,
    literal_type,
    unify,
)
from dbspark.circuit.expressions import Column as ColumnRef
from dbspark.core.types import (
    BIGINT,
    BOOLEAN,
    DATE,
    DOUBLE,
    STRING,
    TIMESTAMP,
    Schema,
    array_of,
    is_array,
    is_decimal,
)

BIGINT_MIN = -(2**63)
BIGINT_MAX = 2**63 - 1
#: What Python's ``int()`` accepts once the text is stripped (ASCII digits only).
PYTHON_INT_SYNTAX = r"^[+-]?[0-9](_?[0-9])*$"
#: What Python's ``float()`` accepts once stripped, besides nan/inf/infinity.
PYTHON_FLOAT_SYNTAX = (
    r"^[+-]?(([0-9](_?[0-9])*)(\.([0-9](_?[0-9])*)?)?|\.[0-9](_?[0-9])*)"
    r"([eE][+-]?[0-9](_?[0-9])*)?$"
)
TRUE_WORDS = ("true", "t", "yes", "y", "1")
FALSE_WORDS = ("false", "f", "no", "n", "0")
#: What a cast from a (stripped) string to DECIMAL accepts (DATE and TIMESTAMP: see
#: ``core/temporal.py``), so that every engine reads the same text as the same number.
DECIMAL_SYNTAX = r"^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?$"


def widens(kind: str, target: str) -> bool:
    """Is ``kind`` -> ``target`` an implicit, exact widening that is a cast (an integer or
    decimal to a wider decimal, a decimal to DOUBLE, a DATE to its midnight UTC)?"""
    if kind == target:
        return False
    if is_decimal(target):
        return kind == BIGINT or is_decimal(kind)
    return (is_decimal(kind) and target == DOUBLE) or (kind, target) == (DATE, TIMESTAMP)


C = TypeVar("C")


class ExpressionCompiler(ABC, Generic[C]):
    """Compiles expressions over rows of ``schema`` to a target's columns of type ``C``."""

    def __init__(self, schema: Schema) -> None:
        self.schema = schema

    # --- the walk (every typing decision) ------------------------------------------------
    def compile(self, expr: Expr) -> tuple[C, str]:
        """``(column, type)``; the type is the reference's inferred type (``null`` possible)."""
        if isinstance(expr, ColumnRef):
            return self.column(expr.name), self.schema.type_of(expr.name)
        if isinstance(expr, Literal):
            return self.literal(expr.value)
        if isinstance(expr, UnaryOp):
            return self._unary(expr)
        if isinstance(expr, BinaryOp):
            return self._binary(expr)
        if isinstance(expr, Cast):
            inner, kind = self.compile(expr.operand)
            return self.cast(inner, kind, expr.to), expr.to
        if isinstance(expr, Call):
            return self._call(expr)
        raise TypeError(f"cannot compile {expr!r}")

    def cast(self, column: C, kind: str, target: str) -> C:
        """The reference's ``cast_value`` (NULL on failure) from ``kind`` to ``target``:
        between scalar types only (``convert``); an array only to its own type."""
        if kind == NULL_TYPE:
            return self.null(target)
        if is_array(kind) or is_array(target):
            if kind == target:
                return column
            raise TypeError(f"cannot cast {kind} to {target}")
        if kind == target:
            return column
        return self.convert(column, kind, target)

    def typed(self, column: C, kind: str, target: str) -> C:
        """``column`` of type ``kind`` as the stored ``target`` (``output_type``)."""
        return self.coerce(column, kind, target)

    def _unary(self, expr: UnaryOp) -> tuple[C, str]:
        inner, kind = self.compile(expr.operand)
        if expr.op == "neg":
            if kind == NULL_TYPE:
                return self.null(BIGINT), BIGINT
            return self.negate(inner), kind
        if expr.op == "not":
            return self.logical_not(self.coerce(inner, kind, BOOLEAN)), BOOLEAN
        if expr.op == "is_null":
            return (self.constant(True) if kind == NULL_TYPE else self.is_null(inner)), BOOLEAN
        if expr.op == "is_not_null":
            return (self.constant(False) if kind == NULL_TYPE else self.is_not_null(inner)), BOOLEAN
        raise TypeError(f"unknown unary operator {expr.op}")

    def _binary(self, expr: BinaryOp) -> tuple[C, str]:
        left, left_type = self.compile(expr.left)
        right, right_type = self.compile(expr.right)
        op = expr.op
        if op in LOGICAL:
            a, b = self.coerce(left, left_type, BOOLEAN), self.coerce(right, right_type, BOOLEAN)
            return self.logical(op, a, b), BOOLEAN
        common = unify(left_type, right_type)
        if common is None:
            raise TypeError(f"cannot apply {op} to {left_type} and {right_type}")
        if op in COMPARISON:
            if common == NULL_TYPE:
                return self.null(BOOLEAN), BOOLEAN
            a, b = self.coerce(left, left_type, common), self.coerce(right, right_type, common)
            return self.compare(op, a, b), BOOLEAN
        if op not in ARITHMETIC:
            raise TypeError(f"unknown binary operator {op}")
        decimal = decimal_arithmetic(expr, left_type, right_type)
        if decimal is not None:
            left_decimal, right_decimal, result = decimal
            if NULL_TYPE in (left_type, right_type):
                return self.null(result), result
            a = self.coerce(left, left_type, left_decimal)
            b = self.coerce(right, right_type, right_decimal)
            operands = ((a, left_decimal), (b, right_decimal))
            return self.decimal_arithmetic(op, operands, result), result
        result_type = DOUBLE if op == "/" else (BIGINT if common == NULL_TYPE else common)
        if common == NULL_TYPE:
            return self.null(result_type), result_type
        a, b = self.coerce(left, left_type, common), self.coerce(right, right_type, common)
        if op == "/":
            return self.divide(a, b), DOUBLE
        if op == "%":
            return self.remainder(a, b), result_type
        return self.arithmetic(op, a, b), result_type

    def _call(self, expr: Call) -> tuple[C, str]:
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
                items = [self.coerce(c, k, element) for c, k in compiled]
                return self.array(items, element), array_of(element)
            if common == NULL_TYPE:
                return self.null(BIGINT), NULL_TYPE
            present = [self.coerce(c, k, common) for c, k in compiled if k != NULL_TYPE]
            if name == "coalesce":
                return (present[0] if len(present) == 1 else self.coalesce(present)), common
            if len(present) == 1:
                return present[0], common
            return self.extremum(name, present, common), common
        if name == "if_else":
            (cond, cond_type), (then, then_type), (other, other_type) = compiled
            common = unify(then_type, other_type)
            if common is None:
                raise TypeError(f"if_else branches have types {then_type} and {other_type}")
            target = BIGINT if common == NULL_TYPE else common
            then_c = self.coerce(then, then_type, target)
            other_c = self.coerce(other, other_type, target)
            if cond_type == NULL_TYPE:
                return other_c, common
            return self.if_else(cond, then_c, other_c), common
        if name in ("lower", "upper", "length"):
            ((arg, kind),) = compiled
            result = BIGINT if name == "length" else STRING
            if kind == NULL_TYPE:
                return self.null(result), result
            return self.string_function(name, arg), result
        if name == "abs":
            ((arg, kind),) = compiled
            return self.absolute(arg), kind
        if name == "concat":
            if any(kind == NULL_TYPE for _, kind in compiled):
                return self.null(STRING), STRING
            parts = [self.cast(c, kind, STRING) for c, kind in compiled]
            return (parts[0] if len(parts) == 1 else self.concat(parts)), STRING
        if name == "sequence":
            (start, start_type), (stop, stop_type) = compiled
            if NULL_TYPE in (start_type, stop_type):
                return self.null(array_of(BIGINT)), array_of(BIGINT)
            return self.sequence(start, stop), array_of(BIGINT)
        if name == "split":
            (text, text_type), _ = compiled
            if text_type == NULL_TYPE:
                return self.null(array_of(STRING)), array_of(STRING)
            separator = expr.args[1]
            if not (
                isinstance(separator, Literal)
                and isinstance(separator.value, str)
                and separator.value
            ):
                raise TypeError(
                    f"split needs a non-empty literal string separator, got {separator!r}"
                )
            return self.split(text, separator.value), array_of(STRING)
        if name == "like":
            (text, text_type), _ = compiled
            if text_type == NULL_TYPE:
                return self.null(BOOLEAN), BOOLEAN
            return self.like(text, expr.args[1].value), BOOLEAN
        raise TypeError(f"unknown function {name}")

    def literal(self, value: Any) -> tuple[C, str]:
        """A Python literal and its type: int is BIGINT, float DOUBLE, None NULL."""
        if value is None:
            return self.untyped_null(), NULL_TYPE
        if isinstance(value, bool):
            return self.constant(value), BOOLEAN
        if isinstance(value, int):
            if not BIGINT_MIN <= value <= BIGINT_MAX:
                raise ValueError(f"literal {value} does not fit in a BIGINT")
            return self.typed_constant(value, BIGINT), BIGINT
        if isinstance(value, float):
            return self.typed_constant(value, DOUBLE), DOUBLE
        if isinstance(value, str):
            return self.constant(value), STRING
        if isinstance(value, (dt.date, Decimal)):
            kind = literal_type(value)
            return self.typed_constant(value, kind), kind
        raise TypeError(f"unsupported literal {value!r}")

    # --- what a target emits -----------------------------------------------------------
    @abstractmethod
    def column(self, name: str) -> C: ...

    @abstractmethod
    def constant(self, value: Any) -> C: ...

    @abstractmethod
    def typed_constant(self, value: Any, kind: str) -> C: ...

    @abstractmethod
    def untyped_null(self) -> C: ...

    @abstractmethod
    def null(self, kind: str) -> C: ...

    @abstractmethod
    def coerce(self, column: C, kind: str, target: str) -> C:
        """NULL literals typed, BIGINT widened to DOUBLE, arrays to a wider element, and
        what ``widens`` names converted (``convert``)."""

    @abstractmethod
    def convert(self, column: C, kind: str, target: str) -> C:
        """A cast between two different scalar types, as the reference's ``cast_value``:
        NULL on failure. BIGINT, DOUBLE and BOOLEAN read Python's syntax from strings and
        a DOUBLE is written as Python's repr; DATE, TIMESTAMP and DECIMAL read the
        ``*_SYNTAX`` forms and are written as Spark writes them; a DECIMAL rounds half away
        from zero and is NULL when it does not fit."""

    @abstractmethod
    def negate(self, column: C) -> C: ...

    @abstractmethod
    def logical_not(self, column: C) -> C: ...

    @abstractmethod
    def is_null(self, column: C) -> C: ...

    @abstractmethod
    def is_not_null(self, column: C) -> C: ...

    @abstractmethod
    def logical(self, op: str, a: C, b: C) -> C: ...

    @abstractmethod
    def compare(self, op: str, a: C, b: C) -> C: ...

    @abstractmethod
    def arithmetic(self, op: str, a: C, b: C) -> C:
        """``+``, ``-`` or ``*`` of two values of one type."""

    @abstractmethod
    def decimal_arithmetic(self, op: str, operands: Sequence[tuple[C, str]], result: str) -> C:
        """``+``, ``-`` or ``*`` of two decimals (each with its type), exact, then rounded
        half away from zero to ``result``'s scale; an error when it does not fit
        ``result`` (Spark's ANSI mode)."""

    @abstractmethod
    def divide(self, a: C, b: C) -> C:
        """Always DOUBLE; NULL for a zero divisor."""

    @abstractmethod
    def remainder(self, a: C, b: C) -> C:
        """The dividend's sign; NULL for a zero divisor."""

    @abstractmethod
    def array(self, items: Sequence[C], element: str) -> C: ...

    @abstractmethod
    def coalesce(self, values: Sequence[C]) -> C: ...

    @abstractmethod
    def extremum(self, name: str, values: Sequence[C], kind: str) -> C:
        """greatest/least skipping NULLs; over DOUBLEs a left fold with Python's order."""

    @abstractmethod
    def if_else(self, condition: C, then: C, otherwise: C) -> C: ...

    @abstractmethod
    def string_function(self, name: str, text: C) -> C:
        """``lower``, ``upper`` (STRING) or ``length`` (BIGINT, code points)."""

    @abstractmethod
    def absolute(self, column: C) -> C: ...

    @abstractmethod
    def concat(self, parts: Sequence[C]) -> C: ...

    @abstractmethod
    def sequence(self, start: C, stop: C) -> C:
        """BIGINTs from start to stop inclusive, downwards when stop < start."""

    @abstractmethod
    def split(self, text: C, separator: str) -> C:
        """Split on a literal separator, keeping empty parts."""

    @abstractmethod
    def like(self, text: C, pattern: str) -> C:
        """``text LIKE pattern`` (the pattern is a literal, checked by ``like_regex``)."""
