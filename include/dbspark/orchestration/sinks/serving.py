"""A SQL serving table per view, kept in step with the view epoch by epoch.

``<prefix><view>`` holds the view's columns plus ``__w BIGINT``. Each epoch's change is
applied to the rows it touches, in one transaction with a bookkeeping row
(``dbspark_serving_epochs``) that records the epoch the table is at.

The serving table is idempotent per epoch: applying the epoch the table is
already at does nothing, and applying any epoch other than the next one is
refused (a fresh table is at epoch -1; :func:`initialize_serving` or
:meth:`ServingTarget.initialize` (re)load it from a full snapshot).
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from dbspark.core.columns import WEIGHT
from dbspark.core.types import (
    BIGINT,
    BOOLEAN,
    DATE,
    DOUBLE,
    STRING,
    TIMESTAMP,
    Schema,
    at_scale,
    decimal_parts,
    element_type,
    is_array,
    is_decimal,
)
from dbspark.orchestration.sinks.files import (
    CHANGES,
    CHUNK_ROWS,
    WeightedRow,
    exported_corrections,
    iter_change_rows,
    output_dir,
    read_marker,
)
from dbspark.orchestration.sinks.tables import TableSettings, table_path, table_rows

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from dbspark.engine.spark.executor import SparkEngine

log = logging.getLogger("dbspark.outputs")

SERVING_EPOCHS_TABLE = "dbspark_serving_epochs"
#: The rebuilds' corrections each serving table holds (``corrections/`` in ``files.py``).
SERVING_CORRECTIONS_TABLE = "dbspark_serving_corrections"


class ServingError(RuntimeError):
    """A serving table cannot take a change: wrong epoch, other circuit, out of sync."""


class ServingEpochError(ServingError):
    """A change was applied out of order (the table is not at the epoch before it)."""

    def __init__(self, table: str, at: int, epoch: int) -> None:
        super().__init__(
            f"serving table {table!r} is at epoch {at}; epoch {epoch} can only be applied "
            f"at epoch {epoch - 1}. Apply the missing epochs in order, or reload the table "
            f"from a snapshot with initialize_serving"
        )
        self.table = table
        self.at = at
        self.epoch = epoch


@dataclass
class ServingResult:
    """What applying (or loading) one epoch did to one serving table."""

    table: str
    epoch: int
    database: str = ""  # the URL, password hidden
    skipped: bool = False
    initialized: bool = False
    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    correction: str | None = None  # a rebuild's correction (``rebuild=<n>``) of ``epoch``

    def describe(self) -> str:
        table = f"serving table {self.table}" + (f" in {self.database}" if self.database else "")
        if self.correction is not None:
            what = f"correction {self.correction} of epoch {self.epoch}"
            if self.skipped:
                return f"{table} already holds {what}"
            return (
                f"{table} took {what}: {self.inserted} inserted, {self.updated} updated, "
                f"{self.deleted} deleted"
            )
        if self.skipped:
            return f"{table} already at epoch {self.epoch}"
        if self.initialized:
            return f"{table} reloaded from the snapshot of epoch {self.epoch}: {self.inserted} rows"
        return (
            f"{table} -> epoch {self.epoch}: {self.inserted} inserted, "
            f"{self.updated} updated, {self.deleted} deleted"
        )


# ==================================================================================== SQL types
def _sql_type(type_name: str) -> sa.types.TypeEngine[Any]:
    if type_name == BIGINT:
        return sa.BigInteger()
    if type_name == DOUBLE:
        return sa.Double()
    if type_name == STRING:
        return sa.Text()
    if type_name == BOOLEAN:
        return sa.Boolean(create_constraint=False)
    if type_name == DATE:
        return sa.Date()
    if type_name == TIMESTAMP:
        # PostgreSQL's timestamptz; SQLite keeps the UTC wall time (``_from_sql``).
        return sa.DateTime(timezone=True)
    if is_decimal(type_name):
        # SQLite has no exact decimal (its NUMERIC keeps 15 digits): there the digits are
        # stored as text at the column's scale, which also compares exactly.
        numeric = sa.Numeric(*decimal_parts(type_name), asdecimal=True)
        return numeric.with_variant(_DecimalText(type_name), "sqlite")
    if is_array(type_name):
        # Arrays travel as canonical JSON text: comparable with "=" on every database
        # (PostgreSQL's json type has no equality), so rows still match exactly.
        return sa.Text()
    raise ServingError(f"no SQL type for dbspark column type {type_name!r}")


class _DecimalText(sa.types.TypeDecorator[Decimal]):
    impl = sa.Text
    cache_ok = True

    def __init__(self, type_name: str) -> None:
        super().__init__()
        self.type_name = type_name

    def process_bind_param(self, value: Any, dialect: Any) -> str | None:
        if value is None:
            return None
        return format(at_scale(value, self.type_name), "f")

    def process_result_value(self, value: Any, dialect: Any) -> Decimal | None:
        return None if value is None else Decimal(value)


def _to_sql(value: Any, type_name: str) -> Any:
    if value is None:
        return None
    if is_array(type_name):
        return json.dumps(_jsonable(value, element_type(type_name)), separators=(",", ":"))
    if type_name == DOUBLE:
        return float(value)
    if type_name == TIMESTAMP:
        return value.astimezone(UTC)
    return value


def _jsonable(values: Sequence[Any], type_name: str) -> list[Any]:
    out = []
    for v in values:
        if v is None:
            out.append(None)
        elif is_array(type_name):
            out.append(_jsonable(v, element_type(type_name)))
        elif type_name == DOUBLE and not math.isfinite(v):
            out.append(repr(float(v)))  # JSON has no NaN/inf literals
        else:
            out.append(v)
    return out


def _from_sql(value: Any, type_name: str) -> Any:
    if value is None:
        return None
    if is_array(type_name):
        return _from_json(json.loads(value), element_type(type_name))
    if type_name == TIMESTAMP:
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    if is_decimal(type_name):
        return at_scale(value, type_name)
    return value


def _from_json(values: list[Any], type_name: str) -> tuple[Any, ...]:
    out: list[Any] = []
    for v in values:
        if v is None:
            out.append(None)
        elif is_array(type_name):
            out.append(_from_json(v, element_type(type_name)))
        elif type_name == DOUBLE:
            out.append(float(v))
        else:
            out.append(v)
    return tuple(out)


def _key(values: Sequence[Any]) -> tuple[Any, ...]:
    # NaN != NaN in Python, but a view holds one NaN per row value: match it by name.
    # SQLite gives an instant back without its zone (it stored the UTC wall time).
    return tuple(
        ("nan",)
        if isinstance(v, float) and math.isnan(v)
        else (v.replace(tzinfo=UTC) if v.tzinfo is None else v.astimezone(UTC))
        if isinstance(v, datetime)
        else v
        for v in values
    )


@dataclass
class ServingTarget:
    """A SQL database holding one serving table per view (SQLAlchemy URL or Engine).

    ``views`` limits which views are served (default: all); ``index`` adds an index over
    the view's columns so that a change's rows are found without a scan (drop it for
    views with very long strings: PostgreSQL's btree refuses entries over ~2.7 kB).
    """

    url: str | Engine
    prefix: str = "dbspark_"
    views: Collection[str] | None = None
    epochs_table: str = SERVING_EPOCHS_TABLE
    corrections_table: str = SERVING_CORRECTIONS_TABLE
    index: bool = True
    _engine: Engine | None = field(default=None, init=False, repr=False)
    _tables: dict[str, sa.Table] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        self._metadata = sa.MetaData()
        self._epochs = sa.Table(
            self.epochs_table,
            self._metadata,
            sa.Column("table_name", sa.String(200), primary_key=True),
            sa.Column("circuit", sa.String(200), nullable=False),
            sa.Column("view", sa.String(200), nullable=False),
            sa.Column("epoch", sa.BigInteger, nullable=False),
            sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        )
        self._corrections = sa.Table(
            self.corrections_table,
            self._metadata,
            sa.Column("table_name", sa.String(200), primary_key=True),
            sa.Column("correction", sa.String(200), primary_key=True),
            sa.Column("epoch", sa.BigInteger, nullable=False),
            sa.Column("applied_at", sa.DateTime(timezone=True), nullable=False),
        )

    # --- naming -------------------------------------------------------------------------
    @property
    def engine(self) -> Engine:
        if self._engine is None:
            self._engine = self.url if isinstance(self.url, Engine) else sa.create_engine(self.url)
        return self._engine

    def table_name(self, view: str) -> str:
        return f"{self.prefix}{view}"

    def serves(self, view: str) -> bool:
        return self.views is None or view in self.views

    @property
    def database(self) -> str:
        """The database's URL with the password hidden, for logs."""
        return self.engine.url.render_as_string(hide_password=True)

    # --- tables -------------------------------------------------------------------------
    def table(self, circuit: str, view: str, schema: Schema) -> sa.Table:
        """The serving table of ``view`` (created if missing, with its bookkeeping row at
        epoch -1); refuses a table that belongs to another circuit or has other columns."""
        name = self.table_name(view)
        if name in self._tables:
            return self._tables[name]
        columns = [sa.Column(n, _sql_type(t), nullable=True) for n, t in schema.fields]
        table = sa.Table(
            name, self._metadata, *columns, sa.Column(WEIGHT, sa.BigInteger, nullable=False)
        )
        if self.index:
            sa.Index(f"ix_{name}"[:63], *(table.c[n] for n in schema.names))
        self._metadata.create_all(
            self.engine, tables=[self._epochs, self._corrections, table], checkfirst=True
        )
        found = self._columns(name)
        wanted = {*schema.names, WEIGHT}
        if found != wanted:
            raise ServingError(
                f"serving table {name!r} has columns {sorted(found)}, view {view!r} needs "
                f"{sorted(wanted)}; drop or rename the table to re-create it"
            )
        with self.engine.begin() as conn:
            row = conn.execute(
                sa.select(self._epochs.c.circuit).where(self._epochs.c.table_name == name)
            ).first()
            if row is None:
                if conn.execute(sa.select(sa.func.count()).select_from(table)).scalar_one():
                    raise ServingError(
                        f"serving table {name!r} has rows but no bookkeeping row in "
                        f"{self.epochs_table!r}; reload it with initialize_serving"
                    )
                self._insert_bookkeeping(conn, name, circuit, view, -1)
            elif row.circuit != circuit:
                raise ServingError(
                    f"serving table {name!r} serves circuit {row.circuit!r}, not {circuit!r}"
                )
        self._tables[name] = table
        return table

    def _insert_bookkeeping(
        self, conn: Connection, name: str, circuit: str, view: str, epoch: int
    ) -> None:
        conn.execute(
            sa.insert(self._epochs).values(
                table_name=name,
                circuit=circuit,
                view=view,
                epoch=epoch,
                updated_at=datetime.now(UTC),
            )
        )

    def owner(self, view: str) -> tuple[str, str] | None:
        """(circuit, view) the bookkeeping says the serving table of ``view`` serves, or
        None when it has no row."""
        if not sa.inspect(self.engine).has_table(self.epochs_table):
            return None
        with self.engine.connect() as conn:
            row = conn.execute(
                sa.select(self._epochs.c.circuit, self._epochs.c.view).where(
                    self._epochs.c.table_name == self.table_name(view)
                )
            ).first()
        return None if row is None else (row.circuit, row.view)

    def columns_differ(self, view: str, schema: Schema) -> bool:
        """Whether the serving table of ``view`` exists with other columns than ``schema``
        and ``__w`` (its view was given other columns)."""
        found = self._columns(self.table_name(view))
        return found is not None and found != {*schema.names, WEIGHT}

    def _columns(self, name: str) -> set[str] | None:
        """The columns of table ``name`` in the database, None when there is none."""
        inspector = sa.inspect(self.engine)
        if not inspector.has_table(name):
            return None
        return {c["name"] for c in inspector.get_columns(name)}

    def retire(self, circuit: str, view: str) -> bool:
        """Drop the serving table of ``view`` of ``circuit`` and its bookkeeping, in one
        transaction (a view removed, or given other columns, by an evolution: its
        outputs' history is kept under ``_retired/``). False when there is no such table
        of that circuit (none, or one without bookkeeping, which is not dbspark's to
        drop); a table of another circuit is refused."""
        name = self.table_name(view)
        owner = self.owner(view)
        if owner is None:
            return False
        if owner[0] != circuit:
            raise ServingError(
                f"serving table {name!r} serves circuit {owner[0]!r}, not {circuit!r}"
            )
        with self.engine.begin() as conn:
            for bookkeeping in (self._epochs, self._corrections):
                if sa.inspect(conn).has_table(bookkeeping.name):
                    conn.execute(sa.delete(bookkeeping).where(bookkeeping.c.table_name == name))
            conn.execute(sa.text(f"DROP TABLE IF EXISTS {self._quoted(name)}"))
        self._tables.pop(name, None)
        stale = self._metadata.tables.get(name)
        if stale is not None:
            self._metadata.remove(stale)
        log.info("serving table %s of view %s retired (dropped) from %s", name, view, self.database)
        return True

    def served_views(self, circuit: str) -> list[str]:
        """The views of ``circuit`` with a serving table here, by the bookkeeping."""
        if not sa.inspect(self.engine).has_table(self.epochs_table):
            return []
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(self._epochs.c.view).where(self._epochs.c.circuit == circuit)
            )
            return sorted(row.view for row in rows)

    def _quoted(self, name: str) -> str:
        return self.engine.dialect.identifier_preparer.quote(name)

    def epoch_of(self, view: str) -> int:
        """The epoch the serving table of ``view`` is at (-1: fresh or not created)."""
        if not sa.inspect(self.engine).has_table(self.epochs_table):
            return -1
        with self.engine.connect() as conn:
            value = conn.execute(
                sa.select(self._epochs.c.epoch).where(
                    self._epochs.c.table_name == self.table_name(view)
                )
            ).scalar_one_or_none()
        return -1 if value is None else int(value)

    def contents(self, circuit: str, view: str, schema: Schema) -> list[WeightedRow]:
        """Every row of the serving table with its multiplicity (for checks and demos)."""
        table = self.table(circuit, view, schema)
        with self.engine.connect() as conn:
            result = conn.execute(sa.select(*(table.c[n] for n in schema.names), table.c[WEIGHT]))
            return [
                (
                    tuple(_from_sql(v, t) for v, t in zip(r[:-1], schema.types, strict=True)),
                    int(r[-1]),
                )
                for r in result
            ]

    # --- applying -----------------------------------------------------------------------
    def apply(
        self,
        circuit: str,
        view: str,
        schema: Schema,
        epoch: int,
        change: Iterable[WeightedRow],
    ) -> ServingResult:
        """Apply epoch ``epoch``'s change (rows with weight deltas) in one transaction.

        Only the changed rows are touched: a row's multiplicity becomes old + delta; a new
        row is inserted, a row reaching 0 is deleted. A no-op if the table is already at
        ``epoch``; :class:`ServingEpochError` unless it is at ``epoch - 1``. ``change``
        is taken ``CHUNK_ROWS`` rows at a time (or as the chunks it yields, when it
        yields lists: ``files.iter_change_rows``), so a change of any size is applied in
        bounded memory; a row's weight may not drive it below zero on the way."""
        table = self.table(circuit, view, schema)
        name = table.name
        result = ServingResult(name, epoch, self.database)
        with self.engine.begin() as conn:
            # Compare-and-set on the bookkeeping row first: it takes the row's lock, so a
            # concurrent attempt at the same epoch waits and then finds it applied.
            moved = conn.execute(
                sa.update(self._epochs)
                .where(self._epochs.c.table_name == name, self._epochs.c.epoch == epoch - 1)
                .values(epoch=epoch, updated_at=datetime.now(UTC))
            ).rowcount
            if moved != 1:
                at = conn.execute(
                    sa.select(self._epochs.c.epoch).where(self._epochs.c.table_name == name)
                ).scalar_one()
                if at == epoch:
                    result.skipped = True
                    return result
                raise ServingEpochError(name, int(at), epoch)
            _apply_chunks(conn, table, schema, change, f"epoch {epoch}", epoch - 1, result)
        return result

    def apply_correction(
        self,
        circuit: str,
        view: str,
        schema: Schema,
        correction: str,
        epoch: int,
        change: Iterable[WeightedRow],
    ) -> ServingResult:
        """Apply a rebuild's correction of ``epoch`` (the change feed's ``correction``
        directory) once, in one transaction with its row in the corrections table. The
        table must be at ``epoch`` or later: a correction follows its epoch's change."""
        table = self.table(circuit, view, schema)
        name = table.name
        result = ServingResult(name, epoch, self.database, correction=correction)
        with self.engine.begin() as conn:
            # The bookkeeping row's lock, as in apply: one applier at a time per table.
            moved = conn.execute(
                sa.update(self._epochs)
                .where(self._epochs.c.table_name == name, self._epochs.c.epoch >= epoch)
                .values(updated_at=datetime.now(UTC))
            ).rowcount
            if moved != 1:
                raise ServingError(
                    f"serving table {name!r} is behind epoch {epoch}: apply the epochs up to "
                    f"it before its correction {correction}"
                )
            if self._applied_corrections(conn, name) & {correction}:
                result.skipped = True
                return result
            self._record_corrections(conn, name, [(correction, epoch)])
            at = f"correction {correction} of epoch {epoch}"
            _apply_chunks(conn, table, schema, change, at, None, result)
        return result

    def reconcile(
        self,
        circuit: str,
        view: str,
        schema: Schema,
        epoch: int,
        rows: Iterable[WeightedRow],
        *,
        corrections: Iterable[tuple[str, int]] = (),
    ) -> ServingResult | None:
        """Make the serving table of ``view``, at ``epoch``, hold ``rows`` (a rebuilt view
        as of ``epoch``), changing only the rows that differ, in one transaction that also
        records ``corrections`` (name, epoch: the feed's, which the rows include) as
        applied. None when the table is not at ``epoch``: its catch-up applies the feed's
        corrections after its changes instead."""
        table = self.table(circuit, view, schema)
        name = table.name
        result = ServingResult(name, epoch, self.database, correction="the rebuilt view")
        with self.engine.begin() as conn:
            moved = conn.execute(
                sa.update(self._epochs)
                .where(self._epochs.c.table_name == name, self._epochs.c.epoch == epoch)
                .values(updated_at=datetime.now(UTC))
            ).rowcount
            if moved != 1:
                return None
            # The difference of the rows wanted and the rows held, applied as a change.
            deltas = _sql_deltas(rows, schema)
            held: dict[tuple[Any, ...], int] = {}
            query = sa.select(*(table.c[n] for n in schema.names), table.c[WEIGHT])
            for record in conn.execute(query):
                key = _key(record[:-1])
                if key in held:
                    raise _held_twice(name, record[:-1])
                held[key] = int(record[-1])
                # As the database gave them back, normalized as a change's values are.
                stored = [
                    _to_sql(_from_sql(v, t), t)
                    for v, t in zip(record[:-1], schema.types, strict=True)
                ]
                values, weight = deltas.get(key, (stored, 0))
                deltas[key] = (values, weight - held[key])
            result.inserted, result.updated, result.deleted = _apply_deltas(
                conn, table, schema, deltas, "the rebuilt view", epoch, held
            )
            applied = self._applied_corrections(conn, name)
            self._record_corrections(conn, name, [c for c in corrections if c[0] not in applied])
        return result

    def corrections_applied(self, view: str) -> set[str]:
        """The corrections (``rebuild=<n>``) the serving table of ``view`` holds."""
        if not sa.inspect(self.engine).has_table(self.corrections_table):
            return set()
        with self.engine.connect() as conn:
            return self._applied_corrections(conn, self.table_name(view))

    def _applied_corrections(self, conn: Connection, name: str) -> set[str]:
        query = sa.select(self._corrections.c.correction).where(
            self._corrections.c.table_name == name
        )
        return set(conn.execute(query).scalars())

    def _record_corrections(
        self, conn: Connection, name: str, corrections: Iterable[tuple[str, int]]
    ) -> None:
        rows = [
            {"table_name": name, "correction": c, "epoch": e, "applied_at": datetime.now(UTC)}
            for c, e in corrections
        ]
        if rows:
            conn.execute(sa.insert(self._corrections), rows)

    def initialize(
        self,
        circuit: str,
        view: str,
        schema: Schema,
        epoch: int,
        rows: Iterable[WeightedRow],
        *,
        batch_size: int = 5000,
        corrections: Iterable[tuple[str, int]] = (),
    ) -> ServingResult:
        """Replace the table's contents with a full snapshot at ``epoch`` (first use, or
        recovery), in one transaction. ``rows`` is consumed as a stream, in batches.
        ``corrections`` (name, epoch) are the rebuilds' corrections the snapshot holds."""
        table = self.table(circuit, view, schema)
        name = table.name
        names = list(schema.names)
        total = 0
        with self.engine.begin() as conn:
            # The bookkeeping row first, as in apply: concurrent appliers wait on its lock.
            moved = conn.execute(
                sa.update(self._epochs)
                .where(self._epochs.c.table_name == name)
                .values(epoch=epoch, circuit=circuit, updated_at=datetime.now(UTC))
            ).rowcount
            if moved != 1:
                self._insert_bookkeeping(conn, name, circuit, view, epoch)
            conn.execute(sa.delete(table))
            conn.execute(sa.delete(self._corrections).where(self._corrections.c.table_name == name))
            self._record_corrections(conn, name, corrections)
            batch: list[dict[str, Any]] = []
            for row, weight in rows:
                if weight == 0:
                    continue
                if weight < 0:
                    raise ServingError(
                        f"snapshot of view {view!r} at epoch {epoch} has row {row} with "
                        f"multiplicity {weight}; a snapshot holds positive multiplicities"
                    )
                values = [_to_sql(v, t) for v, t in zip(row, schema.types, strict=True)]
                batch.append({**dict(zip(names, values, strict=True)), WEIGHT: int(weight)})
                if len(batch) >= batch_size:
                    conn.execute(sa.insert(table), batch)
                    total += len(batch)
                    batch = []
            if batch:
                conn.execute(sa.insert(table), batch)
                total += len(batch)
        return ServingResult(name, epoch, self.database, initialized=True, inserted=total)


