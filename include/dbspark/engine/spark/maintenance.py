"""Maintenance of the stored traces: after an epoch commits, traces advanced to the
frontier and merged, and stream deltas no later epoch reads retired; at a worker's
start, traces loaded into memory. None of it changes an answer.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

from dbspark.circuit.builder import Node
from dbspark.circuit.planner import trace_keys
from dbspark.core.columns import WEIGHT, time_columns
from dbspark.core.timestamps import Time
from dbspark.engine.dialect import dialect_of
from dbspark.engine.kernels import consolidate
from dbspark.storage import collection_names as coll
from dbspark.storage.catalog import BatchRecord
from dbspark.storage.traces import CompactionPlanInput, advance_columns

log = logging.getLogger("dbspark.engine")


class Maintenance:
    """Compaction, mixed into ``SparkEngine``."""

    def compact(self, epoch: int) -> None:
        """Advance every trace by the frontier ``(epoch, 0, ...)`` and merge batches
        (tiered, so old large batches are rewritten only as recent ones grow), then retire
        stream deltas no later epoch reads (``delay`` reads one epoch back)."""
        traces = list(self._traces())
        views = [coll.view(name) for name in self.circuit.views]
        # The catalog read once for the whole pass (a pass compacts each trace once).
        known = self.traces.planning_input([t[0] for t in traces] + views, epoch)
        for collection, node, depth, key_columns in traces:
            frontier = [(epoch, *([0] * (depth - 1)))]
            self._compact(collection, frontier, node, depth, key_columns, known)
        for name, collection in zip(self.circuit.views, views, strict=True):
            node = self.circuit.node(self.circuit.views[name])
            self._compact(collection, [(epoch,)], node, 1, list(node.schema.names), known)
        deltas = {coll.delta(node.id) for node in self.circuit.nodes}
        stale = [  # one catalog read, not one per node
            record.id
            for record in self.catalog.operator_batches(self.circuit.name)
            if record.kind == "delta"
            and record.collection in deltas
            and record.epoch < epoch
            and record.id is not None
        ]
        if stale:
            self.catalog.commit(self.circuit.name, "retire-deltas", (epoch,), [], supersede=stale)

    @property
    def in_process_merge_rows(self) -> int:
        """The largest compaction merge rewritten in this process rather than by Spark.

        A merge is not a unit: it rewrites committed rows, after the epoch's commit. With
        the local tier off (``local_rows=0``), a Spark tier that writes small outputs from
        the driver (``driver_rows``) merges that many rows in the driver as well, as a
        Spark job costs about 0.2 s and the merge of a few small batches milliseconds.
        Both 0 keeps every merge on Spark."""
        return max(self.local_rows, self.driver_rows)

    def _traces(self) -> Iterator[tuple[str, Node, int, list[str]]]:
        """Every trace the circuit keeps: its collection, the node whose rows it holds,
        its time depth and its key columns."""
        for node in self.circuit.nodes:
            keys = trace_keys(self.circuit, node)
            if node.op == "upsert_source":
                yield coll.state(node.id), node, 1, list(keys[0])
                continue
            depth = self.circuit.scope(node.scope).depth
            for port, key_columns in enumerate(keys):
                source = self.circuit.node(node.inputs[port])
                yield coll.arranged(node.id, port), source, depth, list(key_columns)

    def warm(self) -> int:
        """Load the circuit's live traces, and their key indexes, into the local tier's
        resident files (see ``resident_bytes``), and readies its DuckDB connection. A
        long-lived worker calls it at start so that its first epoch runs as the ones after
        do. Returns the bytes resident."""
        if not self.local.resident.enabled:
            return 0
        keys = {collection: key_columns for collection, _, _, key_columns in self._traces()}
        batches = self.catalog.operator_batches(self.circuit.name)
        return self.local.warm(
            [(r, keys[r.collection]) for r in batches if r.kind == "trace" and r.collection in keys]
        )

    def _compact(
        self,
        collection: str,
        frontier: Sequence[Time],
        node: Node,
        depth: int,
        key_columns: list[str],
        known: CompactionPlanInput | None = None,
    ) -> None:
        """One trace's tiered compaction; a merge of at most ``local_rows`` rows (or, with
        the local tier off, ``driver_rows``) is rewritten in this process by the local
        tier's code (no Spark job), a larger one by Spark."""
        fields = self._fields(node, depth)
        names = time_columns(depth)

        def rewrite(chosen: list[BatchRecord], advanced: Any, out_time: Time) -> Any:
            frame = self.local.read(chosen, fields)
            for column, expr in advance_columns(advanced, names, dialect_of(frame).F):
                frame = frame.withColumn(column, expr)
            merged = consolidate(frame, [n for n, _ in fields if n != WEIGHT])
            return self.local.write(
                merged,
                self.circuit.name,
                collection,
                "trace",
                out_time,
                fields,
                bucket_by=key_columns or None,
            )

        self.traces.compact(
            collection,
            frontier,
            self._schema_of(node, depth),
            key_columns,
            names,
            tiered=True,
            local=rewrite,
            local_rows=self.in_process_merge_rows,
            known=known,
        )
