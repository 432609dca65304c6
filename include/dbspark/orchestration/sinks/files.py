"""A view's snapshot and change feed as Parquet directories, for readers outside dbspark.

``<root>/<circuit>/<view>/snapshot/epoch=<n>/``
    the whole view as of epoch ``n``: the view's columns plus ``__w``, the row's
    multiplicity (never 0). Written by Spark's Parquet writer, never collected, and only
    when ``export_epoch(snapshots=True)`` asks: the publish task does not, since the
    view's Delta table (``tables``) holds it as of every epoch without rewriting it.
``<root>/<circuit>/<view>/changes/epoch=<n>/``
    the epoch's change: the view's columns plus ``__w`` (positive: copies
    inserted, negative: copies deleted). An empty change is still written, as a
    Parquet dataset with no rows and the right schema, so that "nothing changed"
    differs from "not exported yet". Summing ``__w`` per row over epochs
    ``0..n`` gives the snapshot of epoch ``n``.

``<root>/<circuit>/<view>/corrections/rebuild=<n>/``
    a rebuild's correction (``correct_views`` in ``export.py``): the rows by which the
    rebuilt view differs from what the feed summed to, signed as a change is, with the
    epoch it corrects in its marker; the view's ``n``-th. A correction of epoch ``e``
    belongs to the view as of ``e`` and every later epoch, so the changes of epochs
    ``0..n`` and the corrections of epochs up to ``n`` sum to the view as of ``n``
    (:func:`feed_view`).

All of them are published atomically: Spark writes into a hidden sibling
(``.epoch=<n>.tmp-<id>``, which Spark and Arrow readers skip), a ``_dbspark.json``
marker (epoch, rows, columns) is added, and one ``rename`` makes data and marker
visible together. A directory with its marker is complete, so a retried task skips
it; readers must likewise only trust directories that have the marker
(:func:`read_changes`, :func:`read_snapshot`, :func:`read_change_rows`). Reading
``<view>/changes`` as one dataset gives an ``epoch`` partition column. A hidden
sibling left by a killed process (no ``finally`` runs on SIGKILL) is removed by the
maintenance task once older than ``gc_min_age_hours`` (:func:`sweep_unfinished_exports`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from dbspark.core.columns import WEIGHT
from dbspark.core.types import BIGINT, Schema, element_type, is_array
from dbspark.storage.durability import sync_directories, sync_tree

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from dbspark.engine.spark.executor import SparkEngine

MARKER = "_dbspark.json"
SNAPSHOT = "snapshot"
CHANGES = "changes"
KINDS = (SNAPSHOT, CHANGES)
CORRECTIONS = "corrections"
#: The hidden siblings :func:`_publish_dir` writes into (``.epoch=3.tmp-<id>``,
#: ``.rebuild=2.tmp-<id>``) or moves a marker-less directory aside to (``.stale-<id>``).
UNFINISHED = re.compile(r"\.(?:epoch|rebuild)=\d+\.(?:tmp|stale)-[0-9a-f]+")

#: One row of a view in schema order, and its weight (a multiplicity or a change).
WeightedRow = tuple[tuple[Any, ...], int]
#: Rows of a change read, counted or applied at a time: the memory a change costs.
CHUNK_ROWS = 10_000


class ExportError(RuntimeError):
    """An export cannot be written or read as asked."""


# ==================================================================================== paths
def output_dir(
    root: str | os.PathLike[str], circuit: str, view: str, kind: str, epoch: int
) -> Path:
    """``<root>/<circuit>/<view>/<kind>/epoch=<n>``; ``kind`` is ``snapshot`` or ``changes``."""
    if kind not in KINDS:
        raise ValueError(f"unknown export kind {kind!r}; use one of {', '.join(KINDS)}")
    return Path(root) / circuit / view / kind / f"epoch={int(epoch)}"


def read_marker(path: Path) -> dict[str, Any] | None:
    """The completion marker of an export directory, or None when it is not complete."""
    try:
        return json.loads((path / MARKER).read_text())
    except FileNotFoundError:
        return None


def exported_epochs(
    root: str | os.PathLike[str], circuit: str, view: str, kind: str = CHANGES
) -> list[int]:
    """The epochs whose ``kind`` export of ``view`` is complete, ascending."""
    base = output_dir(root, circuit, view, kind, 0).parent
    if not base.is_dir():
        return []
    epochs = []
    for child in base.iterdir():
        # Hidden temporaries (".epoch=3.tmp-...") are never complete exports.
        if child.name.startswith("epoch=") and read_marker(child) is not None:
            epochs.append(int(child.name.removeprefix("epoch=")))
    return sorted(epochs)


def exported_columns(
    root: str | os.PathLike[str], circuit: str, view: str
) -> list[list[str]] | None:
    """The columns of the view's latest complete change directory (``marker_columns``);
    None when it has none."""
    epochs = exported_epochs(root, circuit, view)
    marker = read_marker(output_dir(root, circuit, view, CHANGES, epochs[-1])) if epochs else None
    return None if marker is None else marker.get("columns")


# ==================================================================================== writing
@dataclass
class DirectoryExport:
    """One snapshot or change directory: where it is and what is in it."""

    kind: str
    path: Path | None  # None: computed for serving only, not written
    rows: int
    skipped: bool = False
    inserted: int = 0  # changes only: sum of the positive weights
    deleted: int = 0  # changes only: sum of the negative weights, as a positive count

    def describe(self) -> str:
        where = "not written" if self.path is None else str(self.path)
        where += " (already exported)" if self.skipped else ""
        if self.kind == SNAPSHOT:
            return f"snapshot {self.rows} rows -> {where}"
        return f"change +{self.inserted}/-{self.deleted} in {self.rows} rows -> {where}"


def export_snapshot(
    engine: SparkEngine, view: str, epoch: int, root: str | os.PathLike[str]
) -> DirectoryExport:
    """Write the snapshot directory of ``view`` at ``epoch`` under ``root``, unless it is
    already complete."""
    circuit = engine.circuit.name
    schema = engine.circuit.node(engine.circuit.views[view]).schema
    path = output_dir(root, circuit, view, SNAPSHOT, epoch)
    skipped, marker = _publish_dir(
        path,
        lambda tmp: _write_frame(_view(engine, view, epoch), [*schema.names, WEIGHT], tmp),
        _marker(circuit, view, SNAPSHOT, epoch, schema),
    )
    return DirectoryExport(SNAPSHOT, path, int(marker["rows"]), skipped)


def export_changes(
    engine: SparkEngine, view: str, epoch: int, root: str | os.PathLike[str]
) -> DirectoryExport:
    """Write the change directory of ``view`` for ``epoch`` under ``root``, unless it is
    already complete. Only possible before ``engine.close_epoch(epoch)``."""
    circuit = engine.circuit.name
    schema = engine.circuit.node(engine.circuit.views[view]).schema
    path = output_dir(root, circuit, view, CHANGES, epoch)
    return _change_dir(
        path,
        lambda tmp: _write_change(engine, view, epoch, schema, tmp),
        _marker(circuit, view, CHANGES, epoch, schema),
    )


def _change_dir(
    path: Path, write: Callable[[Path], Mapping[str, Any]], marker: Mapping[str, Any]
) -> DirectoryExport:
    """A change directory written atomically (``_publish_dir``), as exported."""
    skipped, written = _publish_dir(path, write, marker)
    return DirectoryExport(
        CHANGES,
        path,
        int(written["rows"]),
        skipped,
        inserted=int(written.get("inserted", 0)),
        deleted=int(written.get("deleted", 0)),
    )


def _publish_dir(
    final: Path,
    write: Callable[[Path], Mapping[str, Any]],
    marker: Mapping[str, Any],
) -> tuple[bool, dict[str, Any]]:
    """Write a directory atomically: ``write(tmp)`` fills a hidden sibling, which gets the
    marker and is renamed into place. Returns (skipped, marker of the final directory)."""
    existing = read_marker(final)
    if existing is not None:
        return True, existing
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}.tmp-{uuid.uuid4().hex[:12]}"
    try:
        stats = write(tmp)
        content = {**marker, **stats, "written_at": datetime.now(UTC).isoformat()}
        (tmp / MARKER).write_text(json.dumps(content, indent=1, sort_keys=True) + "\n")
        # On disk before it is visible, and visible on disk before the epoch commits
        # (issue 18, finding 5): the files, then the rename's folder and those above it.
        sync_tree(tmp, up_to=final.parent)
        try:
            tmp.rename(final)
        except OSError:
            # Either a concurrent attempt won the race (its directory is complete, keep
            # it), or a directory without marker is in the way: not ours to trust.
            winner = read_marker(final)
            if winner is not None:
                return True, winner
            stale = final.parent / f".{final.name}.stale-{uuid.uuid4().hex[:12]}"
            final.rename(stale)
            shutil.rmtree(stale, ignore_errors=True)
            tmp.rename(final)
        sync_directories(final.parent, up_to=final.parents[min(3, len(final.parents) - 1)])
        return False, content
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ==================================================================================== corrections
@dataclass(frozen=True)
class CorrectionExport:
    """One complete correction directory and what its marker says."""

    path: Path
    number: int
    epoch: int
    rows: int
    inserted: int
    deleted: int

    @property
    def name(self) -> str:
        return self.path.name

    def describe(self) -> str:
        return (
            f"correction of epoch {self.epoch}: +{self.inserted}/-{self.deleted} in "
            f"{self.rows} rows -> {self.path}"
        )


def corrections_dir(root: str | os.PathLike[str], circuit: str, view: str) -> Path:
    return Path(root) / circuit / view / CORRECTIONS


def exported_corrections(
    root: str | os.PathLike[str], circuit: str, view: str
) -> list[CorrectionExport]:
    """The complete corrections of ``view``, oldest first."""
    base = corrections_dir(root, circuit, view)
    if not base.is_dir():
        return []
    found = []
    for child in base.iterdir():
        marker = read_marker(child) if child.name.startswith("rebuild=") else None
        if marker is None:
            continue
        found.append(
            CorrectionExport(
                child,
                int(child.name.removeprefix("rebuild=")),
                int(marker["epoch"]),
                int(marker["rows"]),
                int(marker.get("inserted", 0)),
                int(marker.get("deleted", 0)),
            )
        )
    return sorted(found, key=lambda c: c.number)


def export_correction(
    root: str | os.PathLike[str],
    circuit: str,
    view: str,
    schema: Schema,
    epoch: int,
    rows: pa.Table,
) -> CorrectionExport:
    """Write ``rows`` (the view's columns and ``__w``) as the view's next correction, of
    ``epoch``, atomically."""
    columns = [*schema.names, WEIGHT]
    number = 1 + max((c.number for c in exported_corrections(root, circuit, view)), default=0)
    path = corrections_dir(root, circuit, view) / f"rebuild={number}"
    marker = {
        **_marker(circuit, view, CHANGES, epoch, schema),
        "kind": CORRECTIONS,
        "rebuild": number,
    }
    _publish_dir(path, lambda tmp: _write_counted(rows, columns, tmp), marker)
    (done,) = [c for c in exported_corrections(root, circuit, view) if c.path == path]
    return done


def read_correction(correction: CorrectionExport, schema: Schema) -> pa.Table:
    """The correction's rows: the view's columns and ``__w``."""
    return pq.read_table(correction.path, columns=[*schema.names, WEIGHT])


def feed_complete(root: str | os.PathLike[str], circuit: str, view: str, epoch: int) -> bool:
    """Whether the change directories of ``view`` from its first epoch (0, or the epoch
    an evolution added it at, ``export_first_changes``) to ``epoch`` are all there."""
    exported = set(exported_epochs(root, circuit, view, CHANGES))
    return all(e in exported for e in range(feed_start(root, circuit, view, epoch), epoch + 1))


def feed_start(root: str | os.PathLike[str], circuit: str, view: str, epoch: int) -> int:
    """The epoch ``view``'s change feed starts at, as of ``epoch``: 0, or the last epoch
    up to ``epoch`` at which an evolution added the view (its change directory there
    holds the whole view, marked ``first``)."""
    starts = [
        e
        for e in exported_epochs(root, circuit, view, CHANGES)
        if e <= epoch
        and (read_marker(output_dir(root, circuit, view, CHANGES, e)) or {}).get("first")
    ]
    return max(starts, default=0)


def export_first_changes(
    root: str | os.PathLike[str],
    circuit: str,
    view: str,
    schema: Schema,
    epoch: int,
    rows: pa.Table,
) -> DirectoryExport:
    """The change directory of a view added at ``epoch`` by an evolution: ``rows`` (its
    whole contents then, the view's columns and ``__w``), marked as the feed's first
    (``feed_start``); skipped when already complete."""
    path = output_dir(root, circuit, view, CHANGES, epoch)
    columns = [*schema.names, WEIGHT]
    return _change_dir(
        path,
        lambda tmp: _write_counted(rows, columns, tmp),
        {**_marker(circuit, view, CHANGES, epoch, schema), "first": True},
    )


#: Where the outputs of views an evolution removed go (``retire_outputs``).
RETIRED = "_retired"


def retire_outputs(
    root: str | os.PathLike[str], circuit: str, view: str, epoch: int
) -> Path | None:
    """Move the outputs of ``view`` (removed from its circuit by an evolution at
    ``epoch``) under ``<root>/<circuit>/_retired/``, out of readers' way and kept for
    whoever still wants them; None when it has none (or they moved already)."""
    folder = Path(root) / circuit / view
    if not folder.is_dir():
        return None
    target = Path(root) / circuit / RETIRED / f"{view}@epoch={int(epoch)}"
    if target.exists():
        target = target.with_name(f"{target.name}-{uuid.uuid4().hex[:8]}")
    target.parent.mkdir(parents=True, exist_ok=True)
    folder.rename(target)
    sync_directories(target.parent, up_to=Path(root))
    sync_directories(folder.parent, up_to=Path(root))
    return target


def feed_view(
    root: str | os.PathLike[str], circuit: str, view: str, schema: Schema, epoch: int
) -> pa.Table | None:
    """The view as of ``epoch`` as the feed gives it, summed: the changes of epochs
    ``0..epoch`` and the corrections of epochs up to it (the view's columns and ``__w``,
    not consolidated); None when a change directory is missing (pruned by retention)."""
    if not feed_complete(root, circuit, view, epoch):
        return None
    columns = [*schema.names, WEIGHT]
    parts = [
        pq.read_table(output_dir(root, circuit, view, CHANGES, e), columns=columns)
        for e in range(feed_start(root, circuit, view, epoch), epoch + 1)
    ]
    parts += [
        read_correction(c, schema)
        for c in exported_corrections(root, circuit, view)
        if c.epoch <= epoch
    ]
    return stacked(parts)


def stacked(parts: Sequence[pa.Table]) -> pa.Table:
    """Tables of one view's columns and ``__w``, as one (not consolidated). Spark and
    Arrow wrote their directories: the same columns, perhaps not the same types."""
    return pa.concat_tables([part.cast(parts[0].schema) for part in parts])


def weighted_difference(new: pa.Table, old: pa.Table, schema: Schema) -> pa.Table:
    """``new - old``, both the view's columns and ``__w``: per distinct row the weight
    it gains (positive) or loses (negative), rows of no change left out."""
    columns = [*schema.names, WEIGHT]
    new, old = new.select(columns), old.select(columns).cast(new.select(columns).schema)
    negated = old.set_column(len(columns) - 1, WEIGHT, pc.negate(old.column(WEIGHT)))
    both = pa.concat_tables([new, negated])
    try:
        summed = both.group_by(list(schema.names), use_threads=False).aggregate([(WEIGHT, "sum")])
        summed = summed.rename_columns([*schema.names, WEIGHT]).select(columns)
        return summed.filter(pc.not_equal(summed.column(WEIGHT), 0)).cast(new.schema)
    except (pa.ArrowNotImplementedError, pa.ArrowTypeError):
        # Arrays among the columns: Arrow does not group by them.
        totals: dict[tuple[Any, ...], int] = {}
        for row, weight in arrow_rows(both, schema):
            totals[row] = totals.get(row, 0) + weight
        kept = [(row, w) for row, w in totals.items() if w != 0]
        data = {name: [row[i] for row, _ in kept] for i, name in enumerate(schema.names)}
        data[WEIGHT] = [w for _, w in kept]
        return pa.table(data, schema=new.schema)


def prune_exports(
    root: str | os.PathLike[str], circuit: str, view: str, epochs: Iterable[int]
) -> list[Path]:
    """Remove the change and snapshot directories of ``epochs`` of ``view`` (retention):
    each marker first, so no reader trusts a directory being removed, then the rest.
    Returns the directories removed."""
    removed = []
    for kind in KINDS:
        for epoch in epochs:
            where = output_dir(root, circuit, view, kind, epoch)
            if not where.exists():
                continue
            (where / MARKER).unlink(missing_ok=True)
            shutil.rmtree(where, ignore_errors=True)
            removed.append(where)
    return removed


def sweep_unfinished_exports(
    root: str | os.PathLike[str],
    circuit: str,
    views: Iterable[str],
    *,
    min_age_seconds: float,
    now: float | None = None,
) -> list[Path]:
    """Remove the hidden directories of ``views`` (snapshot, changes and corrections) that
    :func:`_publish_dir` leaves behind when its process is killed (a ``finally`` does not
    run on SIGKILL): ``.epoch=<n>.tmp-<id>`` and ``.rebuild=<n>.tmp-<id>`` written and
    never renamed, ``.stale-<id>`` moved aside and not yet deleted. Only those older than
    ``min_age_seconds``; returns the directories removed.

    No reader looks at them (readers trust only directories named ``epoch=<n>`` or
    ``rebuild=<n>`` with their marker), and a retried export writes a new one. What is
    spared is an export still writing: its directory is renamed (or removed) seconds
    after its last file is written. A directory's age is that of its newest entry, the
    files and folders within included (a long write keeps making new ones), on this
    host's clock (``now``, default ``time.time()``) against the modification times the
    exporting host's file system set: an entry dated in the future (clock skew) is
    younger than any minimum age. With the maintenance task's default minimum age
    (``gc_min_age_hours``, 6 h) only a skew of hours could touch a live export; a
    minimum age of 0 is for when nothing exports (tests), as for garbage collection."""
    now = time.time() if now is None else now
    removed = []
    for view in views:
        kinds = [output_dir(root, circuit, view, kind, 0).parent for kind in KINDS]
        for base in [*kinds, corrections_dir(root, circuit, view)]:
            try:
                children = list(base.iterdir())
            except (FileNotFoundError, NotADirectoryError):
                continue
            for child in sorted(children):
                if not UNFINISHED.fullmatch(child.name):
                    continue
                newest = _newest_mtime(child)
                if newest is None or now - newest < min_age_seconds:
                    continue  # gone meanwhile (renamed into place), or young
                shutil.rmtree(child, ignore_errors=True)
                if not child.exists():
                    removed.append(child)
    return removed


def _newest_mtime(path: Path) -> float | None:
    """The latest modification time of ``path`` and everything under it (symlinks not
    followed); None when ``path`` is gone. Entries vanishing meanwhile are skipped."""
    try:
        newest = path.lstat().st_mtime
    except FileNotFoundError:
        return None
    for folder, dirs, files in os.walk(path):
        for name in (*dirs, *files):
            try:
                newest = max(newest, os.lstat(os.path.join(folder, name)).st_mtime)
            except FileNotFoundError:
                continue
    return newest


def _view(engine: SparkEngine, view: str, epoch: int, *, change: bool = False) -> Any:
    """The view (or its change) as Arrow when it is small enough to read in this process
    (no Spark job for a small epoch's export), else as a Spark DataFrame."""
    table = engine.view_table(view, epoch, change=change)
    if table is not None:
        return table
    return engine.view_change(view, epoch) if change else engine.view_frame(view, epoch)


def change_rows(engine: SparkEngine, view: str, epoch: int, schema: Schema) -> list[WeightedRow]:
    """The epoch's change of ``view`` on the driver, for serving without a change feed."""
    change = _view(engine, view, epoch, change=True)
    if isinstance(change, pa.Table):
        return arrow_rows(change, schema)
    from dbspark.engine.spark.frames import frame_to_zset

    return list(frame_to_zset(change, schema).items())


def _write_frame(frame: DataFrame | pa.Table, columns: Sequence[str], tmp: Path) -> dict[str, int]:
    from dbspark.storage.warehouse import parquet_stats, spark_path

    # An empty frame is written as one empty part file with the schema (what Spark does),
    # which is what lets readers tell an empty change from a missing one.
    if isinstance(frame, pa.Table):
        tmp.mkdir()
        pq.write_table(frame.select(list(columns)), tmp / f"part-00000-{uuid.uuid4().hex}.parquet")
    else:
        frame.select(*columns).write.mode("error").parquet(spark_path(tmp))
    rows, size = parquet_stats(tmp)
    return {"rows": rows, "bytes": size}


def _write_change(
    engine: SparkEngine, view: str, epoch: int, schema: Schema, tmp: Path
) -> dict[str, int]:
    columns = [*schema.names, WEIGHT]
    return _write_counted(_view(engine, view, epoch, change=True), columns, tmp)


def _write_counted(
    frame: DataFrame | pa.Table, columns: Sequence[str], tmp: Path
) -> dict[str, int]:
    """:func:`_write_frame` of a change or a correction, with its marker's +/- counts read
    back from the files just written (:func:`weight_sums`)."""
    stats = _write_frame(frame, columns, tmp)
    stats["inserted"], stats["deleted"] = weight_sums(tmp)
    return stats


def weight_sums(path: Path) -> tuple[int, int]:
    """The sums of the positive weights and of the negative ones (as a positive count)
    of the change files under ``path``, read a batch of the weight column at a time:
    a change of any size is counted in bounded memory, without a Python row."""
    inserted = deleted = 0
    for part in _parts(path):
        for batch in pq.ParquetFile(part).iter_batches(columns=[WEIGHT], batch_size=CHUNK_ROWS):
            weights = batch.column(0)
            inserted += pc.sum(pc.if_else(pc.greater(weights, 0), weights, 0)).as_py() or 0
            deleted -= pc.sum(pc.if_else(pc.less(weights, 0), weights, 0)).as_py() or 0
    return inserted, deleted


def marker_columns(schema: Schema) -> list[list[str]]:
    """The columns a directory of ``schema``'s view holds, as its marker lists them:
    ``[name, type]``, ``__w`` last."""
    return [[name, type_name] for name, type_name in schema.fields] + [[WEIGHT, BIGINT]]


def _marker(circuit: str, view: str, kind: str, epoch: int, schema: Schema) -> dict[str, Any]:
    return {
        "format": 1,
        "circuit": circuit,
        "view": view,
        "kind": kind,
        "epoch": int(epoch),
        "columns": marker_columns(schema),
    }


# ==================================================================================== reading
def read_change_rows(path: Path, schema: Schema) -> list[WeightedRow]:
    """The rows of one complete change directory, on the driver (a change is small)."""
    if read_marker(path) is None:
        raise ExportError(f"{path} is not a complete export (no {MARKER})")
    return _parquet_rows(path, schema)


def iter_change_rows(path: Path, schema: Schema) -> Iterator[list[WeightedRow]]:
    """The rows of one complete change directory, ``CHUNK_ROWS`` at a time: what a
    serving table applies in bounded memory, however large the change."""
    if read_marker(path) is None:
        raise ExportError(f"{path} is not a complete export (no {MARKER})")
    columns = [*schema.names, WEIGHT]
    for part in _parts(path):
        for batch in pq.ParquetFile(part).iter_batches(columns=columns, batch_size=CHUNK_ROWS):
            yield arrow_rows(pa.Table.from_batches([batch]), schema)


def _parts(path: Path) -> list[Path]:
    """The data files of an export directory, as Arrow and Spark read it: not the
    ``_``- and ``.``-prefixed ones (_SUCCESS, the marker, .crc)."""
    return sorted(
        p
        for p in path.rglob("*.parquet")
        if not any(n.startswith(("_", ".")) for n in p.relative_to(path).parts)
    )


def _parquet_rows(path: Path, schema: Schema) -> list[WeightedRow]:
    # Arrow skips "_"- and "."-prefixed files (_SUCCESS, the marker, .crc) like Spark.
    return arrow_rows(pq.read_table(path, columns=[*schema.names, WEIGHT]), schema)


def arrow_rows(table: pa.Table, schema: Schema) -> list[WeightedRow]:
    """The rows of an Arrow table of the view's columns and ``__w``."""
    return [
        (tuple(_from_arrow(record[n], t) for n, t in schema.fields), int(record[WEIGHT]))
        for record in table.to_pylist()
    ]


def _from_arrow(value: Any, type_name: str) -> Any:
    if value is None:
        return None
    if is_array(type_name):
        inner = element_type(type_name)
        return tuple(_from_arrow(v, inner) for v in value)
    return value


def read_changes(
    spark: SparkSession,
    root: str | os.PathLike[str],
    circuit: str,
    view: str,
    epochs: Iterable[int] | None = None,
) -> DataFrame:
    """The exported changes of ``view`` for ``epochs`` (default: every complete one) as one
    frame: the view's columns, ``__w`` and ``epoch``. A missing epoch is an error."""
    from dbspark.storage.warehouse import spark_path

    available = exported_epochs(root, circuit, view, CHANGES)
    wanted = available if epochs is None else sorted({int(e) for e in epochs})
    missing = sorted(set(wanted) - set(available))
    if missing:
        raise ExportError(
            f"the changes of view {view!r} of circuit {circuit!r} are not exported for "
            f"epochs {missing} (exported: {available or 'none'})"
        )
    if not wanted:
        raise ExportError(f"no exported changes of view {view!r} of circuit {circuit!r}")
    paths = [output_dir(root, circuit, view, CHANGES, e) for e in wanted]
    base = paths[0].parent
    return spark.read.option("basePath", spark_path(base)).parquet(*(spark_path(p) for p in paths))


def read_snapshot(
    spark: SparkSession, root: str | os.PathLike[str], circuit: str, view: str, epoch: int
) -> DataFrame:
    """The exported snapshot of ``view`` at ``epoch`` (view columns and ``__w``)."""
    from dbspark.storage.warehouse import spark_path

    path = output_dir(root, circuit, view, SNAPSHOT, epoch)
    if read_marker(path) is None:
        raise ExportError(
            f"the snapshot of view {view!r} of circuit {circuit!r} at epoch {epoch} is not "
            f"exported (no complete {path})"
        )
    return spark.read.parquet(spark_path(path))
