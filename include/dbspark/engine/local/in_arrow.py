"""What a local frame computes in Arrow instead of a DuckDB query, and why it is exact.

A small epoch's DuckDB queries cost 2-13 ms each whatever their size, half of it
planning nested SQL; the same step over a few thousand rows in Arrow costs tens of
microseconds. So a frame over an Arrow table (``LocalFrame.table``) derives its result
in Arrow where Arrow's answer is the query's, column for column and type for type, and
leaves everything else to DuckDB. Each function here returns None when it cannot be sure:

* **Types.** Integers, strings, booleans, dates and timestamps are compared and
  grouped. Doubles only where the values allow it (SQL orders NaN above everything and
  equals it to itself, Arrow does neither; SQL's -0.0 equals 0.0, Arrow hashes it
  apart): compared when neither side holds a NaN, grouped and taken the max or min of
  when no value is NaN or -0.0 (``plain_floats``). Decimals of one type are grouped
  and compared (Arrow compares their unscaled integers, which is exact within one
  scale). Their ``+``, ``-``, ``*``, sums and casts are computed exactly in 256-bit
  decimals and cast, checked, to the step's type; a value that would round or does not
  fit leaves the step to the query.
* **Literals** take DuckDB's type: an integer is INTEGER if it fits, else BIGINT.
* **Arithmetic** on integers uses Arrow's checked kernels, so an overflow is an error as
  in Spark and DuckDB (which raises; the frame then runs the query and gets its error).
* **Logic** is three-valued (Kleene), as SQL's; a filter or a ``CASE`` drops or skips
  a NULL condition, as SQL does.
* **Aggregates**: ``sum`` (only where the kernel casts it back to BIGINT: DuckDB's sum is
  a HUGEINT, and a sum that could leave int64 is left to it), ``count``, ``max`` and
  ``min``, with SQL's NULL rules (skipped; an all-NULL or empty group's sum and max are
  NULL; a global aggregate of no rows is one row). ``DISTINCT`` and group keys may also
  be decimals, which hash exactly within one type.
* **Joins**: inner, left outer and semi equi-joins. A plain key equality never matches
  NULL, as in SQL; a NULL-safe one joins on the value with NULL filled plus a NULL flag.
* **Stacking**: ``explode(array(...))`` gives each row once per element (in another
  order than DuckDB's, which no frame relies on), ``struct`` and a struct's field, and
  ``element_at`` of a literal array where every position is in range.

``tests/engine/test_local_frame.py`` computes each case both ways.
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: A column computed from an Arrow table, or None when Arrow's answer is not certain.
ArrowValues = pa.Array | pa.ChunkedArray
ArrowColumn = Callable[[pa.Table], "ArrowValues | None"]

#: Arrow types of the DuckDB types a query returns, for columns computed without one.
ARROW_TYPES = {
    "BIGINT": pa.int64(),
    "INTEGER": pa.int32(),
    "DOUBLE": pa.float64(),
    "BOOLEAN": pa.bool_(),
    "VARCHAR": pa.string(),
}

_INT32 = range(-(2**31), 2**31)


def comparable(kind: pa.DataType) -> bool:
    """Whether Arrow compares and groups values of ``kind`` exactly as SQL does."""
    return (
        pa.types.is_integer(kind)
        or pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_boolean(kind)
        or pa.types.is_date(kind)
        or pa.types.is_timestamp(kind)
    )


def _literal_type(value: Any) -> pa.DataType | None:
    """DuckDB's type of a literal (``sql_literal``); None for floats, an untyped NULL and
    the rest, which keep DuckDB's coercions."""
    if isinstance(value, bool):
        return pa.bool_()
    if isinstance(value, int):
        return pa.int32() if value in _INT32 else pa.int64()
    if isinstance(value, str):
        return pa.string()
    return None


def groupable(kind: pa.DataType) -> bool:
    """Whether Arrow's hash grouping puts values of ``kind`` together exactly as SQL's
    GROUP BY and DISTINCT do (NULL a value of its own): the comparable types, and
    decimals of one type."""
    return comparable(kind) or pa.types.is_decimal(kind)


