"""JSON-lines landings read in this process, with the Spark tier's rules.

A small ``jsonl`` batch is parsed here, so its ingest starts no JVM. The rules are those
of ``engine/spark/files.py`` (the conformance vectors' JSON mapping), checked line by
line in file order, the first failure raised with the Spark tier's words:

* lines are split at ``\\n``, ``\\r\\n`` or ``\\r`` (Hadoop's line reader), counted from
  1; a line of nothing but spaces is skipped;
* a line must be one JSON object with no key twice at any depth (``NaN`` and
  ``Infinity`` are not JSON), and hold no key the source does not declare; a declared
  key that is absent, or ``null``, is NULL;
* types map strictly: BIGINT takes an integer that fits 64 bits (not ``1.0``, not
  ``"1"``), DOUBLE any number, STRING a string, BOOLEAN ``true``/``false``, ARRAY an
  array of such values or ``null``s; a Z-set's ``__w`` is a BIGINT, 1 when absent and a
  problem when ``null``.

DATE, TIMESTAMP and DECIMAL columns arrive as JSON strings (a DECIMAL also as a JSON
number) that Spark casts with its own text rules. Only the forms those rules read one
way are read here: a date ``YYYY-MM-DD``, an instant ``YYYY-MM-DD[T ]hh:mm:ss[.f]`` with
its zone (``Z`` or ``±hh:mm``), and a plain decimal (``-12.5``, or a JSON number without
an exponent) that fits the column's precision and scale with no rounding. Any other
value of such a column, even one Spark would refuse, hands the whole batch to Spark
(:class:`SparksToRead`), which reads it, or words why not, as it always has. Arrays of
these types are Spark's to read (``jsonl_readable``).
"""

from __future__ import annotations

import decimal
import json
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from dbspark.core.columns import WEIGHT
from dbspark.core.temporal import parse_date, parse_timestamp
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
from dbspark.engine.file_batches import declared_columns, json_line_error
from dbspark.engine.local.dialect import arrow_type

_LINE_BREAK = re.compile(r"\r\n|\r|\n")
_INT64 = (-(2**63), 2**63 - 1)


def jsonl_readable(schema: Schema) -> bool:
    """Can every column of ``schema`` be read from JSON here (see the module docstring)?"""
    return all(_readable(kind) for kind in schema.types)


def _readable(kind: str) -> bool:
    if is_array(kind):
        return element_type(kind) in _JSON_TYPES
    return kind in _JSON_TYPES or _cast_from_text(kind)


def _cast_from_text(kind: str) -> bool:
    """Whether Spark casts a column of ``kind`` from JSON text (:func:`_from_text`)."""
    return kind in (DATE, TIMESTAMP) or is_decimal(kind)


#: Types whose JSON values are read by their JSON type alone, with no text to cast.
_JSON_TYPES = (BIGINT, DOUBLE, STRING, BOOLEAN)
#: Text Spark's casts read one way only (see the module docstring); ``parse_date`` and
#: ``parse_timestamp`` give the value.
_DATE_TEXT = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
_INSTANT_TEXT = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}[T ][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?"
    r"(Z|[+-][0-9]{2}:[0-9]{2})"
)
_DECIMAL_TEXT = re.compile(r"-?[0-9]+(\.[0-9]+)?")


class SparksToRead(Exception):
    """A value only Spark's text rules can read (or refuse): the batch is Spark's."""


def file_lines(path: str) -> list[str]:
    """The lines of ``path`` as Spark's text reader splits and decodes them."""
    return _lines(Path(path).read_bytes())


def count_rows(lines: Sequence[str]) -> int:
    """Lines that are not blank (an upper bound on the rows they hold)."""
    return sum(1 for line in lines if line.strip(" "))


class _Fraction(float):
    """A JSON number with a fraction or an exponent, keeping its text: Spark reads one
    without an exponent as a DECIMAL (and shows it so), one with an exponent as a DOUBLE."""

    text: str

    def __new__(cls, text: str) -> _Fraction:
        number = super().__new__(cls, text)
        number.text = text
        return number


def read_jsonl(
    source: str, schema: Schema, lines: Sequence[str], weighted: bool, name: str
) -> pa.Table:
    """The rows of a JSON-lines file (its ``file_lines``) as a table of the declared
    columns (and ``__w`` when ``weighted``), or the Spark tier's :class:`InputError` for
    its first bad line, naming the file ``name`` as the batch gave it."""
    declared = declared_columns(schema, weighted)
    columns: dict[str, list[Any]] = {column: [] for column in declared}
    for number, line in enumerate(lines, start=1):
        if not line.strip(" "):
            continue
        values = _parse(line, declared, schema)
        if isinstance(values, str):
            raise json_line_error(source, f"line {number}", values, line, name)
        for column in declared:
            columns[column].append(values[column])
    if weighted:
        columns[WEIGHT] = [1 if w is None else w for w in columns[WEIGHT]]
    return pa.Table.from_arrays(
        [pa.array(columns[n], arrow_type(t)) for n, t in declared.items()],
        names=list(declared),
    )


def _lines(data: bytes) -> list[str]:
    # Spark's text reader decodes UTF-8, replacing what is not.
    return _LINE_BREAK.split(data.decode("utf-8", errors="replace"))


class _Rejected(ValueError):
    pass


