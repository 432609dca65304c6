"""Compile circuit expressions to native Spark ``Column``s.

The Spark backend must compute exactly what the reference engine
(``dbspark.engine.reference.compile``) computes, row for row, with no Python
UDF. Most of SQL lines up directly; where Spark's built-ins differ from the
reference, this module spells out the reference's behaviour with native
functions:

* ``/`` is ``try_divide`` (always DOUBLE, NULL on a zero divisor) and ``%`` is
  ``try_mod`` (NULL on zero, sign of the dividend), whatever ``spark.sql.ansi``
  says.
* Comparisons are Spark's, which the reference follows: NaN equals NaN and
  is above every other double; -0.0 equals 0.0.
* ``greatest``/``least`` over DOUBLEs fold left to right like Python's
  ``max``/``min`` (the first of equal values wins; NaN is only picked when it
  comes first), via the native ``aggregate`` higher-order function.
* Casts use ``try_cast`` (NULL on failure) behind the reference's parsing rules:
  strings are stripped of Unicode whitespace, integers and floats accept
  Python's syntax (``1_000``, ``inf``, ``nan``; not Java's ``1.5d``), booleans
  accept ``true/t/yes/y/1`` and ``false/f/no/n/0``, a DOUBLE truncates to
  BIGINT (NaN and infinities give NULL), and a DOUBLE cast to STRING is written as Python writes
  it (``1e+16``, ``1.5e-05``, ``12345678.0``, ``nan``, ``inf``), not as Java
  does (``1.0E16``). ``concat`` casts its arguments the same way.
* ``split`` takes a non-empty literal separator, quoted for Java's regex
  engine, keeping trailing empty strings as Python's ``str.split`` does.
* Literals: ``int`` is BIGINT, ``float`` DOUBLE; NULL literals take the type
  their context gives them (BIGINT when nothing does, as ``output_type``).

Differences that remain are outside the value domain both engines can store:
BIGINT overflow raises an error in Spark (ANSI) where Python integers grow;
a DOUBLE or a string of digits beyond the BIGINT range casts to NULL in Spark
(instead of saturating) and to an out-of-range integer in the reference;
Python also accepts non-ASCII digits in numeric strings.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from dbspark.circuit.expressions import (
    NULL_TYPE,
    Expr,
    infer_type,
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
    decimal_parts,
    element_type,
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

#: Python's ``str.isspace`` characters as a Java regex class (Unicode White_Space plus the
#: information separators U+001C..U+001F that Python also strips).
_WS = r"[\p{IsWhite_Space}\x{1c}-\x{1f}]"
_FLOAT_DIGITS = 17  # enough significant digits to round-trip every double


# --- types -------------------------------------------------------------------------------


def spark_type(type_name: str) -> DataType:
    """The Spark type of a dbspark column type (also ``int`` for the reserved ``__iter``)."""
    name = str(type_name).strip().lower()
    if name in (BIGINT, "long"):
        return LongType()
    if name in ("int", "integer"):
        return IntegerType()
    if name == DOUBLE:
        return DoubleType()
    if name == STRING:
        return StringType()
    if name == BOOLEAN:
        return BooleanType()
    if name == DATE:
        return DateType()
    if name == TIMESTAMP:
        return TimestampType()
    if is_decimal(name):
        return DecimalType(*decimal_parts(name))
    if name == NULL_TYPE:
        return LongType()
    if is_array(name):
        return ArrayType(spark_type(element_type(name)), containsNull=True)
    raise TypeError(f"no Spark type for column type {type_name!r}")


def struct_type(schema: Schema, extra: Iterable[tuple[str, str]] = ()) -> StructType:
    """The Spark schema of a collection: the user's columns, then ``extra`` (name, type) pairs."""
    fields = [StructField(name, spark_type(type_name), True) for name, type_name in schema]
    fields += [StructField(name, spark_type(type_name), False) for name, type_name in extra]
    return StructType(fields)


# --- entry points ------------------------------------------------------------------------


def compile_expr(expr: Expr, schema: Schema) -> Column:
    """A Spark ``Column`` computing ``expr`` over rows of ``schema``."""
    infer_type(expr, schema, "spark compile")  # reject ill-typed expressions up front
    column, _ = _Compiler(schema).compile(expr)
    return column