def _apply_chunks(
    conn: Connection,
    table: sa.Table,
    schema: Schema,
    change: Iterable[Any],
    what: str,
    before_epoch: int | None,
    result: ServingResult,
) -> None:
    """:func:`_apply_rows` a chunk at a time (:func:`_chunks`), counted into ``result``."""
    for chunk in _chunks(change):
        inserted, updated, deleted = _apply_rows(conn, table, schema, chunk, what, before_epoch)
        result.inserted += inserted
        result.updated += updated
        result.deleted += deleted


def _chunks(change: Iterable[Any]) -> Iterator[list[WeightedRow]]:
    """``change`` as lists of at most ``CHUNK_ROWS`` rows; an iterable of lists (chunks
    already) as they come."""
    iterator = iter(change)
    first = next(iterator, None)
    if first is None:
        return
    if isinstance(first, list):
        yield first
        yield from iterator
        return
    chunk = [first]
    for row in iterator:
        chunk.append(row)
        if len(chunk) >= CHUNK_ROWS:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


#: Per row of a change (keyed by :func:`_key`): its values as the database takes them,
#: and its weight's change.
Deltas = dict[tuple[Any, ...], tuple[list[Any], int]]


def _apply_rows(
    conn: Connection,
    table: sa.Table,
    schema: Schema,
    change: Iterable[WeightedRow],
    what: str,
    before_epoch: int | None,
) -> tuple[int, int, int]:
    """Apply ``change`` (``what``: the epoch or correction it is) to the rows it touches:
    a row's multiplicity becomes old + delta, a new row is inserted, a row reaching 0 is
    deleted. Returns the rows inserted, updated and deleted."""
    return _apply_deltas(conn, table, schema, _sql_deltas(change, schema), what, before_epoch)


