"""Circuit expressions computed in Arrow, where Arrow's answer is the compiled SQL's.

``compile.py`` writes each circuit expression (a filter's predicate, a projection's
column) as DuckDB SQL. This module is a second backend of the same
``ExpressionCompiler``: the typing walk is shared, so every typing decision is made once,
and here each emit is an Arrow computation built from ``in_arrow.py``'s primitives, or
None where Arrow's answer could differ from DuckDB's. The local tier attaches the result
to the SQL column (``LocalColumn.arrow``), so a frame over Arrow tables filters and
projects without a query, and any None (or a value ``in_arrow`` refuses at run time,
such as a float compared, or an overflow) leaves the step to the SQL.

Why it pays: the circuit's own filters and computed columns were the last steps of a
small epoch that always ran a DuckDB query (2-13 ms each, whatever the rows), because
they arrived as SQL text that the frame could not read.

What Arrow computes: column references; boolean, string, integer, double, date and
timestamp literals; comparisons, NULL tests, three-valued AND/OR/NOT and ``if_else``; checked
``+``, ``-``, ``*`` and negation of integers; decimal ``+``, ``-``, ``*`` and integer or
decimal to decimal casts where they neither round nor overflow; ``coalesce`` of one
comparable type; the final cast to the stored type when it is exact. Everything else
(other casts between types, ``/`` and ``%``, arithmetic on doubles, string functions,
arrays) is None; a double is compared only where no value is NaN (``in_arrow``).
"""

from __future__ import annotations

import datetime as dt
import decimal
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from dbspark.circuit.expressions import NULL_TYPE
from dbspark.core.types import BIGINT, DATE, DOUBLE, TIMESTAMP, is_decimal
from dbspark.engine.expression_compiler import ExpressionCompiler, widens
from dbspark.engine.local import in_arrow
from dbspark.engine.local.frame import col as frame_column
from dbspark.engine.local.frame import duck_type, stored_type

Computed = in_arrow.ArrowColumn | None

#: The Arrow types of the stored types this backend casts to (DuckDB's, with the
#: session's TimeZone at UTC).
_STORED = {
    **in_arrow.ARROW_TYPES,
    "DATE": pa.date32(),
    "TIMESTAMPTZ": pa.timestamp("us", tz="UTC"),
}
_COMPARE = {"==": "=", "!=": "<>"}


def _arrow_type(kind: str) -> pa.DataType | None:
    """The Arrow type a column of the stored type ``kind`` has (None: not computed here)."""
    return stored_type(duck_type(kind))


