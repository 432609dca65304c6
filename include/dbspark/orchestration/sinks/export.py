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
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

from dbspark.core.columns import WEIGHT
from dbspark.orchestration.sinks.files import (
    CHANGES,
    DirectoryExport,
    ExportError,
    change_rows,
    export_changes,
    export_snapshot,
    read_change_rows,
)
from dbspark.orchestration.sinks.serving import ServingResult, ServingTarget
from dbspark.orchestration.sinks.tables import (
    TableCommit,
    TableSettings,
    publish_table,
    table_path,
)

if TYPE_CHECKING:
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
                change = read_change_rows(item.changes.path, schema)
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

    def whole_view() -> pa.Table:
        table = engine.view_table(view, epoch)
        return table if table is not None else engine.view_frame(view, epoch).toArrow()

    return publish_table(
        table_path(settings.location or root, circuit, view),
        circuit=circuit,
        view=view,
        schema=schema,
        epoch=epoch,
        change=pq.read_table(changes.path, columns=columns),
        whole_view=whole_view,
        interval=engine.catalog.epoch_labels(circuit).get(epoch),
        settings=settings,
    )