def plain_floats(values: ArrowValues) -> bool:
    """Doubles that Arrow groups, orders and picks the extremes of exactly as SQL does:
    none is NaN (SQL's NaN equals itself and orders above every number) and none is
    -0.0 (equal to 0.0 in SQL, a group of its own in Arrow's hashing)."""
    if not pa.types.is_floating(values.type):
        return False
    if values.null_count == len(values):
        return True
    if _holds_nan(values):
        return False
    zeros = pc.equal(values, 0.0)
    if not pc.any(zeros).as_py():
        return True
    negative = pc.less(pc.divide(pc.cast(1.0, values.type), values), 0.0)  # 1/-0.0 = -inf
    return not pc.any(pc.and_(zeros, negative)).as_py()


def groupable_values(values: ArrowValues) -> bool:
    """``groupable`` for these values: also doubles when they are ``plain_floats``."""
    return groupable(values.type) or plain_floats(values)


def distinct(table: pa.Table) -> pa.Table | None:
    """``SELECT DISTINCT *``; None for duplicate column names, or a double column holding
    NaN or -0.0."""
    if len(set(table.column_names)) < table.num_columns:
        return None
    if not all(groupable_values(column) for column in table.columns):
        return None
    return table.group_by(table.column_names, use_threads=False).aggregate([])


def constant(scalar: pa.Scalar) -> ArrowColumn:
    """``scalar`` repeated per row."""
    return lambda table: repeated(scalar, table.num_rows)


#: Constant columns by (scalar, length): a kernel's literals (a weight's 0, a flag's 1)
#: are the same few values over tables of one length, many times in one step. Kept for
#: small tables only (the local tier's), so the cache holds a few tens of MB at most.
_REPEATED: dict[tuple[pa.Scalar, int], pa.Array] = {}
_REPEATED_KEPT = 128
_REPEATED_ROWS = 1 << 18


def repeated(scalar: pa.Scalar, length: int) -> pa.Array:
    """``scalar`` ``length`` times (arrays are immutable: one is shared by every use)."""
    if length > _REPEATED_ROWS:
        return pa.repeat(scalar, length)
    key = (scalar, length)
    found = _REPEATED.get(key)
    if found is None or found.type != scalar.type:  # 1 == 1.0 as keys; types differ
        if len(_REPEATED) >= _REPEATED_KEPT:
            _REPEATED.clear()
        found = _REPEATED[key] = pa.repeat(scalar, length)
    return found


def literal(value: Any) -> ArrowColumn | None:
    """A literal of DuckDB's type for it, repeated per row."""
    kind = _literal_type(value)
    if kind is None:
        return None
    try:
        scalar = pa.scalar(value, kind)
    except (pa.ArrowInvalid, OverflowError):
        return None
    return constant(scalar)


def typed_literal(value: Any, target: pa.DataType) -> ArrowColumn | None:
    """``CAST(literal AS target)`` where the value is exactly of the target type."""
    if value is not None and not isinstance(value, (bool, int, float, str)):
        return None
    if isinstance(value, bool) != pa.types.is_boolean(target):
        return None
    if isinstance(value, str) != pa.types.is_string(target):
        return None
    if isinstance(value, float) and not pa.types.is_floating(target):
        return None
    try:
        scalar = pa.scalar(value, target)
    except (pa.ArrowInvalid, OverflowError):  # out of range: DuckDB's error, as Spark's
        return None
    return constant(scalar)


def cast(source: ArrowColumn | None, target: pa.DataType | None) -> ArrowColumn | None:
    """``CAST(column AS target)`` where that is exact: a column already of the type, an
    integer widened, a decimal to a decimal type that holds its value without rounding.
    Anything else (rounding, float to integer, text) runs the query."""
    if source is None or target is None:
        return None

    def run(table: pa.Table) -> ArrowValues | None:
        values = source(table)
        if values is None:
            return None
        if values.type == target:
            return values
        if pa.types.is_decimal128(values.type) and pa.types.is_decimal128(target):
            return decimal_result(values, target)  # exact, or left to the SQL
        widened = (
            pa.types.is_integer(values.type)
            and pa.types.is_signed_integer(target)
            and target.bit_width > values.type.bit_width
        )
        return values.cast(target) if widened else None

    return run