class ArrowCompiler(ExpressionCompiler[Computed]):
    """``ExpressionCompiler`` emitting Arrow computations (None: leave it to the SQL)."""

    def typed(self, column: Computed, kind: str, target: str) -> Computed:
        coerced = self.coerce(column, kind, target)
        if target == NULL_TYPE:
            return coerced
        return in_arrow.cast(coerced, _arrow_type(target))

    def column(self, name: str) -> Computed:
        return frame_column(name).arrow

    def constant(self, value: Any) -> Computed:
        return in_arrow.literal(value)

    def typed_constant(self, value: Any, kind: str) -> Computed:
        if kind == BIGINT:
            return in_arrow.typed_literal(value, pa.int64())
        if kind == DATE and isinstance(value, dt.date) and not isinstance(value, dt.datetime):
            return in_arrow.constant(pa.scalar(value, pa.date32()))
        if kind == TIMESTAMP and isinstance(value, dt.datetime):
            if value.tzinfo is None:  # as the SQL's CAST('...' AS TIMESTAMPTZ) at UTC
                value = value.replace(tzinfo=dt.UTC)
            return in_arrow.constant(pa.scalar(value, _STORED["TIMESTAMPTZ"]))
        if kind == DOUBLE and isinstance(value, float):
            return in_arrow.constant(pa.scalar(value, pa.float64()))  # compared only without NaN
        if isinstance(value, (bool, str)):
            return in_arrow.literal(value)
        if is_decimal(kind) and isinstance(value, (int, decimal.Decimal)):
            try:  # the typing walk gave the literal a type that holds it exactly
                scalar = pa.scalar(decimal.Decimal(value), _arrow_type(kind))
            except (pa.ArrowInvalid, OverflowError):
                return None
            return in_arrow.constant(scalar)
        return None

    def untyped_null(self) -> Computed:
        return None

    def null(self, kind: str) -> Computed:
        arrow_type = _STORED.get(duck_type(kind)) if kind != NULL_TYPE else None
        if arrow_type is None:
            return None
        return in_arrow.constant(pa.scalar(None, arrow_type))

    def coerce(self, column: Computed, kind: str, target: str) -> Computed:
        if kind == target or target == NULL_TYPE:
            return column
        if kind == NULL_TYPE:
            return self.null(target)
        if is_decimal(target) and widens(kind, target):
            return self.convert(column, kind, target)
        return None  # a widening cast to DOUBLE or a timestamp

    def convert(self, column: Computed, kind: str, target: str) -> Computed:
        # An integer or a decimal to a decimal, where the SQL's TRY_CAST neither rounds
        # nor overflows (else NULL there: None here leaves it to the SQL).
        if is_decimal(target) and (kind == BIGINT or is_decimal(kind)):
            return in_arrow.to_decimal(column, _arrow_type(target))
        return None

    def negate(self, column: Computed) -> Computed:
        return in_arrow.negate(column)

    def logical_not(self, column: Computed) -> Computed:
        return in_arrow.invert(column)

    def is_null(self, column: Computed) -> Computed:
        return in_arrow.is_null(column)

    def is_not_null(self, column: Computed) -> Computed:
        return in_arrow.is_valid(column)

    def logical(self, op: str, a: Computed, b: Computed) -> Computed:
        return in_arrow.binary("AND" if op == "and" else "OR", a, b)

    def compare(self, op: str, a: Computed, b: Computed) -> Computed:
        return in_arrow.binary(_COMPARE.get(op, op), a, b)

    def arithmetic(self, op: str, a: Computed, b: Computed) -> Computed:
        return in_arrow.binary(op, a, b)

    def decimal_arithmetic(
        self, op: str, operands: Sequence[tuple[Computed, str]], result: str
    ) -> Computed:
        # Exact, then the result's type; rounding to a smaller scale is the SQL's.
        (a, _), (b, _) = operands
        return in_arrow.exact_decimal(op, a, b, _arrow_type(result))

    def divide(self, a: Computed, b: Computed) -> Computed:
        return None

    def remainder(self, a: Computed, b: Computed) -> Computed:
        return None

    def array(self, items: Sequence[Computed], element: str) -> Computed:
        return None

    def coalesce(self, values: Sequence[Computed]) -> Computed:
        return in_arrow.coalesce(values)

    def extremum(self, name: str, values: Sequence[Computed], kind: str) -> Computed:
        return None

    def if_else(self, condition: Computed, then: Computed, otherwise: Computed) -> Computed:
        return in_arrow.case([(condition, then)], otherwise, has_default=True)

    def string_function(self, name: str, text: Computed) -> Computed:
        return None

    def absolute(self, column: Computed) -> Computed:
        return None

    def concat(self, parts: Sequence[Computed]) -> Computed:
        return None

    def sequence(self, start: Computed, stop: Computed) -> Computed:
        return None

    def split(self, text: Computed, separator: str) -> Computed:
        return None

    def like(self, text: Computed, pattern: str) -> Computed:
        return None


def when_true(condition: Computed) -> Computed:
    """A predicate as a filter reads it: NULL is false (the SQL's ``coalesce(p, FALSE)``)."""
    return in_arrow.unary(lambda v: pc.fill_null(v, False), condition, kind=pa.types.is_boolean)
