"""Maintenance of the stored traces: after an epoch commits, traces advanced to the
frontier and merged, and stream deltas no later epoch reads retired; at a worker's
start, traces loaded into memory; past a retention, the raw input logs merged. None of
it changes an answer.

**Input log retention** (``compact_input_logs``). Each ingest appends its batch to its
source's raw input log, which full refresh, ``verify`` and ``rebuild`` replay; kept
whole, it grows with every epoch. The batches of epochs up to a given one are merged in
runs of neighbouring epochs (``traces.log_merge_runs``), each run into one batch at its
last epoch: a Z-set source's rows consolidated (weights summed, zeros dropped), an
upsert source's reduced to each key's winner, tombstones kept, as the upsert rule
(``kernels.upsert_winners``) picks it over the whole run. Both are what a replay of the
run would end with, so every source is unchanged from the run's last epoch on, and a
full refresh at an epoch ``e`` is unchanged when the sources it reads, at ``e`` and
back as far as the circuit's root-level ``delay``s reach, are all at or after the last
merged epoch (``replayable_from``). Earlier epochs can no longer be replayed: the log's
frontier in the catalog says how far it was merged, and full refresh refuses an epoch
before ``replayable_from``. Merged runs keep their epochs' order, so an upsert replay
compares each later row with the same winners as ingestion did, and a later batch that
ingestion refused is refused again.
"""

from __future__ import annotations

import copy
import logging
import os
import socket
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from dbspark.circuit.builder import Node
from dbspark.circuit.planner import trace_keys
from dbspark.core.antichain import Antichain
from dbspark.core.columns import EPOCH, EPOCH_TYPE, TOMBSTONE, WEIGHT, time_columns
from dbspark.core.timestamps import Time
from dbspark.engine.batches import upsert_spec
from dbspark.engine.dialect import dialect_of
from dbspark.engine.kernels import consolidate, upsert_winners
from dbspark.engine.local.tier import LocalTier
from dbspark.storage import collection_names as coll
from dbspark.storage.catalog import BatchRecord, Catalog
from dbspark.storage.traces import (
    Compaction,
    CompactionPlanInput,
    TraceStore,
    advance_columns,
    log_merge_runs,
)

log = logging.getLogger("dbspark.engine")


class Maintenance:
    """Compaction, mixed into ``SparkEngine``."""

    def _compact_after_close(self, epoch: int) -> None:
        """The compaction after ``epoch`` committed: here, or, with
        ``background_compaction``, in a thread of this process while the caller goes on
        (``BackgroundCompaction``)."""
        if not self.background_compaction:
            self.compact(epoch)
            return
        self.wait_for_compaction()
        if self._background is None:
            self._background = BackgroundCompaction(self)
        self._background.start(epoch)

    def wait_for_compaction(self) -> None:
        """Until the compaction started in the background by the last close has finished;
        its error, if it failed, is raised here (its merges are planned again by the
        next compaction)."""
        if self._background is not None:
            self.catalog.flush()  # it may be waiting for the write lock this thread holds
            self._background.finish()

    @property
    def background_compaction_seconds(self) -> float:
        """What the compactions run in the background so far took, in their thread (a
        compaction run inline is part of its epoch's time)."""
        return 0.0 if self._background is None else self._background.seconds

    def compact(self, epoch: int) -> None:
        """Advance every trace by the frontier ``(epoch, 0, ...)`` and merge batches
        (tiered, so old large batches are rewritten only as recent ones grow), then retire
        stream deltas no later epoch reads (``delay`` reads one epoch back)."""
        self.wait_for_compaction()
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

    # --- input log retention ------------------------------------------------------------
    def replayable_from(self, stored_as: Mapping[int, int] | None = None) -> int:
        """The first epoch a full refresh can recompute exactly from the raw input logs:
        0 while no log was merged; else the last merged epoch, plus one epoch for each
        root-level ``delay`` (a view at ``e`` may read its sources as of ``e - 1``,
        ``e - 2``, ...), counted over the whole circuit, which is never fewer than a
        path holds. ``stored_as``: the node ids the sources' logs are stored under, by
        source node id, where they differ (an evolution, before its rename; a source
        missing from it has no log yet)."""
        frontiers = self.catalog.frontiers(self.circuit.name)
        sources = self.circuit.sources.values()
        ids = sources if stored_as is None else [stored_as[i] for i in sources if i in stored_as]
        logs = [coll.input_log(node_id) for node_id in ids]
        merged = [frontiers[log][0][0] for log in logs if frontiers.get(log)]
        if not merged:
            return 0
        return max(merged) + self._root_delays()

    def _root_delays(self) -> int:
        return sum(1 for node in self.circuit.nodes if node.op == "delay" and node.scope == 0)

    def latest_mergeable_epoch(self) -> int:
        """The last epoch whose raw input log may be merged: a full refresh at the last
        committed epoch must still read every source as of the epochs it needs."""
        return self.last_committed_epoch() - self._root_delays()

    def compact_input_logs(self, through_epoch: int) -> list[Compaction]:
        """Merge each source's raw input log batches of epochs ``0..through_epoch`` in runs
        of neighbouring epochs (module docstring, "Input log retention"); returns what
        each merge did. Refused (``ValueError``) when a full refresh at the last
        committed epoch would then read a merged epoch's sources as of an earlier one.
        Idempotent: a retry plans again from the live batches."""
        latest = self.latest_mergeable_epoch()
        if through_epoch > latest:
            raise ValueError(
                f"circuit {self.circuit.name!r}: the raw input logs can be merged up to "
                f"epoch {latest} at most (the last committed epoch, "
                f"{self.last_committed_epoch()}, less one per root-level delay), not "
                f"{through_epoch}"
            )
        done = []
        for node_id in self.circuit.sources.values():
            node = self.circuit.node(node_id)
            collection = coll.input_log(node_id)
            records = self.catalog.batches(self.circuit.name, collection, max_epoch=through_epoch)
            for run in log_merge_runs(records):
                done.append(self._merge_log_run(node, collection, run))
        return done

    def _merge_log_run(self, node: Node, collection: str, run: list[BatchRecord]) -> Compaction:
        """One run of a raw input log merged into one batch at its last epoch, committed in
        place of the run."""
        user, extra = self._input_log_fields(node)
        fields = [*user.fields, *extra]
        last = tuple(run[-1].time)
        in_process = sum(b.rows for b in run) <= self.in_process_merge_rows
        if in_process:
            frame = self.local.read(run, fields)
        else:
            from dbspark.engine.spark.tier import spark_struct

            frame = self.warehouse.read(self.spark, run, spark_struct(fields))
        F = dialect_of(frame).F
        if node.op == "zset_source":
            merged = consolidate(frame.drop(EPOCH), list(user.names))
        else:
            winners = upsert_winners(upsert_spec(node), frame)  # ties: equal rows only
            merged = winners.drop(TOMBSTONE, EPOCH)
        merged = merged.withColumn(EPOCH, F.lit(last[0]).cast(EPOCH_TYPE))
        merged = merged.select(*[name for name, _ in fields])
        if in_process:
            record = self.local.write(merged, self.circuit.name, collection, "trace", last, fields)
        else:
            self.catalog.flush()  # a commit group must not hold the write lock over a job
            record = self.warehouse.write(merged, self.circuit.name, collection, "trace", last)
        stored = self.catalog.frontier(self.circuit.name, collection)
        frontier = max([last, *(tuple(f) for f in stored or [])])
        first = min(int(b.id or 0) for b in run)
        log.info(
            "%s: raw input log of epochs %s-%s merged, %s batches of %s rows into %s rows",
            self.circuit.name,
            run[0].time[0],
            last[0],
            len(run),
            sum(b.rows for b in run),
            0 if record is None else record.rows,
        )
        return self.traces.commit_merge(
            collection,
            Antichain([frontier]),
            f"compact-log:{collection}@{first}",
            last,
            run,
            record,
        )


