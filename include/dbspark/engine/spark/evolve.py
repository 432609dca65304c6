"""Evolving a circuit in place: a new definition takes over its warehouse's state.

When a circuit's definition changes, the views added or changed are rebuilt from the
raw input log and everything else continues incrementally (issue 16). State is stored
by node id (``storage/collection_names.py``), and ids shift when nodes are added or
removed, so the new definition's nodes are first matched to the old ones by what they
compute (``circuit/evolution.py``, ``map_nodes``):

- a **kept** node (same fingerprint: same operator, parameters and inputs, at any
  distance) keeps its state: its collections are renamed to its new id;
- a **fresh** node (new, or reading something that changed) at the root clock gets its
  state from a full refresh of the kept input logs as of the last committed epoch: a
  join's, distinct's or aggregate's arranged inputs are the accumulated values of its
  inputs, one batch each at ``(epoch,)``; a new or changed view's published collection
  is its accumulated value (as ``rebuild`` writes it);
- a fresh root-level ``delay`` reads its input's change at the last epoch in the next
  one: where that change is not stored (a new input, or a stream delta compaction
  retired), it is written from full refreshes at that epoch and the one before
  (``_seed_delays``), which the raw input logs must still hold;
- a fresh root-level ``join_function`` holds its emits over its input as of that epoch
  that are due later, each at its epoch (``_seed_scheduled``);
- a loop with a fresh node in it (``loops_to_rebuild``) is rebuilt whole, all of its
  nodes fresh: its stateful nodes' arranged inputs are the full refresh's iteration at
  that epoch, the change of each input from one iteration to the next (in every
  iteration coordinate, nested), one batch per iteration at ``(epoch, i, ...)``, and
  a ``join_function``'s rows due at a later epoch ``e`` are its emits over those same
  changes, held at ``(e, i, ...)`` (``_seed_loop``);
- a **retired** old node's state, and the removed and changed views', is superseded
  (garbage collection deletes it later).

All of it is one catalog transaction with the new fingerprint (``Catalog.evolve_circuit``),
refused while an epoch is open, and recorded as the commit ``evolve:<fingerprint>`` at
the last committed epoch. Not evolved in place (refused, saying why): a source whose
definition changed (its stored state or log means something else), or a new ``delay``
once the raw input logs were merged past the epoch before the last.

The published outputs (change feeds, tables) of the views added or changed take the
rebuild's correction, and the removed views' are retired, where the orchestration runs
the evolution (``orchestration/units.py``, ``EvolveUnit``).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import reduce
from typing import TYPE_CHECKING, Any

from dbspark.circuit.builder import STATEFUL_OPS, Node
from dbspark.circuit.evolution import (
    Evolution,
    evolution_obstacles,
    loops_to_rebuild,
    map_nodes,
    rebuilt_whole,
)
from dbspark.circuit.planner import trace_keys
from dbspark.engine.kernels import consolidate, minus, negate
from dbspark.engine.spark.compile import struct_type
from dbspark.storage import collection_names as coll
from dbspark.storage.catalog import BatchRecord, CatalogError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from dbspark.engine.circuits import CircuitChangedError

log = logging.getLogger("dbspark.engine")


@dataclass
class EvolutionReport:
    """What an evolution in place did: ``evolution`` says which views were added,
    changed, removed or kept; ``epoch`` is the last committed epoch it rebuilt as of
    (-1: none yet); ``kept_nodes`` / ``fresh_nodes`` count the new definition's nodes by
    where their state came from; ``seeded`` is each rebuilt collection's rows;
    ``committed`` is False when another process had evolved the circuit first."""

    circuit: str
    fingerprint: str
    epoch: int
    evolution: Evolution
    kept_nodes: int
    fresh_nodes: int
    renamed: int
    seeded: dict[str, int] = field(default_factory=dict)
    committed: bool = True

    @property
    def rebuilt_views(self) -> list[str]:
        return sorted([*self.evolution.added, *self.evolution.changed])

    def describe(self) -> str:
        seeded = ", ".join(f"{name} {rows} rows" for name, rows in sorted(self.seeded.items()))
        return (
            f"circuit {self.circuit!r} evolved in place at epoch {self.epoch} "
            f"(definition {self.fingerprint}): "
            + self.evolution.describe().replace("\n", "; ")
            + f"; {self.kept_nodes} nodes kept their state ({self.renamed} collections "
            f"renamed), {self.fresh_nodes} new or changed"
            + (f"; rebuilt from the raw input log: {seeded}" if seeded else "")
            + ("" if self.committed else " (by another process first)")
        )


class Evolve:
    """Evolution in place, mixed into ``SparkEngine``."""

    def _evolve(self, changed: CircuitChangedError) -> EvolutionReport:
        from dbspark.engine.circuits import (
            mark_evolving,
            register,
            unmark_evolving,
        )

        evolution = changed.evolution
        kept = changed.kept or {}
        mapping = map_nodes(kept, self.circuit)
        obstacles = evolution_obstacles(evolution, mapping)
        if obstacles or mapping is None or changed.stored is None:
            raise self._refused(changed, obstacles) from None
        loops = loops_to_rebuild(mapping, self.circuit)
        mapping = rebuilt_whole(mapping, self.circuit)
        name = self.circuit.name
        epoch = self.last_committed_epoch()
        delays = [
            node
            for node in (self.circuit.node(i) for i in mapping.fresh)
            if node.op == "delay" and node.scope == 0
        ]
        first = self.replayable_from(stored_as=mapping.kept) if delays and epoch >= 0 else 0
        if epoch < first:
            obstacle = (
                f"node {delays[0].label!r} (delay) is new: at epoch {epoch + 1} it reads "
                f"its input's change at epoch {epoch}, which needs the sources as of epoch "
                f"{epoch - 1}, but the raw input logs were merged so that a full refresh "
                f"can start at epoch {first} only"
            )
            raise self._refused(changed, [obstacle]) from None
        renames: dict[str, str] = {}
        retire: list[str] = []
        old_to_new = {old: new for new, old in mapping.kept.items()}
        for collection in sorted(self.catalog.all_collections(name)):
            parsed = coll.parse(collection)
            if parsed is None or parsed.node is None:
                continue
            if parsed.node in old_to_new:
                new_id = old_to_new[parsed.node]
                if new_id != parsed.node:
                    renames[collection] = coll.renumbered(collection, new_id)
            else:
                retire.append(collection)
        replaced = [coll.view(view) for view in [*evolution.removed, *evolution.changed]]
        supersede = [b.id for b in self.catalog.live_batches(name, retire + replaced) if b.id]
        retire += [coll.view(view) for view in evolution.removed]
        written: list[BatchRecord] = []
        seeded: dict[str, int] = {}
        if epoch >= 0:
            written, seeded = self._seed(
                mapping.kept, mapping.fresh, loops, delays, evolution, epoch
            )
        fingerprint = str(changed.fingerprint)
        try:
            mark_evolving(self.root, self.circuit, fingerprint, kept, epoch)
            committed = self.catalog.evolve_circuit(
                name,
                old_fingerprint=changed.stored,
                new_fingerprint=fingerprint,
                stage=coll.evolve_stage(fingerprint),
                epoch=max(epoch, 0),
                renames=renames,
                new_batches=written,
                supersede=supersede,
                retire=retire,
            )
        except CatalogError:  # refused and rolled back: the files are nobody's
            unmark_evolving(self.root, self.circuit, fingerprint)
            for record in written:
                self.warehouse.delete(record)
            raise
        # Any other error (a lost connection: did it commit?) leaves the files to garbage
        # collection, which deletes them only if the catalog does not name them.
        if committed:
            register(self.catalog, self.root, self.circuit)  # the new signature, and note
        else:  # another process evolved it first, with files of its own
            for record in written:
                self.warehouse.delete(record)
        report = EvolutionReport(
            name,
            fingerprint,
            epoch,
            evolution,
            kept_nodes=len(mapping.kept),
            fresh_nodes=len(mapping.fresh),
            renamed=len(renames),
            seeded=seeded if committed else {},
            committed=committed,
        )
        log.info("%s", report.describe())
        return report

    def _refused(self, changed: CircuitChangedError, obstacles: list[str]) -> CircuitChangedError:
        """The error that refuses ``changed``'s evolution in place, saying why."""
        from dbspark.engine.circuits import CircuitChangedError

        return CircuitChangedError(
            f"{changed.evolution.refusal(obstacles)}\n(circuit {self.circuit.name!r}: "
            f"fingerprint {changed.fingerprint}, the warehouse's {changed.stored})",
            changed.evolution,
            kept=changed.kept,
            stored=changed.stored,
            fingerprint=changed.fingerprint,
        )

    def _seed(
        self,
        kept: dict[int, int],
        fresh: list[int],
        loops: list[int],
        delays: list[Node],
        evolution: Evolution,
        epoch: int,
    ) -> tuple[list[BatchRecord], dict[str, int]]:
        """The fresh nodes' traces and the new or changed views' collections, written (not
        committed) from a full refresh at ``epoch`` of the input logs the kept sources
        hold under their old ids; ``loops`` (scope ids) are rebuilt one iteration at a
        time (``_seed_loop``), the inputs of fresh root-level ``delays`` given their
        change at ``epoch`` (``_seed_delays``)."""
        from dbspark.engine.spark.full_refresh import Refresh

        wanted = [
            node
            for node in (self.circuit.node(i) for i in fresh)
            if node.op in STATEFUL_OPS and node.scope == 0
        ]
        views = [*evolution.added, *evolution.changed]
        if not wanted and not views and not loops and not delays:
            return [], {}
        refresh = Refresh(
            self.spark, self.circuit, self._old_input_frames(kept, epoch), checkpoint=True
        )
        written: list[BatchRecord] = []
        seeded: dict[str, int] = {}

        def write(
            collection: str,
            frame: DataFrame,
            bucket_by: list[str] | None,
            at: tuple[int, ...],
            kind: str = "trace",
        ) -> None:
            record = self.traces.write(collection, frame, at, bucket_by=bucket_by, kind=kind)
            seeded[collection] = seeded.get(collection, 0) + (record.rows if record else 0)
            if record is not None:
                written.append(record)

        try:
            for node in wanted:
                for port, keys in enumerate(trace_keys(self.circuit, node)):
                    source = self.circuit.node(node.inputs[port])
                    value = consolidate(refresh.value(source.id, (epoch,)), source.schema.names)
                    write(coll.arranged(node.id, port), value, list(keys), (epoch,))
            for loop in loops:
                self._seed_loop(refresh, loop, epoch, write)
            self._seed_delays(refresh, delays, kept, epoch, write)
            self._seed_scheduled(refresh, fresh, epoch, write)
            for view in views:
                node = self.circuit.node(self.circuit.views[view])
                value = consolidate(refresh.value(node.id, (epoch,)), node.schema.names)
                write(coll.view(view), value, None, (epoch,))
        except BaseException:
            for record in written:
                self.warehouse.delete(record)
            raise
        return written, seeded

    def _seed_delays(
        self,
        refresh: Any,
        delays: list[Node],
        kept: dict[int, int],
        epoch: int,
        write: Callable[..., None],
    ) -> None:
        """The change at ``epoch`` of each fresh root-level delay's input, which the delay
        puts out at the next epoch: the input's stored delta when it is kept and that
        delta is still live, else its full refresh at ``epoch`` minus the one at
        ``epoch - 1`` (empty before epoch 0), written as its delta at ``(epoch,)``."""
        done: set[int] = set()
        for delay in delays:
            source = self.circuit.node(delay.inputs[0])
            if source.id in done:
                continue
            done.add(source.id)
            old = kept.get(source.id)
            stored = old is not None and self.catalog.batches(
                self.circuit.name, coll.delta(old), time=(epoch,), kind="delta"
            )
            if stored:
                continue
            names = source.schema.names
            now = refresh.value(source.id, (epoch,))
            before = refresh.value(source.id, (epoch - 1,))
            change = consolidate(minus(now, before), names)
            write(coll.delta(source.id), change, None, (epoch,), "delta")

    def _seed_scheduled(
        self, refresh: Any, fresh: list[int], epoch: int, write: Callable[..., None]
    ) -> None:
        """The rows each fresh root-level ``join_function`` holds for epochs after
        ``epoch``: its emits over its input as of ``epoch``, those due later
        (``_hold_due_later``). (A row that came at epoch ``e`` is due at ``max(e, its
        emit's epoch)``, so one due after ``epoch`` is due at its emit's epoch, whenever
        it came: the emits of the input's sum are the sum of theirs.)"""
        for node in (self.circuit.node(i) for i in fresh):
            if node.op != "join_function" or node.scope != 0:
                continue
            value = refresh.value(node.inputs[0], (epoch,))
            self._hold_due_later(refresh, node, value, epoch, (), write)

    def _hold_due_later(
        self,
        refresh: Any,
        node: Node,
        rows: DataFrame,
        epoch: int,
        index: tuple[int, ...],
        write: Callable[..., None],
    ) -> None:
        """``node``'s (a ``join_function``'s) emits over ``rows`` that are due after
        ``epoch``, written to its scheduled collection at ``(due, *index)``, the time at
        which it puts them out (``index``: the iteration coordinates, in a loop)."""
        from pyspark.sql import functions as F

        from dbspark.core.columns import EPOCH
        from dbspark.engine.kernels import general_linear

        source = self.circuit.node(node.inputs[0])
        out = refresh.materialize(
            general_linear(rows, node.params["emits"], source.schema, node.schema, epoch)
        )
        later = out.where(F.col(EPOCH) > epoch)
        for (due,) in sorted(later.select(EPOCH).distinct().collect()):
            part = later.where(F.col(EPOCH) == due).drop(EPOCH)
            write(coll.scheduled(node.id), part, None, (int(due), *index), "delta")

    def _seed_loop(
        self,
        refresh: Any,
        loop: int,
        epoch: int,
        write: Callable[..., None],
    ) -> None:
        """A loop's stateful nodes' traces, as if every epoch up to ``epoch`` had been
        one. A node ``k`` loops deep keeps, at ``(epoch, i1, ..., ik)``, its input's
        difference in every iteration coordinate: at depth 1 the change from iteration
        ``i - 1`` to ``i``, nested ``V(i, j) - V(i-1, j) - V(i, j-1) + V(i-1, j-1)``, and so
        on, from the full refresh's own iterates (``_iterates``). That is the trace the
        loop keeps, its times advanced to ``epoch``: an epoch after it only reads a trace
        summed up to its own iteration, over every earlier epoch (compaction does the
        same), so the epochs' split is not needed.

        A ``join_function`` in the loop holds, for a later epoch ``e``, its emits due at
        ``e`` over its input's changes at each iteration coordinate of every epoch up to
        ``epoch``: by linearity, its emits over the sum of those changes, which is that
        same difference, so they are held at ``(e, i1, ..., ik)`` (``_hold_due_later``)."""
        values: dict[tuple[int, int], dict[tuple[int, ...], DataFrame]] = {}
        last: dict[tuple[int, tuple[int, ...]], int] = {}
        self._iterates(refresh, loop, (epoch,), values, last)
        for (node_id, port), by_index in values.items():
            node = self.circuit.node(node_id)
            names = self.circuit.node(node.inputs[port]).schema.names
            scheduling = node.op == "join_function"
            keys = [] if scheduling else list(trace_keys(self.circuit, node)[port])
            scopes = self._enclosing_loops(node)

            for index in _index_span(by_index, scopes, last, epoch):
                terms = []
                for corner in itertools.product((0, 1), repeat=len(index)):
                    shifted = tuple(i - c for i, c in zip(index, corner, strict=True))
                    value = _iterate_at(by_index, scopes, last, epoch, shifted)
                    if value is not None:
                        terms.append(value if sum(corner) % 2 == 0 else negate(value))
                change = consolidate(reduce(lambda a, b: a.unionByName(b), terms), names)
                if scheduling:
                    self._hold_due_later(refresh, node, change, epoch, index, write)
                else:
                    write(coll.arranged(node_id, port), change, keys, (epoch, *index))

    def _iterates(
        self,
        refresh: Any,
        loop: int,
        prefix: tuple[int, ...],
        values: dict[tuple[int, int], dict[tuple[int, ...], DataFrame]],
        last: dict[tuple[int, tuple[int, ...]], int],
    ) -> DataFrame:
        """Run ``loop`` at ``prefix`` as the full refresh does, keeping the input of each
        stateful node and ``join_function`` at every iteration (``values``, by iteration
        coordinates after the epoch) and each loop's last iteration at each prefix
        (``last``). A loop nested in
        it runs to its fixed point inside each iteration, before the nodes that read it,
        and its result is handed to the refresh so that it is not iterated twice.
        Returns the loop's fixed point."""
        from dbspark.engine.spark.full_refresh import iterate

        scope = self.circuit.scope(loop)
        inner = [s.id for s in self.circuit.scopes if s.parent == loop]
        recorded = [
            (node, port)
            for node in self.circuit.nodes
            if node.scope == loop and node.op in STATEFUL_OPS
            for port in range(len(trace_keys(self.circuit, node)))
        ]
        recorded += [
            (node, 0)
            for node in self.circuit.nodes
            if node.scope == loop and node.op == "join_function"
        ]
        iterates = iterate(refresh, scope, prefix)
        while True:
            try:
                iteration = next(iterates)
            except StopIteration as done:
                return done.value
            t = (*prefix, iteration)
            last[(loop, prefix)] = iteration
            for child in inner:
                fixed_point = self._iterates(refresh, child, t, values, last)
                refresh.memo[(self.circuit.scope(child).output, t)] = fixed_point
            for node, port in recorded:
                names = self.circuit.node(node.inputs[port]).schema.names
                value = refresh.materialize(consolidate(refresh.value(node.inputs[port], t), names))
                values.setdefault((node.id, port), {})[t[1:]] = value

    def _enclosing_loops(self, node: Node) -> list[int]:
        """The loops around ``node``, outermost first."""
        scopes = []
        scope = self.circuit.scope(node.scope)
        while scope.parent is not None:
            scopes.append(scope.id)
            scope = self.circuit.scope(scope.parent)
        return scopes[::-1]

    def _old_input_frames(self, kept: dict[int, int], epoch: int) -> dict[str, Any]:
        """Each source's raw input log through ``epoch`` as full refresh reads it, from the
        collection its kept node has under its old id (a source added has none)."""
        frames = {}
        for source, node_id in self.circuit.sources.items():
            user, extra = self._input_log_fields(self.circuit.node(node_id))
            schema = struct_type(user, extra=extra)
            old = kept.get(node_id)
            records = (
                []
                if old is None
                else self.catalog.batches(self.circuit.name, coll.input_log(old), max_epoch=epoch)
            )
            frames[source] = (
                self.warehouse.read(self.spark, records, schema)
                if records
                else self.spark.createDataFrame([], schema)
            )
        return frames


