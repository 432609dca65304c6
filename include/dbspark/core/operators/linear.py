"""Linear operators: one Z-set in, one Z-set out, row by row.

Incremental rule: an operator ``L`` is linear when ``L(a + b) = L(a) + L(b)``
(and hence ``L(-a) = -L(a)``). The change of the output is then ``L`` of the
change of the input, so the incremental version of a linear operator is the
operator itself applied to the delta, with no state. The same holds at every
time of a nested clock: a linear operator is applied to the batch of each time
separately and the time is carried through unchanged. A chain of linear
operators is itself linear, which is what lets an engine fuse the chain into a
single projection (see ``general_linear`` for the fused form).

``plus`` and ``minus`` take two inputs and are linear in the pair:
``plus(a1 + a2, b1 + b2) = plus(a1, b1) + plus(a2, b2)``.

``consolidate`` is the one member that reads a trace: it sums a trace over all
of its times, which is linear in the trace's updates.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable
from typing import Any

from dbspark.core.trace import Trace
from dbspark.core.zset import Row, ZSet


def map_(fn: Callable[[Any], Row], z: ZSet) -> ZSet:
    """Apply ``fn`` to every row; rows that map to the same value add their weights."""
    return z.map(fn)


def filter_(pred: Callable[[Any], bool], z: ZSet) -> ZSet:
    """Keep the rows for which ``pred`` holds, with their weights."""
    return z.filter(pred)


def flat_map(fn: Callable[[Any], Iterable[Row]], z: ZSet) -> ZSet:
    """Replace every row by the rows ``fn`` yields for it, each with the row's weight."""
    return z.flat_map(fn)


def negate(z: ZSet) -> ZSet:
    """Flip the sign of every weight."""
    return -z


def plus(a: ZSet, b: ZSet) -> ZSet:
    """Add weights row by row; rows whose weights cancel disappear."""
    return a + b


def minus(a: ZSet, b: ZSet) -> ZSet:
    """Subtract ``b``'s weights from ``a``'s, row by row."""
    return a - b


def index_with(key_fn: Callable[[Any], Hashable], z: ZSet) -> ZSet:
    """The indexed Z-set of ``(key_fn(row), row)`` pairs, weights unchanged."""
    return z.map(lambda row: (key_fn(row), row))


def inspect(callback: Callable[[ZSet], object], z: ZSet) -> ZSet:
    """Call ``callback(z)`` (for its side effect, e.g. logging) and return ``z`` itself."""
    callback(z)
    return z


def consolidate(trace: Trace) -> ZSet:
    """Sum every update of ``trace`` regardless of its time: the collection with no time."""
    totals: dict[Row, int] = defaultdict(int)
    for row, _time, weight in trace.updates():
        totals[row] += weight
    return ZSet(totals)