class BackgroundCompaction:
    """A compaction after an epoch's commit, run in a thread of its own so that the
    epoch's caller (a long-lived worker, a script running epoch after epoch) goes on
    while it works. It is the same compaction (``Maintenance.compact``), run by a view of
    the engine with a catalog connection, a DuckDB connection and file listings of its
    own; the decoded files it reads and the batch it writes are shared with the engine
    (``ResidentFiles`` is safe between threads), so the next epoch finds the merged
    batch in memory.

    Sound for the same reasons a compaction by another process is: a compaction only
    merges batches under the committed epoch's frontier and supersedes them in one
    catalog commit, so a unit of the next epoch reads either the batches before it or
    the merged one, the same rows either way; the next epoch's own batches are beyond
    the frontier and never merged by it. One compaction at a time: the next close waits
    for this one first, which is also where its error, if any, is raised. It holds a
    lease from before it writes until it ends, so garbage collection keeps its files.
    Its commits wait for the engine's commit group to flush (SQLite's write lock), at
    most ``LOCK_WAIT_SECONDS``."""

    #: How long a commit of the compaction waits for the catalog's write lock, which the
    #: engine's commit group holds from an epoch's first commit to its flush.
    LOCK_WAIT_SECONDS = 3600.0

    def __init__(self, engine: Any) -> None:
        self._engine = engine
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dbspark-compaction")
        self._pending: Future[None] | None = None
        self._view: Any = None
        self.seconds = 0.0  # what the compactions took, in the thread

    def start(self, epoch: int) -> None:
        """Compact after ``epoch`` in the thread; the one before must have finished."""
        assert self._pending is None, "one compaction in the background at a time"
        if self._view is None:
            self._view = self._engine_view()
        self._pending = self._pool.submit(self._compact, epoch)

    def finish(self) -> None:
        """Wait for the compaction in the thread, raising its error."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def _engine_view(self) -> Any:
        """The engine as the thread sees it: its own catalog connection (waiting long
        for the write lock) and local tier, the engine's decoded files."""
        engine = self._engine
        view = copy.copy(engine)
        view.background_compaction = False
        view._background = None
        wait = self.LOCK_WAIT_SECONDS
        view.catalog = Catalog(
            engine.catalog.url, warehouse=engine.root, lock_timeout=wait, statement_timeout=wait
        )
        view.traces = TraceStore(
            lambda: engine.spark,
            engine.warehouse,
            view.catalog,
            engine.circuit.name,
            buckets=engine.buckets,
        )
        view._local = LocalTier(engine.warehouse, buckets=engine.buckets, resident_bytes=0)
        view._local.resident = engine.local.resident
        view._key_sets = {}
        return view

    def _compact(self, epoch: int) -> None:
        view = self._view
        started = time.perf_counter()
        holder = f"compaction after epoch {epoch} ({socket.gethostname()}, pid {os.getpid()})"
        lease = view.catalog.acquire_lease(view.circuit.name, holder)
        try:
            view.compact(epoch)
        except BaseException:
            log.exception("%s: compaction after epoch %s failed", view.circuit.name, epoch)
            raise
        finally:
            view.catalog.release_lease(lease)
            view.local.forget_files()
            self.seconds += time.perf_counter() - started