def _iterate_at(
    by_index: dict[tuple[int, ...], Any],
    scopes: list[int],
    last: dict[tuple[int, tuple[int, ...]], int],
    epoch: int,
    index: tuple[int, ...],
) -> Any:
    """A node's input at iteration coordinates ``index`` (``by_index``), an inner
    coordinate past its loop's fixed point at that prefix taken at the fixed point;
    None before iteration 0."""
    if min(index) < 0:
        return None
    clamped = list(index)
    for depth in range(1, len(index)):
        top = last[(scopes[depth], (epoch, *clamped[:depth]))]
        clamped[depth] = min(clamped[depth], top)
    return by_index[tuple(clamped)]


def _index_span(
    by_index: dict[tuple[int, ...], Any],
    scopes: list[int],
    last: dict[tuple[int, tuple[int, ...]], int],
    epoch: int,
) -> list[tuple[int, ...]]:
    """The iteration coordinates at which a nested node's differences may be non-zero:
    every coordinate its iterates were computed at, and an inner coordinate past its
    loop's fixed point at one prefix up to the fixed point at the prefix one outer
    iteration earlier (where the earlier iterate still changes)."""
    span = set(by_index)
    for index in by_index:
        for depth in range(1, len(index)):
            outer = list(index[:depth])
            if outer[-1] == 0:
                continue
            outer[-1] -= 1
            before = last.get((scopes[depth], (epoch, *outer)))
            if before is not None and before > index[depth]:
                for extra in range(index[depth] + 1, before + 1):
                    span.add((*index[:depth], extra, *index[depth + 1 :]))
    return sorted(span)
