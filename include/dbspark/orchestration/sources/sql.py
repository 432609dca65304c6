"""A change-data pull from an operational table: :class:`SqlTable`.

The database is a SQLAlchemy URL, or an Airflow connection resolved at each pull
(``orchestration/airflow/hook.py``), never when the DAG file is parsed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from dbspark.core.types import Schema
from dbspark.engine.api import InputError
from dbspark.engine.file_batches import FileBatch
from dbspark.orchestration.intervals import Interval
from dbspark.orchestration.sources.base import SourceConnector

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["SqlTable", "sqlalchemy_url"]


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_UNITS = {"s": 1_000_000, "ms": 1_000}


class _Spill:
    """Where a large pull goes, ``spill_rows`` rows at a time: checked as the engine
    checks rows, then one Parquet file each in the task's private scratch folder."""

    def __init__(self, table: SqlTable, source: str, scratch: Path, schema: Schema) -> None:
        self.table = table
        self.source = source
        self.scratch = scratch
        self.schema = schema
        self.files: list[str] = []
        self.pulled = 0  # rows written so far

    def write(self, rows: list[Any]) -> None:
        import pyarrow.parquet as pq

        from dbspark.core.columns import WEIGHT
        from dbspark.engine.batches import upsert_batch, zset_batch
        from dbspark.engine.local.tier import arrow_table

        first, last = self.pulled, self.pulled + len(rows) - 1
        where = f"{self.table!r}, rows {first} to {last} of the pull"
        fields = list(self.schema.fields)
        if self.table.weight_column is None:
            checked = [tuple(row) for row in upsert_batch(self.source, self.schema, rows, where)]
        else:
            weighted = zset_batch(self.source, self.schema, rows, where)
            checked = [(*row, weight) for row, weight in weighted.items()]
            fields.append((WEIGHT, "bigint"))
        self.scratch.mkdir(parents=True, exist_ok=True)
        path = self.scratch / f"part-{len(self.files):05d}.parquet"
        pq.write_table(arrow_table(checked, fields), path)
        self.files.append(str(path))
        self.pulled += len(rows)


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


def _as_utc(row: Sequence[Any], positions: Sequence[int]) -> list[Any]:
    """``row`` with the naive datetimes at ``positions`` as UTC instants."""
    values = list(row)
    for i in positions:
        value = values[i]
        if isinstance(value, datetime) and value.tzinfo is None:
            values[i] = value.replace(tzinfo=UTC)
    return values


#: OpenLineage's scheme for a database, by SQLAlchemy's dialect name.
_LINEAGE_SCHEMES = {"postgresql": "postgres", "mysql": "mysql", "mssql": "mssql"}


