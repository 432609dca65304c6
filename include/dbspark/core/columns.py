"""The reserved column names: what dbspark adds to a user's columns, and nothing else.

A user's column may not start with ``__``. Every stored batch carries its weight in
``__w``; traces carry their time as ``__epoch`` plus one ``__iter`` column per loop level
(``__iter``, ``__iter_2``, ...); an upsert source's state row carries ``__tombstone``.
A view published as a table carries ``__copies``, the row's multiplicity (at least 1),
instead of a weight. Every layer takes these names from here.
"""

from __future__ import annotations

RESERVED_PREFIX = "__"

WEIGHT = "__w"
EPOCH = "__epoch"
ITER = "__iter"
TOMBSTONE = "__tombstone"
COPIES = "__copies"

#: Spark SQL types of the reserved columns (an iteration fits an ``int``).
WEIGHT_TYPE = "bigint"
EPOCH_TYPE = "bigint"
ITER_TYPE = "int"


def is_reserved(name: str) -> bool:
    """Whether ``name`` belongs to dbspark rather than to a user's schema."""
    return name.startswith(RESERVED_PREFIX)


def iter_column(level: int) -> str:
    """The iteration column of loop nesting level ``level`` (1: ``__iter``, 2: ``__iter_2``)."""
    if level < 1:
        raise ValueError(f"loop levels start at 1, got {level}")
    return ITER if level == 1 else f"{ITER}_{level}"


def time_columns(depth: int) -> list[str]:
    """The time columns of a scope ``depth`` deep (1: root): ``__epoch``, ``__iter``, ..."""
    if depth < 1:
        raise ValueError(f"a time has at least one coordinate, got depth {depth}")
    return [EPOCH, *(iter_column(level) for level in range(1, depth))]


def time_fields(depth: int) -> list[tuple[str, str]]:
    """``(name, type)`` of the time columns of a scope ``depth`` deep."""
    return [(name, EPOCH_TYPE if name == EPOCH else ITER_TYPE) for name in time_columns(depth)]
