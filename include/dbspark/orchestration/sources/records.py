"""What each ingest read, kept so that a later ingest can tell what arrived too late.

An ingest reads a source's batch for its interval once; files that land in that
interval's partition after the epoch commits are never read. Before the ingest unit
runs, the task stores the connector's :meth:`~SourceConnector.record` of the batch
under ``<warehouse>/<circuit>/_ingested/<source>/interval=<slug>.json``, and every
later ingest of the source asks the connector what changed since, for the intervals
of the last ``late_window`` committed epochs (:func:`late_changes`).

The records live in the warehouse because they belong to the circuit that read the
files (two circuits may read one landing directory), and outside the catalog because
they are advice, not state: losing one only means that interval is not checked. So they
are not fsynced, and a committed interval's record is removed once it falls out of the
late window (:meth:`IngestRecords.forget`): no later ingest reads it again. Beside each
record, ``interval=<slug>.reported.json`` lists the late input already warned about, so
each is warned about once (a ``fail`` policy refuses every time: it must be dealt with).
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from dbspark.orchestration.intervals import Interval
from dbspark.orchestration.sources.base import SourceConnector

__all__ = ["IngestRecords", "late_changes", "late_changes_by_interval", "late_window"]


class IngestRecords:
    """The records of one circuit's ingests, by source and interval."""

    def __init__(self, warehouse: str | os.PathLike[str], circuit: str) -> None:
        self.root = Path(warehouse) / circuit / "_ingested"

    def path(self, source: str, interval: Interval) -> Path:
        return self.root / source / f"interval={interval.slug}.json"

    def reported_path(self, source: str, interval: Interval) -> Path:
        """Where the late input already warned about for ``interval`` is kept."""
        return self.root / source / f"interval={interval.slug}.reported.json"

    def reported(self, source: str, interval: Interval) -> set[str]:
        """The lines of late input of ``interval`` that an ingest has warned about."""
        try:
            return set(json.loads(self.reported_path(source, interval).read_text()))
        except (FileNotFoundError, ValueError):
            return set()

    def add_reported(self, source: str, interval: Interval, lines: Iterable[str]) -> None:
        """Remember that ``lines`` of late input of ``interval`` were warned about."""
        known = self.reported(source, interval) | set(lines)
        self._replace(self.reported_path(source, interval), sorted(known))

    def write(self, source: str, interval: Interval, record: Mapping[str, Any]) -> None:
        """Store ``record`` (replacing an earlier attempt's), renamed into place whole."""
        self._replace(self.path(source, interval), record)

    @staticmethod
    def _replace(target: Path, content: Any) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        temporary = target.with_name(f".{target.name}.tmp-{uuid.uuid4().hex}")
        temporary.write_text(json.dumps(content, sort_keys=True))
        os.replace(temporary, target)

    def forget(self, source: str, intervals: Iterable[Interval]) -> int:
        """Remove the records of ``source`` for ``intervals``, and what writes of them
        left when they died before their rename; how many records were removed. Only the
        folder's entries are looked at, which pruning keeps to about the late window."""
        folder = self.root / source
        try:
            names = os.listdir(folder)
        except FileNotFoundError:
            return 0
        intervals = list(intervals)
        wanted = {self.path(source, interval).name for interval in intervals}
        notes = {self.reported_path(source, interval).name for interval in intervals}
        removed = 0
        for name in names:
            leftover = name.startswith(".") and name[1:].split(".tmp-", 1)[0] in wanted | notes
            if name in wanted or name in notes or leftover:
                (folder / name).unlink(missing_ok=True)
                removed += name in wanted
        return removed

    def read(self, source: str, interval: Interval) -> dict[str, Any] | None:
        """The record of the ingest of ``source`` for ``interval``, or None."""
        try:
            return json.loads(self.path(source, interval).read_text())
        except FileNotFoundError:
            return None


def late_changes(
    connector: SourceConnector,
    source: str,
    records: IngestRecords,
    committed: list[Interval],
) -> list[str]:
    """What the connector finds changed in the last ``connector.late_window`` of the
    ``committed`` intervals (oldest first) since each was ingested, one line each."""
    return [
        line
        for _, lines in late_changes_by_interval(connector, source, records, committed)
        for line in lines
    ]


def late_changes_by_interval(
    connector: SourceConnector,
    source: str,
    records: IngestRecords,
    committed: list[Interval],
) -> list[tuple[Interval, list[str]]]:
    """:func:`late_changes`, by interval (those with a change only)."""
    found = []
    for interval in late_window(connector, committed):
        recorded = records.read(source, interval)
        if recorded is not None:
            lines = connector.changes(source, interval, recorded)
            if lines:
                found.append((interval, lines))
    return found


def late_window(connector: SourceConnector, committed: list[Interval]) -> list[Interval]:
    """The committed intervals (oldest first) whose late input an ingest looks for."""
    return committed[-connector.late_window :] if connector.late_window else []
