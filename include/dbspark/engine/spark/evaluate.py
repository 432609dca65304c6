"""Operator evaluation on both tiers: one function per operator, looked up by its name.

``EVALUATORS`` maps each operator of the builder (``node.op``) to a function that takes
an :class:`Evaluation` (the node, its time, the unit it runs in and the deltas that unit
computed so far) and returns the node's delta at that time, or None when it is known to
be empty. The incremental rules themselves live once, in ``engine/kernels.py``; what is
here is which deltas and which key-pruned trace slices each rule reads.

:class:`OperatorEvaluation` is the part of ``SparkEngine`` that reads traces for the
stateful operators (join, distinct, aggregate) and for general linear operators.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import reduce
from typing import TYPE_CHECKING, Any

from pyspark.sql import DataFrame

from dbspark.circuit.builder import STATEFUL_OPS, Circuit, Node
from dbspark.circuit.planner import Plan, aggregate_columns, trace_keys
from dbspark.core import timestamps
from dbspark.core.columns import EPOCH, time_columns
from dbspark.core.timestamps import Time
from dbspark.core.types import Schema
from dbspark.engine import kernels as ops
from dbspark.engine.api import UnitReport
from dbspark.engine.dialect import dialect_of
from dbspark.engine.kernels import consolidate
from dbspark.engine.spark.tier import SparkTier
from dbspark.engine.spark.unit import Frame, Unit
from dbspark.storage import collection_names as coll
from dbspark.storage.catalog import BatchRecord
from dbspark.storage.warehouse import KeySet

if TYPE_CHECKING:
    from dbspark.engine.spark.executor import SparkEngine

#: Gathered key sets an engine keeps for reuse (``_keys_of``), newest last.
KEY_SETS_KEPT = 64


@dataclass
class Evaluation:
    """One node evaluated at one time inside one unit."""

    engine: SparkEngine
    node: Node
    t: Time
    frames: dict[tuple[int, Time], Frame]
    unit: Unit
    report: UnitReport

    def input(self, port: int = 0, at: Time | None = None) -> Frame:
        """The delta of input ``port`` at ``at`` (default: this time)."""
        at = self.t if at is None else at
        return self.engine._delta(self.node.inputs[port], at, self.unit, self.frames)

    @property
    def input_schema(self) -> Any:
        return self.engine.circuit.node(self.node.inputs[0]).schema

    @property
    def previous(self) -> Time:
        """This time one iteration (or, at the root, one epoch) earlier."""
        return (*self.t[:-1], self.t[-1] - 1)


Evaluator = Callable[[Evaluation], Frame]
EVALUATORS: dict[str, Evaluator] = {}


def evaluates(*ops_: str) -> Callable[[Evaluator], Evaluator]:
    """Register the decorated function as the evaluation of the operators ``ops_``."""

    def register(function: Evaluator) -> Evaluator:
        for op in ops_:
            EVALUATORS[op] = function
        return function

    return register


def evaluate(evaluation: Evaluation) -> Frame:
    op = evaluation.node.op
    if op not in EVALUATORS:
        raise AssertionError(f"no evaluation for operator {op!r}")
    return EVALUATORS[op](evaluation)


# --- linear: the delta of the output is the operator applied to the delta of the input
@evaluates("select")
def _select(e: Evaluation) -> Frame:
    delta = e.input()
    return None if delta is None else ops.select(delta, e.node.params["columns"], e.input_schema)


@evaluates("filter")
def _filter(e: Evaluation) -> Frame:
    delta = e.input()
    if delta is None:
        return None
    return ops.filter_(delta, e.node.params["predicate"], e.input_schema)


@evaluates("flat_map")
def _flat_map(e: Evaluation) -> Frame:
    delta = e.input()
    if delta is None:
        return None
    params = e.node.params
    return ops.flat_map(delta, params["name"], params["array"], e.input_schema)


@evaluates("negate")
def _negate(e: Evaluation) -> Frame:
    delta = e.input()
    return None if delta is None else ops.negate(delta)


@evaluates("constant")
def _constant(e: Evaluation) -> Frame:
    """A constant's rows arrive once, at the first epoch."""
    if e.t != (0,):
        return None
    rows = [(*values, weight) for values, weight in e.node.params["rows"]]
    return e.unit.tier.frame(rows, e.engine._fields(e.node)) if rows else None


@evaluates("upsert_live")
def _upsert_live(e: Evaluation) -> Frame:
    delta = e.input()
    return None if delta is None else ops.upsert_live(delta)


@evaluates("index_by", "consolidate", "inspect")
def _identity(e: Evaluation) -> Frame:
    return e.input()


