"""Source connectors: where one source's batch for one data interval comes from.

A DAG run ingests one :class:`~dbspark.orchestration.intervals.Interval` per epoch. Each
source's ingest task asks that source's :class:`SourceConnector` for the batch of the
interval and hands it to ``SparkEngine.check_batch`` / ``ingest``. A connector returns
what the engine already accepts:

* a :class:`~dbspark.engine.file_batches.FileBatch` (files the engine reads and checks
  itself, naming the file and line of any bad row): :class:`LandingDirectory`;
* a list of Python rows in the source's schema order (``[row, weight]`` pairs for a
  Z-set source): :class:`SqlTable`;
* ``None``: nothing arrived for this interval. Omit the source from ``run_epoch``'s
  inputs (``check_batch`` does not take ``None``), or pass it to ``ingest``, which ingests
  an empty batch.

Connectors are given the source's declared column names (:func:`source_columns` reads
them off the circuit) because only the circuit knows them: files are matched by name by
the engine, but a table pull must select the right columns in the right order.

An epoch's input must never change once it is committed (a retried ingest would
otherwise silently fork history): the engine records a fingerprint of what each ingest
consumed and refuses a different batch for it on a re-run.
"""

from __future__ import annotations

import abc
import contextlib
import csv
import json
import os
import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from dbspark.circuit.builder import Circuit
from dbspark.engine.api import InputError, require_sources
from dbspark.engine.file_batches import FORMATS, FileBatch
from dbspark.orchestration.intervals import Interval

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "LandingDirectory",
    "SourceConnector",
    "SqlTable",
    "airflow_connection_url",
    "source_columns",
    "sqlalchemy_url",
]


class SourceConnector(abc.ABC):
    """Where one source's batch for one interval comes from."""

    @abc.abstractmethod
    def batch(
        self,
        source: str,
        interval: Interval,
        *,
        columns: Sequence[str],
        spark: SparkSession | None = None,
    ) -> Any:
        """The batch of ``source`` for ``interval``: a ``FileBatch``, a list of rows in
        ``columns`` order, or ``None`` when nothing arrived.

        ``columns`` are the source's declared column names in schema order
        (:func:`source_columns`); ``spark`` is there for connectors that read with Spark.
        """

    @abc.abstractmethod
    def describe(self, source: str, interval: Interval) -> str:
        """One line for the task log: where the batch of ``source`` for ``interval`` is read."""


def source_columns(circuit: Circuit, source: str) -> tuple[str, ...]:
    """The declared column names of ``source`` in schema order (an upsert source's user
    columns, not its internal state columns)."""
    require_sources(circuit.name, circuit.sources, [source])
    node = circuit.node(circuit.sources[source])
    schema = node.schema if node.op == "zset_source" else node.params["user_schema"]
    return tuple(schema.names)


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


# ==================================================================================== tables
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_UNITS = {"s": 1_000_000, "ms": 1_000}


