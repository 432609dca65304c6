"""Reading a conformance vector: JSON in, checked engine inputs out.

The format is the conformance README's: ``{"circuit": NAME, "epochs": [...],
"expected": [...]}``. Every problem is a :class:`VectorError` whose message says
what is wrong and where (epoch, source, entry), so the command can print it as
one line. The whole vector is checked before any epoch runs: a bad row in the
last epoch costs no engine work.

JSON values map to column types strictly: integers to BIGINT (a float such as
``1.0`` is not a BIGINT, nor is a boolean), strings to STRING, booleans to
BOOLEAN, numbers to DOUBLE, ``null`` to NULL, arrays to ARRAY columns.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from dbspark.circuit.builder import Circuit, CircuitError
from dbspark.core.types import (
    BIGINT,
    BOOLEAN,
    DATE,
    DOUBLE,
    STRING,
    TIMESTAMP,
    Schema,
    at_scale,
    decimal_fits,
    element_type,
    is_array,
    is_decimal,
)
from dbspark.examples.circuits import NAMED_CIRCUITS
from dbspark.sql import compile_circuit

BIGINT_MIN = -(2**63)
BIGINT_MAX = 2**63 - 1


class VectorError(ValueError):
    """The vector is malformed or does not fit its circuit (exit status 2)."""


@dataclass(frozen=True)
class SourceInfo:
    name: str
    kind: str  # "zset" | "upsert"
    schema: Schema
    key: tuple[str, ...] = ()


@dataclass
class Vector:
    """A parsed, checked vector: ``epochs[n]`` maps source names to engine-ready batches."""

    circuit_name: str
    circuit: Circuit
    epochs: list[dict[str, list[Any]]]
    expected: Any = None

    @property
    def has_expected(self) -> bool:
        return self.expected is not None


def sources_of(circuit: Circuit) -> dict[str, SourceInfo]:
    """Each source's kind and the schema its input rows must have."""
    infos = {}
    for name, node_id in circuit.sources.items():
        node = circuit.node(node_id)
        if node.op == "upsert_source":
            infos[name] = SourceInfo(
                name, "upsert", node.params["user_schema"], tuple(node.params["key"])
            )
        else:
            infos[name] = SourceInfo(name, "zset", node.schema)
    return infos


