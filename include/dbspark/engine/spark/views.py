"""Views: publish each view's delta, read views back, and check them against a full
refresh.

``publish`` appends an epoch's view deltas to the views' collections before the epoch
commits; readers see them only once it has (``view_change`` between publish and close
is the one exception, for the export task). ``verify`` and ``rebuild`` recompute views
from the sources' raw input logs: with Spark (``full_refresh.py``), or, for ``verify``
of a small log while the local tier is on, with the reference engine in this process
(``reference/full_refresh.py``), which is as independent of the incremental path and
starts no JVM.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql import DataFrame

from dbspark.circuit.builder import Node
from dbspark.core.columns import WEIGHT, time_columns
from dbspark.core.types import Schema
from dbspark.core.zset import ZSet
from dbspark.engine.api import (
    EpochOrderError,
    UnitReport,
)
from dbspark.engine.epoch_units import PUBLISH, publish_inputs
from dbspark.engine.kernels import consolidate
from dbspark.engine.spark.compile import struct_type
from dbspark.engine.spark.unit import records_rows
from dbspark.storage import collection_names as coll
from dbspark.storage.catalog import BatchRecord

log = logging.getLogger("dbspark.engine")

#: ``verify`` recomputes in this process, with the reference engine, when the local tier
#: is on and the input logs hold at most this many rows. The reference engine evaluates
#: row by row in Python: a few seconds at this size, where a Spark full refresh of a
#: small circuit costs a JVM and a plan per operator (the demo's four circuits: 37 s).
REFERENCE_VERIFY_ROWS = 20_000
VERIFY_TIERS = ("local", "spark")


class Views:
    """Publishing and reading views, mixed into ``SparkEngine``."""

    def publish(self, epoch: int) -> UnitReport:
        """Append each view's delta for ``epoch`` to the view's published collection."""
        t = (epoch,)
        if self.catalog.stage_done(self.circuit.name, PUBLISH, t):
            return UnitReport(PUBLISH, t, skipped=True)
        self.require_inputs(PUBLISH, epoch, publish_inputs(self.plan))
        unit = self._epoch_unit(epoch)
        report = UnitReport(PUBLISH, t, tier=unit.tier.name)
        for name, node_id in self.circuit.views.items():
            node = self.circuit.node(node_id)
            delta = self._delta(node_id, t, unit, {})
            record = (
                None
                if delta is None
                else unit.write_at(delta, coll.view(name), "trace", t, self._fields(node, 1))
            )
            report.rows_out[name] = record.rows if record else 0
        unit.commit(PUBLISH, t)
        log.info("%s", report.describe())
        return report

    def view_frame(self, name: str, epoch: int | None = None) -> DataFrame:
        """The view's contents (consolidated, with ``__w``) as of the last committed epoch,
        or as of ``epoch`` once that epoch's publish has committed.

        A view's batch for an epoch is registered by ``publish`` before the epoch commits;
        readers must not see it until the epoch does: only the publishing task, which
        exports it, asks for an uncommitted epoch explicitly."""
        node, records = self._view_records(name, epoch, change=False)
        frame = self.warehouse.read(self.spark, records, self._schema_of(node, 1))
        return consolidate(frame.drop(*time_columns(1)), list(node.schema.names))

    def view_change(self, name: str, epoch: int) -> DataFrame:
        """The view's change at ``epoch`` (consolidated, ``__w`` = +inserted / -deleted).

        Compaction at the close of the epoch merges the batch into older ones, so the
        change is read between ``publish`` and ``close_epoch``."""
        node, records = self._view_records(name, epoch, change=True)
        frame = self.warehouse.read(self.spark, records, self._schema_of(node, 1))
        return consolidate(frame.drop(*time_columns(1)), list(node.schema.names))

    def view_table(self, name: str, epoch: int, *, change: bool = False) -> pa.Table | None:
        """``view_frame`` (or, with ``change``, ``view_change``) as Arrow, read in this
        process when the batches hold at most ``local_rows`` rows; None when they hold
        more (read them with Spark), so exporting a small epoch starts no Spark."""
        node, records = self._view_records(name, epoch, change=change)
        if records_rows(records) > self.local_rows:
            return None
        frame = self.local.read(records, self._fields(node, 1))
        return consolidate(frame.drop(*time_columns(1)), list(node.schema.names)).toArrow()

    def _view_records(
        self, name: str, epoch: int | None, *, change: bool
    ) -> tuple[Node, list[BatchRecord]]:
        node = self.circuit.node(self.circuit.views[name])
        if epoch is None:
            epoch = self.last_committed_epoch()
        else:
            self._require_published(epoch)
        if not change:
            return node, self.catalog.batches(self.circuit.name, coll.view(name), max_epoch=epoch)
        if self.catalog.epoch_state(self.circuit.name, epoch) == "committed":
            raise EpochOrderError(
                f"circuit {self.circuit.name!r}: epoch {epoch} is committed and its view "
                f"batches may be compacted; read a change between publish and close_epoch"
            )
        return node, self.catalog.batches(self.circuit.name, coll.view(name), epoch=epoch)

    def _require_published(self, epoch: int) -> None:
        if not self.catalog.stage_done(self.circuit.name, PUBLISH, (epoch,)):
            raise EpochOrderError(
                f"circuit {self.circuit.name!r}: the views of epoch {epoch} are not published"
            )

    def view(self, name: str) -> ZSet:
        """The view's contents as of the last committed epoch, read in this process (no
        Spark job: the rows come to Python anyway)."""
        node = self.circuit.node(self.circuit.views[name])
        epoch = self.last_committed_epoch()
        records = self.catalog.batches(self.circuit.name, coll.view(name), max_epoch=epoch)
        frame = self.local.read(records, self._fields(node, 1))
        return self.local.zset(frame.drop(*time_columns(1)), node.schema)

    def views(self) -> dict[str, ZSet]:
        return {name: self.view(name) for name in self.circuit.views}

    def _input_logs(
        self, epoch: int | None
    ) -> Iterator[tuple[str, Schema, list[tuple[str, str]], list[BatchRecord]]]:
        """Per source: its name, its user columns, the log's other fields (``__w`` of a
        Z-set source, the time) and the log's batches of epochs ``0..epoch``."""
        for name, node_id in self.circuit.sources.items():
            user, extra = self._input_log_fields(self.circuit.node(node_id))
            records = self.catalog.batches(
                self.circuit.name, coll.input_log(node_id), max_epoch=epoch
            )
            yield name, user, extra, records

    def input_frames(self, epoch: int | None = None) -> dict[str, DataFrame]:
        """Every source's raw input log (epochs ``0..epoch``), shaped for full refresh."""
        return {
            name: self.warehouse.read(self.spark, records, struct_type(user, extra=extra))
            for name, user, extra, records in self._input_logs(epoch)
        }

    def full_refresh(self, epoch: int | None = None) -> dict[str, DataFrame]:
        """Every view recomputed from scratch over the accumulated input (a full refresh)."""
        from dbspark.engine.spark.full_refresh import evaluate

        epoch = self.last_committed_epoch() if epoch is None else epoch
        if epoch < 0:
            raise ValueError(f"circuit {self.circuit.name!r} has no committed epoch yet")
        self._require_replayable(epoch)
        return evaluate(self.spark, self.circuit, self.input_frames(epoch), epoch)

    def _require_replayable(self, epoch: int) -> None:
        """Refuse a full refresh at ``epoch`` when the raw input logs were merged past it
        (input log retention, ``Maintenance.compact_input_logs``)."""
        first = self.replayable_from()
        if epoch < first:
            raise ValueError(
                f"circuit {self.circuit.name!r}: a full refresh at epoch {epoch} needs the "
                f"raw input logs as they were then, but they are merged up to epoch "
                f"{first - self._root_delays()} (input log retention); a full refresh "
                f"is possible as of epoch {first} or later"
            )

    def verify(self, tier: str | None = None) -> dict[str, list[tuple]]:
        """Per view, the rows (with ``__w`` = full refresh minus maintained) that differ
        between the incrementally maintained view and a full refresh; empty when equal.

        ``tier`` is where the full refresh runs: ``"local"`` (the reference engine in
        this process), ``"spark"``, or None for ``verify_tier()``'s choice."""
        tier = self.verify_tier() if tier is None else tier
        if tier not in VERIFY_TIERS:
            raise ValueError(f"verify runs on one of {VERIFY_TIERS}, not {tier!r}")
        epoch = self.last_committed_epoch()
        if epoch < 0:
            raise ValueError(f"circuit {self.circuit.name!r} has no committed epoch yet")
        if tier == "local":
            return self._verify_locally(epoch)
        from dbspark.engine.spark.full_refresh import verify

        log.info("verify %s at epoch %s: full refresh with Spark", self.circuit.name, epoch)
        fresh = self.full_refresh(epoch)
        differences = {}
        for name in self.circuit.views:
            diff = verify(fresh[name], self.view_frame(name))
            differences[name] = [tuple(row) for row in diff.limit(1000).collect()]
        return differences

    def verify_tier(self) -> str:
        """Where ``verify`` recomputes by default: ``"local"`` while the local tier is on
        and the input logs hold at most ``REFERENCE_VERIFY_ROWS`` rows, else ``"spark"``."""
        if self.local_rows <= 0:
            return "spark"
        return "local" if self._input_log_rows() <= REFERENCE_VERIFY_ROWS else "spark"

    def _input_log_rows(self) -> int:
        logs = self._input_logs(self.last_committed_epoch())
        return sum(record.rows for *_, records in logs for record in records)

    def _verify_locally(self, epoch: int) -> dict[str, list[tuple]]:
        from dbspark.engine.reference.full_refresh import full_refresh

        self._require_replayable(epoch)
        history = self._input_history(epoch)
        log.info(
            "verify %s at epoch %s: full refresh of %s input rows with the reference engine "
            "in this process",
            self.circuit.name,
            epoch,
            sum(len(batch) for inputs in history for batch in inputs.values()),
        )
        fresh = full_refresh(self.circuit, history, epoch)
        differences = {}
        for name in self.circuit.views:
            diff = fresh.get(name, ZSet()) - self.view(name)
            differences[name] = [(*row, weight) for row, weight in list(diff.items())[:1000]]
        return differences

    def _input_history(self, epoch: int) -> list[dict[str, list]]:
        """The raw input logs of epochs ``0..epoch``, read in this process, as the
        reference engine takes them: per epoch and source, ``(row, weight)`` pairs of a
        Z-set source and the rows of an upsert source."""
        from dbspark.engine.local.tier import table_rows

        history: list[dict[str, list]] = [
            {name: [] for name in self.circuit.sources} for _ in range(epoch + 1)
        ]
        for name, user, extra, records in self._input_logs(epoch):
            table = self.local.read(records, [*user.fields, *extra]).toArrow()
            epochs = table.column(time_columns(1)[0]).to_pylist()
            rows = table_rows(table, user)
            if WEIGHT in table.column_names:  # a Z-set source: (row, weight) pairs
                rows = list(zip(rows, table.column(WEIGHT).to_pylist(), strict=True))
            for at, row in zip(epochs, rows, strict=True):
                history[at][name].append(row)
        return history

    def rebuild(self, name: str, *, by: str | None = None) -> int:
        """Replace a view's published contents with its full refresh; returns its rows.
        ``by`` names who asked (``coll.rebuild_stage``: a DAG run's rebuild task), for the
        catalog's record of the commit.

        The refresh is as of the last committed epoch, so it replaces the batches of that
        epoch and before only: an open epoch's published change (its publish ran, its
        close did not) stays, and its close adds it to the rebuilt view, as if the
        rebuild had run before the epoch opened. Replacing it too would erase that
        epoch's change for good, since its close commits whatever is left."""
        epoch = self.last_committed_epoch()
        fresh = self.full_refresh(epoch)[name]
        record = self.traces.write(coll.view(name), fresh, (epoch,))
        replaced = self.catalog.batches(self.circuit.name, coll.view(name), max_epoch=epoch)
        old = [r.id for r in replaced if r.id]
        stage = coll.rebuild_stage(name, uuid.uuid4().hex[:8], by)
        self.catalog.commit(
            self.circuit.name, stage, (epoch,), [record] if record else [], supersede=old
        )
        log.info(
            "view %s rebuilt from scratch at epoch %s: %s rows",
            name,
            epoch,
            record.rows if record else 0,
        )
        return record.rows if record else 0
