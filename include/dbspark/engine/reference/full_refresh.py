"""Full refresh: every view recomputed from scratch over the accumulated inputs.

Every circuit can be evaluated two ways from one definition,
the incremental plan and a *full refresh*. Users run a full refresh to rebuild
a view (after a bug fix, a lost warehouse, a new view over old data) and to
verify one (compare it with what the incremental engine published); the test
suite uses it as the oracle that the incremental engines must agree with,
epoch after epoch.

To be a trustworthy oracle it shares none of the incremental machinery: no
arranged traces, no deltas, no corner formula, no convergence bookkeeping, no
compaction. It evaluates each operator's *definition*, as ``core/operators`` states
it and the reference engine uses it, on whole collections:

* A Z-set source at epoch ``e`` is the sum of its batches of epochs ``0..e``.
* An upsert source is replayed per key over every row received so far: the row
  with the greatest watermark wins, a winning tombstone deletes the key (the
  source's collection is the state rows, tombstones included and flagged;
  ``upsert_live`` drops them). Bad input raises exactly as ingestion does: the
  batch checks of ``engine.batches``, ``BadUpsertRow`` from the spec's row
  check, and ``UpsertConflict`` when a batch holds two different rows for a key
  at one watermark, or a row that differs from the key's winner so far at that
  winner's watermark.
* Linear operators (select, filter, flat_map, negate, plus, minus, index_by,
  inspect, consolidate, upsert_live) map whole collections. ``inspect`` is a
  pass-through here: its callback sees deltas, which a full refresh has not.
* ``join_function``: each input row contributes each emit whose ``when`` is
  true, weighted by ``weight`` (a NULL or zero weight emits nothing); an emit
  with an ``epoch`` expression is visible at evaluation epoch ``e`` iff its
  value is ``<= e`` (a NULL epoch never arrives). Inside loops the same test
  uses the epoch coordinate.
* ``join`` multiplies weights of rows with equal keys; as in SQL, a key with a
  NULL in it matches nothing, ``distinct`` keeps rows with
  positive weight at weight one, ``aggregate`` has one row per group with any
  row of nonzero weight, computed by ``dbspark.core.aggregates``.
* ``delay`` is the input one tick earlier on its innermost clock: at the root
  the input's collection at epoch ``e - 1`` (empty at epoch 0); inside a loop
  the previous iteration's collection (empty at iteration 0).
* ``iterate`` is the naive fixed point: ``X_0`` is the initial collection,
  ``X_{i+1} = body(X_i)`` on whole collections, until the loop's state repeats
  (the variable and the input of every ``delay`` in the loop); the result is
  the fixed point. At most ``max_iterations`` applications of the body, else
  ``LoopDidNotConverge``. Streams entered from outside are the outer collection
  at every iteration; nested loops are evaluated the same way, per iteration
  of the enclosing loop.

Values are memoized per evaluation by ``(node, time)``, where a time is the
epoch followed by one iteration counter per enclosing loop; that is only a
cache of pure function values, never of deltas.

It is quadratic where the incremental engine is linear, and that is the point:
it is short enough to check by reading.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dbspark.circuit.builder import Circuit, Node, Scope
from dbspark.core import operators as ops
from dbspark.core.upsert import (
    UpsertConflict,
    UpsertSpec,
    conform_rows,
    format_key,
)
from dbspark.core.zset import ZSet
from dbspark.engine.api import LoopDidNotConverge, require_sources
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

__all__ = ["FullRefresh", "full_refresh"]

EMPTY = ZSet()
Time = tuple[int, ...]
History = Sequence[Mapping[str, Any] | None]


def full_refresh(circuit: Circuit, history: History, epoch: int | None = None) -> dict[str, ZSet]:
    """Every view of ``circuit`` as of ``epoch`` (default: the last), from scratch.

    ``history[k]`` maps source names to epoch ``k``'s batch, in the form
    ``ReferenceEngine.step`` accepts; absent sources (or a ``None`` entry) are
    empty. With an empty history and no ``epoch``, every view is empty.
    """
    return FullRefresh(circuit, history).views(epoch)


class FullRefresh:
    """One from-scratch evaluation of a circuit over a recorded input history."""

    def __init__(self, circuit: Circuit, history: History) -> None:
        circuit.validate()
        self.circuit = circuit
        self.history = [dict(batches or {}) for batches in history]
        for index, batches in enumerate(self.history):
            require_sources(circuit.name, circuit.sources, batches, epoch=index)
        self._memo: dict[Time, dict[int, ZSet]] = {}
        self._compiled: dict[int, Any] = {}
        # Per source, its collection after each epoch replayed so far (running sums).
        self._zset_totals: dict[str, list[ZSet]] = {}
        self._upsert_replays: dict[str, list[dict[tuple, tuple]]] = {}

    # --- public API ----------------------------------------------------------------
    def views(self, epoch: int | None = None) -> dict[str, ZSet]:
        """Every view's contents as of ``epoch`` (default: the last epoch of the history)."""
        if epoch is None:
            if not self.history:
                return {name: EMPTY for name in self.circuit.views}
            epoch = len(self.history) - 1
        self._check_epoch(epoch)
        # A delay at the root reads the epoch before; evaluating earlier epochs first
        # keeps the recursion shallow (each one is then a cache hit).
        root_delays = [n for n in self.circuit.nodes if n.op == "delay" and n.scope == 0]
        if root_delays:
            for earlier in range(epoch):
                for node in root_delays:
                    self.collection(node.inputs[0], (earlier,))
        return {
            name: self.collection(node_id, (epoch,)) for name, node_id in self.circuit.views.items()
        }

    def collection(self, node_id: int, time: Time) -> ZSet:
        """What node ``node_id`` holds at ``time``: ``(epoch, iteration per enclosing loop)``.

        Inside a loop any iteration may be asked for, including ones past the
        fixed point (they hold the fixed point's values).
        """
        node = self.circuit.node(node_id)
        depth = self.circuit.scope(node.scope).depth
        time = tuple(time)
        if len(time) != depth or any(c < 0 for c in time):
            raise ValueError(f"{node!r} lives at depth {depth}; cannot ask about time {time}")
        self._check_epoch(time[0])
        at = self._memo.setdefault(time, {})
        if node_id not in at:
            at[node_id] = self._evaluate(node, time)
        return at[node_id]

    # --- operators ------------------------------------------------------------------
    def _evaluate(self, node: Node, t: Time) -> ZSet:
        op = node.op
        if op == "zset_source":
            return self._zset_source(node, t[0])
        if op == "upsert_source":
            return self._upsert_source(node, t[0])
        if op == "constant":
            return ZSet(node.params["rows"])
        if op == "enter":
            return self.collection(node.inputs[0], t[:-1])
        if op == "variable":
            if t[-1] == 0:
                return self.collection(node.inputs[0], t)
            return self.collection(node.params["feedback"], (*t[:-1], t[-1] - 1))
        if op == "leave":
            return self._fixed_point(self.circuit.scope(node.params["loop"]), t)
        if op == "delay":
            if t[-1] == 0:
                return EMPTY
            return self.collection(node.inputs[0], (*t[:-1], t[-1] - 1))
        inputs = [self.collection(i, t) for i in node.inputs]
        if op in ("index_by", "consolidate", "inspect"):
            return inputs[0]
        if op == "plus":
            return ops.plus(inputs[0], inputs[1])
        if op == "minus":
            return ops.minus(inputs[0], inputs[1])
        if op == "negate":
            return ops.negate(inputs[0])
        if op == "upsert_live":
            return ZSet((row[:-1], w) for row, w in inputs[0].items() if row[-1] is False)
        if op == "select":
            return ops.map_(self._compile(node), inputs[0])
        if op == "filter":
            return ops.filter_(self._compile(node), inputs[0])
        if op == "flat_map":
            produce = self._compile(node)
            return ops.flat_map(lambda row: [(*row, v) for v in produce(row) or ()], inputs[0])
        if op == "join_function":
            return self._join_function(node, inputs[0], t[0])
        if op == "join":
            return self._join(node, *inputs)
        if op == "distinct":
            return ops.distinct(inputs[0])
        if op == "aggregate":
            return self._aggregate(node, inputs[0])
        raise AssertionError(f"full refresh has no definition for {op!r}")

    def _compile(self, node: Node) -> Any:
        if node.id not in self._compiled:
            schema = self.circuit.node(node.inputs[0]).schema
            params = node.params
            compiled: Any
            if node.op == "select":
                compiled = compile_projection(params["columns"], schema)
            elif node.op == "filter":
                compiled = compile_predicate(params["predicate"], schema)
            elif node.op == "flat_map":
                compiled = compile_expr(params["array"], schema)
            elif node.op == "join_function":
                compiled = emits_logic(params["emits"], schema)
            elif node.op == "aggregate":
                compiled = (
                    key_function(params["keys"], schema),
                    group_values(params["aggregations"], schema),
                )
            else:
                raise AssertionError(node.op)
            self._compiled[node.id] = compiled
        return self._compiled[node.id]

    def _join_function(self, node: Node, rows: ZSet, epoch: int) -> ZSet:
        """Every row's emits, each visible from the epoch it names (from the start when
        it names none): the general linear operator over rows present since epoch 0,
        summed up to ``epoch``."""
        since_start = [(row, (0,), weight) for row, weight in rows.items()]
        emitted = ops.join_function(self._compile(node), since_start)
        out: dict[tuple, int] = {}
        for row, (visible_from, *_), weight in emitted.updates():
            if visible_from <= epoch:
                out[row] = out.get(row, 0) + weight
        return ZSet(out)

    def _join(self, node: Node, left: ZSet, right: ZSet) -> ZSet:
        left_schema = self.circuit.node(node.inputs[0]).schema
        right_schema = self.circuit.node(node.inputs[1]).schema
        right_key = key_function(node.params["right_keys"], right_schema)
        # SQL: NULL = NULL is not true, so a key with a NULL never joins.
        joinable = ops.filter_(lambda row: None not in right_key(row), right)
        return ops.join_stream(
            join_output(node.params["right_values"], right_schema),
            ops.index_with(key_function(node.params["left_keys"], left_schema), left),
            ops.index_with(right_key, joinable),
        )

    def _aggregate(self, node: Node, rows: ZSet) -> ZSet:
        key_of, values = self._compile(node)
        grouped = ops.aggregate(values, ops.index_with(key_of, rows))
        return ops.map_(lambda row: (*row[0], *row[1]), grouped)

    # --- recursion ------------------------------------------------------------------
    def _fixed_point(self, scope: Scope, prefix: Time) -> ZSet:
        assert scope.variable is not None and scope.result is not None
        delays = [n for n in self.circuit.nodes if n.scope == scope.id and n.op == "delay"]
        for i in range(scope.max_iterations):
            t = (*prefix, i)
            result = self.collection(scope.result, t)  # X_{i+1} = body(X_i)
            settled = result == self.collection(scope.variable, t) and all(
                self.collection(d.inputs[0], t) == self.collection(d.id, t) for d in delays
            )
            self._forget(prefix, below=i)  # iteration i + 1 reads only iteration i
            if settled:
                self._forget(prefix, below=i + 1)
                return result
        raise LoopDidNotConverge(
            f"full refresh: loop {scope.name!r} did not reach a fixed point at time {prefix} "
            f"within {scope.max_iterations} iterations"
        )

    def _forget(self, prefix: Time, below: int) -> None:
        """Drop cached values of iterations ``< below`` of the loop running at ``prefix``."""
        level = len(prefix)
        for time in [
            time
            for time in self._memo
            if len(time) > level and time[:level] == prefix and time[level] < below
        ]:
            del self._memo[time]

    # --- sources --------------------------------------------------------------------
    def _check_epoch(self, epoch: int) -> None:
        if not 0 <= epoch < len(self.history):
            raise ValueError(
                f"epoch {epoch} is outside the history (epochs 0..{len(self.history) - 1})"
            )

    def _zset_source(self, node: Node, epoch: int) -> ZSet:
        """The sum of the source's batches of epochs ``0..epoch`` (a running sum, cached)."""
        totals = self._zset_totals.setdefault(node.label, [])
        while len(totals) <= epoch:
            batch = self.history[len(totals)].get(node.label)
            checked = EMPTY if batch is None else zset_batch(node.label, node.schema, batch)
            totals.append((totals[-1] if totals else EMPTY) + checked)
        return totals[epoch]

    def _upsert_source(self, node: Node, epoch: int) -> ZSet:
        """The winning row of every key over the rows of epochs ``0..epoch``, flagged."""
        spec = upsert_spec(node)
        replay = self._upsert_replays.setdefault(node.label, [])
        while len(replay) <= epoch:
            # winners: key -> the freshest row received up to this epoch.
            winners = dict(replay[-1]) if replay else {}
            batch = self.history[len(replay)].get(node.label)
            if batch is not None:
                user = node.params["user_schema"]
                rows = conform_rows(spec, upsert_batch(node.label, user, batch))
                _check_conflicts(spec, rows, winners)
                for row in rows:
                    key = spec.key_of(row)
                    best = winners.get(key)
                    if best is None or spec.watermark_of(row) > spec.watermark_of(best):
                        winners[key] = row
            replay.append(winners)
        return ZSet(((*row, spec.is_tombstone(row)), 1) for row in replay[epoch].values())


def _check_conflicts(spec: UpsertSpec, rows: list[tuple], winners: Mapping[tuple, tuple]) -> None:
    """Raise ``UpsertConflict`` for two different rows of one key at one watermark.

    The rows compared are the batch's rows and the key's winner before the
    batch (a stale row below the winner is not compared with anything older).
    """
    seen: dict[tuple, dict[tuple, tuple]] = {}
    conflicts: list[tuple] = []
    reports: list[str] = []
    for row in rows:
        key = spec.key_of(row)
        at_watermark = seen.setdefault(key, {})
        if not at_watermark and key in winners:
            best = winners[key]
            at_watermark[spec.watermark_of(best)] = best
        wm = spec.watermark_of(row)
        other = at_watermark.setdefault(wm, row)
        if other != row and key not in conflicts:
            conflicts.append(key)
            reports.append(
                f"key {format_key(key, spec.key)}: watermark {spec.watermark_values(row)!r} "
                f"carried by {other!r}, {row!r}"
            )
    if conflicts:
        detail = f"{len(conflicts)} key(s) with different rows at an equal watermark: " + "; ".join(
            reports
        )
        raise UpsertConflict(spec.source, None, conflicts, detail, (), spec.key)
