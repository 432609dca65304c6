"""The planner: from a circuit graph to stages.

A *stage* is the unit of execution: one Spark step, one Airflow task. Each
stage has an *anchor* (a source, a stateful operator, a multi-input operator,
or a loop boundary) followed by the chain of linear operators that only it
feeds. Fusing that chain means one projection over the anchor's output instead
of one materialized collection per operator, which is the point of the
general-linear-operator view of map/filter/flat_map.

Stages inside a loop are grouped per loop; an iteration of the loop runs them
in order, and the loop repeats until it converges.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dbspark.circuit.builder import LINEAR_OPS, STATEFUL_OPS, Circuit, Node
from dbspark.circuit.expressions import Literal, referenced_columns

#: Linear operators that may be fused onto the stage of their (single) input.
FUSABLE_OPS = LINEAR_OPS - {"plus", "minus", "delay"}


@dataclass
class Stage:
    """A fused group of operators run as one step."""

    id: int
    name: str
    scope: int
    nodes: tuple[int, ...]
    inputs: tuple[int, ...]  # nodes of other stages that this stage reads
    outputs: tuple[int, ...]  # nodes of this stage read by other stages or published as views

    @property
    def anchor(self) -> int:
        return self.nodes[0]


@dataclass
class LoopPlan:
    """The stages of one fixed-point loop, in the order an iteration runs them."""

    scope: int
    name: str
    depth: int
    stages: tuple[
        int, ...
    ]  # stage ids whose scope is this loop (nested loops appear via their leave)
    variable: int
    result: int
    output: int
    max_iterations: int
    nested: tuple[int, ...] = ()  # scopes of loops directly inside this one


@dataclass
class Plan:
    circuit: Circuit
    stages: list[Stage]
    loops: dict[int, LoopPlan]
    node_stage: dict[int, int] = field(default_factory=dict)
    #: The nodes whose collection is positive at every time (``positive_nodes``).
    positive: frozenset[int] = frozenset()

    def stages_in_scope(self, scope: int) -> list[Stage]:
        return [s for s in self.stages if s.scope == scope]

    def stage_of(self, node_id: int) -> Stage:
        return self.stages[self.node_stage[node_id]]

    def describe(self) -> str:
        lines = [f"plan for circuit {self.circuit.name}: {len(self.stages)} stages"]
        for stage in self.stages:
            depth = self.circuit.scope(stage.scope).depth
            ops = " > ".join(self.circuit.node(n).op for n in stage.nodes)
            lines.append(f"{'  ' * depth}stage {stage.id} {stage.name}: {ops}")
        return "\n".join(lines)


def plan(circuit: Circuit) -> Plan:
    """Validate ``circuit`` and cut it into fused stages."""
    circuit.validate()
    readers = circuit.consumers()
    published = set(circuit.views.values())
    stage_nodes: list[list[int]] = []
    node_stage: dict[int, int] = {}

    for node in circuit.nodes:
        host = _fusion_host(circuit, node, readers)
        if host is None:
            node_stage[node.id] = len(stage_nodes)
            stage_nodes.append([node.id])
        else:
            node_stage[node.id] = node_stage[host]
            stage_nodes[node_stage[host]].append(node.id)

    stages = []
    for stage_id, members in enumerate(stage_nodes):
        member_set = set(members)
        inputs = sorted(
            {i for n in members for i in circuit.node(n).inputs if i not in member_set}
            | {
                circuit.node(n).params["feedback"]
                for n in members
                if circuit.node(n).op == "variable"
            }
        )
        outputs = sorted(
            n
            for n in members
            if n in published
            or any(node_stage[r] != stage_id for r in readers[n])
            or _is_feedback(circuit, n)
        )
        anchor = circuit.node(members[0])
        stages.append(
            Stage(
                id=stage_id,
                name=_stage_name(anchor),
                scope=anchor.scope,
                nodes=tuple(members),
                inputs=tuple(inputs),
                outputs=tuple(outputs),
            )
        )

    loops = {}
    for scope in circuit.scopes[1:]:
        assert scope.variable is not None and scope.result is not None and scope.output is not None
        loops[scope.id] = LoopPlan(
            scope=scope.id,
            name=scope.name,
            depth=scope.depth,
            stages=tuple(s.id for s in stages if s.scope == scope.id),
            variable=scope.variable,
            result=scope.result,
            output=scope.output,
            max_iterations=scope.max_iterations,
            nested=tuple(s.id for s in circuit.scopes if s.parent == scope.id),
        )
    return Plan(circuit, stages, loops, node_stage, positive_nodes(circuit))


#: Operators whose output is positive when every input is: they pass rows on with their
#: weights, add positive collections, or multiply weights (join). ``join_function`` also
#: when each emit keeps the weight as it is (see ``_keeps_weights``).
_POSITIVE_WHEN_INPUTS_ARE = frozenset(
    {
        "select",
        "filter",
        "flat_map",
        "index_by",
        "inspect",
        "consolidate",
        "upsert_live",
        "delay",
        "plus",
        "join",
        "enter",
        "leave",
    }
)


def positive_nodes(circuit: Circuit) -> frozenset[int]:
    """The nodes whose collection is a positive Z-set at every time: no row's weight,
    accumulated to any time, is ever below zero.

    An upsert source's state holds each key at most once, and ``distinct`` and
    ``aggregate`` give each row weight 1; a Z-set source may carry any weight, and
    ``negate``, ``minus`` and weights from data (``explode``) make negative ones.
    ``_POSITIVE_WHEN_INPUTS_ARE`` keeps positivity. A loop's variable is positive when
    the collection it starts from is, and its body's result is, assuming the variable
    is: by induction over the iterations.

    On a positive collection, a group's rows may be merged when they agree on the
    columns an aggregate reads (``aggregate_columns``): a row is present exactly when
    the merged row is, and a sum or a multiset of values is the same."""
    assumed = {s.variable for s in circuit.scopes[1:] if s.variable is not None}
    while True:
        positive: set[int] = set()
        for node in circuit.nodes:
            inputs_positive = all(i in positive for i in node.inputs)
            if (
                node.op in ("upsert_source", "distinct", "aggregate")
                or (node.op == "variable" and node.id in assumed and inputs_positive)
                or (node.op == "constant" and all(w > 0 for _, w in node.params["rows"]))
                or (node.op in _POSITIVE_WHEN_INPUTS_ARE and inputs_positive)
                or (node.op == "join_function" and inputs_positive and _keeps_weights(node))
            ):
                positive.add(node.id)
        broken = {
            s.variable
            for s in circuit.scopes[1:]
            if s.variable in assumed and s.result not in positive
        }
        if not broken:
            return frozenset(positive)
        assumed -= broken


def _keeps_weights(node: Node) -> bool:
    """Whether every emit of a ``join_function`` keeps its input row's weight."""
    return all(
        isinstance(emit["weight"], Literal) and emit["weight"].value == 1
        for emit in node.params["emits"]
    )


