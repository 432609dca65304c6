"""Antichains and frontiers.

A frontier is the set of minimal times at which updates may still arrive. In a
partial order there may be several such times, none below another: an
antichain. A time is *beyond* the frontier when some element of the frontier
is less than or equal to it.

Data at times not beyond the frontier can be *advanced* (compacted): every time
``t`` is replaced by the greatest time that compares the same way as ``t``
with every time beyond the frontier. For a lattice that representative is the
meet, over the frontier's elements ``f``, of ``join(t, f)``. Accumulating a
trace at any time beyond the frontier gives the same answer before and after.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from dbspark.core import timestamps
from dbspark.core.timestamps import Time


class Antichain:
    """A set of mutually incomparable times (the minimal elements of what was given)."""

    __slots__ = ("_elements",)

    def __init__(self, times: Iterable[Time] = ()) -> None:
        self._elements: tuple[Time, ...] = ()
        for t in times:
            self.insert(t)

    def insert(self, t: Time) -> bool:
        """Add ``t`` unless something already here is at or below it."""
        if any(timestamps.less_equal(e, t) for e in self._elements):
            return False
        kept = tuple(e for e in self._elements if not timestamps.less_equal(t, e))
        self._elements = tuple(sorted((*kept, t)))
        return True

    @property
    def elements(self) -> tuple[Time, ...]:
        return self._elements

    def __iter__(self) -> Iterator[Time]:
        return iter(self._elements)

    def __len__(self) -> int:
        return len(self._elements)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Antichain) and self._elements == other._elements

    def __hash__(self) -> int:
        return hash(self._elements)

    def __repr__(self) -> str:
        return f"Antichain({list(self._elements)})"

    def is_empty(self) -> bool:
        """An empty frontier: nothing more can ever happen."""
        return not self._elements

    def less_equal(self, t: Time) -> bool:
        """Is ``t`` beyond (at or after) this frontier?"""
        return any(timestamps.less_equal(e, t) for e in self._elements)

    def less_than(self, t: Time) -> bool:
        return any(timestamps.less_than(e, t) for e in self._elements)

    def dominates(self, other: Antichain) -> bool:
        """``self <= other`` as frontiers: every time beyond ``other`` is beyond ``self``."""
        return all(self.less_equal(t) for t in other)

    def meet(self, other: Antichain) -> Antichain:
        """Greatest lower bound of two frontiers: the union of their upper sets."""
        return Antichain((*self._elements, *other._elements))

    def advance(self, t: Time) -> Time:
        """Compact ``t`` to its representative with respect to this frontier."""
        if not self._elements:
            return t
        result: Time | None = None
        for f in self._elements:
            candidate = timestamps.join(t, f)
            result = candidate if result is None else timestamps.meet(result, candidate)
        assert result is not None
        return result