@evaluates("plus", "minus")
def _plus_minus(e: Evaluation) -> Frame:
    left, right = e.input(0), e.input(1)
    if right is None:
        return left
    if e.node.op == "minus":
        right = ops.negate(right)
    return right if left is None else ops.plus(left, right)


@evaluates("join_function")
def _general_linear(e: Evaluation) -> Frame:
    return e.engine._general_linear(e.node, e.t, e.input(), e.unit)


# --- time: z^-1 and the loop's boundary
@evaluates("delay")
def _delay(e: Evaluation) -> Frame:
    return e.input(0, e.previous) if e.t[-1] > 0 else None


@evaluates("enter")
def _enter(e: Evaluation) -> Frame:
    """A loop's input arrives at iteration 0 only."""
    return e.input(0, e.t[:-1]) if e.t[-1] == 0 else None


@evaluates("variable")
def _variable(e: Evaluation) -> Frame:
    """Iteration 0 takes the initial delta; later ones what was fed back minus the
    previous iteration's initial delta (the variable's value is initial + feedback)."""
    if e.t[-1] == 0:
        return e.input()
    fed_back = e.engine._delta(e.node.params["feedback"], e.previous, e.unit, e.frames)
    initial = e.input(0, e.previous)
    if initial is None:
        return fed_back
    names = list(e.node.schema.names)
    fed_back = e.engine._or_empty(fed_back, e.node, e.unit)
    on_driver = e.engine._on_driver(
        e.unit, e.node, [fed_back, initial], lambda a, b: consolidate(ops.minus(a, b), names)
    )
    if on_driver is not None:
        return on_driver
    return consolidate(ops.minus(fed_back, initial), names)


@evaluates("leave")
def _leave(e: Evaluation) -> Frame:
    return e.engine._leave(e.node, e.t, e.unit, e.report)


# --- stateful: the delta of the output depends on the input's history (its trace)
@evaluates(*STATEFUL_OPS)
def _stateful(e: Evaluation) -> Frame:
    return e.engine._stateful(e.node, e.t, e.unit, e.frames)


