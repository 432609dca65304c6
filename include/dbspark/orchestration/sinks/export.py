"""Exporting a circuit's views after each epoch: the Delta tables (``tables``), the Parquet
directories (``files``) and the SQL serving tables (``serving``) in one call,
:func:`export_epoch`.

The publish task calls it between ``engine.publish(epoch)`` and
``engine.close_epoch(epoch)``, the only window in which the epoch's change can still be
read on its own. The engine keeps a view as a log of weighted batches in its warehouse,
which is private (its layout changes under compaction and its catalog decides what is
visible); these outputs are what downstream readers get instead.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from dbspark.core.columns import COPIES, WEIGHT
from dbspark.core.types import Schema
from dbspark.orchestration.sinks.files import (
    CHANGES,
    CorrectionExport,
    DirectoryExport,
    ExportError,
    arrow_rows,
    change_rows,
    export_changes,
    export_correction,
    export_first_changes,
    export_snapshot,
    exported_columns,
    exported_corrections,
    feed_complete,
    feed_view,
    iter_change_rows,
    marker_columns,
    output_dir,
    read_marker,
    retire_outputs,
    stacked,
    weighted_difference,
)
from dbspark.orchestration.sinks.serving import ServingResult, ServingTarget
from dbspark.orchestration.sinks.tables import (
    TableCommit,
    TableSettings,
    correct_table,
    publish_table,
    read_table,
    replace_table,
    retire_table,
    table_columns,
    table_epoch,
    table_exists,
    table_path,
)

if TYPE_CHECKING:
    from dbspark.circuit.evolution import Evolution
    from dbspark.engine.spark.executor import SparkEngine

log = logging.getLogger("dbspark.outputs")

#: Tables kept with the default settings (:class:`TableSettings`).
DEFAULT_TABLES = TableSettings()


@dataclass
class ViewExport:
    view: str
    snapshot: DirectoryExport | None = None
    changes: DirectoryExport | None = None
    table: TableCommit | None = None
    serving: ServingResult | None = None


@dataclass
class ExportReport:
    """What :func:`export_epoch` wrote, per view; ``describe()`` is for task logs."""

    circuit: str
    epoch: int
    views: dict[str, ViewExport] = field(default_factory=dict)

    def describe(self) -> str:
        lines = [f"export of circuit {self.circuit!r}, epoch {self.epoch}:"]
        for name, view in self.views.items():
            parts = [
                part.describe()
                for part in (view.table, view.snapshot, view.changes, view.serving)
                if part is not None
            ]
            lines.append(f"  {name}: " + ("; ".join(parts) if parts else "nothing to export"))
        return "\n".join(lines)


def export_epoch(
    engine: SparkEngine,
    epoch: int,
    *,
    root: str | os.PathLike[str] | None = None,
    serving: ServingTarget | None = None,
    views: Collection[str] | None = None,
    tables: TableSettings | None = DEFAULT_TABLES,
    snapshots: bool = False,
) -> ExportReport:
    """Export every view (or ``views``) of ``engine``'s circuit for ``epoch``: under
    ``root`` the change directory, the Delta table kept as ``tables`` says (None: no
    table; under ``tables.location`` when set, such as ``s3://bucket/prefix``) and,
    with ``snapshots``, the snapshot directory; and the serving tables of ``serving``.

    The publish task writes no snapshot: the table holds the view as of every epoch,
    while a snapshot rewrites the whole view each epoch (kept for the benchmarks'
    comparison and for readers of Parquet directories that ask for it).

    Call it after ``engine.publish(epoch)`` and before ``engine.close_epoch(epoch)``. Every
    output that is already complete is skipped, so a retried task redoes only what is
    missing (after the close, only complete outputs can be skipped: the change is gone).
    """
    circuit = engine.circuit.name
    report = ExportReport(circuit, epoch)
    names = list(engine.circuit.views) if views is None else list(views)
    for name in names:
        if name not in engine.circuit.views:
            raise ExportError(f"circuit {circuit!r} has no view {name!r}")
    for name in names:
        schema = engine.circuit.node(engine.circuit.views[name]).schema
        item = ViewExport(name)
        report.views[name] = item
        if root is not None:
            if snapshots:
                item.snapshot = export_snapshot(engine, name, epoch, root)
            item.changes = export_changes(engine, name, epoch, root)
            if tables is not None:
                item.table = _publish_table(engine, name, epoch, root, item.changes, tables)
        if serving is not None and serving.serves(name):
            if serving.epoch_of(name) == epoch:
                item.serving = ServingResult(
                    serving.table_name(name), epoch, serving.database, skipped=True
                )
                continue
            if item.changes is not None and item.changes.path is not None:
                # The exported change is what readers of the feed see: serve exactly that.
                change = iter_change_rows(item.changes.path, schema)
            else:
                change = change_rows(engine, name, epoch, schema)
            item.serving = serving.apply(circuit, name, schema, epoch, change)
            if item.changes is None:
                item.changes = DirectoryExport(
                    CHANGES,
                    None,
                    len(change),
                    inserted=sum(w for _, w in change if w > 0),
                    deleted=-sum(w for _, w in change if w < 0),
                )
    log.info("%s", report.describe())
    return report


def _publish_table(
    engine: SparkEngine,
    view: str,
    epoch: int,
    root: str | os.PathLike[str],
    changes: DirectoryExport,
    settings: TableSettings,
) -> TableCommit:
    """Commit the epoch to the view's table from the change directory just exported:
    the table applies exactly the feed that readers of ``changes/`` see."""
    circuit = engine.circuit.name
    schema = engine.circuit.node(engine.circuit.views[view]).schema
    columns = [*schema.names, WEIGHT]
    assert changes.path is not None  # written under root

    return publish_table(
        table_path(settings.location or root, circuit, view),
        circuit=circuit,
        view=view,
        schema=schema,
        epoch=epoch,
        change=pq.read_table(changes.path, columns=columns),
        whole_view=lambda: whole_view(engine, view, epoch),
        interval=engine.catalog.epoch_labels(circuit).get(epoch),
        settings=settings,
    )


def whole_view(engine: SparkEngine, view: str, epoch: int) -> pa.Table:
    """The view as of ``epoch`` as Arrow (its columns and ``__w``): read in this process
    when it is small enough, else by Spark and collected."""
    table = engine.view_table(view, epoch)
    return table if table is not None else engine.view_frame(view, epoch).toArrow()


# ==================================================================================== rebuilds
@dataclass
class ViewCorrection:
    """What a rebuild at ``epoch`` changed in a view's outputs: the change feed's
    correction, the table's correction commit and the serving table's (each None where
    that output already held the rebuilt view, or is not there)."""

    view: str
    epoch: int
    correction: CorrectionExport | None = None
    table: TableCommit | None = None
    serving: ServingResult | None = None

    @property
    def changed(self) -> bool:
        return self.correction is not None or self.table is not None

    def summary(self) -> dict[str, Any]:
        """Flat JSON values for a task's result and an asset event's ``extra``."""
        feed, table = self.correction, self.table
        return {
            "correction": str(feed.path) if feed else None,
            "rows_inserted": feed.inserted if feed else 0,
            "rows_deleted": feed.deleted if feed else 0,
            "table": str(table.path) if table else None,
            "table_version": table.version if table else None,
            "table_rows_inserted": table.inserted if table else 0,
            "table_rows_updated": table.updated if table else 0,
            "table_rows_deleted": table.deleted if table else 0,
        }

    def describe(self) -> str:
        parts = [
            part.describe()
            for part in (self.correction, self.table, self.serving)
            if part is not None
        ]
        if not parts:
            return f"{self.view}: its outputs held the rebuilt view of epoch {self.epoch}"
        return f"{self.view}: " + "; ".join(parts)


def rebuild_views(
    engine: SparkEngine,
    views: Collection[str],
    *,
    root: str | os.PathLike[str],
    tables: TableSettings | None = DEFAULT_TABLES,
    serving: ServingTarget | None = None,
    by: str | None = None,
) -> tuple[dict[str, int], dict[str, ViewCorrection]]:
    """``engine.rebuild`` each of ``views`` (``by``: who asked), then correct their outputs
    under ``root`` (:func:`correct_views`). Returns the rebuilt views' rows and what
    changed in their outputs. A view whose change feed lacks early changes is read first:
    what the engine held before the rebuild is what that feed sums to."""
    circuit = engine.circuit.name
    epoch = engine.last_committed_epoch()
    before = {}
    for view in views:
        if not feed_complete(root, circuit, view, epoch):
            before[view] = whole_view(engine, view, epoch)
    rows = {view: engine.rebuild(view, by=by) for view in views}  # the engine logs each
    corrected = correct_views(
        engine, views, root=root, tables=tables, serving=serving, before=before
    )
    return rows, corrected


def correct_views(
    engine: SparkEngine,
    views: Collection[str],
    *,
    root: str | os.PathLike[str],
    tables: TableSettings | None = DEFAULT_TABLES,
    serving: ServingTarget | None = None,
    before: Mapping[str, pa.Table] | None = None,
) -> dict[str, ViewCorrection]:
    """After ``engine.rebuild`` of ``views``: make each output of each view hold the
    rebuilt view as of the last committed epoch, each compared with itself, so a rebuild
    repairs whichever side was wrong (the engine's state, or an output changed behind
    its back) and changes nothing where they agree:

    - the table takes one commit of the rebuilt view minus the table
      (``tables.correct_table``);
    - the change feed takes a correction directory of the rebuilt view minus what the
      feed sums to (``files.export_correction``). When retention has removed early
      changes, the feed's sum is taken to be the view the engine held before the
      rebuild (``before``, which published every change the feed holds), or else the
      table as it was;
    - a serving table at that epoch is made equal to the rebuilt view in one
      transaction (``ServingTarget.reconcile``); one behind takes the feed's
      corrections after the changes, at its catch-up.

    A retry computes each difference again, so an output done before a failure is
    not corrected twice."""
    circuit = engine.circuit.name
    epoch = engine.last_committed_epoch()
    corrected = {}
    for view in views:
        schema = engine.circuit.node(engine.circuit.views[view]).schema
        rebuilt = whole_view(engine, view, epoch)
        item = ViewCorrection(view, epoch)
        corrected[view] = item
        held_by_table = None
        if tables is not None:
            path = table_path(tables.location or root, circuit, view)
            if table_exists(path, storage_options=tables.options):
                held_by_table = _table_as_of(root, path, tables, circuit, view, schema, epoch)
                difference = weighted_difference(rebuilt, held_by_table, schema)
                if len(difference):
                    item.table = correct_table(
                        path,
                        circuit=circuit,
                        view=view,
                        schema=schema,
                        epoch=epoch,
                        rows=difference,
                        settings=tables,
                    )
        held_by_feed = feed_view(root, circuit, view, schema, epoch)
        if held_by_feed is None:
            held_by_feed = (before or {}).get(view, held_by_table)
        if held_by_feed is None:
            raise ExportError(
                f"view {view!r} of circuit {circuit!r} has no table, and its change feed "
                f"lacks early epochs (pruned, or never exported): what the feed holds as "
                f"of epoch {epoch} is unknown, so its correction cannot be computed"
            )
        difference = weighted_difference(rebuilt, held_by_feed, schema)
        if len(difference):
            item.correction = export_correction(root, circuit, view, schema, epoch, difference)
        if serving is not None and serving.serves(view):
            known = [(c.name, c.epoch) for c in exported_corrections(root, circuit, view)]
            item.serving = serving.reconcile(
                circuit, view, schema, epoch, arrow_rows(rebuilt, schema), corrections=known
            )
        log.info("%s", item.describe())
    return corrected


def _table_as_of(
    root: str | os.PathLike[str],
    path: str | os.PathLike[str],
    tables: TableSettings,
    circuit: str,
    view: str,
    schema: Schema,
    epoch: int,
) -> pa.Table:
    """What the table at ``path`` holds of the view as of ``epoch``, corrections included
    (the view's columns and ``__w``): its latest version minus the changes of the later
    epochs it holds (an open epoch already published), which it applied from their change
    directories. Not the version of the epoch: a correction committed after a later
    epoch's version belongs to it too."""
    options = tables.options
    latest = read_table(path, storage_options=options)
    names = [*schema.names, WEIGHT]
    held = latest.select([*schema.names, COPIES]).rename_columns(names)
    later = range(epoch + 1, (table_epoch(path, circuit, view, storage_options=options) or 0) + 1)
    changes = []
    for e in later:
        directory = output_dir(root, circuit, view, CHANGES, e)
        if read_marker(directory) is None:
            raise ExportError(
                f"the table of view {view!r} at {path} holds epoch {e}, whose change "
                f"directory {directory} is not complete: the table's view as of epoch "
                f"{epoch} cannot be told, so no correction can be computed"
            )
        changes.append(pq.read_table(directory, columns=names))
    if not changes:
        return held
    # Subtract: the later changes negated, summed with the latest rows.
    return weighted_difference(held, stacked(changes), schema)


# ================================================================================== evolutions
def _starts_again(
    engine: SparkEngine,
    view: str,
    root: str | os.PathLike[str],
    tables: TableSettings | None,
) -> bool:
    """Whether a view an evolution changed cannot be corrected in place: its change feed
    or its table holds other columns than its new definition gives (names or types),
    or it has neither (never exported, or moved away by a try that failed after)."""
    circuit = engine.circuit.name
    schema = engine.circuit.node(engine.circuit.views[view]).schema
    fed = exported_columns(root, circuit, view)
    if fed is not None and fed != marker_columns(schema):
        return True
    held = None
    if tables is not None:
        path = table_path(tables.location or root, circuit, view)
        if table_exists(path, storage_options=tables.options):
            held = table_columns(path, storage_options=tables.options)
    if held is not None and held != [*schema.names, COPIES]:
        return True
    return fed is None and held is None


def evolve_outputs(
    engine: SparkEngine,
    evolution: Evolution,
    epoch: int,
    *,
    root: str | os.PathLike[str],
    tables: TableSettings | None = DEFAULT_TABLES,
    serving: ServingTarget | None = None,
) -> dict[str, str]:
    """After ``engine``'s circuit evolved in place at ``epoch`` (``engine/spark/evolve.py``):
    each view added gets its whole contents as of ``epoch`` as its first change
    directory (``export_first_changes``) and as its table's first commit; each view
    changed takes a rebuild's correction (``correct_views``), unless its definition
    gave it other columns (or it has no outputs yet): then its outputs are retired and
    it starts again as an added view does, its table elsewhere (such as on S3) replaced
    in the new columns (``replace_table``); each view removed has its outputs moved
    under ``_retired/``, its table elsewhere (such as on S3) too (``retire_table``).
    Every step skips what is done, so a retry completes it. Returns, per view, what was done."""
    circuit = engine.circuit.name
    done: dict[str, str] = {}
    restarted = [view for view in evolution.changed if _starts_again(engine, view, root, tables)]
    for view in restarted:
        moved = retire_outputs(root, circuit, view, epoch)
        log.info(
            "view %s of circuit %s has other columns from epoch %s on: its outputs %s",
            view,
            circuit,
            epoch,
            f"moved to {moved}" if moved else "start again",
        )
    for view in [*evolution.added, *restarted]:
        schema = engine.circuit.node(engine.circuit.views[view]).schema
        rows = whole_view(engine, view, epoch)
        changes = export_first_changes(root, circuit, view, schema, epoch, rows)
        said = [changes.describe()]
        if tables is not None:
            path = table_path(tables.location or root, circuit, view)
            if view in restarted and table_exists(path, storage_options=tables.options):
                table = replace_table(
                    path,
                    circuit=circuit,
                    view=view,
                    schema=schema,
                    epoch=epoch,
                    rows=rows,
                    settings=tables,
                )
            else:
                table = publish_table(
                    path,
                    circuit=circuit,
                    view=view,
                    schema=schema,
                    epoch=epoch,
                    change=rows,
                    whole_view=lambda rows=rows: rows,
                    settings=tables,
                )
            said.append(table.describe())
        how = "added" if view in evolution.added else "changed, with other columns"
        done[view] = f"{how}: {'; '.join(said)}"
    corrected_views = [view for view in evolution.changed if view not in restarted]
    if corrected_views:
        corrected = correct_views(
            engine, corrected_views, root=root, tables=tables, serving=serving
        )
        done.update({view: f"changed: {item.describe()}" for view, item in corrected.items()})
    for view in evolution.removed:
        moved = [retire_outputs(root, circuit, view, epoch)]
        if tables is not None and tables.location is not None:
            moved.append(
                retire_table(tables.location, circuit, view, epoch, storage_options=tables.options)
            )
        said = " and ".join(str(place) for place in moved if place)
        done[view] = f"removed: outputs moved to {said}" if said else "removed: no outputs"
    for view, what in done.items():
        log.info("evolution of circuit %s at epoch %s, view %s %s", circuit, epoch, view, what)
    return done
