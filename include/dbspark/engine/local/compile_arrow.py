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
``+``, ``-``, ``*`` and negation of integers; ``coalesce`` of one comparable type;
the final cast to the stored type when it is exact. Everything else (casts between
types, ``/`` and ``%``, decimals, arithmetic on doubles, string functions, arrays) is
None; a double is compared only where no value is NaN (``in_arrow``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from dbspark.circuit.expressions import NULL_TYPE
from dbspark.core.types import BIGINT, DATE, DOUBLE, TIMESTAMP
from dbspark.engine.expression_compiler import ExpressionCompiler
from dbspark.engine.local import in_arrow
from dbspark.engine.local.frame import col as frame_column
from dbspark.engine.local.frame import duck_type

Computed = in_arrow.ArrowColumn | None

#: The Arrow types of the stored types this backend casts to (DuckDB's, with the
#: session's TimeZone at UTC).
_STORED = {
    **in_arrow.ARROW_TYPES,
    "DATE": pa.date32(),
    "TIMESTAMPTZ": pa.timestamp("us", tz="UTC"),
}
_COMPARE = {"==": "=", "!=": "<>"}


class ArrowCompiler(ExpressionCompiler[Computed]):
    """``ExpressionCompiler`` emitting Arrow computations (None: leave it to the SQL)."""

    def typed(self, column: Computed, kind: str, target: str) -> Computed:
        coerced = self.coerce(column, kind, target)
        if target == NULL_TYPE:
            return coerced
        return in_arrow.cast(coerced, _STORED.get(duck_type(target)))

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
        return None  # decimals

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
        return None  # a widening cast: to DOUBLE, a decimal or a timestamp

    def convert(self, column: Computed, kind: str, target: str) -> Computed:
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
        return None

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