class OperatorEvaluation:
    """The trace-reading part of ``SparkEngine`` (mixed into it: it uses the engine's
    circuit, catalog and tiers)."""

    circuit: Circuit
    plan: Plan
    buckets: int
    _key_sets: dict[tuple[Any, ...], KeySet]

    def _general_linear(self, node: Node, t: Time, delta: Frame, unit: Unit) -> Frame:
        """Emit each input row's outputs; those due at a later epoch are written to the
        node's scheduled collection, and this epoch's come back from it."""
        schema_in = self.circuit.node(node.inputs[0]).schema
        names = list(node.schema.names)
        now: Frame = None
        if delta is not None:
            out = unit.tier.checkpoint(
                ops.general_linear(delta, node.params["emits"], schema_in, node.schema, t[0])
            )
            F = dialect_of(out).F
            later = out.where(F.col(EPOCH) > t[0])
            for (due,) in later.select(EPOCH).distinct().collect():
                at = (int(due), *t[1:])
                part = later.where(F.col(EPOCH) == due).drop(EPOCH)
                collection = coll.scheduled(node.id)
                unit.write(part, collection, "delta", at, self._fields(node))
            now = out.where(F.col(EPOCH) == t[0]).drop(EPOCH)
        scheduled = unit.batches(coll.scheduled(node.id), "delta", lambda time: time == t)
        if scheduled:
            due_now = unit.tier.read(scheduled, self._fields(node))
            now = due_now if now is None else now.unionByName(due_now)
        return None if now is None else consolidate(now, names)

    def _on_driver(
        self, unit: Unit, node: Node, inputs: Sequence[Frame], compute: Callable[..., Any]
    ) -> Frame:
        """``compute`` over ``inputs`` on the driver when a Spark unit holds the rows of
        every input (``Unit.known_rows``): the same kernel evaluated by the local tier,
        its result a frame whose rows stay known, so neither computing nor writing it
        costs a Spark job. None when some input's rows are not on the driver."""
        if not isinstance(unit.tier, SparkTier):
            return None
        tables = [unit.known_rows(frame) for frame in inputs]
        if any(table is None for table in tables):
            return None
        result = compute(*[self.local.from_arrow(table) for table in tables])
        return unit.tier.known_frame(result.toArrow(), self._fields(node))

    def _stateful(
        self, node: Node, t: Time, unit: Unit, frames: dict[tuple[int, Time], Frame]
    ) -> Frame:
        """The output delta at ``t`` of a join, distinct or aggregate: arrange the input
        deltas, then recompute the keys that can change now from the traces' slices."""
        depth = len(t)
        port_keys = keys_by_port(self.circuit, node)
        deltas, arranged = self._arrange_inputs(node, t, unit, frames, port_keys)
        if depth == 1 and all(d is None for d in deltas):
            return None  # at the root clock, output needs input at this very epoch
        # Per port, the batches of t's epoch at or before t: their keys are the only ones
        # that can change now.
        now = [
            unit.batches(
                coll.arranged(node.id, port),
                "trace",
                lambda time: time[0] == t[0] and timestamps.less_equal(time, t),
            )
            for port in range(len(node.inputs))
        ]
        if depth > 1 and not any(now):
            return None  # no key of this node changed in this epoch: nothing can be owed
        deltas = [
            self._or_empty(d, self.circuit.node(i), unit)
            for d, i in zip(deltas, node.inputs, strict=True)
        ]
        if node.op == "join" and depth == 1:
            return self._join_at_root(node, t, unit, deltas, arranged)
        return self._from_trace_slices(node, t, unit, now, port_keys)

    def _arrange_inputs(
        self,
        node: Node,
        t: Time,
        unit: Unit,
        frames: dict[tuple[int, Time], Frame],
        port_keys: list[tuple[str, ...]],
    ) -> tuple[list[Frame], list[BatchRecord | None]]:
        """Each port's input delta at ``t`` appended to the node's arranged trace, and read
        back from there; with the batch written per port (None: the delta was empty)."""
        deltas: list[Frame] = []
        arranged: list[BatchRecord | None] = []
        for port, input_id in enumerate(node.inputs):
            delta = self._delta(input_id, t, unit, frames)
            record = None
            if delta is not None:
                input_node = self.circuit.node(input_id)
                if node.op == "distinct":
                    # distinct reads back each touched row's whole weight, and its input
                    # is typically a projection that repeats rows (routes of flights):
                    # arranged consolidated, a row is one stored row, not one per copy.
                    delta = consolidate(delta, list(input_node.schema.names))
                record = unit.write_at(
                    delta,
                    coll.arranged(node.id, port),
                    "trace",
                    t,
                    self._fields(input_node, len(t)),
                    bucket_by=list(port_keys[port]),
                )
                # The input delta is exactly what was just arranged: read it from there.
                delta = self._read_back(record, input_node, unit, len(t))
            deltas.append(delta)
            arranged.append(record)
        return deltas, arranged

    def _from_trace_slices(
        self,
        node: Node,
        t: Time,
        unit: Unit,
        now: list[list[BatchRecord]],
        port_keys: list[tuple[str, ...]],
    ) -> Frame:
        """The output delta of a distinct, an aggregate or a nested join, from the slices
        of its traces that hold the keys ``now``'s batches touched."""
        params = node.params
        depth = len(t)
        schemas = [self.circuit.node(i).schema for i in node.inputs]
        # A global aggregate (no group columns) is one group: it reads its whole trace.
        global_group = node.op == "aggregate" and not params["keys"]
        fields = [self._fields(self.circuit.node(i), depth) for i in node.inputs]
        touched = None if global_group else self._keys_of(node, now, port_keys, fields, unit)
        if node.op == "aggregate":
            # Only the columns the aggregate reads, when its rows may merge on them.
            columns = aggregate_columns(self.circuit, node, self.plan.positive)
            schemas[0] = Schema(tuple((n, schemas[0].type_of(n)) for n in columns))
        traces = [
            self._trace(
                node,
                port,
                unit,
                keys=touched,
                when=lambda time: timestamps.less_equal(time, t),
                columns=schemas[port].names,
            )
            for port in range(len(node.inputs))
        ]
        if node.op == "distinct":
            return ops.distinct_delta(traces[0], list(node.schema.names), t)
        if node.op == "aggregate":
            # The local tier reads exactly the touched keys; at the root clock those are
            # the groups updated at t.
            exact = depth == 1 and touched is not None and unit.tier.name == "local"
            return ops.aggregate_delta(
                traces[0],
                schemas[0],
                list(params["keys"]),
                params["aggregations"],
                node.schema,
                t,
                touched_only=exact,
                positive=node.inputs[0] in self.plan.positive,
            )
        return ops.join_delta_nested(
            traces[0],
            traces[1],
            list(params["left_keys"]),
            list(params["right_keys"]),
            list(schemas[0].names),
            list(schemas[1].names),
            list(params["right_values"]),
            list(node.schema.names),
            t,
        )

    def _join_at_root(
        self,
        node: Node,
        t: Time,
        unit: Unit,
        deltas: list[Any],
        arranged: list[BatchRecord | None],
    ) -> Frame:
        """A join at the root clock: each side's delta against the other side's history
        before this epoch, read only for the delta's keys (``arranged``: each side's delta
        as just arranged, None where it is empty)."""
        params = node.params
        left_keys, right_keys = list(params["left_keys"]), list(params["right_keys"])

        def before(port: int, keys: list[str]) -> DataFrame:
            """One side's history before this epoch, for the other side's delta keys
            (no read at all when the other side did not change)."""
            other = 1 - port
            record = arranged[other]
            if record is None:
                return self._or_empty(None, self.circuit.node(node.inputs[port]), unit)
            fields = self._fields(self.circuit.node(node.inputs[other]))
            gathered = self._written_keys(unit, [([record], keys)], fields, keys)
            if gathered is None:
                gathered = self._gather(unit, deltas[other].select(*keys))
            rows = self._trace(node, port, unit, keys=gathered, when=lambda x: x[0] < t[0])
            return rows.drop(*time_columns(1))

        return ops.join_delta_root(
            deltas[0],
            deltas[1],
            before(0, right_keys),
            before(1, left_keys),
            left_keys,
            right_keys,
            list(self.circuit.node(node.inputs[0]).schema.names),
            list(params["right_values"]),
            list(node.schema.names),
        )

    def _trace(
        self,
        node: Node,
        port: int,
        unit: Unit,
        *,
        keys: KeySet | None,
        when: Callable[[Time], bool],
        columns: Sequence[str] | None = None,
    ) -> DataFrame:
        """Port ``port``'s trace at the times ``when`` accepts, pruned to ``keys`` (given in
        either port's key names: they are renamed to this port's), with the input's
        ``columns`` only (default: all), its weight and times."""
        input_node = self.circuit.node(node.inputs[port])
        depth = self.circuit.scope(node.scope).depth
        collection = coll.arranged(node.id, port)
        records = unit.batches(collection, "trace", when)
        port_keys = list(keys_by_port(self.circuit, node)[port])
        fields = self._fields(input_node, depth)
        if columns is not None:
            wanted = set(columns)
            fields = [f for f in fields if f[0] in wanted or f[0] not in input_node.schema.names]
        return unit.tier.read(
            records,
            fields,
            keys=None if keys is None else keys.renamed(port_keys),
            bucket_by=port_keys,
        )

    def _gather(self, unit: Unit, keys: Any) -> KeySet:
        return unit.tier.gather_keys(keys, (self.buckets,))

    def _written_keys(
        self,
        unit: Unit,
        parts: Sequence[tuple[Sequence[BatchRecord], Sequence[str]]],
        fields: Sequence[tuple[str, str]],
        names: Sequence[str],
    ) -> KeySet | None:
        """On the Spark tier, the keys ``names`` (typed as in ``fields``) of batches it
        wrote from the driver, known without a job; None elsewhere (gather them)."""
        if not isinstance(unit.tier, SparkTier):
            return None
        types = dict(fields)
        return unit.tier.written_keys(parts, [(n, types[n]) for n in names], (self.buckets,))

    def _keys_of(
        self,
        node: Node,
        records: Sequence[Sequence[BatchRecord]],
        port_keys: Sequence[Sequence[str]],
        schemas: Sequence[Any],
        unit: Unit,
    ) -> KeySet:
        """The keys in each port's ``records`` (named as port 0's keys), gathered by one
        Spark job (or one local query). Batches never change, so the same batches give the
        same keys: a loop iteration that added no batch for the node reuses the previous
        gathering."""
        paths = tuple(tuple(sorted(r.path for r in rs)) for rs in records)
        memo = (unit.tier.name, node.id, paths)
        if memo in self._key_sets:
            return self._key_sets[memo]
        parts = [(rs, port_keys[port]) for port, rs in enumerate(records)]
        keys = self._written_keys(unit, parts, schemas[0], port_keys[0])
        if keys is None:
            frames = [
                renamed(unit.tier.read(rs, schemas[port]), port_keys[port], port_keys[0])
                for port, rs in enumerate(records)
            ]
            keys = self._gather(unit, reduce(ops.plus, frames))
        if keys.buckets is not None:  # gathered to the driver: a local relation to keep
            self._key_sets[memo] = keys
            while len(self._key_sets) > KEY_SETS_KEPT:
                del self._key_sets[next(iter(self._key_sets))]
        return keys


def renamed(
    frame: Any, source: Sequence[str], target: Sequence[str], rest: Sequence[str] = ()
) -> Any:
    """``frame``'s ``source`` columns under ``target`` names (one port's keys as another's),
    then the ``rest``."""
    F = dialect_of(frame).F
    return frame.select(*[F.col(a).alias(b) for a, b in zip(source, target, strict=True)], *rest)


def keys_by_port(circuit: Circuit, node: Node) -> list[tuple[str, ...]]:
    """The columns each input's trace is arranged by (the planner states the rule)."""
    return list(trace_keys(circuit, node))
