"""Traces: the history of a collection as ``(row, time, weight)`` updates.

A trace answers "what did the collection hold at time ``t``?" by adding up
every update at a time less than or equal to ``t`` in the product order. It is
what stateful operators (joins, distinct, aggregates) consult, and what the
storage layer persists as batches.

Compaction advances every time by a frontier (see ``antichain``) and merges
updates that land on the same time. Accumulations at times beyond the frontier
do not change, so a trace can shed history once nobody can ask about it; this
keeps a trace proportional to the size of the collection, not to the number of
epochs.

A trace may be *keyed*: given a function from row to key, it keeps an index so
that an operator touching a few keys reads only those keys' updates.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Iterator

from dbspark.core import timestamps
from dbspark.core.antichain import Antichain
from dbspark.core.timestamps import Time
from dbspark.core.zset import Row, ZSet

Update = tuple[Row, Time, int]


class Trace:
    """A mutable, consolidated multiset of timed updates, optionally indexed by key."""

    def __init__(self, key_of: Callable[[Row], Hashable] | None = None) -> None:
        self._key_of = key_of
        # key -> row -> time -> weight; with no key function every row is its own key.
        self._by_key: dict[Hashable, dict[Row, dict[Time, int]]] = {}

    # --- writing -------------------------------------------------------------
    def insert(self, batch: ZSet, time: Time) -> None:
        """Record ``batch`` as the change at ``time``."""
        for row, weight in batch.items():
            self.insert_update(row, time, weight)

    def insert_update(self, row: Row, time: Time, weight: int) -> None:
        if weight == 0:
            return
        key = self._key(row)
        rows = self._by_key.setdefault(key, {})
        times = rows.setdefault(row, {})
        total = times.get(time, 0) + weight
        if total:
            times[time] = total
        else:
            del times[time]
            if not times:
                del rows[row]
                if not rows:
                    del self._by_key[key]

    def extend(self, updates: Iterable[Update]) -> None:
        for row, time, weight in updates:
            self.insert_update(row, time, weight)

    def compact(self, frontier: Antichain) -> None:
        """Advance every time by ``frontier`` and merge what lands together."""
        old = list(self.updates())
        self._by_key.clear()
        for row, time, weight in old:
            self.insert_update(row, frontier.advance(time), weight)

    # --- reading -------------------------------------------------------------
    def updates(self) -> Iterator[Update]:
        for rows in self._by_key.values():
            for row, times in rows.items():
                for time, weight in times.items():
                    yield row, time, weight

    def updates_for_key(self, key: Hashable) -> Iterator[Update]:
        for row, times in self._by_key.get(key, {}).items():
            for time, weight in times.items():
                yield row, time, weight

    def keys(self) -> Iterator[Hashable]:
        return iter(self._by_key)

    def times(self) -> set[Time]:
        return {time for _, time, _ in self.updates()}

    def at(self, time: Time) -> ZSet:
        """Exactly the updates recorded at ``time`` (not accumulated)."""
        return ZSet((row, w) for row, t, w in self.updates() if t == time)

    def accumulate(self, time: Time, keys: Iterable[Hashable] | None = None) -> ZSet:
        """The collection as of ``time``: every update at or before it, summed."""
        return self.accumulate_where(lambda t: timestamps.less_equal(t, time), keys)

    def accumulate_where(
        self, include: Callable[[Time], bool], keys: Iterable[Hashable] | None = None
    ) -> ZSet:
        source = self.updates() if keys is None else self._updates_for_keys(keys)
        totals: dict[Row, int] = defaultdict(int)
        for row, time, weight in source:
            if include(time):
                totals[row] += weight
        return ZSet(totals)

    def __len__(self) -> int:
        return sum(len(times) for rows in self._by_key.values() for times in rows.values())

    def __repr__(self) -> str:
        return f"Trace({sorted(self.updates(), key=repr)})"

    def _updates_for_keys(self, keys: Iterable[Hashable]) -> Iterator[Update]:
        for key in keys:
            yield from self.updates_for_key(key)

    def _key(self, row: Row) -> Hashable:
        return row if self._key_of is None else self._key_of(row)


def trace_of(updates: Iterable[Update], key_of: Callable[[Row], Hashable] | None = None) -> Trace:
    """Build a trace from literal updates (handy in tests and examples)."""
    trace = Trace(key_of)
    trace.extend(updates)
    return trace