def sql_dataset(url: sa.URL, schema: str | None, table: str) -> tuple[str, str]:
    """(namespace, name) of ``table`` at ``url`` by OpenLineage's naming spec."""
    dialect = url.get_backend_name()
    if dialect == "sqlite":
        return "sqlite", f"{url.database}.{table}"
    scheme = _LINEAGE_SCHEMES.get(dialect, dialect)
    port = f":{url.port}" if url.port else ""
    default_schema = "public" if dialect == "postgresql" else None
    parts = [url.database, schema or default_schema, table]
    return f"{scheme}://{url.host}{port}", ".".join(p for p in parts if p)


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
    source's types (a NUMERIC column gives ``Decimal``, which a BIGINT source refuses),
    except that a timestamp column without a time zone is taken to hold UTC, as the
    watermark is: its naive values become UTC instants, which a TIMESTAMP source takes.
    Rows are fetched ``chunk_rows`` at a time through a server-side cursor where the
    driver has one, never all at once. A pull of more than ``spill_rows`` rows is not
    held in memory either: given the task's private ``scratch`` folder and the source's
    schema, each ``spill_rows`` rows are checked as the engine checks rows (an error
    names the row and which rows of the pull it is among) and written there as a
    Parquet file, and the batch is a ``FileBatch`` of those files.

    **Late rows.** A row committed after its interval was pulled with a watermark inside
    that interval (a long transaction, a lagging replica) would never be read. ``lag``
    makes every pull reach back: the interval ``[start - lag, end)``, so such a row is
    read by the next pull if it commits within ``lag``. Rows of the overlap are read
    twice; for an upsert source that is harmless, since a row equal to the stored
    version (same key, same watermark, same values) changes nothing and an older one is
    stale. A Z-set source would count them twice, so ``lag`` needs an upsert source
    (no ``weight_column``). **Hard deletes** are never seen by a pull: a deleted row is
    simply absent. Delete with a tombstone (an upsert source's tombstone column, set in
    a new version of the row with a greater watermark), or soft-delete in the table.
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
        lag: timedelta = timedelta(0),
        chunk_rows: int = 10_000,
        spill_rows: int = 100_000,
    ) -> None:
        if (url is None) == (conn_id is None):
            raise ValueError("SqlTable needs exactly one of url and conn_id")
        if lag < timedelta(0):
            raise ValueError(f"lag {lag} is negative")
        if lag and weight_column is not None:
            raise ValueError(
                "lag reads the rows of the overlap again, which a Z-set source "
                "(weight_column) would count twice: lag needs an upsert source"
            )
        if chunk_rows < 1:
            raise ValueError(f"chunk_rows must be 1 or more, not {chunk_rows}")
        if spill_rows < 1:
            raise ValueError(f"spill_rows must be 1 or more, not {spill_rows}")
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
        self.lag = lag
        self.chunk_rows = chunk_rows
        self.spill_rows = spill_rows

    @property
    def _table_name(self) -> str:
        return f"{self.schema}.{self.table}" if self.schema else self.table

    def _where(self) -> str:
        if self.url is not None:
            return self.url.render_as_string(hide_password=True)
        return f"Airflow connection {self.conn_id!r}"

    def __repr__(self) -> str:
        return f"SqlTable({self._where()}, table={self._table_name!r})"

    def dataset(self, source: str) -> tuple[str, str] | None:
        """The table, named as OpenLineage names a table of its database:
        ``<scheme>://<host>:<port>`` and ``<database>.<schema>.<table>`` (a SQLite file:
        ``sqlite`` and ``<path>.<table>``). An Airflow connection is resolved here."""
        from dbspark.orchestration.airflow.hook import connection_url

        url = self.url if self.url is not None else connection_url(str(self.conn_id))
        return sql_dataset(url, self.schema, self.table)

    def describe(self, source: str, interval: Interval) -> str:
        lag = f" reaching back {self.lag} for late rows" if self.lag else ""
        return (
            f"source {source!r}: table {self._table_name} at {self._where()}, rows with "
            f"{self.watermark_column} in {interval}{lag}"
        )

    def batch(
        self,
        source: str,
        interval: Interval,
        *,
        columns: Sequence[str],
        spark: SparkSession | None = None,
        scratch: Path | None = None,
        schema: Schema | None = None,
    ) -> list[tuple] | FileBatch:
        """The rows of the interval (reaching back ``lag``), as tuples in ``columns``
        order (``[row, weight]`` pairs with ``weight_column``). An interval without rows
        gives an empty list. Past ``spill_rows`` rows, with ``scratch`` and ``schema``,
        a ``FileBatch`` of Parquet files written there instead (see the class text)."""
        if not columns:
            raise ValueError(f"source {source!r}: SqlTable needs the source's columns")
        unknown = sorted(set(self.columns) - set(columns))
        if unknown:
            raise InputError(
                source, f"SqlTable maps column(s) {unknown} the source does not declare"
            )
        engine = sa.create_engine(self._url())
        rows: list[tuple] = []
        spill = None if scratch is None or schema is None else _Spill(self, source, scratch, schema)
        try:
            with engine.connect() as conn:
                table = self._reflect(source, conn)
                query = self._query(source, table, columns, self._pulled(interval))
                # A server-side cursor, read a chunk at a time: the driver's rows are
                # dropped as they become tuples, never held all at once beside them.
                result = conn.execution_options(yield_per=self.chunk_rows).execute(query)
                naive = self._naive_positions(table, columns)
                for chunk in result.partitions():
                    if naive:
                        chunk = [_as_utc(r, naive) for r in chunk]
                    if self.weight_column is None:
                        rows.extend(tuple(r) for r in chunk)
                    else:
                        rows.extend((tuple(r[:-1]), r[-1]) for r in chunk)
                    if spill is not None and len(rows) >= self.spill_rows:
                        spill.write(rows)
                        rows = []
        finally:
            engine.dispose()
        if spill is not None and spill.files:
            if rows:
                spill.write(rows)
            return FileBatch(spill.files, "parquet")
        return rows

    def _naive_positions(self, table: sa.Table, columns: Sequence[str]) -> list[int]:
        """Where the selected columns are timestamps without a time zone: their values
        come back naive, and are taken to hold UTC (as the watermark bounds take them,
        and as a Spark session at UTC reads a TIMESTAMP_NTZ as a TIMESTAMP)."""
        kinds = [table.c[self.columns.get(c, c)].type for c in columns]
        return [
            i
            for i, kind in enumerate(kinds)
            if isinstance(kind, sa.DateTime) and not getattr(kind, "timezone", False)
        ]

    def _pulled(self, interval: Interval) -> Interval:
        """The interval a pull reads: ``interval`` reaching back ``lag``."""
        return Interval(interval.start - self.lag, interval.end)

    def _url(self) -> sa.URL:
        if self.url is not None:
            return self.url
        assert self.conn_id is not None  # the constructor requires one of the two
        from dbspark.orchestration.airflow.hook import connection_url

        return connection_url(self.conn_id)

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