def compile_typed(expr: Expr, schema: Schema) -> tuple[Column, str]:
    """``expr`` as a ``Column`` cast to its stored type, and that type (``output_type``)."""
    target = output_type(infer_type(expr, schema, "spark compile"))
    compiler = _Compiler(schema)
    column, kind = compiler.compile(expr)
    return compiler.typed(column, kind, target), target


def compile_projection(columns: Mapping[str, Expr], schema: Schema) -> list[Column]:
    """One aliased ``Column`` per output column, each cast to the type the builder declared."""
    return [compile_typed(expr, schema)[0].alias(name) for name, expr in columns.items()]


def compile_predicate(expr: Expr, schema: Schema) -> Column:
    """A filter condition that is true only where ``expr`` is true (NULL counts as false)."""
    column, kind = _Compiler(schema).compile(expr)
    if kind == NULL_TYPE:
        return F.lit(False)
    return F.coalesce(column, F.lit(False))


# --- the compiler: PySpark for what ``ExpressionCompiler`` decides -------------------------


_SPARK_COMPARE = {
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
}


class _Compiler(ExpressionCompiler[Column]):
    def column(self, name: str) -> Column:
        return F.col(name)

    def constant(self, value: Any) -> Column:
        return F.lit(value)

    def typed_constant(self, value: Any, kind: str) -> Column:
        return F.lit(value).cast(spark_type(kind))

    def untyped_null(self) -> Column:
        return F.lit(None)

    def null(self, kind: str) -> Column:
        return _null(kind)

    def coerce(self, column: Column, kind: str, target: str) -> Column:
        return _coerce(column, kind, target)

    def convert(self, column: Column, kind: str, target: str) -> Column:
        return _convert(column, kind, target)

    def negate(self, column: Column) -> Column:
        return -column

    def logical_not(self, column: Column) -> Column:
        return ~column

    def is_null(self, column: Column) -> Column:
        return column.isNull()

    def is_not_null(self, column: Column) -> Column:
        return column.isNotNull()

    def logical(self, op: str, a: Column, b: Column) -> Column:
        return a & b if op == "and" else a | b

    def compare(self, op: str, a: Column, b: Column) -> Column:
        # Spark's order is the reference's: NaN = NaN, NaN above every other double,
        # -0.0 = 0.0.
        return _SPARK_COMPARE[op](a, b)

    def arithmetic(self, op: str, a: Column, b: Column) -> Column:
        return {"+": a + b, "-": a - b, "*": a * b}[op]

    def decimal_arithmetic(
        self, op: str, operands: Sequence[tuple[Column, str]], result: str
    ) -> Column:
        # The operands have the decimal types Spark would give them, so Spark's own
        # arithmetic already has ``result``'s type; the cast only states it.
        (a, _), (b, _) = operands
        return self.arithmetic(op, a, b).cast(spark_type(result))

    def divide(self, a: Column, b: Column) -> Column:
        return F.try_divide(a.cast("double"), b.cast("double"))

    def remainder(self, a: Column, b: Column) -> Column:
        return F.try_mod(a, b)

    def array(self, items: Sequence[Column], element: str) -> Column:
        return F.array(*items)

    def coalesce(self, values: Sequence[Column]) -> Column:
        return F.coalesce(*values)

    def extremum(self, name: str, values: Sequence[Column], kind: str) -> Column:
        if kind != DOUBLE:
            return F.greatest(*values) if name == "greatest" else F.least(*values)

        def better(x: Column, best: Column) -> Column:
            beats = x > best if name == "greatest" else x < best
            return beats & ~F.isnan(x) & ~F.isnan(best)

        def step(best: Column, x: Column) -> Column:
            return F.when(x.isNull(), best).when(best.isNull() | better(x, best), x).otherwise(best)

        return F.aggregate(F.array(*values), _null(DOUBLE), step)

    def if_else(self, condition: Column, then: Column, otherwise: Column) -> Column:
        return F.when(condition, then).otherwise(otherwise)

    def string_function(self, name: str, text: Column) -> Column:
        if name == "lower":
            return F.lower(text)
        if name == "upper":
            return F.upper(text)
        return F.length(text).cast("bigint")

    def absolute(self, column: Column) -> Column:
        return F.abs(column)

    def concat(self, parts: Sequence[Column]) -> Column:
        return F.concat(*parts)

    def sequence(self, start: Column, stop: Column) -> Column:
        return F.sequence(start.cast("bigint"), stop.cast("bigint"))

    def split(self, text: Column, separator: str) -> Column:
        return F.split(text, java_regex_quote(separator), -1)

    def like(self, text: Column, pattern: str) -> Column:
        return text.like(pattern)


