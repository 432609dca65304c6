"""Z-sets: collections whose rows carry integer weights.

A weight counts how many times a row is present; a negative weight is a
deletion still to be matched. Z-sets form a group under ``+``, which is what
makes incremental computation work: a change is just another Z-set, and the
collection at any moment is the sum of the changes so far.

A Z-set is always kept *consolidated*: one entry per distinct row, no zero
weights. Rows are tuples (the values of the columns, in schema order).

An *indexed* Z-set is a Z-set of ``(key, value)`` pairs; ``group_by_key``
gives the per-key view that joins and aggregates need.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from typing import Any

Row = Hashable


class ZSet:
    """An immutable, consolidated map from row to non-zero weight."""

    __slots__ = ("_weights",)

    def __init__(self, items: Iterable[tuple[Row, int]] | Mapping[Row, int] = ()) -> None:
        pairs = items.items() if isinstance(items, Mapping) else items
        weights: dict[Row, int] = defaultdict(int)
        for row, weight in pairs:
            if not isinstance(weight, int) or isinstance(weight, bool):
                raise TypeError(f"weight of {row!r} must be an int, got {weight!r}")
            weights[row] += weight
        self._weights: dict[Row, int] = {r: w for r, w in weights.items() if w != 0}

    @classmethod
    def from_rows(cls, rows: Iterable[Row]) -> ZSet:
        """Each row once per occurrence, weight +1."""
        return cls((row, 1) for row in rows)

    # --- reading -------------------------------------------------------
    def items(self) -> Iterator[tuple[Row, int]]:
        return iter(self._weights.items())

    def rows(self) -> Iterator[Row]:
        return iter(self._weights)

    def weight(self, row: Row) -> int:
        return self._weights.get(row, 0)

    def as_dict(self) -> dict[Row, int]:
        return dict(self._weights)

    def is_empty(self) -> bool:
        return not self._weights

    def __len__(self) -> int:
        return len(self._weights)

    def __bool__(self) -> bool:
        return bool(self._weights)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ZSet):
            return self._weights == other._weights
        return NotImplemented

    def __hash__(self) -> int:
        return hash(frozenset(self._weights.items()))

    def __repr__(self) -> str:
        body = ", ".join(f"{r!r}: {w}" for r, w in sorted_items(self))
        return f"ZSet({{{body}}})"

    # --- the group structure ---------------------------------------------
    def __add__(self, other: ZSet) -> ZSet:
        merged = dict(self._weights)
        for row, weight in other._weights.items():
            merged[row] = merged.get(row, 0) + weight
        return ZSet(merged)

    def __neg__(self) -> ZSet:
        return ZSet({r: -w for r, w in self._weights.items()})

    def __sub__(self, other: ZSet) -> ZSet:
        return self + (-other)

    def scale(self, factor: int) -> ZSet:
        return ZSet({r: w * factor for r, w in self._weights.items()})

    # --- record-at-a-time transformations (all linear) ---------------------
    def map(self, fn: Callable[[Any], Row]) -> ZSet:
        return ZSet((fn(r), w) for r, w in self._weights.items())

    def filter(self, predicate: Callable[[Any], bool]) -> ZSet:
        return ZSet((r, w) for r, w in self._weights.items() if predicate(r))

    def flat_map(self, fn: Callable[[Any], Iterable[Row]]) -> ZSet:
        return ZSet((out, w) for r, w in self._weights.items() for out in fn(r))

    def positive_part(self) -> ZSet:
        """Rows with positive weight, each at weight one (set semantics)."""
        return ZSet((r, 1) for r, w in self._weights.items() if w > 0)

    def group_by_key(self) -> dict[Hashable, dict[Hashable, int]]:
        """For an indexed Z-set of ``(key, value)`` rows: key -> {value: weight}."""
        groups: dict[Hashable, dict[Hashable, int]] = defaultdict(dict)
        for (key, value), weight in self._weights.items():  # type: ignore[misc]
            groups[key][value] = weight
        return dict(groups)


def sorted_items(zset: ZSet) -> list[tuple[Row, int]]:
    """Items in a deterministic order, for printing and comparing."""
    return sorted(zset.items(), key=lambda item: repr(item[0]))
