"""Operators on time: the delay ``z^-1`` and appending batches to traces.

``z^-1`` shifts a stream by one step of its clock: its output at step ``t`` is
its input at step ``t - 1``, and at the first step it outputs the empty value.
It is linear and is the only operator with memory of the previous step; inside
a loop it is the feedback edge, carrying the deltas of iteration ``i`` into
iteration ``i + 1``. ``Delay`` and ``DelayTrace`` are its stateful, one step at
a time form; ``delay`` and ``delay_trace`` apply it to a whole stream.

``trace_append`` adds a batch to a trace at a given time, giving the next
value of the "everything so far" trace that stateful operators read. Delaying
that trace gives "everything strictly before now", which is what the
incremental join needs on both sides. ``untimed_trace_append`` is the form for
operators that only ever sum a trace over all of its times: the batch is
recorded at ``MIN_TIME`` (``()``), so the trace stays as small as the
collection.

Incremental rule: each of these is linear, and a trace append is computed from
the previous trace and the new batch alone. Traces are mutable objects, so the
functions here return new traces and the delays hand back snapshots: a value
that has come out of a delay never changes afterwards.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator

from dbspark.core.operators._time import MIN_TIME
from dbspark.core.timestamps import Time
from dbspark.core.trace import Trace
from dbspark.core.zset import ZSet


class Delay:
    """``z^-1`` on a stream of Z-sets: ``step(z)`` returns the previous ``z``, empty at first."""

    __slots__ = ("_previous",)

    def __init__(self, initial: ZSet | None = None) -> None:
        self._previous = ZSet() if initial is None else initial

    def step(self, z: ZSet) -> ZSet:
        previous, self._previous = self._previous, z
        return previous

    def peek(self) -> ZSet:
        """What the next ``step`` will return."""
        return self._previous


class DelayTrace:
    """``z^-1`` on a stream of traces: ``step(trace)`` returns a snapshot of the previous one."""

    __slots__ = ("_previous",)

    def __init__(self, initial: Trace | None = None) -> None:
        self._previous = Trace() if initial is None else snapshot(initial)

    def step(self, trace: Trace) -> Trace:
        previous, self._previous = self._previous, snapshot(trace)
        return previous

    def peek(self) -> Trace:
        """What the next ``step`` will return."""
        return self._previous


def delay(stream: Iterable[ZSet]) -> Iterator[ZSet]:
    """The stream shifted by one step: empty first, then every input but the last."""
    state = Delay()
    for z in stream:
        yield state.step(z)


def delay_trace(stream: Iterable[Trace]) -> Iterator[Trace]:
    """The stream of traces shifted by one step: an empty trace first."""
    state = DelayTrace()
    for trace in stream:
        yield state.step(trace)


def trace_append(trace: Trace, zset: ZSet, time: Time) -> Trace:
    """A new trace: ``trace`` plus ``zset`` recorded at ``time`` (``trace`` is unchanged)."""
    out = snapshot(trace)
    out.insert(zset, time)
    return out


def untimed_trace_append(trace: Trace, zset: ZSet) -> Trace:
    """A new trace: ``trace`` plus ``zset`` recorded at ``MIN_TIME`` (no time)."""
    return trace_append(trace, zset, MIN_TIME)


def snapshot(trace: Trace) -> Trace:
    """An independent copy of ``trace``, with the same key function."""
    # Functions (the key function) are copied by reference; the nested dicts are copied.
    return copy.deepcopy(trace)