# --- pieces ------------------------------------------------------------------------------


def _null(type_name: str) -> Column:
    return F.lit(None).cast(spark_type(type_name))


def _coerce(column: Column, kind: str, target: str) -> Column:
    """``column`` (of type ``kind``) as ``target``: NULL literals typed, BIGINT widened."""
    if kind == target or target == NULL_TYPE:
        return column
    if kind == NULL_TYPE:
        return _null(target)
    if kind == BIGINT and target == DOUBLE:
        return column.cast("double")
    if is_array(kind) and is_array(target):
        return column.cast(spark_type(target))
    if widens(kind, target):
        return _convert(column, kind, target)
    return column


# --- casts -------------------------------------------------------------------------------


def _convert(column: Column, kind: str, target: str) -> Column:
    """``ExpressionCompiler.convert``: between two different scalar types."""
    if target in (DATE, TIMESTAMP) or is_decimal(target) or kind in (DATE, TIMESTAMP):
        return _convert_new_types(column, kind, target)
    if is_decimal(kind):
        if target == BOOLEAN:
            return column != F.lit(0)
        return column.try_cast(spark_type(target))  # BIGINT truncates; DOUBLE; STRING
    if target == STRING:
        if kind == DOUBLE:
            return python_float_repr(column)
        return column.cast("string")  # BIGINT digits; BOOLEAN true/false
    if target == BIGINT:
        if kind == STRING:
            return let(
                python_strip(column),
                lambda text: F.when(
                    text.rlike(PYTHON_INT_SYNTAX),
                    F.regexp_replace(text, "_", "").try_cast("bigint"),
                ),
            )
        if kind == DOUBLE:
            # Python's int() truncates; beyond the BIGINT range Spark saturates, we say NULL.
            in_range = (column >= F.lit(float(BIGINT_MIN))) & (column < F.lit(2.0**63))
            return F.when(in_range, column.try_cast("bigint"))
        return column.cast("bigint")  # BOOLEAN -> 0/1
    if target == DOUBLE:
        if kind == STRING:
            return _parse_python_float(column)
        return column.cast("double")
    if target == BOOLEAN:
        if kind == STRING:
            return let(
                F.lower(python_strip(column)),
                lambda word: F.when(word.isin(*TRUE_WORDS), F.lit(True)).when(
                    word.isin(*FALSE_WORDS), F.lit(False)
                ),
            )
        return column != F.lit(0).cast(spark_type(kind))  # bool(x): NaN is true
    raise TypeError(f"cannot cast to {target}")


def _convert_new_types(column: Column, kind: str, target: str) -> Column:
    """Casts to and from DATE, TIMESTAMP and DECIMAL (Spark's own, behind the syntax that
    every engine reads)."""
    if target == STRING:
        return column.cast("string")
    if kind == STRING:
        syntax = {DATE: DATE_SYNTAX, TIMESTAMP: TIMESTAMP_SYNTAX}.get(target, DECIMAL_SYNTAX)
        return let(
            python_strip(column),
            lambda text: F.when(text.rlike(syntax), text.try_cast(spark_type(target))),
        )
    if is_decimal(target) and kind == DOUBLE:
        # Read as its shortest decimal form (Python's repr), as the reference does.
        finite = ~F.isnan(column) & (F.abs(column) != F.lit(float("inf")))
        return F.when(finite, python_float_repr(column).try_cast(spark_type(target)))
    return column.try_cast(spark_type(target))


def python_strip(column: Column) -> Column:
    """``str.strip()``: remove leading and trailing Unicode whitespace."""
    return F.regexp_replace(column, f"^{_WS}+|{_WS}+$", "")


def _parse_python_float(column: Column) -> Column:
    return let(python_strip(column), _parse_stripped_float)


def _parse_stripped_float(text: Column) -> Column:
    word = F.lower(text)
    unsigned = F.regexp_replace(word, "^[+-]", "")
    negative = word.startswith("-")
    special = (
        F.when(unsigned == "nan", F.lit(float("nan")))
        .when(unsigned.isin("inf", "infinity") & negative, F.lit(float("-inf")))
        .when(unsigned.isin("inf", "infinity"), F.lit(float("inf")))
    )
    number = F.when(
        text.rlike(PYTHON_FLOAT_SYNTAX), F.regexp_replace(text, "_", "").try_cast("double")
    )
    return F.coalesce(special, number)


