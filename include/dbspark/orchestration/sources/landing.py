"""Files landed per source and interval: :class:`LandingDirectory`.

A writer lands each source's files under ``<root>/<source>/interval=<slug>/``
(:meth:`LandingDirectory.land` does it atomically), where ``slug`` is the interval's
start in UTC whatever the DAG's time zone; the ingest task hands the partition's files
to the engine as one ``FileBatch``, which the engine reads and checks itself.

What the connector checks before the engine reads anything:

* **the partition is there** (``require_partition``, on by default): a writer lands
  something for every interval, if only a completion marker, so a missing partition
  is a late writer, not an empty interval;
* **the completion marker**, when the writer leaves one (``_dbspark_complete.json``,
  :data:`COMPLETION_MARKER`): the partition's data files must be exactly the files it
  names, each with the number of rows it says;
* **text is UTF-8**: a CSV or JSON-lines file with bytes that are not UTF-8 is refused
  naming its line (Spark would read them as U+FFFD, silently);
* **no symbolic links**: a partition, or a file in it, that is a symbolic link is
  refused; it could read anything the worker can, and a link's target may change
  after the epoch commits.

File names are read literally (``a[1].csv`` is that file, not a glob).
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

from dbspark.core.types import Schema
from dbspark.engine.api import InputError
from dbspark.engine.file_batches import FORMATS, TEXT_FORMATS, FileBatch, open_binary, utf8_lines
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

    ``slug`` is :attr:`Interval.slug`, the interval's start in UTC (``20260101T000000Z``)
    in every schedule, so a time zone's daylight-saving change never renames a partition.
    A partition holds files of one format: ``format`` if given, else told by their
    extensions (``.parquet``, ``.csv``, ``.jsonl`` or ``.json``, optionally
    ``.gz``/``.bz2`` compressed). What a file must hold is the engine's business
    (``engine/spark/files.py``): an upsert source's columns, or a Z-set source's columns
    and an optional ``__w``.

    Names starting with ``_`` or ``.`` are ignored (``_SUCCESS``, ``.crc`` files), except
    the completion marker (:func:`read_marker`). A missing partition is an error naming
    the source and the expected directory, since a writer that must land something for
    every interval (a completion marker, or only ``_SUCCESS``, when nothing arrived) is
    late; ``require_partition=False`` makes it an empty batch instead, for a source
    that lands only when it has data. An existing partition without data files is an
    empty batch (``None``).

    ``late_files`` says what an ingest does about files of an earlier, committed interval
    that arrived, changed or vanished after that interval was ingested
    (:meth:`changes`): ``"warn"`` logs them, ``"fail"`` refuses the ingest; ``None``
    reads ``[dbspark] late_files`` from ``airflow.cfg`` (default ``"warn"``).
    ``late_window`` is how many earlier intervals each ingest looks back at.
    """

    def __init__(
        self,
        root: str | os.PathLike[str] | None = None,
        format: str | None = None,
        *,
        require_partition: bool = True,
        late_files: str | None = None,
        late_window: int = 24,
    ) -> None:
        self._root = None if root is None else Path(root)
        self.format = None if format is None else _normal_format(format)
        self.require_partition = require_partition
        self._late_files = None if late_files is None else _late_policy(late_files)
        if late_window < 0:
            raise ValueError(f"late_window must be 0 or more, not {late_window}")
        self.late_window = late_window

    @property
    def root(self) -> Path:
        """The given root, or ``[dbspark] landing`` from ``airflow.cfg`` (read when
        needed, not when the DAG file is parsed), or ``$AIRFLOW_HOME/dbspark/landing``."""
        if self._root is not None:
            return self._root
        configured = _airflow_setting("landing")
        if configured:
            return Path(configured)
        return Path(os.environ.get("AIRFLOW_HOME", Path.home() / "airflow")) / "dbspark" / "landing"

    @property
    def late_files(self) -> str:
        """``"warn"`` or ``"fail"``: the given policy, else ``[dbspark] late_files``."""
        if self._late_files is not None:
            return self._late_files
        return _late_policy(_airflow_setting("late_files") or "warn")

    def __repr__(self) -> str:
        root = "[dbspark] landing" if self._root is None else str(self._root)
        return f"LandingDirectory({root!r}, format={self.format!r})"

    def partition(self, source: str, interval: Interval) -> Path:
        """The directory that holds the files of ``source`` for ``interval``."""
        if not source or "/" in source or source in (".", ".."):
            raise ValueError(f"source name {source!r} cannot be a directory name")
        return self.root / source / f"interval={interval.slug}"

    def dataset(self, source: str) -> tuple[str, str] | None:
        """The source's landing directory (every interval's partition), a local path."""
        return "file", str(self.root / source)

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
        scratch: Path | None = None,
        schema: Schema | None = None,
    ) -> FileBatch | None:
        """The partition's data files, sorted by name, as one ``FileBatch`` (or ``None``).

        ``columns``, ``spark``, ``scratch`` and ``schema`` are not needed: the engine reads
        and checks the files where they are.
        Text files are checked to be UTF-8 here; with a completion marker, the files and
        their row counts are checked against it (see the module docstring).
        """
        directory = self.partition(source, interval)
        files = self._data_files(source, interval)
        if files is None:
            return None
        fmt = self._format(source, directory, files) if files else None
        marker = read_marker(source, directory)
        if fmt in TEXT_FORMATS or marker is not None:  # text is always scanned for UTF-8
            counts = {path.name: _count_rows(source, path, fmt) for path in files}  # type: ignore[arg-type]
            if marker is not None:
                _check_marker(source, directory, marker, counts)
        if not files:
            return None
        return FileBatch([str(p.resolve()) for p in files], fmt)  # type: ignore[arg-type]

    def _data_files(self, source: str, interval: Interval) -> list[Path] | None:
        """The partition's data files sorted by name; None when there is no partition and
        none is required. Refuses what cannot be read safely (see the class docstring)."""
        directory = self.partition(source, interval)
        if directory.is_symlink():
            raise InputError(
                source,
                "the landing partition is a symbolic link, which is not followed",
                str(directory),
            )
        if not directory.is_dir():
            if directory.exists():
                raise InputError(source, "the landing partition is not a directory", str(directory))
            if self.require_partition:
                raise InputError(
                    source,
                    f"nothing landed for {interval}: the partition directory does not exist "
                    "(a writer lands at least a completion marker for every interval; "
                    "LandingDirectory(require_partition=False) takes a missing partition "
                    "as an empty batch)",
                    str(directory),
                )
            return None
        files = []
        for entry in sorted(directory.iterdir(), key=lambda p: p.name):
            if _is_hidden(entry.name):
                continue
            if entry.is_symlink():
                raise InputError(
                    source,
                    f"{entry.name!r} is a symbolic link, which is not followed: land the "
                    "file itself",
                    str(directory),
                )
            if entry.is_dir():
                raise InputError(
                    source,
                    f"unexpected directory {entry.name!r} in the landing partition",
                    str(directory),
                )
            files.append(entry)
        return files

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

    # ------------------------------------------------------------------ lateness
    def record(self, source: str, interval: Interval, batch: Any) -> dict[str, Any] | None:
        """What an ingest of ``batch`` read, to tell later whether the partition changed:
        each data file's size and modification time (nanoseconds), by name."""
        paths = [] if batch is None else [Path(p) for p in batch.paths]
        files = {}
        for path in paths:
            stat = path.stat()
            files[path.name] = [stat.st_size, stat.st_mtime_ns]
        return {"partition": str(self.partition(source, interval)), "files": files}

    def changes(self, source: str, interval: Interval, recorded: Mapping[str, Any]) -> list[str]:
        """How the partition of ``interval`` differs from what its ingest read
        (``recorded``, from :meth:`record`): files that arrived after it, were replaced
        (another size or modification time) or were removed, one line each."""
        directory = self.partition(source, interval)
        before = {name: tuple(value) for name, value in recorded.get("files", {}).items()}
        now = {}
        if directory.is_dir() and not directory.is_symlink():
            for entry in directory.iterdir():
                if _is_hidden(entry.name) or entry.is_symlink() or not entry.is_file():
                    continue
                stat = entry.stat()
                now[entry.name] = (stat.st_size, stat.st_mtime_ns)
        found = []
        for name in sorted(set(before) | set(now)):
            if name not in before:
                found.append(f"{directory / name} arrived after interval {interval} was ingested")
            elif name not in now:
                found.append(
                    f"{directory / name} was removed after interval {interval} was ingested"
                )
            elif now[name] != before[name]:
                found.append(
                    f"{directory / name} was replaced after interval {interval} was ingested"
                )
        return found

    def complete(self, source: str, interval: Interval) -> Path:
        """Write the partition's completion marker, naming its data files as they are now
        with their row counts (the partition is created if it is missing: an interval in
        which nothing arrived is complete and empty). Writers call it last."""
        directory = self.partition(source, interval)
        directory.mkdir(parents=True, exist_ok=True)
        files = self._data_files(source, interval) or []
        fmt = self._format(source, directory, files) if files else None
        counts = {path.name: _count_rows(source, path, fmt) for path in files}  # type: ignore[arg-type]
        target = directory / COMPLETION_MARKER
        _write_atomically(target, lambda path: path.write_text(json.dumps({"files": counts})))
        return target

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
        _write_atomically(target, lambda path: _WRITERS[fmt](path, columns, records))
        return target

    @staticmethod
    def _next_name(directory: Path) -> str:
        taken = {p.name.split(".")[0] for p in directory.iterdir() if not _is_hidden(p.name)}
        index = 0
        while f"part-{index:05d}" in taken:
            index += 1
        return f"part-{index:05d}"