def _evaluated(table: pa.Table, *columns: ArrowColumn | None) -> list[ArrowValues] | None:
    values = []
    for column in columns:
        if column is None:
            return None
        found = column(table)
        if found is None:
            return None
        values.append(found)
    return values


_COMPARISONS = {
    "=": pc.equal,
    "<>": pc.not_equal,
    "<": pc.less,
    "<=": pc.less_equal,
    ">": pc.greater,
    ">=": pc.greater_equal,
}
_ARITHMETIC = {"+": pc.add_checked, "-": pc.subtract_checked, "*": pc.multiply_checked}
_LOGIC = {"AND": pc.and_kleene, "OR": pc.or_kleene}


def binary(op: str, left: ArrowColumn | None, right: ArrowColumn | None) -> ArrowColumn | None:
    """``left op right`` for a comparison, integer arithmetic or AND/OR."""
    if left is None or right is None:
        return None
    exact = _DECIMAL_ARITHMETIC.get(op)
    if op in _COMPARISONS:
        function = _COMPARISONS[op]
        accepts: Callable[[pa.DataType, pa.DataType], bool] = _same_comparable
    elif op in _ARITHMETIC:
        function = _ARITHMETIC[op]
        accepts = _both_integers
    elif op in _LOGIC:
        function = _LOGIC[op]
        accepts = _both_booleans
    else:
        return None

    def run(table: pa.Table) -> ArrowValues | None:
        values = _evaluated(table, left, right)
        if values is None:
            return None
        if exact is not None and _decimal_operands(*values):
            a, b = values
            return _computed_exactly(exact, a, b, _duckdb_result(op, a.type, b.type))
        if not accepts(values[0].type, values[1].type) and not (
            op in _COMPARISONS and _without_nan(*values)
        ):
            return None
        try:
            return function(*values)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):  # overflow, say: DuckDB's
            return None

    return run


# --- decimals ----------------------------------------------------------------------------
# Decimal arithmetic is computed exactly, in 256-bit decimals (76 digits hold any sum or
# product of two 38-digit operands), then cast, checked, to the type the SQL's step has:
# a value that does not fit raises, and the step is left to the SQL, which raises its own
# error. A cast that would round (a smaller scale) is left to the SQL as well.
_DECIMAL_ARITHMETIC = {"+": pc.add, "-": pc.subtract, "*": pc.multiply}
_DUCKDB_INTEGERS = {
    pa.int8(): "TINYINT",
    pa.int16(): "SMALLINT",
    pa.int32(): "INTEGER",
    pa.int64(): "BIGINT",
}
_duckdb_results: dict[tuple[str, pa.DataType, pa.DataType], pa.DataType | None] = {}
_duckdb_lock = threading.Lock()


def _decimal_operands(a: ArrowValues, b: ArrowValues) -> bool:
    """Two decimals, or a decimal and a signed integer (at most 38 digits each)."""
    kinds = (a.type, b.type)
    return any(pa.types.is_decimal128(k) for k in kinds) and all(
        pa.types.is_decimal128(k) or k in _DUCKDB_INTEGERS for k in kinds
    )


def _exact(values: ArrowValues) -> ArrowValues:
    """A decimal or an integer as a 256-bit decimal of the same value."""
    kind = values.type
    if pa.types.is_decimal(kind):
        return values.cast(pa.decimal256(kind.precision, kind.scale))
    return values.cast(pa.int64()).cast(pa.decimal256(19, 0))