def _sql_deltas(change: Iterable[WeightedRow], schema: Schema) -> Deltas:
    """``change`` summed per row, its values converted for the database."""
    deltas: Deltas = {}
    for row, weight in change:
        values = [_to_sql(v, t) for v, t in zip(row, schema.types, strict=True)]
        key = _key(values)
        deltas[key] = (values, deltas.get(key, (values, 0))[1] + int(weight))
    return deltas


def _apply_deltas(
    conn: Connection,
    table: sa.Table,
    schema: Schema,
    deltas: Deltas,
    what: str,
    before_epoch: int | None,
    held: dict[tuple[Any, ...], int] | None = None,
) -> tuple[int, int, int]:
    """:func:`_apply_rows` of deltas already summed; ``held`` is what the table holds of
    their rows when the caller has read it (else looked up here)."""
    changes = [(values, d) for values, d in deltas.values() if d != 0]
    old = held
    if old is None:
        old = _lookup(conn, table, schema.names, [values for values, _ in changes])
    inserts, updates, deletes = [], [], []
    for values, delta in changes:
        before = old.get(_key(values), 0)
        after = before + delta
        if after < 0:
            at = "" if before_epoch is None else f" at epoch {before_epoch}"
            raise ServingError(
                f"serving table {table.name!r}{at} holds row {values} {before} times; "
                f"{what} deletes {-delta}: the table is out of sync, reload it with "
                f"initialize_serving"
            )
        if before == 0:
            inserts.append((values, after))
        elif after == 0:
            deletes.append(values)
        else:
            updates.append((values, after))
    names = list(schema.names)
    if inserts:
        conn.execute(
            sa.insert(table),
            [{**dict(zip(names, v, strict=True)), WEIGHT: w} for v, w in inserts],
        )
    _by_pattern(conn, table, names, updates, update=True)
    _by_pattern(conn, table, names, [(v, 0) for v in deletes], update=False)
    return len(inserts), len(updates), len(deletes)