def _write_atomically(target: Path, write: Any) -> None:
    """``write(path)`` to a hidden temporary name, then renamed to ``target``, so a reader
    never sees half a file."""
    temporary = target.parent / f".{target.name}.tmp-{uuid.uuid4().hex}"
    try:
        write(temporary)
        with temporary.open("rb") as handle:
            os.fsync(handle.fileno())
        os.replace(temporary, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()


def _airflow_setting(key: str) -> str | None:
    """``[dbspark] <key>`` from ``airflow.cfg`` (or ``AIRFLOW__DBSPARK__<KEY>``)."""
    from dbspark.orchestration.airflow.hook import dbspark_setting

    return dbspark_setting(key)


def _late_policy(value: str) -> str:
    policy = str(value).strip().lower()
    if policy not in ("warn", "fail"):
        raise ValueError(f"late_files must be 'warn' or 'fail', not {value!r}")
    return policy


# ==================================================================================== markers
#: The completion marker a writer may leave in a partition (:meth:`LandingDirectory.complete`).
COMPLETION_MARKER = "_dbspark_complete.json"


def read_marker(source: str, directory: Path) -> dict[str, int] | None:
    """The row count of each data file that the partition's completion marker names, or
    None without a marker. The marker is a JSON object ``{"files": {name: rows}}``:
    every data file of the partition by name (without directories), and its rows (a
    Parquet file's rows, a CSV file's non-blank lines after the header, a JSON-lines
    file's non-blank lines). ``{"files": {}}`` marks an interval in which nothing arrived."""
    path = directory / COMPLETION_MARKER
    if path.is_symlink():
        raise InputError(source, "the completion marker is a symbolic link", str(path))
    if not path.is_file():
        return None
    try:
        content = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise InputError(
            source, f"the completion marker is not JSON ({error})", str(path)
        ) from None
    files = content.get("files") if isinstance(content, dict) else None
    good = isinstance(files, dict) and all(
        isinstance(name, str) and "/" not in name and type(rows) is int and rows >= 0
        for name, rows in files.items()
    )
    if not good:
        raise InputError(
            source,
            'the completion marker must be {"files": {"<file name>": <rows>, ...}} with a '
            "whole number of rows (0 or more) per file",
            str(path),
        )
    return dict(files)


def _check_marker(
    source: str, directory: Path, marker: Mapping[str, int], counts: Mapping[str, int]
) -> None:
    missing = sorted(set(marker) - set(counts))
    unlisted = sorted(set(counts) - set(marker))
    wrong = [
        f"{name} has {counts[name]} rows, the marker says {marker[name]}"
        for name in sorted(set(marker) & set(counts))
        if counts[name] != marker[name]
    ]
    problems = []
    if missing:
        problems.append(f"file(s) {missing} named by the marker are not in the partition")
    if unlisted:
        problems.append(f"file(s) {unlisted} are in the partition but not in the marker")
    problems.extend(wrong)
    if problems:
        raise InputError(
            source,
            f"the partition does not match its completion marker {COMPLETION_MARKER}: "
            + "; ".join(problems),
            str(directory),
        )


def _count_rows(source: str, path: Path, fmt: str) -> int:
    """The rows of a data file as the marker counts them; a text file is also checked to
    be UTF-8, line by line, so the error can name the line."""
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            return pq.ParquetFile(path).metadata.num_rows
        except (OSError, pa.ArrowException) as error:
            raise InputError(source, f"cannot be read: {error}", str(path)) from None
    rows = 0
    try:
        with open_binary(path) as handle:
            for line in utf8_lines(source, str(path), handle):
                if line.strip():
                    rows += 1
    except (OSError, EOFError) as error:  # a truncated or corrupt .gz / .bz2
        raise InputError(source, f"cannot be read: {error}", str(path)) from None
    return rows - 1 if fmt == "csv" and rows else rows


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