def aggregate_columns(circuit: Circuit, node: Node, positive: frozenset[int]) -> tuple[str, ...]:
    """The columns of an aggregate's input its trace must be read with: its group
    columns and those its aggregations read when the input is positive (rows that agree
    on them may merge, ``positive_nodes``), else every column (a row whose weight
    cancels another's at some time must stay a row of its own)."""
    source = circuit.node(node.inputs[0])
    if source.id not in positive:
        return tuple(source.schema.names)
    read = set(node.params["keys"])
    for aggregation in node.params["aggregations"].values():
        if aggregation.expr is not None:
            read |= referenced_columns(aggregation.expr)
    return tuple(n for n in source.schema.names if n in read)


def trace_keys(circuit: Circuit, node: Node) -> tuple[tuple[str, ...], ...]:
    """The traces ``node`` keeps, each as the columns it is arranged by: one per input
    of a stateful operator (a join's sides by their join keys, an aggregate's input by
    its group, or by every column without one, a distinct's input by every column) and
    an upsert source's state by its primary key; nothing for other operators.

    An epoch reads and appends to a trace only for the keys its changes touch, so the
    keys say what a change costs; ``explain`` shows them, and the engines arrange
    (bucket and read) their traces by the same columns."""
    if node.op == "join":
        return (tuple(node.params["left_keys"]), tuple(node.params["right_keys"]))
    if node.op in STATEFUL_OPS:
        keys = tuple(node.params.get("keys", ()))
        return (keys or tuple(circuit.node(node.inputs[0]).schema.names),)
    if node.op == "upsert_source":
        return (tuple(node.params["key"]),)
    return ()


def _fusion_host(circuit: Circuit, node: Node, readers: dict[int, list[int]]) -> int | None:
    """The node whose stage ``node`` joins, or None if it anchors a stage of its own."""
    if node.op not in FUSABLE_OPS or len(node.inputs) != 1:
        return None
    (source,) = node.inputs
    producer = circuit.node(source)
    if producer.scope != node.scope or len(readers[source]) != 1:
        return None
    if _is_feedback(circuit, source):
        return None
    return source


def _is_feedback(circuit: Circuit, node_id: int) -> bool:
    return any(s.result == node_id for s in circuit.scopes[1:])


def _stage_name(anchor: Node) -> str:
    label = (
        anchor.label.split(" ")[-1] if anchor.op in ("zset_source", "upsert_source") else anchor.op
    )
    base = f"{anchor.op}_{anchor.id}" if anchor.op not in ("zset_source", "upsert_source") else None
    return base or f"ingest_{label}"