def load_json(text: str) -> Any:
    """Strict JSON: no NaN/Infinity, no duplicate keys in an object."""

    def no_constants(token: str) -> Any:
        raise VectorError(f"not valid JSON: {token} is not a JSON number")

    def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        result: dict[str, Any] = {}
        for key, value in pairs:
            if key in result:
                raise VectorError(f"not valid JSON: object key {key!r} appears twice")
            result[key] = value
        return result

    try:
        return json.loads(text, parse_constant=no_constants, object_pairs_hook=unique_keys)
    except json.JSONDecodeError as exc:
        raise VectorError(
            f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None


def parse_vector(text: str) -> Vector:
    """Parse and check a vector's text; raise :class:`VectorError` on the first problem."""
    data = load_json(text)
    if not isinstance(data, dict):
        raise VectorError(f"the vector must be a JSON object, got {_kind(data)}")
    if "circuit" not in data:
        raise VectorError('the vector has no "circuit"')
    name, circuit = _circuit(data["circuit"])
    if "epochs" not in data:
        raise VectorError('the vector has no "epochs"')
    raw_epochs = data["epochs"]
    if not isinstance(raw_epochs, list):
        raise VectorError(f'"epochs" must be a list of objects, got {_kind(raw_epochs)}')
    sources = sources_of(circuit)
    epochs = [_parse_epoch(index, raw, sources, name) for index, raw in enumerate(raw_epochs)]
    expected = data.get("expected")
    return Vector(name, circuit, epochs, expected)


#: The name a circuit defined in SQL runs under (its warehouse folder, its DAG).
SQL_CIRCUIT = "sql_circuit"


def _circuit(spec: Any) -> tuple[str, Circuit]:
    """The vector's circuit: a named one, or sources and SQL views (the conformance
    README, "Circuits defined in SQL")."""
    if isinstance(spec, str):
        if spec not in NAMED_CIRCUITS:
            raise VectorError(
                f"unknown circuit {spec!r} (known: {', '.join(sorted(NAMED_CIRCUITS))})"
            )
        return spec, NAMED_CIRCUITS[spec]()
    if not isinstance(spec, dict):
        raise VectorError(f'"circuit" must be a name or an object, got {_kind(spec)}')
    unknown = sorted(set(spec) - {"sources", "sql"})
    if unknown or not isinstance(spec.get("sources"), dict) or not isinstance(spec.get("sql"), str):
        raise VectorError(
            '"circuit" as an object needs "sources" (an object) and "sql" (a string)'
            + (f"; unknown keys: {unknown}" if unknown else "")
        )
    try:
        return SQL_CIRCUIT, compile_circuit(SQL_CIRCUIT, spec["sources"], spec["sql"])
    except CircuitError as error:
        raise VectorError(str(error)) from None


def _parse_epoch(
    index: int, raw: Any, sources: Mapping[str, SourceInfo], circuit: str
) -> dict[str, list[Any]]:
    where = f"epoch {index}"
    if not isinstance(raw, dict):
        raise VectorError(
            f"{where}: an epoch must be an object of source -> input, got {_kind(raw)}"
        )
    batches: dict[str, list[Any]] = {}
    for source, entries in raw.items():
        info = sources.get(source)
        if info is None:
            raise VectorError(
                f"{where}: circuit {circuit!r} has no source {source!r} "
                f"(sources: {', '.join(sorted(sources))})"
            )
        here = f"{where}, source {source!r}"
        if not isinstance(entries, list):
            raise VectorError(f"{here}: the input must be a list, got {_kind(entries)}")
        if info.kind == "zset":
            batches[source] = [_zset_entry(here, pos, e, info) for pos, e in enumerate(entries)]
        else:
            batches[source] = [_upsert_entry(here, pos, e, info) for pos, e in enumerate(entries)]
    return batches


def _zset_entry(where: str, position: int, entry: Any, info: SourceInfo) -> tuple[tuple, int]:
    here = f"{where}, entry {position}"
    if not isinstance(entry, list) or len(entry) != 2:
        raise VectorError(f"{here}: a Z-set entry must be [row, weight], got {_show(entry)}")
    row, weight = entry
    if not isinstance(row, list):
        raise VectorError(f"{here}: the row must be a list of column values, got {_show(row)}")
    here = f"{where}, row {_show(row)}"
    if not isinstance(weight, int) or isinstance(weight, bool):
        raise VectorError(f"{here}: the weight must be an integer, got {_show(weight)}")
    if not BIGINT_MIN <= weight <= BIGINT_MAX:
        raise VectorError(f"{here}: the weight {weight} does not fit in a BIGINT")
    if len(row) != len(info.schema):
        raise VectorError(
            f"{here}: {len(row)} values, but the schema {info.schema} has {len(info.schema)}"
        )
    values = tuple(
        convert_value(value, type_name, f"{here}: column {name!r}")
        for (name, type_name), value in zip(info.schema.fields, row, strict=True)
    )
    return values, weight


def _upsert_entry(where: str, position: int, entry: Any, info: SourceInfo) -> tuple:
    if not isinstance(entry, dict):
        raise VectorError(
            f"{where}, entry {position}: an upsert row must be an object keyed by column name, "
            f"got {_show(entry)}"
        )
    here = f"{where}, row {_show(entry)}"
    unknown = [name for name in entry if name not in info.schema]
    if unknown:
        raise VectorError(
            f"{here}: unknown column(s) {unknown} (columns: {', '.join(info.schema.names)})"
        )
    values = tuple(
        convert_value(entry.get(name), type_name, f"{here}: column {name!r}")
        for name, type_name in info.schema.fields
    )
    for name in info.key:
        if values[info.schema.index_of(name)] is None:
            raise VectorError(f"{here}: key column {name!r} is NULL")
    return values


def convert_value(value: Any, type_name: str, where: str) -> Any:
    """The JSON ``value`` as a Python value of a column of ``type_name``, or VectorError."""
    if value is None:
        return None
    if type_name == BIGINT:
        if isinstance(value, int) and not isinstance(value, bool):
            if BIGINT_MIN <= value <= BIGINT_MAX:
                return value
            raise VectorError(f"{where} is BIGINT, but {value} is out of range")
    elif type_name == DOUBLE:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif type_name == STRING:
        if isinstance(value, str):
            return value
    elif type_name == BOOLEAN:
        if isinstance(value, bool):
            return value
    elif is_array(type_name) and isinstance(value, list):
        inner = element_type(type_name)
        return tuple(convert_value(v, inner, f"{where} element") for v in value)
    elif type_name in (DATE, TIMESTAMP) or is_decimal(type_name):
        return _from_text(value, type_name, where)
    raise VectorError(f"{where} is {type_name.upper()}, got {_show(value)} ({_kind(value)})")


_DATE_TEXT = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
_TIMESTAMP_TEXT = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?Z"
)
_DECIMAL_TEXT = re.compile(r"[+-]?[0-9]+(\.[0-9]+)?")
_TEXT_FORMS = {
    DATE: "a string YYYY-MM-DD",
    TIMESTAMP: "a string YYYY-MM-DDTHH:MM:SS[.ffffff]Z",
}


def _from_text(value: Any, type_name: str, where: str) -> Any:
    """DATE, TIMESTAMP and DECIMAL values are JSON strings in one strict form each."""
    form = _TEXT_FORMS.get(type_name, 'a string of digits such as "12.50"')
    if isinstance(value, str):
        try:
            if type_name == DATE and _DATE_TEXT.fullmatch(value):
                return dt.date.fromisoformat(value)
            if type_name == TIMESTAMP and _TIMESTAMP_TEXT.fullmatch(value):
                return dt.datetime.fromisoformat(value)
        except ValueError as error:
            raise VectorError(f"{where} is {type_name.upper()}, but {value!r}: {error}") from None
        if is_decimal(type_name) and _DECIMAL_TEXT.fullmatch(value):
            number = Decimal(value)
            if not decimal_fits(number, type_name):
                raise VectorError(f"{where} is {type_name.upper()}, but {value} does not fit it")
            return at_scale(number, type_name)
    raise VectorError(
        f"{where} is {type_name.upper()}, given as {form}; got {_show(value)} ({_kind(value)})"
    )


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a float"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _show(value: Any, limit: int = 120) -> str:
    text = json.dumps(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
