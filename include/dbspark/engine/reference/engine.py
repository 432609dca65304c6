"""The reference engine: incremental evaluation in pure Python, the oracle.

It runs a planned circuit one epoch at a time with exactly the semantics the
Spark engine must reproduce, written for clarity rather than speed. Each operator is
evaluated through its definition in ``core/operators`` (the linear ones on the delta,
the general linear one as ``join_function``, the stateful ones per key at each corner
below).

**Linear operators** act on the delta at a time ``t`` and nothing else. The
general linear operator may schedule output at a later epoch (the join of the
input time with the time its logic emits); such output waits in the node's
stream until that epoch runs.

**Stateful operators** (join, distinct, aggregate) are defined by a function
``f`` of their accumulated inputs. Their output at time ``t`` is whatever makes
the accumulated output equal ``f`` of the accumulated input at every time. In
the product order of integer tuples that is the finite difference of
``g(x) = f(inputs accumulated at or before x)`` over the corners of the unit
box below ``t``::

    out(t) = sum over subsets S of the coordinates: (-1)^|S| * g(t - 1_S)

For one coordinate this is ``g(e) - g(e - 1)``; for ``(epoch, iteration)`` it is
the four-corner rule of the DBSP ``distinct_trace`` operator. A key can only
have output at ``t`` if, for every coordinate, it has an update at or before
``t`` that sits exactly on ``t``'s value of that coordinate. That is the set of
keys the engine recomputes, and it includes keys with no input at ``t`` at
all (the first trap in ARCHITECTURE.md, "How operators are incremental").

**Loops** run iterations ``(epoch, 0), (epoch, 1), ...`` of every operator in the
loop. A loop has converged at iteration ``i`` only when every operator's delta
at ``i`` is empty *and* no key touched in this epoch has history from earlier
epochs at a deeper iteration (where a correction may still be due; the
second trap). The loop's output at the epoch is the sum of its result's
deltas over the iterations.

**Compaction**: after an epoch completes, every trace advances its times by the
frontier ``(epoch, 0, ...)``: earlier epochs collapse into one per iteration,
which is all later epochs ever ask about.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dbspark.circuit.builder import STATEFUL_OPS, Circuit, Node
from dbspark.circuit.planner import LoopPlan, Plan, plan
from dbspark.core import operators as ops
from dbspark.core import timestamps
from dbspark.core.antichain import Antichain
from dbspark.core.timestamps import Time
from dbspark.core.trace import Trace
from dbspark.core.upsert import (
    UpsertSpec,
    current_state,
    live_rows,
    state_trace,
    upserts_to_updates,
)
from dbspark.core.zset import ZSet
from dbspark.engine.api import (
    EpochReport,
    EpochResult,
    LoopDidNotConverge,
    LoopReport,
    require_sources,
)
from dbspark.engine.batches import upsert_batch, upsert_spec, zset_batch
from dbspark.engine.reference.compile import (
    compile_expr,
    compile_predicate,
    compile_projection,
    emits_logic,
    group_values,
    join_output,
    key_function,
)

log = logging.getLogger(__name__)

EMPTY = ZSet()


@dataclass
class _Keyed:
    """A stateful operator: per-port key functions and the per-key function ``f``."""

    key_of: list[Callable[[tuple], Hashable]]
    function: Callable[[Hashable, list[ZSet]], ZSet]


class ReferenceEngine:
    """Runs a circuit incrementally, epoch by epoch, entirely in memory."""

    def __init__(self, circuit: Circuit, *, compact: bool = True) -> None:
        self.circuit = circuit
        self.plan: Plan = plan(circuit)
        self.compact = compact
        self.epoch = -1
        # Each node's output stream: time -> delta (future times possible).
        self._streams: dict[int, dict[Time, ZSet]] = defaultdict(dict)
        # Each stateful node's arranged inputs, one trace per port.
        self._arranged: dict[int, list[Trace]] = {}
        self._keyed: dict[int, _Keyed] = {}
        self._linear: dict[int, Callable[[ZSet, Time], None]] = {}
        self._upsert_specs: dict[int, UpsertSpec] = {}
        self._upsert_state: dict[int, Trace] = {}
        self._views: dict[str, ZSet] = {name: EMPTY for name in circuit.views}
        self._loop_reports: list[LoopReport] = []
        # Every epoch's inputs as given, for ``verify`` (the engine is an in-memory oracle).
        self._history: list[dict[str, Any]] = []
        for node in circuit.nodes:
            self._prepare(node)

    # --- public API -------------------------------------------------------------------
    def step(self, inputs: Mapping[str, Any] | None = None) -> EpochResult:
        """Run the next epoch with ``inputs`` (source name -> batch); absent sources are empty."""
        inputs = dict(inputs or {})
        require_sources(self.circuit.name, self.circuit.sources, inputs)
        epoch = self.epoch + 1
        # Check every batch before touching any state, so bad input commits nothing.
        checked = {name: self._check_batch(name, batch) for name, batch in inputs.items()}
        ingested = self._ingest_all(checked, epoch)
        self.epoch = epoch
        self._loop_reports = []
        t: Time = (epoch,)
        for stage in self.plan.stages_in_scope(0):
            for node_id in stage.nodes:
                node = self.circuit.node(node_id)
                if node.op in ("zset_source", "upsert_source"):
                    self._emit(node_id, t, ingested.get(node_id, EMPTY))
                else:
                    self._evaluate(node, t)
        view_deltas = {}
        for name, node_id in self.circuit.views.items():
            delta = self.delta(node_id, t)
            view_deltas[name] = delta
            self._views[name] = self._views[name] + delta
        if self.compact:
            self._compact(epoch)
        self._history.append(inputs)
        return EpochResult(
            epoch, dict(self._views), view_deltas, list(self._loop_reports), EpochReport(epoch)
        )

    @property
    def location(self) -> str:
        return "in memory (reference engine)"

    def last_committed_epoch(self) -> int:
        return self.epoch

    def view(self, name: str) -> ZSet:
        return self._views[name]

    def views(self) -> dict[str, ZSet]:
        return dict(self._views)

    def verify(self) -> dict[str, list[tuple]]:
        """Per view, ``(*row, weight)`` of full refresh minus maintained (empty when equal)."""
        from dbspark.engine.reference.full_refresh import full_refresh

        fresh = full_refresh(self.circuit, self._history)
        return {
            name: [(*row, weight) for row, weight in (fresh[name] - self._views[name]).items()]
            for name in self.circuit.views
        }

    def delta(self, node_id: int, t: Time) -> ZSet:
        return self._streams[node_id].get(t, EMPTY)

    # --- ingestion ----------------------------------------------------------------------
    def _check_batch(self, name: str, batch: Any) -> Any:
        node = self.circuit.node(self.circuit.sources[name])
        if node.op == "zset_source":
            return zset_batch(name, node.schema, batch)
        return upsert_batch(name, node.params["user_schema"], batch)

    def _ingest_all(self, checked: Mapping[str, Any], epoch: int) -> dict[int, ZSet]:
        deltas: dict[int, ZSet] = {}
        # Sources in declaration order, so the first bad batch reported does not depend
        # on the order of the caller's mapping.
        for name in [n for n in self.circuit.sources if n in checked]:
            batch = checked[name]
            node_id = self.circuit.sources[name]
            if self.circuit.node(node_id).op == "zset_source":
                deltas[node_id] = batch
            else:
                spec = self._upsert_specs[node_id]
                state = self._upsert_state[node_id]
                deltas[node_id] = upserts_to_updates(
                    spec, batch, lambda key, s=state: current_state(s, key)
                )
        # Only now, with every batch accepted, does any state change.
        for node_id, delta in deltas.items():
            if node_id in self._upsert_state:
                self._upsert_state[node_id].insert(delta, (epoch,))
        return deltas

    # --- operator set-up ---------------------------------------------------------------------
    def _prepare(self, node: Node) -> None:
        op, params = node.op, node.params
        if op == "upsert_source":
            spec = upsert_spec(node)
            self._upsert_specs[node.id] = spec
            self._upsert_state[node.id] = state_trace(spec)
            return
        if op in STATEFUL_OPS:
            self._keyed[node.id] = self._stateful_function(node)
            self._arranged[node.id] = [Trace(key_of) for key_of in self._keyed[node.id].key_of]
            return
        input_schema = self.circuit.node(node.inputs[0]).schema if node.inputs else None
        if op == "select":
            project = compile_projection(params["columns"], input_schema)
            self._linear[node.id] = self._mapper(node.id, lambda z: ops.map_(project, z))
        elif op == "filter":
            keep = compile_predicate(params["predicate"], input_schema)
            self._linear[node.id] = self._mapper(node.id, lambda z: ops.filter_(keep, z))
        elif op == "flat_map":
            produce = compile_expr(params["array"], input_schema)
            self._linear[node.id] = self._mapper(
                node.id, lambda z: ops.flat_map(lambda r: [(*r, v) for v in produce(r) or ()], z)
            )
        elif op == "join_function":
            self._linear[node.id] = self._general_linear(node, input_schema)
        elif op == "negate":
            self._linear[node.id] = self._mapper(node.id, ops.negate)
        elif op == "upsert_live":
            self._linear[node.id] = self._mapper(node.id, live_rows)
        elif op in ("index_by", "consolidate"):
            self._linear[node.id] = self._mapper(node.id, lambda z: z)
        elif op == "inspect":
            callback = params["callback"]
            label = params["label"]

            def show(z: ZSet, t: Time, node_id: int = node.id) -> None:
                if callback is not None:
                    callback(t, z)
                else:
                    log.info("inspect %s at %s: %s", label, t, z)
                self._emit(node_id, t, z)

            self._linear[node.id] = show

    def _mapper(self, node_id: int, fn: Callable[[ZSet], ZSet]) -> Callable[[ZSet, Time], None]:
        return lambda z, t: self._emit(node_id, t, fn(z))

    def _general_linear(self, node: Node, schema: Any) -> Callable[[ZSet, Time], None]:
        """``core.operators.join_function`` with the node's emits as its logic: an emit
        with an ``epoch`` expression is due at that epoch (``join`` with the input time
        keeps the later one), and waits in the node's stream until it runs."""
        logic = emits_logic(node.params["emits"], schema)

        def run(z: ZSet, t: Time) -> None:
            out: dict[Time, list[tuple[tuple, int]]] = defaultdict(list)
            for row, at, weight in ops.join_function(
                logic, [(r, t, w) for r, w in z.items()]
            ).updates():
                out[at].append((row, weight))
            for at, pairs in out.items():
                self._emit(node.id, at, ZSet(pairs))

        return run

    def _stateful_function(self, node: Node) -> _Keyed:
        circuit = self.circuit
        if node.op == "distinct":
            return _Keyed([lambda row: row], lambda key, accs: ops.distinct(accs[0]))
        if node.op == "aggregate":
            schema = circuit.node(node.inputs[0]).schema
            key_of = key_function(node.params["keys"], schema)
            values = group_values(node.params["aggregations"], schema)

            def aggregate(key: Hashable, accs: list[ZSet]) -> ZSet:
                grouped = ops.aggregate(values, ops.index_with(key_of, accs[0]))
                return ops.map_(lambda row: (*row[0], *row[1]), grouped)

            return _Keyed([key_of], aggregate)
        if node.op == "join":
            left_schema = circuit.node(node.inputs[0]).schema
            right_schema = circuit.node(node.inputs[1]).schema
            left_key = key_function(node.params["left_keys"], left_schema)
            right_key = key_function(node.params["right_keys"], right_schema)
            joined = join_output(node.params["right_values"], right_schema)

            def join(key: Hashable, accs: list[ZSet]) -> ZSet:
                if None in key:  # type: ignore[operator]
                    return EMPTY  # SQL: a NULL key matches nothing
                left, right = accs
                return ops.join_stream(
                    joined, ops.index_with(left_key, left), ops.index_with(right_key, right)
                )

            return _Keyed([left_key, right_key], join)
        raise AssertionError(node.op)

    # --- evaluation ---------------------------------------------------------------------------
    def _emit(self, node_id: int, t: Time, z: ZSet) -> None:
        if not z:
            return
        stream = self._streams[node_id]
        stream[t] = stream.get(t, EMPTY) + z

    def _input(self, node: Node, port: int, t: Time) -> ZSet:
        return self.delta(node.inputs[port], t)

    def _evaluate(self, node: Node, t: Time) -> None:
        op = node.op
        if node.id in self._linear:
            self._linear[node.id](self._input(node, 0, t), t)
        elif op == "constant":
            if t == (0,):  # its rows arrive once, at the first epoch
                self._emit(node.id, t, ZSet(node.params["rows"]))
        elif op == "plus":
            self._emit(node.id, t, ops.plus(self._input(node, 0, t), self._input(node, 1, t)))
        elif op == "minus":
            self._emit(node.id, t, ops.minus(self._input(node, 0, t), self._input(node, 1, t)))
        elif op == "delay":
            if t[-1] > 0:
                self._emit(node.id, t, self._input(node, 0, (*t[:-1], t[-1] - 1)))
        elif op == "enter":
            if t[-1] == 0:
                self._emit(node.id, t, self._input(node, 0, t[:-1]))
        elif op == "variable":
            self._evaluate_variable(node, t)
        elif op == "leave":
            self._evaluate_leave(node, t)
        elif op in STATEFUL_OPS:
            self._evaluate_stateful(node, t)
        else:
            raise AssertionError(f"no evaluation for {op}")

    def _evaluate_variable(self, node: Node, t: Time) -> None:
        initial = self._input(node, 0, t)
        if t[-1] == 0:
            self._emit(node.id, t, initial)
            return
        previous = (*t[:-1], t[-1] - 1)
        fed_back = self.delta(node.params["feedback"], previous) - self._input(node, 0, previous)
        self._emit(node.id, t, fed_back)

    def _evaluate_stateful(self, node: Node, t: Time) -> None:
        keyed = self._keyed[node.id]
        arranged = self._arranged[node.id]
        for port, trace in enumerate(arranged):
            trace.insert(self._input(node, port, t), t)
        out: list[tuple[Any, int]] = []
        corners = timestamps.box_corners(t)
        for key in _candidate_keys(arranged, t):
            for sign, corner in corners:
                accs = [trace.accumulate(corner, keys=[key]) for trace in arranged]
                for row, weight in keyed.function(key, accs).items():
                    out.append((row, sign * weight))
        self._emit(node.id, t, ZSet(out))

    def _evaluate_leave(self, node: Node, t: Time) -> None:
        loop = self.plan.loops[node.params["loop"]]
        self._run_loop(loop, t)
        result = self._streams[loop.result]
        total = EMPTY
        for time, delta in result.items():
            if time[:-1] == t:
                total = total + delta
        self._emit(node.id, t, total)

    def _run_loop(self, loop: LoopPlan, prefix: Time) -> None:
        report = LoopReport(loop.name, prefix)
        stages = [self.plan.stages[s] for s in loop.stages]
        members = [n for stage in stages for n in stage.nodes]
        iteration = 0
        while True:
            if iteration >= loop.max_iterations:
                report.stop_reason = f"hit max_iterations={loop.max_iterations} with work pending"
                self._loop_reports.append(report)
                raise LoopDidNotConverge(
                    f"loop {loop.name!r} did not converge at time {prefix} within "
                    f"{loop.max_iterations} iterations"
                )
            t = (*prefix, iteration)
            for node_id in members:
                self._evaluate(self.circuit.node(node_id), t)
            changed = sum(len(self.delta(n, t)) for n in members)
            report.delta_sizes.append(len(self.delta(loop.result, t)))
            pending = self._pending_depth(loop, prefix)
            if changed == 0 and pending <= iteration:
                report.stop_reason = (
                    f"converged: iteration {iteration} changed nothing and no correction is "
                    f"pending (history reaches iteration {pending})"
                )
                break
            iteration += 1
        self._loop_reports.append(report)

    def _pending_depth(self, loop: LoopPlan, prefix: Time) -> int:
        """The deepest iteration at which this epoch may still owe output (-1 if none)."""
        level = len(prefix)
        deepest = -1
        inside = self.circuit.nodes_within(loop.scope)
        for node_id in inside:
            for time in self._streams[node_id]:
                if time[:level] == prefix:
                    deepest = max(deepest, time[level])
            traces = self._arranged.get(node_id, ())
            # A correction at (prefix, j) needs, for every coordinate of the prefix, an
            # update of the key lying exactly on it, from any port (a join's other side
            # counts), among the updates at or below the prefix.
            keys = {key for trace in traces for key in trace.keys()}  # noqa: SIM118
            for key in keys:
                below = [
                    u_time
                    for trace in traces
                    for _, u_time, _ in trace.updates_for_key(key)
                    if timestamps.less_equal(u_time[:level], prefix)
                ]
                if below and all(any(u[d] == prefix[d] for u in below) for d in range(level)):
                    deepest = max(deepest, max(u[level] for u in below))
        return deepest

    # --- compaction ------------------------------------------------------------------------------
    def _compact(self, epoch: int) -> None:
        for stream in self._streams.values():
            for time in [time for time in stream if time[0] < epoch]:
                del stream[time]
        for node_id, traces in self._arranged.items():
            depth = self.circuit.scope(self.circuit.node(node_id).scope).depth
            frontier = Antichain([(epoch, *([0] * (depth - 1)))])
            for trace in traces:
                trace.compact(frontier)
        for trace in self._upsert_state.values():
            trace.compact(Antichain([(epoch,)]))


def _candidate_keys(arranged: Iterable[Trace], t: Time) -> set[Hashable]:
    """Keys that may have output at ``t``: for every coordinate, an update at or before
    ``t`` lying exactly on ``t``'s value of that coordinate."""
    candidates: set[Hashable] = set()
    traces = list(arranged)
    for trace in traces:
        for key in trace.keys():  # noqa: SIM118 (a Trace, not a dict)
            if key in candidates:
                continue
            times = [
                u
                for tr in traces
                for _, u, _ in tr.updates_for_key(key)
                if timestamps.less_equal(u, t)
            ]
            if all(any(u[d] == t[d] for u in times) for d in range(len(t))):
                candidates.add(key)
    return candidates
