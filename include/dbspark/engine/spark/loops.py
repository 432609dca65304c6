"""Loops: a recursive subcircuit iterated to its fixed point, one unit per iteration.

An iteration runs the loop's stages at time ``(prefix..., i)`` and commits with a loop
record (delta rows, pending depth, reason). The loop has converged when an iteration
changed nothing and no stateful operator in it can still owe a correction deeper than
that iteration: the bound comes from the batches' times and Parquet footers first, and
only a node whose bound is too deep is judged exactly from its trace. A loop nested in
a loop runs inside the enclosing iteration's unit.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import reduce
from typing import Any

from dbspark.circuit.builder import STATEFUL_OPS, Node
from dbspark.circuit.planner import LoopPlan
from dbspark.core.columns import time_columns
from dbspark.core.timestamps import Time
from dbspark.engine import kernels as ops
from dbspark.engine.api import (
    IterationReport,
    LoopDidNotConverge,
    UnitReport,
)
from dbspark.engine.dialect import dialect_of
from dbspark.engine.epoch_units import loop_inputs
from dbspark.engine.kernels import consolidate
from dbspark.engine.spark.evaluate import keys_by_port, renamed
from dbspark.engine.spark.unit import Frame, Unit
from dbspark.storage import collection_names as coll
from dbspark.storage.catalog import LoopIteration
from dbspark.storage.driver_plans import one_job

log = logging.getLogger("dbspark.engine")


class Loops:
    """Loop iteration, mixed into ``SparkEngine``."""

    def _leave(self, node: Node, t: Time, unit: Unit, report: UnitReport) -> Frame:
        loop = self.plan.loops[node.params["loop"]]
        if len(t) > 1:
            # A loop nested in a loop runs inside the enclosing iteration's unit of work.
            self._iterate_inline(loop, t, unit)
        level = len(t)
        records = unit.batches(coll.delta(loop.result), "delta", lambda time: time[:level] == t)
        if not records:
            return None
        result_node = self.circuit.node(loop.result)
        total = unit.tier.read(records, self._fields(result_node))
        return consolidate(total, list(node.schema.names))

    def run_loop(self, loop: LoopPlan, prefix: Time) -> list[IterationReport]:
        """Iterate ``loop`` at ``prefix`` until it converges; each iteration commits on its own."""
        reports = []
        while True:
            report = self.run_iteration(loop, prefix)
            reports.append(report)
            if report.converged:
                return reports

    def loop_state(self, loop: LoopPlan, prefix: Time) -> tuple[int, bool, str]:
        """(next iteration to run, converged?, reason) from the catalog."""
        done = self.catalog.loop_iterations(self.circuit.name, loop.name, prefix)
        if not done:
            return 0, False, ""
        last = done[-1]
        return last.iteration + 1, last.converged, last.reason

    def run_iteration(self, loop: LoopPlan, prefix: Time) -> IterationReport:
        """Run the next pending iteration of ``loop`` at ``prefix`` (the catalog orders them)."""
        iteration, converged, reason = self.loop_state(loop, prefix)
        if converged:
            return IterationReport(
                loop.name, prefix, iteration - 1, 0, -1, True, reason, skipped=True
            )
        if iteration >= loop.max_iterations:
            raise LoopDidNotConverge(
                f"loop {loop.name!r} of circuit {self.circuit.name!r} did not converge at "
                f"{list(prefix)} within max_iterations={loop.max_iterations}"
            )
        if iteration == 0:  # later iterations follow one that found its inputs committed
            self.require_inputs(f"loop {loop.name}", prefix[0], loop_inputs(self.plan, loop))
        unit = self._epoch_unit(prefix[0])
        t = (*prefix, iteration)
        report = self._iteration(loop, t, unit)
        unit.commit(
            f"loop:{loop.name}",
            t,
            loop_iteration=LoopIteration(
                loop=loop.name,
                prefix=tuple(prefix),
                iteration=iteration,
                delta_rows=report.delta_rows,
                converged=report.converged,
                pending_depth=report.pending_depth,
                reason=report.reason,
            ),
        )
        log.info(
            "loop %s at %s iteration %s: delta %s rows; %s",
            loop.name,
            list(prefix),
            iteration,
            report.delta_rows,
            report.reason,
        )
        return report

    def _iteration(self, loop: LoopPlan, t: Time, unit: Unit) -> IterationReport:
        prefix, iteration = t[:-1], t[-1]
        frames: dict[tuple[int, Time], Frame] = {}
        inner_report = UnitReport(f"loop:{loop.name}", t)
        before = len(unit.records)
        for stage_id in loop.stages:
            stage = self.plan.stages[stage_id]
            self._finish_stage(stage, t, frames, unit, inner_report, start=0, commit=False)
        written = unit.records[before:]
        # What changed at t: the stored deltas and the stateful operators' arranged inputs
        # (every other delta in the iteration ends in one of those or has no effect).
        changed = sum(r.rows for r in written if tuple(r.time) == t)
        result_rows = inner_report.rows_out.get(self.circuit.node(loop.result).label, 0)
        pending = -1 if changed else self._pending_depth(loop, prefix, unit, iteration)
        converged = changed == 0 and pending <= iteration
        if converged:
            reason = (
                f"converged: iteration {iteration} changed nothing and no correction is pending"
                f" (history of the touched keys reaches iteration {pending} at most)"
            )
        elif changed:
            reason = f"continue: iteration {iteration} changed {changed} rows"
        else:
            reason = f"continue: corrections pending up to iteration {pending}"
        return IterationReport(
            loop.name, prefix, iteration, result_rows, pending, converged, reason
        )

    def _iterate_inline(self, loop: LoopPlan, prefix: Time, unit: Unit) -> None:
        for iteration in range(loop.max_iterations):
            if self._iteration(loop, (*prefix, iteration), unit).converged:
                return
        raise LoopDidNotConverge(
            f"loop {loop.name!r} did not converge at {list(prefix)} within {loop.max_iterations}"
        )

    def _pending_depth(self, loop: LoopPlan, prefix: Time, unit: Unit, iteration: int) -> int:
        """The deepest iteration at which this prefix may still owe output (-1: none), as
        far as it decides whether ``iteration`` is the last: exact when it is deeper than
        ``iteration``, otherwise possibly an upper bound.

        A stateful node's bound comes from its batches alone (their times and the time
        columns' maxima in their Parquet footers), with no Spark job; only a node whose
        bound goes deeper than ``iteration`` is judged exactly (``_deepest_pending``)."""
        level = len(prefix)
        deepest = -1
        exact: list[Any] = []  # per node judged exactly, its deepest pending coordinate
        inside = self.circuit.nodes_within(loop.scope)
        for node_id in inside:
            node = self.circuit.node(node_id)
            for record in unit.batches(
                coll.scheduled(node_id), "delta", lambda time: time[:level] == prefix
            ):
                deepest = max(deepest, record.time[level])
            if node.op not in STATEFUL_OPS:
                continue
            port_keys = keys_by_port(self.circuit, node)
            depth = self.circuit.scope(node.scope).depth
            names = time_columns(depth)
            bound = self._pending_bound(node, prefix, unit, names[level])
            if bound is not None and bound <= iteration:
                deepest = max(deepest, bound)
                continue
            schemas = [self._fields(self.circuit.node(i), depth) for i in node.inputs]
            frame = self._deepest_pending(node, prefix, unit, port_keys, names, schemas)
            if frame is not None:
                exact.append(frame)
        if exact:
            # The nodes' queries as one: one Spark job, however many nodes it judges.
            F = dialect_of(exact[0]).F
            both = reduce(lambda a, b: a.unionByName(b), exact)
            small = unit.tier.name == "spark" and unit.driver_rows > 0  # see driver_plans.py
            with one_job(unit.tier.spark if small else None):
                value = both.agg(F.max("__deepest")).collect()[0][0]
            if value is not None:
                deepest = max(deepest, int(value))
        return deepest

    def _pending_bound(self, node: Node, prefix: Time, unit: Unit, column: str) -> int | None:
        """An upper bound of ``_deepest_pending`` from the catalog and the Parquet footers:
        -1 when no port has a batch in the prefix's epoch (nothing is pending), else the
        largest ``column`` (the next coordinate) among the batches it would read; None
        when a footer has no statistics."""
        level = len(prefix)
        ports = range(len(node.inputs))
        if not any(
            unit.batches(coll.arranged(node.id, p), "trace", lambda time: time[0] == prefix[0])
            for p in ports
        ):
            return -1
        bound = -1
        for port in ports:
            for record in unit.batches(
                coll.arranged(node.id, port),
                "trace",
                lambda time: all(a <= b for a, b in zip(time[:level], prefix, strict=True)),
            ):
                top = self.warehouse.column_max(record, column)
                if top is None:
                    return None
                bound = max(bound, top)
        return bound

    def _deepest_pending(
        self,
        node: Node,
        prefix: Time,
        unit: Unit,
        port_keys: Sequence[Sequence[str]],
        names: Sequence[str],
        schemas: Sequence[Any],
    ) -> Any:
        """For one stateful node, as a query (None: no port has a batch in the prefix's
        epoch): the deepest next coordinate, in ``__deepest``, among the updates of keys
        that, at or below ``prefix`` and on any port, match every coordinate of
        ``prefix`` exactly (so a correction may still be due under it)."""
        level = len(prefix)
        # Matching the epoch coordinate needs an update in this epoch: a cheap pruning set.
        now = [
            unit.batches(coll.arranged(node.id, port), "trace", lambda time: time[0] == prefix[0])
            for port in range(len(node.inputs))
        ]
        if not any(now):
            return None
        keys = self._keys_of(node, now, port_keys, schemas, unit)
        F = dialect_of(keys.frame).F
        below = reduce(
            lambda a, b: a & b,
            [F.col(n) <= v for n, v in zip(names[:level], prefix, strict=True)],
        )
        history = []
        for port in range(len(node.inputs)):
            records = unit.batches(
                coll.arranged(node.id, port),
                "trace",
                lambda time: all(a <= b for a, b in zip(time[:level], prefix, strict=True)),
            )
            rows = unit.tier.read(
                records,
                schemas[port],
                keys=keys.renamed(port_keys[port]),
                bucket_by=list(port_keys[port]),
            )
            history.append(
                renamed(rows.where(below), port_keys[port], port_keys[0], names[: level + 1])
            )
        flags = [
            F.max(F.when(F.col(n) == v, F.lit(1)).otherwise(F.lit(0))).alias(f"__on{d}")
            for d, (n, v) in enumerate(zip(names[:level], prefix, strict=True))
        ]
        per_key = (
            reduce(ops.plus, history)
            .groupBy(*port_keys[0])
            .agg(*flags, F.max(names[level]).alias("__deepest"))
        )
        matched = reduce(lambda a, b: a & b, [F.col(f"__on{d}") == 1 for d in range(level)])
        return per_key.where(matched).select("__deepest")