def _epoch_bound(moment: datetime, unit: str) -> int:
    """The smallest integer ``n`` in ``unit`` with ``n >= moment``: for integer column
    values, ``v >= bound(t)`` exactly when ``v`` (as an instant) is at or after ``t``, so
    the half-open interval stays half-open when its bounds are not whole units."""
    delta = moment - _EPOCH
    micros = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    return -(-micros // _UNITS[unit])


def sqlalchemy_url(uri: str | sa.URL) -> sa.URL:
    """``uri`` as a SQLAlchemy URL, with PostgreSQL on the installed driver (psycopg 3):
    Airflow writes ``postgres://`` and plain ``postgresql://`` would mean psycopg2."""
    url = sa.make_url(uri)
    if url.drivername in ("postgres", "postgresql"):
        url = url.set(drivername="postgresql+psycopg")
    return url


def airflow_connection_url(conn_id: str) -> sa.URL:
    """The SQLAlchemy URL of the Airflow connection ``conn_id`` (resolved now).

    Works inside a task and outside one (connections given as ``AIRFLOW_CONN_<ID>``
    environment variables, a URI or JSON). A SQLite connection may hold its file path in
    ``host`` (Airflow's SQLite hook convention, and the JSON form) or in ``schema`` (the
    URI form ``sqlite:////abs/path.db``); ``get_uri`` renders the first one wrongly, so
    SQLite URLs are built from the fields.
    """
    # Imported here: the task SDK costs seconds to import and DAG parsing must not need it.
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        conn = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        raise LookupError(
            f"Airflow connection {conn_id!r} is not defined (add it in Airflow, or set "
            f"AIRFLOW_CONN_{conn_id.upper()})"
        ) from None
    if conn.conn_type == "sqlite":
        path = conn.host or conn.schema
        if not path:
            raise ValueError(f"Airflow connection {conn_id!r} (sqlite) names no database file")
        return sa.URL.create("sqlite", database=path)
    return sqlalchemy_url(conn.get_uri())


class SqlTable(SourceConnector):
    """A change-data pull from an operational table: the rows whose ``watermark_column``
    lies in the interval ``[start, end)``.

    Give the database as a SQLAlchemy ``url``, or as an Airflow ``conn_id`` that is
    resolved at each pull (never when the DAG is parsed, so DAG files need no database or
    secrets). ``schema`` is the database schema of ``table``.

    The watermark column is a TIMESTAMP (a column without a time zone is taken to hold
    UTC), or an integer of epoch seconds or milliseconds: ``watermark_unit="s"`` or
    ``"ms"``. The bounds are bound parameters of the query. A row whose watermark is
    NULL is in no interval and is never pulled.

    Selected are the source's declared columns (given to :meth:`batch`), in that order;
    ``columns`` maps a source column to a table column of another name. With
    ``weight_column`` the rows are ``[row, weight]`` pairs, for a Z-set source. Rows are
    ordered by the watermark and then by every selected column, so a pull is
    reproducible. Values are what the driver returns; the engine checks them against the
    source's types (a NUMERIC column gives ``Decimal``, which a BIGINT source refuses).
    """

    def __init__(
        self,
        url: str | sa.URL | None = None,
        *,
        conn_id: str | None = None,
        table: str,
        watermark_column: str,
        watermark_unit: str | None = None,
        columns: Mapping[str, str] | None = None,
        schema: str | None = None,
        weight_column: str | None = None,
    ) -> None:
        if (url is None) == (conn_id is None):
            raise ValueError("SqlTable needs exactly one of url and conn_id")
        if watermark_unit not in (None, *_UNITS):
            raise ValueError(
                f"watermark_unit {watermark_unit!r} is not one of None (a timestamp), 's', 'ms'"
            )
        self.url = None if url is None else sqlalchemy_url(url)
        self.conn_id = conn_id
        self.table = table
        self.schema = schema
        self.watermark_column = watermark_column
        self.watermark_unit = watermark_unit
        self.columns = dict(columns or {})
        self.weight_column = weight_column

    @property
    def _table_name(self) -> str:
        return f"{self.schema}.{self.table}" if self.schema else self.table

    def _where(self) -> str:
        if self.url is not None:
            return self.url.render_as_string(hide_password=True)
        return f"Airflow connection {self.conn_id!r}"

    def __repr__(self) -> str:
        return f"SqlTable({self._where()}, table={self._table_name!r})"

    def describe(self, source: str, interval: Interval) -> str:
        return (
            f"source {source!r}: table {self._table_name} at {self._where()}, rows with "
            f"{self.watermark_column} in {interval}"
        )

    def batch(
        self,
        source: str,
        interval: Interval,
        *,
        columns: Sequence[str],
        spark: SparkSession | None = None,
    ) -> list[tuple]:
        """The rows of the interval, as tuples in ``columns`` order (``[row, weight]``
        pairs with ``weight_column``). An interval without rows gives an empty list."""
        if not columns:
            raise ValueError(f"source {source!r}: SqlTable needs the source's columns")
        unknown = sorted(set(self.columns) - set(columns))
        if unknown:
            raise InputError(
                source, f"SqlTable maps column(s) {unknown} the source does not declare"
            )
        engine = sa.create_engine(self._url())
        try:
            with engine.connect() as conn:
                table = self._reflect(source, conn)
                query = self._query(source, table, columns, interval)
                rows = conn.execute(query).all()
        finally:
            engine.dispose()
        if self.weight_column is None:
            return [tuple(r) for r in rows]
        return [(tuple(r[:-1]), r[-1]) for r in rows]

    def _url(self) -> sa.URL:
        if self.url is not None:
            return self.url
        assert self.conn_id is not None  # the constructor requires one of the two
        return airflow_connection_url(self.conn_id)

    def _reflect(self, source: str, conn: sa.Connection) -> sa.Table:
        try:
            return sa.Table(self.table, sa.MetaData(), schema=self.schema, autoload_with=conn)
        except sa.exc.NoSuchTableError:
            raise InputError(
                source, f"table {self._table_name!r} does not exist at {self._where()}"
            ) from None

    def _column(self, source: str, table: sa.Table, name: str, role: str) -> sa.Column:
        if name not in table.c:
            raise InputError(
                source,
                f"{role} column {name!r} is not in table {self._table_name!r} at "
                f"{self._where()} (it has {list(table.c.keys())})",
            )
        return table.c[name]

    def _query(
        self, source: str, table: sa.Table, columns: Sequence[str], interval: Interval
    ) -> sa.Select:
        selected = [
            self._column(source, table, self.columns.get(c, c), "the source").label(c)
            for c in columns
        ]
        if self.weight_column is not None:
            selected.append(self._column(source, table, self.weight_column, "the weight"))
        mark = self._column(source, table, self.watermark_column, "the watermark")
        start, end = self._bounds(source, mark, interval)
        return (
            sa.select(*selected)
            .where(mark >= start, mark < end)
            .order_by(mark, *[table.c[self.columns.get(c, c)] for c in columns])
        )

    def _bounds(self, source: str, mark: sa.Column, interval: Interval) -> tuple[Any, Any]:
        kind = mark.type
        untyped = isinstance(kind, sa.types.NullType)  # a SQLite column declared without type
        if self.watermark_unit is not None:
            if not (untyped or isinstance(kind, sa.Integer)):
                raise InputError(
                    source,
                    f"watermark column {mark.name!r} of table {self._table_name!r} is {kind}, "
                    f"not an integer of epoch {self.watermark_unit}",
                )
            unit = self.watermark_unit
            return _epoch_bound(interval.start, unit), _epoch_bound(interval.end, unit)
        if not (untyped or isinstance(kind, sa.DateTime)):
            hint = " (give watermark_unit='s' or 'ms')" if isinstance(kind, sa.Integer) else ""
            raise InputError(
                source,
                f"watermark column {mark.name!r} of table {self._table_name!r} is {kind}, "
                f"not a TIMESTAMP{hint}",
            )
        if getattr(kind, "timezone", False):
            return interval.start, interval.end
        # A timestamp without time zone holds UTC; an aware bound would be shifted by the
        # session's time zone on some databases (PostgreSQL compares as timestamptz).
        return interval.start.replace(tzinfo=None), interval.end.replace(tzinfo=None)
