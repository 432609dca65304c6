"""Files landed per source and interval: :class:`LandingDirectory`.

A writer lands each source's files under ``<root>/<source>/interval=<slug>/``
(:meth:`LandingDirectory.land` does it atomically); the ingest task hands the partition's
files to the engine as one ``FileBatch``, which the engine reads and checks itself.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dbspark.engine.api import InputError
from dbspark.engine.file_batches import FORMATS, FileBatch
from dbspark.orchestration.intervals import Interval
from dbspark.orchestration.sources.base import SourceConnector

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["LandingDirectory"]


#: File extensions by format; compressed files are told by the extension before ``.gz``.
_EXTENSIONS = {".parquet": "parquet", ".csv": "csv", ".jsonl": "jsonl", ".json": "jsonl"}
_COMPRESSED = {".gz", ".bz2"}


def _format_of(path: Path) -> str | None:
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] in _COMPRESSED:
        suffixes.pop()
    return _EXTENSIONS.get(suffixes[-1]) if suffixes else None


def _normal_format(format: str) -> str:
    fmt = str(format).strip().lower()
    fmt = "jsonl" if fmt == "json" else fmt
    if fmt not in FORMATS:
        raise ValueError(f"file format {format!r} is not one of {', '.join(FORMATS)}")
    return fmt


def _is_hidden(name: str) -> bool:
    # Writers' markers and checksums (_SUCCESS, _temporary, .part-0.crc) and our own
    # in-flight files (.name.tmp-...) are not data.
    return name.startswith(("_", "."))


class LandingDirectory(SourceConnector):
    """Files landed per source and interval under ``<root>/<source>/interval=<slug>/``.

    ``slug`` is :attr:`Interval.slug` (``20260101T000000Z``). A partition holds files of
    one format: ``format`` if given, else told by their extensions (``.parquet``,
    ``.csv``, ``.jsonl`` or ``.json``, optionally ``.gz``/``.bz2`` compressed). What a
    file must hold is the engine's business (``engine/spark/files.py``): an upsert
    source's columns, or a Z-set source's columns and an optional ``__w``.

    Names starting with ``_`` or ``.`` are ignored (``_SUCCESS``, ``.crc`` files). A
    missing partition means nothing arrived (``None``), unless ``require_partition``:
    then a writer that must always land something (even only ``_SUCCESS``) is late, and
    that is an error naming the directory. An existing partition without data files is
    an empty batch (``None``).
    """

    def __init__(
        self,
        root: str | os.PathLike[str] | None = None,
        format: str | None = None,
        *,
        require_partition: bool = False,
    ) -> None:
        self._root = None if root is None else Path(root)
        self.format = None if format is None else _normal_format(format)
        self.require_partition = require_partition

    @property
    def root(self) -> Path:
        """The given root, or ``[dbspark] landing`` from ``airflow.cfg`` (read when
        needed, not when the DAG file is parsed), or ``$AIRFLOW_HOME/dbspark/landing``."""
        if self._root is not None:
            return self._root
        from airflow.sdk.configuration import conf

        configured = conf.get("dbspark", "landing", fallback=None)
        if configured:
            return Path(configured)
        return Path(os.environ.get("AIRFLOW_HOME", Path.home() / "airflow")) / "dbspark" / "landing"

    def __repr__(self) -> str:
        root = "[dbspark] landing" if self._root is None else str(self._root)
        return f"LandingDirectory({root!r}, format={self.format!r})"

    def partition(self, source: str, interval: Interval) -> Path:
        """The directory that holds the files of ``source`` for ``interval``."""
        if not source or "/" in source or source in (".", ".."):
            raise ValueError(f"source name {source!r} cannot be a directory name")
        return self.root / source / f"interval={interval.slug}"

    def describe(self, source: str, interval: Interval) -> str:
        fmt = self.format or "format from file extensions"
        return f"source {source!r}: files under {self.partition(source, interval)} ({fmt})"

    def batch(
        self,
        source: str,
        interval: Interval,
        *,
        columns: Sequence[str] = (),
        spark: SparkSession | None = None,
    ) -> FileBatch | None:
        """The partition's data files, sorted by name, as one ``FileBatch`` (or ``None``).

        ``columns`` and ``spark`` are not needed: the engine reads and checks the files.
        """
        directory = self.partition(source, interval)
        if not directory.is_dir():
            if directory.exists():
                raise InputError(source, "the landing partition is not a directory", str(directory))
            if self.require_partition:
                raise InputError(
                    source,
                    f"nothing landed for {interval}: the partition directory does not exist",
                    str(directory),
                )
            return None
        files = []
        for entry in sorted(directory.iterdir(), key=lambda p: p.name):
            if _is_hidden(entry.name):
                continue
            if entry.is_dir():
                raise InputError(
                    source,
                    f"unexpected directory {entry.name!r} in the landing partition",
                    str(directory),
                )
            files.append(entry)
        if not files:
            return None
        return FileBatch([str(p.resolve()) for p in files], self._format(source, directory, files))

    def _format(self, source: str, directory: Path, files: Sequence[Path]) -> str:
        found: dict[str, list[str]] = {}
        unknown = []
        for path in files:
            fmt = _format_of(path)
            if fmt is None:
                unknown.append(path.name)
            else:
                found.setdefault(fmt, []).append(path.name)
        if self.format is not None:
            # Files without a known extension are taken to be of the declared format.
            others = {f: names for f, names in found.items() if f != self.format}
            if others:
                shown = "; ".join(f"{f}: {names}" for f, names in sorted(others.items()))
                raise InputError(
                    source,
                    f"the partition is declared {self.format}, but holds other files ({shown})",
                    str(directory),
                )
            return self.format
        if unknown:
            raise InputError(
                source,
                f"cannot tell the format of {unknown} from the extension "
                f"(.parquet, .csv, .jsonl, .json); give LandingDirectory a format",
                str(directory),
            )
        if len(found) > 1:
            shown = "; ".join(f"{f}: {names}" for f, names in sorted(found.items()))
            raise InputError(source, f"the partition mixes file formats ({shown})", str(directory))
        return next(iter(found))

    def land(
        self,
        source: str,
        interval: Interval,
        rows: Iterable[Sequence[Any] | Mapping[str, Any]],
        columns: Sequence[str],
        format: str = "parquet",
        *,
        name: str | None = None,
    ) -> Path:
        """Write ``rows`` as one file into the partition, atomically; return its path.

        Rows are tuples in ``columns`` order or mappings by column name (a missing key is
        NULL). The file is written under a hidden temporary name and renamed, so a reader
        never sees half a file. ``name`` (without extension) defaults to the next free
        ``part-NNNNN``; landing under an existing name replaces that file. Parquet column
        types are inferred from the values (Python ``int`` is BIGINT, a column of only
        NULLs fits any type). CSV writes NULL as an empty field (so an empty string reads
        back as NULL) and cannot hold arrays.
        """
        fmt = _normal_format(format)
        columns = list(columns)
        if len(set(columns)) != len(columns):
            raise ValueError(f"columns {columns} name a column more than once")
        records = [_as_record(row, columns, i) for i, row in enumerate(rows)]
        directory = self.partition(source, interval)
        directory.mkdir(parents=True, exist_ok=True)
        extension = ".jsonl" if fmt == "jsonl" else f".{fmt}"
        target = directory / f"{name or self._next_name(directory)}{extension}"
        temporary = directory / f".{target.name}.tmp-{uuid.uuid4().hex}"
        try:
            _WRITERS[fmt](temporary, columns, records)
            with temporary.open("rb") as handle:
                os.fsync(handle.fileno())
            os.replace(temporary, target)
        finally:
            with contextlib.suppress(FileNotFoundError):
                temporary.unlink()
        return target

    @staticmethod
    def _next_name(directory: Path) -> str:
        taken = {p.name.split(".")[0] for p in directory.iterdir() if not _is_hidden(p.name)}
        index = 0
        while f"part-{index:05d}" in taken:
            index += 1
        return f"part-{index:05d}"


def _as_record(row: Sequence[Any] | Mapping[str, Any], columns: list[str], position: int) -> dict:
    if isinstance(row, Mapping):
        unknown = sorted(set(row) - set(columns))
        if unknown:
            raise ValueError(f"row {position} has unknown column(s) {unknown}; columns {columns}")
        return {c: row.get(c) for c in columns}
    values = list(row)
    if len(values) != len(columns):
        raise ValueError(
            f"row {position} {values!r} has {len(values)} values for the "
            f"{len(columns)} columns {columns}"
        )
    return dict(zip(columns, values, strict=True))


def _write_parquet(path: Path, columns: list[str], records: list[dict]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({c: pa.array([r[c] for r in records]) for c in columns})
    pq.write_table(table, path)


def _write_csv(path: Path, columns: list[str], records: list[dict]) -> None:
    def field(column: str, value: Any) -> Any:
        if isinstance(value, (list, tuple, dict)):
            raise ValueError(f"column {column!r}: CSV cannot hold {value!r}; use parquet or jsonl")
        if isinstance(value, bool):  # Spark's CSV reader wants true/false, not True/False
            return "true" if value else "false"
        return "" if value is None else value

    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(columns)
        for record in records:
            writer.writerow([field(c, record[c]) for c in columns])


def _write_jsonl(path: Path, columns: list[str], records: list[dict]) -> None:
    with path.open("w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, allow_nan=False) + "\n")


_WRITERS = {"parquet": _write_parquet, "csv": _write_csv, "jsonl": _write_jsonl}