def _no_duplicates(pairs: Sequence[tuple[str, Any]]) -> dict[str, Any]:
    found = dict(pairs)
    if len(found) != len(pairs):
        raise _Rejected("a key appears twice")
    return found


def _not_json(constant: str) -> Any:
    raise _Rejected(f"{constant} is not JSON")


def _parse(line: str, declared: dict[str, str], schema: Schema) -> dict[str, Any] | str:
    """The line's values by column, or the problem with it (the Spark tier's words)."""
    try:
        record = json.loads(
            line,
            object_pairs_hook=_no_duplicates,
            parse_constant=_not_json,
            parse_float=_Fraction,
        )
    except (ValueError, RecursionError):
        return "not valid JSON (or a key appears twice)"
    if not isinstance(record, dict):
        return "not a JSON object"
    unknown = [key for key in record if key not in declared]
    if unknown:
        return f"unknown key(s) {', '.join(unknown)}; the source declares {schema}"
    values = {}
    for name, kind in declared.items():
        value = record.get(name)
        if value is not None and not _fits(value, kind):
            return f"column {name!r} is {kind.upper()}, got {_as_json(value)}"
        if value is not None and _cast_from_text(kind):
            value = _from_text(value, kind)
        values[name] = float(value) if kind == DOUBLE and value is not None else value
        if is_array(kind) and value is not None and element_type(kind) == DOUBLE:
            values[name] = [None if v is None else float(v) for v in value]
    if WEIGHT in declared and WEIGHT in record and record[WEIGHT] is None:
        return f"the weight {WEIGHT!r} is null"
    return values


def _fits(value: Any, kind: str) -> bool:
    if is_array(kind):
        inner = element_type(kind)
        return isinstance(value, list) and all(v is None or _fits(v, inner) for v in value)
    if isinstance(value, bool):
        return kind == BOOLEAN
    if kind == BIGINT:
        return isinstance(value, int) and _INT64[0] <= value <= _INT64[1]
    if kind == DOUBLE:  # an integer past a double's range is not a number Spark reads
        return isinstance(value, float) or (isinstance(value, int) and abs(value) < 2**1024)
    if kind in (STRING, DATE, TIMESTAMP):
        return isinstance(value, str)
    if is_decimal(kind):  # a string, or a number Spark's variant holds as one exactly
        return isinstance(value, (str, int)) or (
            isinstance(value, _Fraction) and not re.search("[eE]", value.text)
        )
    return False


def _from_text(value: Any, kind: str) -> Any:
    """A DATE, TIMESTAMP or DECIMAL value as Spark reads it; :class:`SparksToRead` when
    this is not one of the forms read here."""
    if kind == DATE:
        day = parse_date(value) if _DATE_TEXT.fullmatch(value) else None
        if day is None:
            raise SparksToRead(value)
        return day
    if kind == TIMESTAMP:
        moment = parse_timestamp(value) if _INSTANT_TEXT.fullmatch(value) else None
        if moment is None:
            raise SparksToRead(value)
        return moment
    text = value.text if isinstance(value, _Fraction) else str(value)
    if not _DECIMAL_TEXT.fullmatch(text):
        raise SparksToRead(value)
    exact = decimal.Decimal(text)
    precision, scale = decimal_parts(kind)
    whole, _, fraction = text.lstrip("-").partition(".")
    if len(fraction) > scale or len(whole.lstrip("0")) > precision - scale:
        raise SparksToRead(value)  # Spark rounds, or refuses: its rule decides
    return exact


def _as_json(value: Any) -> str:
    """``value`` as Spark's ``to_json`` of the variant shows it (a wrong value's message)."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ",".join(_as_json(v) for v in value) + "]"
    if isinstance(value, dict):  # a variant keeps an object's keys sorted
        items = sorted(value.items())
        return "{" + ",".join(f"{_as_json(k)}:{_as_json(v)}" for k, v in items) + "}"
    if isinstance(value, _Fraction) and not re.search("[eE]", value.text):
        exact = decimal.Decimal(value.text)
        if len(exact.normalize().as_tuple().digits) <= _DECIMAL_DIGITS:
            return _plain(exact)
    elif isinstance(value, int) and abs(value) < 10**_DECIMAL_DIGITS:
        return str(value)
    return _java_double(float(value))


#: Digits of Spark's widest DECIMAL: a number with more is read as a DOUBLE.
_DECIMAL_DIGITS = 38


def _plain(exact: decimal.Decimal) -> str:
    if exact == 0:
        return "0"
    return format(exact.normalize(), "f")


def _java_double(number: float) -> str:
    """``Double.toString``: plain from 10^-3 up to 10^7, else ``d.dddE±n``."""
    if math.isinf(number):
        return '"Infinity"' if number > 0 else '"-Infinity"'
    if number == 0:
        return "-0.0" if math.copysign(1.0, number) < 0 else "0.0"
    exact = decimal.Decimal(repr(number))
    if 1e-3 <= abs(number) < 1e7:
        text = format(exact, "f")
        return text if "." in text else text + ".0"
    sign, digits, exponent = exact.normalize().as_tuple()
    shown = "".join(map(str, digits))
    power = len(shown) + int(exponent) - 1
    return f"{'-' if sign else ''}{shown[0]}.{shown[1:] or '0'}E{power}"
