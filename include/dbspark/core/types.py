"""Column types and schemas.

dbspark speaks a deliberately small set of SQL types, each with one Python and
one Spark representation, so that a circuit means the same thing on every
engine. Reserved column names start with ``__`` (weights, times, flags); users
may not declare them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from dbspark.core.columns import is_reserved

BIGINT = "bigint"
DOUBLE = "double"
STRING = "string"
BOOLEAN = "boolean"
SCALAR_TYPES = (BIGINT, DOUBLE, STRING, BOOLEAN)
NUMERIC_TYPES = (BIGINT, DOUBLE)

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
}


def array_of(element: str) -> str:
    return f"array<{element}>"


def element_type(array_type: str) -> str:
    if not is_array(array_type):
        raise TypeError(f"{array_type} is not an array type")
    return array_type[len("array<") : -1]


def is_array(type_name: str) -> bool:
    return type_name.startswith("array<") and type_name.endswith(">")


def normalize_type(type_name: str) -> str:
    """Map a user's spelling of a type (``"long"``, ``"STRING"``) to the canonical name."""
    lowered = str(type_name).strip().lower()
    if lowered in _ALIASES:
        return _ALIASES[lowered]
    if is_array(lowered):
        return array_of(normalize_type(element_type(lowered)))
    raise TypeError(f"unknown column type {type_name!r}; use one of {', '.join(SCALAR_TYPES)}")


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