def _pattern(values: Sequence[Any]) -> tuple[bool, ...]:
    return tuple(v is None for v in values)


def _match(table: sa.Table, names: Sequence[str], nulls: Sequence[bool]) -> list[Any]:
    """IS NOT DISTINCT FROM, spelled per NULL pattern as ``col IS NULL`` / ``col = :v``:
    the same rows for known values, but indexable (PostgreSQL never uses an index for
    IS NOT DISTINCT FROM)."""
    return [
        table.c[n].is_(None) if null else table.c[n] == sa.bindparam(f"k_{n}")
        for n, null in zip(names, nulls, strict=True)
    ]


def _held_twice(table: str, values: Sequence[Any]) -> ServingError:
    return ServingError(
        f"serving table {table!r} holds row {list(values)} more than once; reload it with "
        "initialize_serving"
    )


def _lookup(
    conn: Connection, table: sa.Table, names: Sequence[str], rows: Sequence[Sequence[Any]]
) -> dict[tuple[Any, ...], int]:
    """The current multiplicity of each of ``rows`` that the table holds (one query per
    NULL pattern and chunk, a row-value IN over the non-NULL columns)."""
    found: dict[tuple[Any, ...], int] = {}
    groups: dict[tuple[bool, ...], list[Sequence[Any]]] = {}
    for values in rows:
        groups.setdefault(_pattern(values), []).append(values)
    chunk = max(1, 500 // max(1, len(names)))
    for nulls, members in groups.items():
        present = [i for i, null in enumerate(nulls) if not null]
        for start in range(0, len(members), chunk):
            part = members[start : start + chunk]
            where = [table.c[names[i]].is_(None) for i, null in enumerate(nulls) if null]
            if len(present) == 1:
                where.append(table.c[names[present[0]]].in_([v[present[0]] for v in part]))
            elif present:
                columns = sa.tuple_(*(table.c[names[i]] for i in present))
                where.append(columns.in_([tuple(v[i] for i in present) for v in part]))
            query = sa.select(*(table.c[n] for n in names), table.c[WEIGHT]).where(*where)
            for record in conn.execute(query):
                key = _key(record[:-1])
                if key in found:
                    raise _held_twice(table.name, record[:-1])
                found[key] = int(record[-1])
    return found


def _by_pattern(
    conn: Connection,
    table: sa.Table,
    names: Sequence[str],
    rows: Sequence[tuple[Sequence[Any], int]],
    *,
    update: bool,
) -> None:
    """UPDATE (set ``__w``) or DELETE the given rows, one executemany per NULL pattern."""
    groups: dict[tuple[bool, ...], list[dict[str, Any]]] = {}
    for values, weight in rows:
        params = {f"k_{n}": v for n, v in zip(names, values, strict=True) if v is not None}
        params["new_w"] = weight
        groups.setdefault(_pattern(values), []).append(params)
    for nulls, params in groups.items():
        where = _match(table, names, nulls)
        if update:
            statement: Any = sa.update(table).where(*where).values({WEIGHT: sa.bindparam("new_w")})
        else:
            statement = sa.delete(table).where(*where)
            params = [{k: v for k, v in p.items() if k != "new_w"} for p in params]
        touched = conn.execute(statement, params).rowcount
        sane = conn.dialect.supports_sane_multi_rowcount or len(params) == 1
        if sane and touched != len(params):
            raise ServingError(
                f"serving table {table.name!r}: {'update' if update else 'delete'} of "
                f"{len(params)} rows matched {touched}; the table changed underneath"
            )


# ==================================================================================== loading
def initialize_serving(
    engine: SparkEngine,
    serving: ServingTarget,
    *,
    epoch: int | None = None,
    root: str | os.PathLike[str] | None = None,
    views: Collection[str] | None = None,
    tables: TableSettings | None = None,
) -> dict[str, ServingResult]:
    """(Re)load serving tables from the whole view at ``epoch`` (default: the last
    committed one): the view's published Delta table under ``root`` (or
    ``tables.location``) when ``root`` is given (one Arrow batch at a time), with the
    rebuilds' corrections that table holds; else the engine's view (one Spark partition
    at a time), which a later ``catch_up`` from a change feed with corrections would
    correct twice: load from the table where there is one."""
    circuit = engine.circuit.name
    epoch = engine.last_committed_epoch() if epoch is None else int(epoch)
    names = [n for n in (views or engine.circuit.views) if serving.serves(n)]
    results = {}
    for name in names:
        schema = engine.circuit.node(engine.circuit.views[name]).schema
        held: list[tuple[str, int]] = []
        if root is not None:
            rows = _table_rows(root, tables, circuit, name, schema, epoch)
            held = _corrections_up_to(root, circuit, name, epoch)
        else:
            rows = _stream(engine.view_frame(name, epoch), schema)
        results[name] = serving.initialize(circuit, name, schema, epoch, rows, corrections=held)
        log.info("%s", results[name].describe())
    return results


def reconcile_with_tables(
    serving: ServingTarget,
    circuit: str,
    schemas: dict[str, Schema],
    root: str | os.PathLike[str],
    epoch: int,
    *,
    tables: TableSettings | None = None,
) -> dict[str, ServingResult | None]:
    """After a rebuild of the views in ``schemas`` at ``epoch``: make each serving table
    at ``epoch`` hold its view's table as of ``epoch`` (which the rebuild corrected),
    changing only the rows that differ (``ServingTarget.reconcile``). None for a table
    not at ``epoch``."""
    results: dict[str, ServingResult | None] = {}
    for view, schema in schemas.items():
        if not serving.serves(view):
            continue
        rows = _table_rows(root, tables, circuit, view, schema, epoch)
        held = _corrections_up_to(root, circuit, view, epoch)
        results[view] = serving.reconcile(circuit, view, schema, epoch, rows, corrections=held)
        if results[view] is not None:
            log.info("%s", results[view].describe())
    return results


def retire_removed(serving: ServingTarget, circuit: str, views: Collection[str]) -> list[str]:
    """Drop the serving tables the bookkeeping has for views of ``circuit`` that are not
    among ``views`` (removed by an evolution: ``ServingTarget.retire``); the views they
    were for."""
    gone = [view for view in serving.served_views(circuit) if view not in views]
    return [view for view in gone if serving.retire(circuit, view)]


def _take_corrections(
    serving: ServingTarget,
    circuit: str,
    view: str,
    schema: Schema,
    root: str | os.PathLike[str],
    epoch: int,
) -> None:
    """Apply the rebuilds' corrections of epochs up to ``epoch`` (where the serving table
    is) that the table does not hold yet, oldest first."""
    applied = serving.corrections_applied(view)
    for correction in exported_corrections(root, circuit, view):
        if correction.name in applied or correction.epoch > epoch:
            continue
        rows = iter_change_rows(correction.path, schema)
        result = serving.apply_correction(
            circuit, view, schema, correction.name, correction.epoch, rows
        )
        log.info("%s", result.describe())


def _corrections_up_to(
    root: str | os.PathLike[str], circuit: str, view: str, epoch: int
) -> list[tuple[str, int]]:
    """The feed's corrections of epochs up to ``epoch``: the view's table as of ``epoch``
    holds what they correct (a rebuild corrects the table as it corrects the feed)."""
    corrections = exported_corrections(root, circuit, view)
    return [(c.name, c.epoch) for c in corrections if c.epoch <= epoch]


def _table_rows(
    root: str | os.PathLike[str],
    tables: TableSettings | None,
    circuit: str,
    view: str,
    schema: Schema,
    epoch: int,
) -> Iterator[WeightedRow]:
    """The view as of ``epoch`` from its published table: under ``tables.location``
    (with its storage options) when set, else under ``root``."""
    tables = tables or TableSettings()
    path = table_path(tables.location or root, circuit, view)
    return table_rows(path, schema, epoch, storage_options=tables.options)


def _stream(frame: DataFrame, schema: Schema) -> Iterator[WeightedRow]:
    from dbspark.engine.spark.frames import from_spark_value

    selected = frame.select(*schema.names, WEIGHT)
    # One partition on the driver at a time, never the whole snapshot.
    for record in selected.toLocalIterator(prefetchPartitions=False):
        values = tuple(from_spark_value(record[i], t) for i, t in enumerate(schema.types))
        yield values, int(record[len(schema)])


# ==================================================================================== catching up
#: A fresh serving table (or one further behind than this many epochs) is loaded from the
#: view's Delta table instead of replaying that many change directories.
MAX_REPLAY_EPOCHS = 100


class ServingCatchUpError(ServingError):
    """Some serving tables could not be brought up to date; ``failures`` maps each view
    to what went wrong. The others were, and the epochs are committed either way."""

    def __init__(self, message: str, failures: dict[str, str]) -> None:
        super().__init__(message)
        self.failures = failures


def catch_up(
    serving: ServingTarget,
    circuit: str,
    schemas: dict[str, Schema],
    root: str | os.PathLike[str],
    epoch: int,
    *,
    max_replay: int = MAX_REPLAY_EPOCHS,
    tables: TableSettings | None = None,
) -> dict[str, ServingResult]:
    """Bring the serving table of each view in ``schemas`` (those ``serving`` serves) to
    committed ``epoch``, from what the publish task exported under ``root``.

    A table behind applies each missing epoch's change directory in order (one
    transaction each, so a failure keeps the epochs before it). A fresh table, one more
    than ``max_replay`` epochs behind, or one whose change directories are gone (pruned by
    retention, or exported before serving was enabled) is loaded whole from the view's
    Delta table as of ``epoch`` (under ``tables.location`` when set). A view that fails
    does not stop the others: every failure is raised at the end as one
    :class:`ServingCatchUpError` naming each view, its table, the epoch and the
    database's error."""
    results: dict[str, ServingResult] = {}
    failures: dict[str, str] = {}
    for view, schema in schemas.items():
        if not serving.serves(view):
            continue
        name = serving.table_name(view)
        at = -1
        try:
            if serving.columns_differ(view, schema) and serving.owner(view) == (circuit, view):
                # Its view was given other columns (an evolution): the table cannot take
                # the new rows; loaded again below, from the view's table.
                serving.retire(circuit, view)
            at = serving.epoch_of(view)
            if at >= epoch:
                results[view] = ServingResult(name, at, serving.database, skipped=True)
                _take_corrections(serving, circuit, view, schema, root, at)
                continue
            missing = range(at + 1, epoch + 1)
            feeds = [output_dir(root, circuit, view, CHANGES, e) for e in missing]
            replay = (
                at >= 0
                and len(feeds) <= max_replay
                and all(read_marker(f) is not None for f in feeds)
            )
            if not replay:
                rows = _table_rows(root, tables, circuit, view, schema, epoch)
                held = _corrections_up_to(root, circuit, view, epoch)
                results[view] = serving.initialize(
                    circuit, view, schema, epoch, rows, corrections=held
                )
                log.info("%s", results[view].describe())
            else:
                for e, feed in zip(missing, feeds, strict=True):
                    at = e - 1
                    rows = iter_change_rows(feed, schema)
                    result = serving.apply(circuit, view, schema, e, rows)
                    log.info("%s", result.describe())
                results[view] = result
            at = epoch
            _take_corrections(serving, circuit, view, schema, root, epoch)
        except Exception as err:  # each view on its own; all reported together
            failures[view] = (
                f"serving table {name!r} of view {view!r} in {serving.database}, at epoch "
                f"{at}, catching up to epoch {epoch}: {type(err).__name__}: {err}"
            )
            log.error("%s", failures[view])
    if failures:
        listed = "\n  ".join(failures.values())
        raise ServingCatchUpError(
            f"circuit {circuit!r}: {len(failures)} serving table(s) could not be brought to "
            f"epoch {epoch}:\n  {listed}\nThe epochs are committed and the other outputs "
            "published; each later run tries again from where the table stands. Fix the "
            "cause (e.g. a value over PostgreSQL's btree limit: ServingTarget(index=False)), "
            "or drop the table and its row in the bookkeeping table to have it reloaded from "
            "the view's Delta table.",
            failures,
        )
    return results