def decimal_result(exact: ArrowValues, target: pa.DataType | None) -> ArrowValues | None:
    """An exactly computed decimal as ``target``, checked; None when it would round or
    does not fit."""
    if target is None or not pa.types.is_decimal(target) or target.scale < exact.type.scale:
        return None
    try:
        return exact.cast(target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None


def to_decimal(column: ArrowColumn | None, target: pa.DataType | None) -> ArrowColumn | None:
    """An integer or decimal column as the decimal ``target``: exact, or None (the SQL's
    TRY_CAST, which gives NULL where the value does not fit)."""
    if column is None or target is None:
        return None

    def run(table: pa.Table) -> ArrowValues | None:
        values = column(table)
        if values is None:
            return None
        kind = values.type
        if not (pa.types.is_decimal128(kind) or kind in _DUCKDB_INTEGERS):
            return None
        return decimal_result(_exact(values), target)

    return run


def exact_decimal(
    op: str, left: ArrowColumn | None, right: ArrowColumn | None, result: pa.DataType | None
) -> ArrowColumn | None:
    """``left op right`` (``+``, ``-``, ``*``) of two decimals, computed exactly, as the
    decimal ``result``; None where that would round or the value does not fit it."""
    function = _DECIMAL_ARITHMETIC.get(op)
    if left is None or right is None or result is None or function is None:
        return None

    def run(table: pa.Table) -> ArrowValues | None:
        values = _evaluated(table, left, right)
        if values is None or not all(pa.types.is_decimal128(v.type) for v in values):
            return None
        return _computed_exactly(function, *values, result)

    return run


def _computed_exactly(
    function: Callable[..., ArrowValues],
    a: ArrowValues,
    b: ArrowValues,
    result: pa.DataType | None,
) -> ArrowValues | None:
    """``function(a, b)`` in 256-bit decimals, as ``result`` (``decimal_result``)."""
    try:
        exact = function(_exact(a), _exact(b))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    return decimal_result(exact, result)


def _duckdb_result(op: str, a: pa.DataType, b: pa.DataType) -> pa.DataType | None:
    """The type DuckDB gives ``a op b`` (its own rules: a product of two 18-digit
    decimals keeps 18 digits, say), asked of DuckDB once per pair of types."""
    key = (op, a, b)
    with _duckdb_lock:
        if key not in _duckdb_results:
            _duckdb_results[key] = _ask_duckdb(op, a, b)
        return _duckdb_results[key]


def _ask_duckdb(op: str, a: pa.DataType, b: pa.DataType) -> pa.DataType | None:
    import duckdb

    def name(kind: pa.DataType) -> str:
        if pa.types.is_decimal(kind):
            return f"DECIMAL({kind.precision},{kind.scale})"
        return _DUCKDB_INTEGERS[kind]

    # Zeros, not NULLs: DuckDB folds an expression over NULL constants to an untyped NULL.
    query = f"SELECT CAST(0 AS {name(a)}) {op} CAST(0 AS {name(b)}) AS r"
    try:
        with duckdb.connect(":memory:") as connection:
            kind = connection.sql(query).to_arrow_table().schema.field("r").type
    except duckdb.Error:
        return None
    return kind if pa.types.is_decimal128(kind) else None


def _without_nan(a: ArrowValues, b: ArrowValues) -> bool:
    """Doubles of one type, neither side NaN: IEEE comparison is SQL's then (-0.0 equals
    0.0 in both), where SQL's NaN equals itself and orders above every number."""
    if not (pa.types.is_floating(a.type) and a.type == b.type):
        return False
    return not (_holds_nan(a) or _holds_nan(b))


def _holds_nan(values: ArrowValues) -> bool:
    """Whether a double column holds a NaN (an all-NULL one holds none)."""
    return values.null_count < len(values) and bool(pc.any(pc.is_nan(values)).as_py())


def _same_comparable(a: pa.DataType, b: pa.DataType) -> bool:
    if pa.types.is_integer(a) and pa.types.is_integer(b):
        return True
    return a == b and groupable(a)


def _both_integers(a: pa.DataType, b: pa.DataType) -> bool:
    return pa.types.is_integer(a) and pa.types.is_integer(b)


def _both_booleans(a: pa.DataType, b: pa.DataType) -> bool:
    return pa.types.is_boolean(a) and pa.types.is_boolean(b)


def null_safe_equal(left: ArrowColumn | None, right: ArrowColumn | None) -> ArrowColumn | None:
    """``left IS NOT DISTINCT FROM right``: equal, or both NULL; never NULL itself."""
    equal = binary("=", left, right)
    if equal is None:
        return None

    def run(table: pa.Table) -> ArrowValues | None:
        values = _evaluated(table, equal, left, right)
        if values is None:
            return None
        same, a, b = values
        both_null = pc.and_(pc.is_null(a), pc.is_null(b))
        return pc.or_(pc.fill_null(same, False), both_null)

    return run


def unary(
    function: Callable[[ArrowValues], ArrowValues],
    column: ArrowColumn | None,
    *,
    kind: Callable[[pa.DataType], bool],
) -> ArrowColumn | None:
    """``function(column)`` where the column's type passes ``kind``."""
    if column is None:
        return None

    def run(table: pa.Table) -> ArrowValues | None:
        values = column(table)
        if values is None or not kind(values.type):
            return None
        try:
            return function(values)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return None

    return run


def is_null(column: ArrowColumn | None) -> ArrowColumn | None:
    return unary(pc.is_null, column, kind=lambda _: True)


def is_valid(column: ArrowColumn | None) -> ArrowColumn | None:
    return unary(pc.is_valid, column, kind=lambda _: True)


def invert(column: ArrowColumn | None) -> ArrowColumn | None:
    return unary(pc.invert, column, kind=pa.types.is_boolean)


def negate(column: ArrowColumn | None) -> ArrowColumn | None:
    return unary(pc.negate_checked, column, kind=pa.types.is_integer)


def case(
    branches: Sequence[tuple[ArrowColumn | None, ArrowColumn | None]],
    default: ArrowColumn | None,
    has_default: bool,
) -> ArrowColumn | None:
    """``CASE WHEN c THEN v ... [ELSE d] END``: the first true condition's value, the
    default (NULL without one) when none is true. Values of one type, or integers
    widened to the widest, as DuckDB unifies them."""
    if any(c is None or v is None for c, v in branches) or (has_default and default is None):
        return None

    def run(table: pa.Table) -> ArrowValues | None:
        conditions = _evaluated(table, *(c for c, _ in branches))
        values = _evaluated(table, *(v for _, v in branches), *([default] if has_default else []))
        if conditions is None or values is None:
            return None
        if not all(pa.types.is_boolean(c.type) for c in conditions):
            return None
        kinds = {v.type for v in values}
        if len(kinds) > 1:
            if not all(pa.types.is_signed_integer(k) for k in kinds):
                return None
            widest = max(kinds, key=operator.attrgetter("bit_width"))
            values = [v.cast(widest) for v in values]
        conditions = [_one_chunk(c) for c in conditions]
        first = conditions[0]
        if first.null_count == 0 and first.true_count == len(first):
            # The first condition holds on every row (a value tested for NULL that has
            # none, the kernels' usual case): its value is the answer, no selection.
            return values[0]
        names = [f"c{i}" for i in range(len(conditions))]
        return pc.case_when(
            pc.make_struct(*conditions, field_names=names), *map(_one_chunk, values)
        )

    return run


def coalesce(columns: Sequence[ArrowColumn | None]) -> ArrowColumn | None:
    """``coalesce(a, b, ...)``: the first non-NULL value, over columns of one comparable
    type (DuckDB would unify mixed types)."""
    if not columns or any(c is None for c in columns):
        return None

    def run(table: pa.Table) -> ArrowValues | None:
        values = _evaluated(table, *columns)
        if values is None or len({v.type for v in values}) > 1:
            return None
        if not comparable(values[0].type):
            return None
        return pc.coalesce(*values)

    return run


def row_number(
    partition: Sequence[ArrowColumn | None], order: Sequence[tuple[ArrowColumn | None, bool]]
) -> ArrowColumn | None:
    """``row_number() OVER (PARTITION BY p ORDER BY o [DESC] NULLS LAST)``: each row's
    position within its partition, from 1. Rows that tie on the order are numbered in
    some order, as SQL numbers them (the upsert rule refuses ties that differ)."""
    if any(c is None for c in partition) or any(c is None for c, _ in order):
        return None

    def run(table: pa.Table) -> ArrowValues | None:
        keys = _evaluated(table, *partition)
        marks = _evaluated(table, *(c for c, _ in order))
        if keys is None or marks is None:
            return None
        if not all(comparable(v.type) for v in (*keys, *marks)):
            return None
        rows = table.num_rows
        names = [f"p{i}" for i in range(len(keys))] + [f"o{i}" for i in range(len(marks))]
        frame = pa.Table.from_arrays([*keys, *marks], names=names)
        sort_keys = [(f"p{i}", "ascending", "at_end") for i in range(len(keys))] + [
            (f"o{i}", "descending" if descending else "ascending", "at_end")
            for i, (_, descending) in enumerate(order)
        ]
        positions = pc.sort_indices(frame, sort_keys=sort_keys)
        starts = np.zeros(rows, dtype=bool)
        if rows:
            starts[0] = True
        for i in range(len(keys)):
            values = frame.column(f"p{i}").take(positions)
            before, after = values.slice(0, rows - 1), values.slice(1)
            same = pc.or_(
                pc.fill_null(pc.equal(before, after), False),
                pc.and_(pc.is_null(before), pc.is_null(after)),
            )
            starts[1:] |= ~np.asarray(same.to_numpy(zero_copy_only=False), dtype=bool)
        first = np.flatnonzero(starts)
        group = np.cumsum(starts) - 1
        numbers = np.empty(rows, dtype=np.int64)
        numbers[positions.to_numpy()] = np.arange(rows) - first[group] + 1
        return pa.array(numbers, pa.int64())

    return run


def _one_chunk(values: ArrowValues) -> pa.Array:
    return values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values


def struct_field(column: ArrowColumn, field: str) -> ArrowColumn:
    """``column.field`` of a struct column (None for any other column)."""

    def run(table: pa.Table) -> ArrowValues | None:
        values = column(table)
        if values is None or not pa.types.is_struct(values.type):
            return None
        if values.type.get_field_index(field) < 0:
            return None
        return pc.struct_field(_one_chunk(values), [values.type.get_field_index(field)])

    return run


def struct(fields: Sequence[tuple[str, ArrowColumn | None]]) -> ArrowColumn | None:
    """``struct_pack(name := value, ...)``."""
    if any(column is None for _, column in fields):
        return None

    def run(table: pa.Table) -> ArrowValues | None:
        values = _evaluated(table, *(column for _, column in fields))
        if values is None:
            return None
        names = [name for name, _ in fields]
        return pc.make_struct(*map(_one_chunk, values), field_names=names)

    return run


def pick(values: Sequence[Any], position: ArrowColumn | None) -> ArrowColumn | None:
    """``list_extract([v1, v2, ...], position)`` of literal values (1-based), where every
    position is in range (else DuckDB's NULL, or Spark's error, by running the query)."""
    kinds = {_literal_type(v) for v in values}
    if position is None or not values or None in kinds:
        return None
    if len(kinds) > 1:
        if not all(pa.types.is_signed_integer(k) for k in kinds):
            return None
        kinds = {pa.int64()}
    array = pa.array(list(values), kinds.pop())

    def run(table: pa.Table) -> ArrowValues | None:
        found = position(table)
        if found is None or not pa.types.is_integer(found.type) or found.null_count:
            return None
        if len(found) and (pc.min(found).as_py() < 1 or pc.max(found).as_py() > len(array)):
            return None
        return array.take(pc.subtract(found.cast(pa.int64()), 1))

    return run


# --- aggregates --------------------------------------------------------------------------
class Aggregate:
    """``function(argument)`` in a ``groupBy().agg()``, with the type it is cast to."""

    __slots__ = ("argument", "cast_to", "function")

    def __init__(
        self, function: str, argument: ArrowColumn | None, cast_to: pa.DataType | None = None
    ) -> None:
        self.function = function
        self.argument = argument
        self.cast_to = cast_to

    def cast(self, target: pa.DataType | None) -> Aggregate | None:
        if target is None:
            return None
        return Aggregate(self.function, self.argument, target)


_ARROW_AGGREGATES = {"sum": "sum", "count": "count", "max": "max", "min": "min"}


def aggregate(
    table: pa.Table,
    keys: Sequence[tuple[str, ArrowColumn | None]],
    aggregates: Sequence[tuple[str, Aggregate | None]],
) -> pa.Table | None:
    """``SELECT keys..., aggregates... FROM table GROUP BY keys`` (one row for no keys),
    with the given output names; None when a part is not exact in Arrow."""
    key_values = _evaluated(table, *(column for _, column in keys))
    if key_values is None or not all(groupable_values(v) for v in key_values):
        return None
    arguments = []
    for _, found in aggregates:
        if found is None or found.function not in _ARROW_AGGREGATES:
            return None
        values = _evaluated(table, found.argument)
        if values is None or not _aggregable(found, values[0], table.num_rows):
            return None
        if found.function == "sum" and pa.types.is_decimal(values[0].type):
            # 76 digits: no partial sum of 38-digit values can leave them.
            values = [values[0].cast(pa.decimal256(76, values[0].type.scale))]
        arguments.append(values[0])
    columns = {f"k{i}": v for i, v in enumerate(key_values)}
    columns.update({f"a{i}": v for i, v in enumerate(arguments)})
    inputs = pa.table(columns) if columns else table.select([])
    specs = [(f"a{i}", _ARROW_AGGREGATES[a.function]) for i, (_, a) in enumerate(aggregates)]
    if keys:
        grouped = inputs.group_by([f"k{i}" for i in range(len(keys))], use_threads=False)
        result = grouped.aggregate(specs)
        out = [result.column(f"k{i}") for i in range(len(keys))]
        out += [result.column(f"{name}_{fn}") for name, fn in specs]
    else:  # a global aggregate: one row, even over no rows
        out = []
        for name, fn in specs:
            values = inputs.column(name)
            result = _scalar_aggregate(fn, values).as_py()
            out.append(pa.array([result], _scalar_type(fn, values.type)))
    finished = []
    for column, (_, found) in zip(out[len(keys) :], aggregates, strict=True):
        target = found.cast_to  # type: ignore[union-attr]
        if pa.types.is_decimal256(column.type):  # a sum of decimals, exact
            # DuckDB's sum of a DECIMAL(p, s) is a DECIMAL(38, s), then cast.
            column = decimal_result(column, pa.decimal128(38, column.type.scale))
            if column is not None and target is not None:
                column = decimal_result(column, target)
            if column is None:
                return None
        elif target is not None and column.type != target:
            if not (pa.types.is_integer(column.type) and pa.types.is_integer(target)):
                return None
            column = column.cast(target)  # checked: a value that does not fit raises
        finished.append(column)
    names = [name for name, _ in keys] + [name for name, _ in aggregates]
    return pa.Table.from_arrays([*out[: len(keys)], *finished], names=names)


def _aggregable(found: Aggregate, values: ArrowValues, rows: int) -> bool:
    kind = values.type
    if found.function == "count":
        return True
    if found.function in ("max", "min"):
        return comparable(kind) or plain_floats(values)
    if pa.types.is_decimal128(kind):  # summed exactly (``aggregate``)
        return found.cast_to is None or pa.types.is_decimal(found.cast_to)
    # sum: DuckDB's is a HUGEINT the kernels cast back; exact in int64 when no partial sum
    # can leave it, which the largest magnitude times the row count bounds.
    if not pa.types.is_integer(kind) or found.cast_to != pa.int64():
        return False
    if rows == 0:
        return True
    extremes = pc.min_max(values)
    low, high = extremes["min"].as_py(), extremes["max"].as_py()
    largest = max(abs(low or 0), abs(high or 0))
    return largest * rows < 2**63


def _scalar_aggregate(function: str, values: ArrowValues) -> pa.Scalar:
    if function == "count":
        return pc.count(values)
    if function == "sum":
        return pc.sum(values)
    return pc.max(values) if function == "max" else pc.min(values)


def _scalar_type(function: str, kind: pa.DataType) -> pa.DataType:
    if function == "count":
        return pa.int64()
    if function == "sum":
        return kind if pa.types.is_decimal256(kind) else pa.int64()
    return kind


# --- joins -------------------------------------------------------------------------------
#: A join condition's equalities: (left reference, right reference, NULL-safe).
KeyPairs = tuple[tuple[str, str, bool], ...]

_JOIN_TYPES = {"inner": "inner", "left": "left outer", "left_semi": "left semi"}


def join(
    left: pa.Table,
    right: pa.Table,
    aliases: tuple[str, str],
    pairs: KeyPairs,
    how: str,
) -> pa.Table | None:
    """An equi-join of two tables (both sides' columns; the left's for a semi-join) on
    ``pairs``, each ``a = b`` (a NULL matches nothing, as in SQL) or NULL-safe (NULL
    matches NULL: joined on the value with NULL filled and on whether it was NULL).
    References are a column name of one side, or ``alias.column``."""
    if how not in _JOIN_TYPES:
        return None
    if how != "left_semi" and set(left.column_names) & set(right.column_names):
        return None  # SQL would give both sides' columns under one name
    left_keys, right_keys = [], []
    for a, b, null_safe in pairs:
        sides = [_side(ref, left, right, aliases) for ref in (a, b)]
        if None in sides or {s[0] for s in sides} != {0, 1}:  # type: ignore[index]
            return None
        (_, left_name), (_, right_name) = sorted(sides)  # type: ignore[type-var]
        keys = _join_keys(left.column(left_name), right.column(right_name), null_safe)
        if keys is None:
            return None
        left_keys.extend(keys[0])
        right_keys.extend(keys[1])
    names = [f"k{i}" for i in range(len(left_keys))]
    rows_left = pa.table({**dict(zip(names, left_keys, strict=True)), "__left": _rows(left)})
    rows_right = pa.table({**dict(zip(names, right_keys, strict=True)), "__right": _rows(right)})
    joined = rows_left.join(rows_right, keys=names, join_type=_JOIN_TYPES[how], use_threads=False)
    taken = left.take(joined.column("__left"))
    if how == "left_semi":
        return taken
    matched = right.take(joined.column("__right"))  # a NULL row where nothing matched
    return pa.Table.from_arrays(
        [*taken.columns, *matched.columns], names=[*left.column_names, *right.column_names]
    )


def _side(
    reference: str, left: pa.Table, right: pa.Table, aliases: tuple[str, str]
) -> tuple[int, str] | None:
    alias, _, name = reference.rpartition(".")
    if alias:
        side = aliases.index(alias) if alias in aliases else None
        table = (left, right)[side] if side is not None else None
        return (side, name) if table is not None and name in table.column_names else None
    found = [side for side, t in enumerate((left, right)) if name in t.column_names]
    return (found[0], name) if len(found) == 1 else None


def _join_keys(
    a: ArrowValues, b: ArrowValues, null_safe: bool
) -> tuple[list[ArrowValues], list[ArrowValues]] | None:
    if not (comparable(a.type) and comparable(b.type)):
        return None
    a, b = _key_values(a), _key_values(b)
    if a.type != b.type:
        return None
    if not null_safe:
        return [a], [b]
    filler = pa.scalar("" if pa.types.is_string(a.type) else 0, a.type)
    return (
        [pc.fill_null(a, filler), pc.is_null(a).cast(pa.int8())],
        [pc.fill_null(b, filler), pc.is_null(b).cast(pa.int8())],
    )


def _key_values(values: ArrowValues) -> ArrowValues:
    """Integers, dates and timestamps as int64 (equal exactly when the values are),
    booleans as int8, large strings as strings."""
    kind = values.type
    if pa.types.is_date32(kind):
        return values.cast(pa.int32()).cast(pa.int64())
    if pa.types.is_integer(kind) or pa.types.is_temporal(kind):
        return values.cast(pa.int64())
    if pa.types.is_boolean(kind):
        return values.cast(pa.int8())
    if pa.types.is_large_string(kind):
        return values.cast(pa.string())
    return values


def _rows(table: pa.Table) -> pa.Array:
    # From numpy without a copy: from a Python range, each number is a Python object.
    return pa.array(np.arange(table.num_rows, dtype=np.int64))
