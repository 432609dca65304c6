"""Scalar SQL expressions as circuit expressions (``dbspark.circuit.expressions``).

A column reference is resolved against the relation in scope and becomes that
relation's internal column. Everything else maps to one circuit expression with
Spark SQL's meaning: ``BETWEEN`` is two comparisons, ``IN (list)`` a chain of ``OR``
(which keeps SQL's three-valued answer when the list holds NULL), ``CASE`` nested
``if_else``. A construct with no circuit expression is refused here, by name.

Literals have Spark's types: ``12.50`` is a DECIMAL(4,2) (``1e3`` a DOUBLE), and
``DATE '...'``/``TIMESTAMP '...'`` are read here, once, so a bad one is refused
before anything runs. A string literal compared with a DATE or TIMESTAMP is read as
one (Spark casts it), and a DATE or TIMESTAMP literal plus or minus an ``INTERVAL`` of
days, months or years is computed here.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from functools import reduce

from sqlglot import exp

from dbspark.circuit.expressions import (
    Expr,
    ExpressionError,
    Literal,
    call,
    col,
    if_else,
    infer_type,
    like,
    lit,
)
from dbspark.core.temporal import add_months, parse_date, parse_timestamp
from dbspark.core.types import (
    BIGINT,
    BOOLEAN,
    DATE,
    DOUBLE,
    STRING,
    TIMESTAMP,
    Schema,
    is_decimal,
    normalize_type,
    rounded_decimal,
)
from dbspark.sql.errors import SqlError, position, sql_text


@dataclass(frozen=True)
class Field:
    """A column a query can name: ``qualifier.name``, held in ``column`` of the stream."""

    qualifier: str | None
    name: str
    column: str
    type: str


#: Functions that give another answer on every run: a view over them has no fixed value.
NONDETERMINISTIC = (exp.Rand, exp.Uuid, exp.CurrentDate, exp.CurrentTimestamp)
_NONDETERMINISTIC_NAMES = {
    "now",
    "random",
    "randn",
    "rand",
    "uuid",
    "current_timestamp",
    "current_date",
    "monotonically_increasing_id",
    "shuffle",
    "spark_partition_id",
    "input_file_name",
}
#: Spark type names a CAST may target, as circuit types.
_CAST_TYPES = {
    exp.DataType.Type.BIGINT: BIGINT,
    exp.DataType.Type.INT: BIGINT,
    exp.DataType.Type.SMALLINT: BIGINT,
    exp.DataType.Type.TINYINT: BIGINT,
    exp.DataType.Type.DOUBLE: DOUBLE,
    exp.DataType.Type.FLOAT: DOUBLE,
    exp.DataType.Type.VARCHAR: STRING,
    exp.DataType.Type.TEXT: STRING,
    exp.DataType.Type.BOOLEAN: BOOLEAN,
    exp.DataType.Type.DATE: DATE,
    exp.DataType.Type.TIMESTAMP: TIMESTAMP,
    exp.DataType.Type.TIMESTAMPTZ: TIMESTAMP,
    exp.DataType.Type.TIMESTAMPLTZ: TIMESTAMP,
}
_INTERVAL_MONTHS = {"MONTH": 1, "MONTHS": 1, "YEAR": 12, "YEARS": 12}
_INTERVAL_DAYS = {"DAY": 1, "DAYS": 1, "WEEK": 7, "WEEKS": 7}
_COMPARISONS: dict[type, Callable[[Expr, Expr], Expr]] = {
    exp.EQ: lambda a, b: a == b,
    exp.NEQ: lambda a, b: a != b,
    exp.GT: lambda a, b: a > b,
    exp.GTE: lambda a, b: a >= b,
    exp.LT: lambda a, b: a < b,
    exp.LTE: lambda a, b: a <= b,
}
_ARITHMETIC: dict[type, Callable[[Expr, Expr], Expr]] = {
    exp.Add: lambda a, b: a + b,
    exp.Sub: lambda a, b: a - b,
    exp.Mul: lambda a, b: a * b,
    exp.Div: lambda a, b: a / b,
    exp.Mod: lambda a, b: a % b,
}
_BINARY = {**_COMPARISONS, **_ARITHMETIC}
_ONE_ARGUMENT = {exp.Upper: "upper", exp.Lower: "lower", exp.Length: "length", exp.Abs: "abs"}

#: A replacement tried at every node before the default translation (the aggregate
#: phase uses it for group keys and aggregate results); None means "translate as usual".
Hook = Callable[[exp.Expression], Expr | None]


class Scalars:
    """Translates the scalar expressions of one query block over ``fields``."""

    def __init__(
        self,
        view: str,
        fields: Sequence[Field],
        hook: Hook | None = None,
        schema: Schema | None = None,
    ) -> None:
        self.view = view
        self.fields = list(fields)
        self.hook = hook
        # The types of the columns a translated expression reads (for literals that take
        # their type from the other side of a comparison).
        self.schema = schema or Schema(tuple((f.column, f.type) for f in self.fields))

    def type_of(self, expr: Expr) -> str | None:
        try:
            return infer_type(expr, self.schema, self.view)
        except ExpressionError:
            return None

    def error(self, message: str, node: exp.Expression | None) -> SqlError:
        line, column = position(node)
        return SqlError(message, view=self.view, line=line, column=column)

    def resolve(self, column: exp.Column) -> Field:
        """The field ``column`` names: Spark's rule, names compared without case, an
        unqualified name found in two relations is ambiguous."""
        name = column.name.lower()
        qualifier = column.table.lower() or None
        found = [
            f
            for f in self.fields
            if f.name.lower() == name and (qualifier is None or f.qualifier == qualifier)
        ]
        if not found:
            known = ", ".join(
                f"{f.qualifier}.{f.name}" if f.qualifier else f.name for f in self.fields
            )
            raise self.error(
                f"unknown column {column.sql(dialect='spark')} (known: {known})", column
            )
        if len({(f.qualifier, f.name) for f in found}) > 1:
            raise self.error(
                f"column {column.name!r} is ambiguous: it is in "
                f"{', '.join(sorted({str(f.qualifier) for f in found}))}; qualify it",
                column,
            )
        return found[0]

    def __call__(self, node: exp.Expression) -> Expr:
        if self.hook is not None:
            replaced = self.hook(node)
            if replaced is not None:
                return replaced
        return self._translate(node)

    def _translate(self, node: exp.Expression) -> Expr:
        if isinstance(node, exp.Paren):
            return self(node.this)
        if isinstance(node, exp.Column):
            if isinstance(node.this, exp.Star):
                raise self.error(f"{sql_text(node)} is only allowed in the select list", node)
            return col(self.resolve(node).column)
        if isinstance(node, exp.Literal):
            return lit(_literal(node))
        if isinstance(node, exp.Boolean):
            return lit(bool(node.this))
        if isinstance(node, exp.Null):
            return lit(None)
        if isinstance(node, exp.Neg):
            return -self(node.this)
        if isinstance(node, exp.Not):
            return ~self(node.this)
        if isinstance(node, exp.And):
            return self(node.this) & self(node.expression)
        if isinstance(node, exp.Or):
            return self(node.this) | self(node.expression)
        if isinstance(node, (exp.Add, exp.Sub)) and (
            isinstance(node.this, exp.Interval) or isinstance(node.expression, exp.Interval)
        ):
            return self._shifted(node)
        comparison = _COMPARISONS.get(type(node))
        if comparison is not None:
            return self.compare(comparison, self(node.this), self(node.expression), node)
        binary = _BINARY.get(type(node))
        if binary is not None:
            return binary(self(node.this), self(node.expression))
        if isinstance(node, exp.Is):
            if not isinstance(node.expression, exp.Null):
                raise self.error(f"IS {sql_text(node.expression)} is not supported", node)
            return self(node.this).is_null()
        if isinstance(node, exp.Between):
            value = self(node.this)
            low = self.compare(lambda a, b: a >= b, value, self(node.args["low"]), node)
            high = self.compare(lambda a, b: a <= b, value, self(node.args["high"]), node)
            return low & high
        if isinstance(node, exp.In):
            if node.args.get("query") is not None:
                raise self.error("IN (subquery) is only supported as a condition in WHERE", node)
            value = self(node.this)
            return reduce(
                lambda a, b: a | b,
                [self.compare(lambda a, b: a == b, value, self(i), i) for i in node.expressions],
            )
        if isinstance(node, (exp.Like, exp.ILike, exp.Escape)):
            return self._like(node)
        if isinstance(node, exp.Case):
            return self._case(node)
        if isinstance(node, exp.If):
            then, other = self.branches([self(node.args["true"]), self._else(node)])
            return if_else(self(node.this), then, other)
        if isinstance(node, exp.Coalesce):
            values = [self(node.this), *[self(e) for e in node.expressions]]
            return call("coalesce", *self.branches(values))
        function = _ONE_ARGUMENT.get(type(node))
        if function is not None:
            return call(function, self(node.this))
        if isinstance(node, (exp.Cast, exp.TryCast)):
            return self._cast(node)
        self._refuse(node)
        raise AssertionError("unreachable")

    def _like(self, node: exp.Expression) -> Expr:
        """``[NOT] LIKE`` and ``[NOT] ILIKE`` (Spark's: ``lower(text) LIKE lower(pattern)``)
        of a literal pattern, with an optional ``ESCAPE`` character (by default a
        backslash), rewritten to the backslash escapes of ``like``."""
        escape = None
        if isinstance(node, exp.Escape):
            escape, node = node.expression, node.this
            if not isinstance(node, (exp.Like, exp.ILike)):
                raise self.error(f"ESCAPE after {sql_text(node)} is not supported", escape)
        word = "ILIKE" if isinstance(node, exp.ILike) else "LIKE"
        pattern = node.expression
        if not (isinstance(pattern, exp.Literal) and pattern.is_string):
            raise self.error(f"{word} needs a literal string pattern", node)
        text, written = self(node.this), pattern.this
        if escape is not None:
            if not (isinstance(escape, exp.Literal) and escape.is_string):
                raise self.error("ESCAPE needs a literal character", escape)
            written = self._backslash_escapes(written, escape.this, escape)
        if word == "ILIKE":
            text, written = call("lower", text), written.lower()
        try:
            matched = like(text, written)
        except ValueError as error:
            raise self.error(str(error), pattern) from None
        return ~matched if node.args.get("negate") else matched  # NOT [I]LIKE

    def _backslash_escapes(self, pattern: str, escape: str, node: exp.Expression) -> str:
        """``pattern`` written with ``escape`` as its escape character, rewritten with the
        backslash (a literal backslash then escaped itself)."""
        if len(escape) != 1 or escape in "%_":
            raise self.error(f"ESCAPE {escape!r} must be one character other than % and _", node)
        out, escaped = [], False
        for char in pattern:
            if escaped:
                if char not in ("%", "_", escape):
                    raise self.error(
                        f"LIKE pattern {pattern!r}: the escape character must be followed by "
                        f"%, _ or itself, not {char!r}",
                        node,
                    )
                out.append("\\" + char if char in "%_\\" else char)
                escaped = False
            elif char == escape:
                escaped = True
            else:
                out.append("\\\\" if char == "\\" else char)
        if escaped:
            raise self.error(f"LIKE pattern {pattern!r} ends with the escape character", node)
        return "".join(out)

    def _case(self, node: exp.Case) -> Expr:
        subject = node.this
        ifs = node.args.get("ifs") or []
        default = self(node.args["default"]) if node.args.get("default") else lit(None)
        *values, result = self.branches([*(self(b.args["true"]) for b in ifs), default])
        for branch, value in reversed(list(zip(ifs, values, strict=True))):
            condition = self(branch.this)
            if subject is not None:
                condition = self(subject) == condition
            result = if_else(condition, value, result)
        return result

    def branches(self, values: list[Expr]) -> list[Expr]:
        """Values that meet in one type (COALESCE, CASE, IF): next to a DECIMAL, an integer
        literal is Spark's INT (10 digits) or BIGINT (20), not only its own digits."""
        if not any(is_decimal(self.type_of(v) or "") for v in values):
            return values
        return [_integer_as_decimal(v) for v in values]

    def _else(self, node: exp.If) -> Expr:
        other = node.args.get("false")
        return lit(None) if other is None else self(other)

    def compare(
        self, comparison: Callable[[Expr, Expr], Expr], a: Expr, b: Expr, node: exp.Expression
    ) -> Expr:
        """``comparison(a, b)``, a string literal read as the DATE or TIMESTAMP it meets."""
        a = self._temporal_literal(a, self.type_of(b), node)
        b = self._temporal_literal(b, self.type_of(a), node)
        return comparison(a, b)

    def _temporal_literal(self, expr: Expr, other: str | None, node: exp.Expression) -> Expr:
        if not (isinstance(expr, Literal) and isinstance(expr.value, str)):
            return expr
        if other not in (DATE, TIMESTAMP):
            return expr
        return lit(self._read_literal(expr.value, other, node))

    def _read_literal(self, text: str, target: str, node: exp.Expression) -> object:
        """A string literal as a value of ``target`` (DATE, TIMESTAMP or DECIMAL), read
        once here; a literal that does not read is refused (Spark's ANSI mode fails)."""
        value: object
        if target == DATE:
            value = parse_date(text)
        elif target == TIMESTAMP:
            value = parse_timestamp(text)
        else:
            value = rounded_decimal(text.strip(), target)
        if value is None:
            raise self.error(f"{text!r} is not a valid {target.upper()}", node)
        return value

    def _shifted(self, node: exp.Add | exp.Sub) -> Expr:
        """A DATE or TIMESTAMP literal plus or minus an INTERVAL literal, computed now."""
        interval, other = (
            (node.this, node.expression)
            if isinstance(node.this, exp.Interval)
            else (node.expression, node.this)
        )
        if isinstance(node, exp.Sub) and interval is node.this:
            raise self.error("an INTERVAL cannot be subtracted from", node)
        base = self(other)
        unit = interval.text("unit").upper()
        amount_node = interval.this
        try:
            amount = int(str(amount_node.this if amount_node is not None else ""))
        except ValueError:
            amount = None
        if amount is None or (unit not in _INTERVAL_MONTHS and unit not in _INTERVAL_DAYS):
            raise self.error(
                f"{sql_text(interval)} is not supported: use INTERVAL 'n' DAY, MONTH or YEAR",
                interval,
            )
        if not (isinstance(base, Literal) and isinstance(base.value, dt.date)):
            raise self.error(
                f"{sql_text(node)}: INTERVAL arithmetic is only supported on DATE and "
                "TIMESTAMP literals",
                node,
            )
        sign = -1 if isinstance(node, exp.Sub) else 1
        value = base.value
        if unit in _INTERVAL_MONTHS:
            months = sign * amount * _INTERVAL_MONTHS[unit]
            if isinstance(value, dt.datetime):
                moved = add_months(value.date(), months)
                return lit(dt.datetime.combine(moved, value.timetz()))
            return lit(add_months(value, months))
        return lit(value + dt.timedelta(days=sign * amount * _INTERVAL_DAYS[unit]))

    def _cast(self, node: exp.Cast) -> Expr:
        to = node.to
        if to.this == exp.DataType.Type.DECIMAL:
            target = normalize_type(to.sql(dialect="spark"))
        elif to.this in _CAST_TYPES:
            target = _CAST_TYPES[to.this]
        else:
            raise self.error(f"CAST to {to.sql(dialect='spark')} is not supported", node)
        operand = node.this
        if (
            isinstance(operand, exp.Literal)
            and operand.is_string
            and (target in (DATE, TIMESTAMP) or target.startswith("decimal("))
        ):
            return lit(self._read_literal(operand.this, target, node))  # DATE '2026-01-02'
        return self(operand).cast(target)

    def _refuse(self, node: exp.Expression) -> None:
        if isinstance(node, exp.Window):
            raise self.error(f"window function {sql_text(node)} is not supported", node)
        if isinstance(node, NONDETERMINISTIC) or (
            isinstance(node, exp.Anonymous) and str(node.this).lower() in _NONDETERMINISTIC_NAMES
        ):
            raise self.error(
                f"non-deterministic function {sql_text(node)}: a view must have one answer", node
            )
        if isinstance(node, exp.AggFunc):
            raise self.error(f"aggregate {sql_text(node)} is not allowed here", node)
        if isinstance(node, (exp.Subquery, exp.Exists, exp.Select)):
            raise self.error(f"subquery {sql_text(node)} is not supported here", node)
        raise self.error(f"{type(node).__name__.upper()} ({sql_text(node)}) is not supported", node)


def _integer_as_decimal(expr: Expr) -> Expr:
    if not (isinstance(expr, Literal) and type(expr.value) is int):
        return expr
    digits = 10 if -(2**31) <= expr.value < 2**31 else 20
    return expr.cast(f"decimal({digits},0)")


def _literal(node: exp.Literal) -> object:
    """Spark's literal types: digits are an integer, digits with a point a DECIMAL of
    exactly those digits, and a number with an exponent a DOUBLE."""
    if node.is_string:
        return node.this
    text = node.this
    try:
        return int(text)
    except ValueError:
        pass
    if "e" in text.lower():
        return float(text)
    return Decimal(text)


def conjuncts(node: exp.Expression | None) -> list[exp.Expression]:
    """The terms of an ``AND`` chain (parentheses removed), in order."""
    if node is None:
        return []
    while isinstance(node, exp.Paren):
        node = node.this
    if isinstance(node, exp.And):
        return conjuncts(node.this) + conjuncts(node.expression)
    return [node]


def column_refs(node: exp.Expression) -> list[exp.Column]:
    """The column references in ``node``, not descending into subqueries."""
    found = []
    for part in node.walk(prune=lambda n: isinstance(n, (exp.Select, exp.Subquery))):
        if isinstance(part, exp.Column) and not isinstance(part.this, exp.Star):
            found.append(part)
    return found
