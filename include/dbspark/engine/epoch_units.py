"""Which units of work an epoch plans, and which must commit before another may run.

An epoch's units are its root-scope stages (each source's ingest among them), one
fixed-point loop per top-level loop (its iterations, until one records convergence),
and ``publish``. The catalog commits an epoch only when every one of them committed,
checked in the transaction that closes it (``Catalog.commit_epoch``); and a unit
refuses to run before the units that produce what it reads committed
(``Catalog.require_units``). A unit whose task was marked done without running (Airflow's
"mark success") therefore never lets the epoch commit without it: the stages after it
refuse, and so does the close, naming it.

Stage names are the catalog's (the planner's ``Stage.name``, ``publish``); a loop is
named ``loop:<name>``, as its iterations commit.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from dbspark.circuit.planner import LoopPlan, Plan, Stage

#: The unit that appends an epoch's view changes (``SparkEngine.publish``).
PUBLISH = "publish"


@dataclass(frozen=True)
class Units:
    """Units of one epoch: ``stages`` committed at ``(epoch,)``, ``loops`` converged there."""

    stages: tuple[str, ...] = ()
    loops: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.stages or self.loops)


def epoch_units(plan: Plan) -> Units:
    """Every unit an epoch of ``plan`` must commit before the epoch may."""
    stages = [stage.name for stage in plan.stages_in_scope(0)]
    loops = [loop.name for loop in plan.loops.values() if _top_level(plan, loop.scope)]
    return Units((*stages, PUBLISH), tuple(loops))


def publish_inputs(plan: Plan) -> Units:
    """What ``publish`` waits for: every other unit of the epoch."""
    every = epoch_units(plan)
    return Units(tuple(s for s in every.stages if s != PUBLISH), every.loops)


def stage_inputs(plan: Plan, stage: Stage) -> Units:
    """The units that produce what the root-scope ``stage`` reads."""
    return producers(plan, stage.inputs)


def loop_inputs(plan: Plan, loop: LoopPlan) -> Units:
    """The units that produce what ``loop``'s iterations read from outside the loop."""
    inside = set(plan.circuit.nodes_within(loop.scope))
    reads = [
        node
        for stage in plan.stages
        if stage.anchor in inside
        for node in stage.inputs
        if node not in inside
    ]
    return producers(plan, reads)


def producers(plan: Plan, nodes: Iterable[int]) -> Units:
    """The root-scope stages, or top-level loops, that compute ``nodes`` at an epoch, in
    plan order."""
    stages: set[int] = set()
    loops: set[int] = set()
    for node in nodes:
        stage = plan.stage_of(node)
        if stage.scope == 0:
            stages.add(stage.id)
        else:
            loops.add(_outermost_loop(plan, stage.scope))
    return Units(
        tuple(plan.stages[i].name for i in sorted(stages)),
        tuple(plan.loops[scope].name for scope in sorted(loops)),
    )


def _top_level(plan: Plan, scope: int) -> bool:
    return plan.circuit.scope(scope).parent == 0


def _outermost_loop(plan: Plan, scope: int) -> int:
    while not _top_level(plan, scope):
        parent = plan.circuit.scope(scope).parent
        assert parent is not None
        scope = parent
    return scope
