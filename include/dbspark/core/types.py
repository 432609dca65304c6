"""Column types and schemas.

dbspark speaks a deliberately small set of SQL types, each with one Python and
one Spark representation, so that a circuit means the same thing on every
engine. Reserved column names start with ``__`` (weights, times, flags); users
may not declare them.

=================  ===========================  ==========================
type               Python value                 Spark / Arrow
=================  ===========================  ==========================
``bigint``         ``int``                      LongType / int64
``double``         ``float``                    DoubleType / float64
``string``         ``str``                      StringType / string
``boolean``        ``bool``                     BooleanType / bool
``date``           ``datetime.date``            DateType / date32
``timestamp``      ``datetime.datetime`` (UTC)  TimestampType / timestamp[us, UTC]
``decimal(p,s)``   ``decimal.Decimal``          DecimalType(p, s) / decimal128(p, s)
``array<t>``       ``tuple``                    ArrayType / list
=================  ===========================  ==========================

A TIMESTAMP is an instant: its Python value is timezone-aware, in UTC (a naive
``datetime`` is refused, since it names no instant). A DECIMAL has 1 to 38 digits
of precision ``p``, ``s`` of them after the point, as in Spark.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Context, Decimal, InvalidOperation

from dbspark.core.columns import is_reserved

BIGINT = "bigint"
DOUBLE = "double"
STRING = "string"
BOOLEAN = "boolean"
DATE = "date"
TIMESTAMP = "timestamp"
SCALAR_TYPES = (BIGINT, DOUBLE, STRING, BOOLEAN, DATE, TIMESTAMP)  # and every decimal(p,s)
NUMERIC_TYPES = (BIGINT, DOUBLE)  # and every decimal(p,s): see is_numeric
MAX_DECIMAL_PRECISION = 38
#: Spark's ``DECIMAL`` with no precision, and the decimal a BIGINT widens to.
DEFAULT_DECIMAL = "decimal(10,0)"
BIGINT_AS_DECIMAL = "decimal(20,0)"

_DECIMAL = re.compile(r"(?:decimal|numeric|dec)\s*(?:\(\s*(\d+)\s*(?:,\s*(\d+)\s*)?\))?")

_ALIASES = {
    "bigint": BIGINT,
    "long": BIGINT,
    "int": BIGINT,
    "integer": BIGINT,
    "double": DOUBLE,
    "float": DOUBLE,
    "string": STRING,
    "str": STRING,
    "varchar": STRING,
    "boolean": BOOLEAN,
    "bool": BOOLEAN,
    "date": DATE,
    "timestamp": TIMESTAMP,
}


def array_of(element: str) -> str:
    return f"array<{element}>"


def element_type(array_type: str) -> str:
    if not is_array(array_type):
        raise TypeError(f"{array_type} is not an array type")
    return array_type[len("array<") : -1]


def is_array(type_name: str) -> bool:
    return type_name.startswith("array<") and type_name.endswith(">")


def decimal_of(precision: int, scale: int) -> str:
    """The canonical name of ``DECIMAL(precision, scale)``, checked as Spark checks it."""
    if not 1 <= precision <= MAX_DECIMAL_PRECISION:
        raise TypeError(f"DECIMAL precision must be 1..{MAX_DECIMAL_PRECISION}, got {precision}")
    if not 0 <= scale <= precision:
        raise TypeError(f"DECIMAL scale must be 0..precision ({precision}), got {scale}")
    return f"decimal({precision},{scale})"


def is_decimal(type_name: str) -> bool:
    return type_name.startswith("decimal(")


def decimal_parts(type_name: str) -> tuple[int, int]:
    """``(precision, scale)`` of a canonical decimal type name."""
    if not is_decimal(type_name):
        raise TypeError(f"{type_name} is not a decimal type")
    precision, scale = type_name[len("decimal(") : -1].split(",")
    return int(precision), int(scale)


def is_numeric(type_name: str) -> bool:
    return type_name in NUMERIC_TYPES or is_decimal(type_name)


def is_temporal(type_name: str) -> bool:
    return type_name in (DATE, TIMESTAMP)


def is_scalar(type_name: str) -> bool:
    return type_name in SCALAR_TYPES or is_decimal(type_name)


def normalize_type(type_name: str) -> str:
    """Map a user's spelling of a type (``"long"``, ``"STRING"``, ``"DECIMAL(10, 2)"``) to
    the canonical name."""
    lowered = str(type_name).strip().lower()
    if lowered in _ALIASES:
        return _ALIASES[lowered]
    if is_array(lowered):
        return array_of(normalize_type(element_type(lowered)))
    decimal = _DECIMAL.fullmatch(lowered)
    if decimal:
        if decimal.group(1) is None:
            return DEFAULT_DECIMAL
        return decimal_of(int(decimal.group(1)), int(decimal.group(2) or 0))
    raise TypeError(
        f"unknown column type {type_name!r}; use one of {', '.join(SCALAR_TYPES)}, "
        "DECIMAL(p,s) or ARRAY<type>"
    )


#: Enough digits for any decimal dbspark holds (Python's default context keeps 28).
EXACT = Context(prec=160, rounding=ROUND_HALF_UP)


def at_scale(value: Decimal | int, type_name: str) -> Decimal:
    """``value`` at the scale of the decimal type ``type_name``, rounded half away from
    zero (Spark's ``ROUND_HALF_UP``); whether it fits is ``decimal_fits``'s question."""
    _, scale = decimal_parts(type_name)
    return Decimal(value).quantize(Decimal(1).scaleb(-scale), context=EXACT)


def rounded_decimal(value: object, type_name: str) -> Decimal | None:
    """``value`` (a number, or text of one) as a value of the decimal type ``type_name``,
    rounded half away from zero to its scale (a float as its shortest decimal form, which
    is how Spark reads a double); None when it does not read, is not finite or does not
    fit."""
    try:
        number = Decimal(repr(value)) if isinstance(value, float) else Decimal(value)  # type: ignore[arg-type]
    except InvalidOperation:
        return None
    if not number.is_finite():
        return None
    rounded = at_scale(number, type_name)
    return rounded if decimal_fits(rounded, type_name) else None


def decimal_fits(value: Decimal, type_name: str) -> bool:
    """Is ``value`` a finite decimal with at most ``s`` digits after the point and at most
    ``p - s`` before it?"""
    precision, scale = decimal_parts(type_name)
    if not value.is_finite():
        return False
    exponent = value.as_tuple().exponent
    assert isinstance(exponent, int)
    if -exponent > scale and value != value.quantize(Decimal(1).scaleb(-scale), context=EXACT):
        return False
    return value.adjusted() < precision - scale or value == 0


def decimal_widens(digits: tuple[int, int] | None, type_name: str) -> bool:
    """Does every number with ``digits`` (precision, scale) fit ``type_name`` exactly?"""
    if digits is None:
        return False
    precision, scale = decimal_parts(type_name)
    return digits[1] <= scale and digits[0] - digits[1] <= precision - scale


def is_utc_instant(value: object) -> bool:
    return (
        isinstance(value, dt.datetime)
        and value.tzinfo is not None
        and value.utcoffset() == dt.timedelta(0)
    )


def python_value_fits(value: object, type_name: str) -> bool:
    """Does a Python value belong to a column of this type? ``None`` is SQL NULL and always fits."""
    if value is None:
        return True
    if type_name == BIGINT:
        return isinstance(value, int) and not isinstance(value, bool)
    if type_name == DOUBLE:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if type_name == STRING:
        return isinstance(value, str)
    if type_name == BOOLEAN:
        return isinstance(value, bool)
    if type_name == DATE:
        return isinstance(value, dt.date) and not isinstance(value, dt.datetime)
    if type_name == TIMESTAMP:
        return is_utc_instant(value)
    if is_decimal(type_name):
        if isinstance(value, int) and not isinstance(value, bool):
            value = Decimal(value)
        return isinstance(value, Decimal) and decimal_fits(value, type_name)
    if is_array(type_name):
        inner = element_type(type_name)
        return isinstance(value, (list, tuple)) and all(python_value_fits(v, inner) for v in value)
    return False


@dataclass(frozen=True)
class Schema:
    """An ordered list of named, typed columns."""

    fields: tuple[tuple[str, str], ...]

    @classmethod
    def of(cls, columns: Mapping[str, str] | Iterable[tuple[str, str]], *, what: str) -> Schema:
        """Build a schema from user input, checking names and types; ``what`` names it in errors."""
        pairs = list(columns.items()) if isinstance(columns, Mapping) else list(columns)
        if not pairs:
            raise ValueError(f"{what}: a schema needs at least one column")
        seen: set[str] = set()
        fields = []
        for name, type_name in pairs:
            if not isinstance(name, str) or not name.isidentifier():
                raise ValueError(f"{what}: column name {name!r} is not a valid identifier")
            if is_reserved(name):
                raise ValueError(f"{what}: column {name!r} starts with '__', reserved for dbspark")
            if name in seen:
                raise ValueError(f"{what}: column {name!r} declared twice")
            seen.add(name)
            try:
                fields.append((name, normalize_type(type_name)))
            except TypeError as exc:
                raise TypeError(f"{what}: column {name!r}: {exc}") from None
        return cls(tuple(fields))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.fields)

    @property
    def types(self) -> tuple[str, ...]:
        return tuple(t for _, t in self.fields)

    def type_of(self, name: str) -> str:
        for field_name, type_name in self.fields:
            if field_name == name:
                return type_name
        raise KeyError(name)

    def index_of(self, name: str) -> int:
        return self.names.index(name)

    def __contains__(self, name: object) -> bool:
        return name in self.names

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(self.fields)

    def __len__(self) -> int:
        return len(self.fields)

    def __str__(self) -> str:
        return "(" + ", ".join(f"{n} {t.upper()}" for n, t in self.fields) + ")"
