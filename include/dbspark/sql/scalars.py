"""Scalar SQL expressions as circuit expressions (``dbspark.circuit.expressions``).

A column reference is resolved against the relation in scope and becomes that
relation's internal column. Everything else maps to one circuit expression with
Spark SQL's meaning: ``BETWEEN`` is two comparisons, ``IN (list)`` a chain of ``OR``
(which keeps SQL's three-valued answer when the list holds NULL), ``CASE`` nested
``if_else``. A construct with no circuit expression is refused here, by name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import reduce

from sqlglot import exp

from dbspark.circuit.expressions import Expr, call, col, if_else, like, lit
from dbspark.core.types import BIGINT, BOOLEAN, DOUBLE, STRING
from dbspark.sql.errors import SqlError, position, sql_text


@dataclass(frozen=True)
class Field:
    """A column a query can name: ``qualifier.name``, held in ``column`` of the stream."""

    qualifier: str | None
    name: str
    column: str


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
}
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

    def __init__(self, view: str, fields: Sequence[Field], hook: Hook | None = None) -> None:
        self.view = view
        self.fields = list(fields)
        self.hook = hook

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
        binary = _BINARY.get(type(node))
        if binary is not None:
            return binary(self(node.this), self(node.expression))
        if isinstance(node, exp.Is):
            if not isinstance(node.expression, exp.Null):
                raise self.error(f"IS {sql_text(node.expression)} is not supported", node)
            return self(node.this).is_null()
        if isinstance(node, exp.Between):
            value = self(node.this)
            return (value >= self(node.args["low"])) & (value <= self(node.args["high"]))
        if isinstance(node, exp.In):
            if node.args.get("query") is not None:
                raise self.error("IN (subquery) is only supported as a condition in WHERE", node)
            value = self(node.this)
            return reduce(lambda a, b: a | b, [value == self(item) for item in node.expressions])
        if isinstance(node, exp.Like):
            pattern = node.expression
            if not (isinstance(pattern, exp.Literal) and pattern.is_string):
                raise self.error("LIKE needs a literal string pattern", node)
            try:
                matched = like(self(node.this), pattern.this)
            except ValueError as error:
                raise self.error(str(error), pattern) from None
            return ~matched if node.args.get("negate") else matched  # NOT LIKE
        if isinstance(node, exp.Case):
            return self._case(node)
        if isinstance(node, exp.If):
            return if_else(self(node.this), self(node.args["true"]), self._else(node))
        if isinstance(node, exp.Coalesce):
            return call("coalesce", self(node.this), *[self(e) for e in node.expressions])
        function = _ONE_ARGUMENT.get(type(node))
        if function is not None:
            return call(function, self(node.this))
        if isinstance(node, (exp.Cast, exp.TryCast)):
            return self._cast(node)
        self._refuse(node)
        raise AssertionError("unreachable")

    def _case(self, node: exp.Case) -> Expr:
        subject = node.this
        result = self(node.args["default"]) if node.args.get("default") else lit(None)
        for branch in reversed(node.args.get("ifs") or []):
            condition = self(branch.this)
            if subject is not None:
                condition = self(subject) == condition
            result = if_else(condition, self(branch.args["true"]), result)
        return result

    def _else(self, node: exp.If) -> Expr:
        other = node.args.get("false")
        return lit(None) if other is None else self(other)

    def _cast(self, node: exp.Cast) -> Expr:
        target = node.to.this
        if target not in _CAST_TYPES:
            raise self.error(f"CAST to {node.to.sql(dialect='spark')} is not supported", node)
        return self(node.this).cast(_CAST_TYPES[target])

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


def _literal(node: exp.Literal) -> object:
    if node.is_string:
        return node.this
    text = node.this
    try:
        return int(text)
    except ValueError:
        return float(text)


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