def python_float_repr(column: Column) -> Column:
    """A DOUBLE as Python's ``repr`` writes it: the shortest round-tripping digits, fixed
    notation for exponents -4..15, else ``d.ddde+XX``; ``nan``, ``inf``, ``-inf``.

    The shortest digits are found by formatting with 1, 2, ... 17 significant digits
    (``%.Ne``) until the text reads back as the same double; ``let`` keeps every
    intermediate value computed once, so the expression stays small.
    """
    return let(column, _float_repr)


def _float_repr(value: Column) -> Column:
    tries = [
        let(F.format_string(f"%.{p}e", value), lambda text: F.when(_reads_back(text, value), text))
        for p in range(_FLOAT_DIGITS - 1)
    ]
    scientific = F.coalesce(*tries, F.format_string(f"%.{_FLOAT_DIGITS - 1}e", value))
    return (
        F.when(value.isNull(), F.lit(None).cast("string"))
        .when(F.isnan(value), F.lit("nan"))
        .when(value == F.lit(float("inf")), F.lit("inf"))
        .when(value == F.lit(float("-inf")), F.lit("-inf"))
        .otherwise(let(scientific, _layout))
    )


def _reads_back(text: Column, value: Column) -> Column:
    return text.try_cast("double") == value


def _layout(scientific: Column) -> Column:
    pattern = r"^(-?)([0-9])(?:\.([0-9]+))?e([+-][0-9]+)$"
    mantissa = F.concat(
        F.regexp_extract(scientific, pattern, 2), F.regexp_extract(scientific, pattern, 3)
    )
    stripped = F.regexp_replace(mantissa, "0+$", "")
    parts = F.struct(
        F.regexp_extract(scientific, pattern, 1).alias("sign"),
        stripped.alias("digits"),
        F.regexp_extract(scientific, pattern, 4).cast("int").alias("exponent"),
    )
    return let(parts, lambda p: _python_notation(p["sign"], p["digits"], p["exponent"]))


def _python_notation(sign: Column, stripped: Column, exponent: Column) -> Column:
    digits = F.when(stripped == "", F.lit("0")).otherwise(stripped)
    # Fixed notation, exponent >= 0: digits padded to exponent + 1 integer digits.
    integer_part = F.rpad(digits, exponent + 1, "0")
    rest = F.substring(digits, exponent + 2, _FLOAT_DIGITS + 1)
    fixed_large = F.concat(
        sign, integer_part, F.lit("."), F.when(rest == "", F.lit("0")).otherwise(rest)
    )
    # Fixed notation, exponent < 0: 0.000ddd
    fixed_small = F.concat(sign, F.lit("0."), F.repeat(F.lit("0"), -exponent - 1), digits)
    # Scientific: d[.ddd]e+XX with at least two exponent digits.
    tail = F.substring(digits, 2, _FLOAT_DIGITS + 1)
    magnitude = F.abs(exponent).cast("string")
    science = F.concat(
        sign,
        F.substring(digits, 1, 1),
        F.when(tail == "", F.lit("")).otherwise(F.concat(F.lit("."), tail)),
        F.lit("e"),
        F.when(exponent < 0, F.lit("-")).otherwise(F.lit("+")),
        F.when(F.abs(exponent) < 10, F.concat(F.lit("0"), magnitude)).otherwise(magnitude),
    )
    return (
        F.when((exponent >= 0) & (exponent < 16), fixed_large)
        .when((exponent >= -4) & (exponent < 0), fixed_small)
        .otherwise(science)
    )


def let(value: Column, body: Callable[[Column], Column]) -> Column:
    """``body(value)`` with ``value`` computed once: a one-element ``transform``.

    Catalyst does not share repeated subexpressions between branches of the plan
    tree; binding a lambda variable keeps expressions that use a value many times
    (number formatting, parsing) linear in size.
    """
    return F.transform(F.array(value), body).getItem(0)


# --- split -------------------------------------------------------------------------------


def java_regex_quote(text: str) -> str:
    """``java.util.regex.Pattern.quote``: a regex matching ``text`` literally."""
    if "\\E" not in text:
        return f"\\Q{text}\\E"
    return "\\Q" + text.replace("\\E", "\\E\\\\E\\Q") + "\\E"
