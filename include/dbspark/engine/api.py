"""The engine contract: what every engine offers, returns and raises.

An engine is built from a circuit and runs it epoch by epoch. Callers (the conformance
replay, the demo, the tests) hold it as an :class:`Engine` and never ask which one it is:

* ``step(inputs)`` runs the next epoch. ``inputs`` maps source names to that epoch's
  batch (Z-set sources: ``[(row, weight), ...]``; upsert sources: rows in schema order or
  mappings by column name); a source left out has an empty batch. It returns an
  :class:`EpochResult`: every view's contents and change, and what each loop did.
* ``views()`` is every view as of the last committed epoch; ``last_committed_epoch()``
  is -1 before the first.
* ``verify()`` compares every view with a full refresh over the input so far.

Bad input raises :class:`InputError` (an :class:`UpsertError` when it is about upsert
keys) before the epoch commits anything; a loop that reaches its bound raises
:class:`LoopDidNotConverge`. Importing this module imports no engine.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from dbspark.circuit.builder import Circuit
from dbspark.circuit.planner import Plan
from dbspark.core.errors import InputError, require_sources
from dbspark.core.timestamps import Time
from dbspark.core.upsert import UpsertError
from dbspark.core.zset import ZSet

__all__ = [
    "Engine",
    "EpochOrderError",
    "EpochReport",
    "EpochResult",
    "InputError",
    "IterationReport",
    "LoopDidNotConverge",
    "LoopReport",
    "UnitReport",
    "UpsertError",
    "loop_reports",
    "require_sources",
]


class LoopDidNotConverge(RuntimeError):
    """A loop reached its iteration bound with work still pending."""


class EpochOrderError(RuntimeError):
    """An epoch was asked to run (or read) out of order."""


@dataclass
class UnitReport:
    """What one unit of work did, for task logs."""

    unit: str
    time: Time
    skipped: bool = False
    rows_in: int = 0
    rows_out: dict[str, int] = field(default_factory=dict)
    paths: list[str] = field(default_factory=list)
    note: str = ""
    tier: str = ""  # "local" or "spark": where the unit ran
    seconds: float = 0.0  # its wall time, when run by ``run_epoch`` (0: not measured)

    def describe(self) -> str:
        if self.skipped:
            return f"{self.unit} at {list(self.time)}: already committed, nothing to do"
        outs = ", ".join(f"{k}={v}" for k, v in self.rows_out.items()) or "none"
        text = f"{self.unit} at {list(self.time)}: rows in {self.rows_in}, rows out {outs}"
        if self.tier:
            text += f"; ran on the {self.tier} tier"
        return text + (f"; {self.note}" if self.note else "")


@dataclass
class IterationReport:
    """One loop iteration: its result's delta and whether the loop converged there."""

    loop: str
    prefix: Time
    iteration: int
    delta_rows: int
    pending_depth: int
    converged: bool
    reason: str
    skipped: bool = False


@dataclass
class EpochReport:
    """The units and iterations an epoch ran (the reference engine runs no units)."""

    epoch: int
    skipped: bool = False
    units: list[UnitReport] = field(default_factory=list)
    iterations: list[IterationReport] = field(default_factory=list)
    view_deltas: dict[str, int] = field(default_factory=dict)
    close_seconds: float = 0.0  # the epoch's commit and the start of its compaction


@dataclass
class LoopReport:
    """What one run of a loop did: per-iteration delta sizes and why it stopped."""

    loop: str
    time: Time
    delta_sizes: list[int] = field(default_factory=list)
    stop_reason: str = ""

    @property
    def iterations(self) -> int:
        return len(self.delta_sizes)


@dataclass
class EpochResult:
    """One epoch as ``Engine.step`` returns it."""

    epoch: int
    views: dict[str, ZSet]
    view_deltas: dict[str, ZSet]
    loops: list[LoopReport]
    report: EpochReport


def loop_reports(iterations: Iterable[IterationReport]) -> list[LoopReport]:
    """One :class:`LoopReport` per loop run (loop and time prefix), from its iterations."""
    runs: dict[tuple[str, Time], LoopReport] = {}
    for it in iterations:
        if it.skipped:
            continue
        key = (it.loop, tuple(it.prefix))
        run = runs.setdefault(key, LoopReport(it.loop, tuple(it.prefix)))
        run.delta_sizes.append(it.delta_rows)
        run.stop_reason = it.reason
    return list(runs.values())


class Engine(Protocol):
    """What every engine offers; see the module docstring."""

    circuit: Circuit
    plan: Plan

    @property
    def location(self) -> str:
        """Where the engine keeps its state, in words (for logs and the demo)."""
        ...

    def step(self, inputs: Mapping[str, Any] | None = None) -> EpochResult: ...

    def last_committed_epoch(self) -> int: ...

    def views(self) -> dict[str, ZSet]: ...

    def verify(self) -> dict[str, list[tuple]]:
        """Per view, the rows (with their weight, full refresh minus maintained) where the
        view differs from a full refresh; every list is empty when they agree."""
        ...
