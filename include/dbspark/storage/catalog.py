"""The catalog: which batches exist, which stages have committed, where loops stand.

A SQL database reached through SQLAlchemy Core (a SQLite file in the warehouse by
default, PostgreSQL when deployed; any SQLAlchemy URL works). It is the single source of
truth for what is visible: a Parquet batch exists when, and only when, its row here is
committed.

Commit protocol (ARCHITECTURE.md, "Storage and the commit protocol"): a stage writes
its output files first, each to a fresh unique path, then calls :meth:`Catalog.commit`,
which in ONE transaction inserts the stage's ``stage_runs`` row, registers the new
batches and marks the batches they replace as superseded. The ``stage_runs`` row is
unique per (circuit, stage, time), so

- a crash before the commit leaves only unregistered files: garbage that
  :func:`garbage_collect` removes, never half-visible state;
- a retried task whose work was already committed finds its ``stage_runs`` row and
  does nothing (``commit`` returns ``False``; check :meth:`Catalog.stage_done` first to
  skip the work itself);
- two concurrent attempts of one stage cannot both commit: the unique constraint lets
  exactly one through.

Times are stored as canonical JSON arrays (``[3]``, ``[3,2]``) so that equality on the
text is equality of times; batches and stage runs also carry ``epoch`` (= ``time[0]``)
as an integer column for range filters.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import re
import shutil
import threading
import time as _time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine

from dbspark.storage import collection_names as coll
from dbspark.storage.durability import shared_filesystem, sync_trees

Time = tuple[int, ...]

KINDS = ("delta", "trace", "view", "changes")
EPOCH_STATES = ("open", "committed")


#: A collection's name in the middle of an evolution's renames (never seen outside it).
_EVOLVING = "~evolving~"


class CatalogError(RuntimeError):
    """The catalog refuses an operation that would leave it inconsistent."""


class CircuitDefinitionChanged(CatalogError):
    """The circuit's definition differs from the one the catalog holds state for: every
    retry finds the same definition, so a task fails at once."""


class UnsafeCatalog(CatalogError):
    """A SQLite catalog whose file or warehouse is on a shared file system: refused until
    the deployment changes, so a task fails at once."""


class UncommittedUnits(CatalogError):
    """An epoch cannot commit, or a unit cannot run, because units it needs have not
    committed (``missing``: stage names, ``loop:<name>`` for a loop not converged)."""

    def __init__(self, message: str, missing: Sequence[str]) -> None:
        super().__init__(message)
        self.missing = list(missing)


# --- schema ------------------------------------------------------------------------------

metadata = sa.MetaData()

# SQLite only auto-increments an INTEGER PRIMARY KEY; elsewhere ids are 64-bit.
_Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_Timestamp = sa.DateTime(timezone=True)

circuits_table = sa.Table(
    "circuits",
    metadata,
    sa.Column("name", sa.String(200), primary_key=True),
    sa.Column("fingerprint", sa.String(200), nullable=False),
    sa.Column("created_at", _Timestamp, nullable=False),
)

epochs_table = sa.Table(
    "epochs",
    metadata,
    sa.Column("circuit", sa.String(200), sa.ForeignKey("circuits.name"), primary_key=True),
    sa.Column("epoch", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("opened_at", _Timestamp, nullable=False),
    sa.Column("committed_at", _Timestamp, nullable=True),
    sa.CheckConstraint("state IN ('open', 'committed')", name="ck_epochs_state"),
)

# What an epoch stands for outside the catalog, e.g. an Airflow data interval; unique
# per circuit, so one interval can never become two epochs.
epoch_labels_table = sa.Table(
    "epoch_labels",
    metadata,
    sa.Column("circuit", sa.String(200), sa.ForeignKey("circuits.name"), primary_key=True),
    sa.Column("epoch", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("label", sa.String(200), nullable=False),
    sa.UniqueConstraint("circuit", "label", name="uq_epoch_labels_label"),
)

# Which orchestrator run worked on an epoch (an Airflow DAG run), so that people can go
# from an epoch to its run and task logs. Several runs when one failed and another
# (same interval) finished the epoch.
epoch_runs_table = sa.Table(
    "epoch_runs",
    metadata,
    sa.Column("circuit", sa.String(200), sa.ForeignKey("circuits.name"), primary_key=True),
    sa.Column("epoch", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("dag_id", sa.String(250), primary_key=True),
    sa.Column("run_id", sa.String(250), primary_key=True),
    sa.Column("recorded_at", _Timestamp, nullable=False),
)

# A fingerprint of the input a unit committed (ingest units): a retry that brings a
# different batch for a committed unit is refused instead of silently skipped.
unit_inputs_table = sa.Table(
    "unit_inputs",
    metadata,
    sa.Column("circuit", sa.String(200), sa.ForeignKey("circuits.name"), primary_key=True),
    sa.Column("stage", sa.String(500), primary_key=True),
    sa.Column("time", sa.String(200), primary_key=True),
    sa.Column("fingerprint", sa.String(200), nullable=False),
)

stage_runs_table = sa.Table(
    "stage_runs",
    metadata,
    sa.Column("id", _Id, primary_key=True, autoincrement=True),
    sa.Column("circuit", sa.String(200), sa.ForeignKey("circuits.name"), nullable=False),
    sa.Column("stage", sa.String(500), nullable=False),
    sa.Column("time", sa.String(200), nullable=False),
    sa.Column("epoch", sa.BigInteger, nullable=False),
    sa.Column("finished_at", _Timestamp, nullable=False),
    sa.UniqueConstraint("circuit", "stage", "time", name="uq_stage_runs_circuit_stage_time"),
    sa.Index("ix_stage_runs_circuit_epoch", "circuit", "epoch"),
)

batches_table = sa.Table(
    "batches",
    metadata,
    sa.Column("id", _Id, primary_key=True, autoincrement=True),
    sa.Column("circuit", sa.String(200), sa.ForeignKey("circuits.name"), nullable=False),
    sa.Column("collection", sa.String(500), nullable=False),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("time", sa.String(200), nullable=False),
    sa.Column("epoch", sa.BigInteger, nullable=False),
    sa.Column("path", sa.String(1000), nullable=False),
    sa.Column("rows", sa.BigInteger, nullable=False),
    sa.Column("bytes", sa.BigInteger, nullable=False),
    sa.Column("buckets", sa.Integer, nullable=False, server_default="0"),
    # The stage run (commit) that replaced this batch, e.g. a compaction; NULL = live.
    # It points at the commit rather than at a new batch because a compaction whose
    # updates all cancel out supersedes its inputs with no new batch at all.
    sa.Column("superseded_by", _Id, sa.ForeignKey("stage_runs.id"), nullable=True),
    sa.Column("created_at", _Timestamp, nullable=False),
    # The stage run (commit) that registered this batch: what an epoch's ingest, publish
    # or compaction wrote, for people (the Airflow UI page). NULL in catalogs older than
    # the column (added by _upgrade_schema).
    sa.Column("created_by", _Id, sa.ForeignKey("stage_runs.id"), nullable=True),
    sa.CheckConstraint("kind IN ('delta', 'trace', 'view', 'changes')", name="ck_batches_kind"),
    sa.UniqueConstraint("path", name="uq_batches_path"),
    sa.Index("ix_batches_lookup", "circuit", "collection", "epoch"),
    sa.Index("ix_batches_superseded_by", "superseded_by"),
    sa.Index("ix_batches_created_by", "created_by"),
)

frontiers_table = sa.Table(
    "frontiers",
    metadata,
    sa.Column("circuit", sa.String(200), sa.ForeignKey("circuits.name"), primary_key=True),
    sa.Column("collection", sa.String(500), primary_key=True),
    sa.Column("frontier", sa.Text, nullable=False),
    sa.Column("updated_at", _Timestamp, nullable=False),
)

loop_iterations_table = sa.Table(
    "loop_iterations",
    metadata,
    sa.Column("id", _Id, primary_key=True, autoincrement=True),
    sa.Column("circuit", sa.String(200), sa.ForeignKey("circuits.name"), nullable=False),
    sa.Column("loop", sa.String(500), nullable=False),
    sa.Column("prefix", sa.String(200), nullable=False),
    sa.Column("iteration", sa.Integer, nullable=False),
    sa.Column("delta_rows", sa.BigInteger, nullable=False),
    sa.Column("pending_depth", sa.Integer, nullable=True),
    sa.Column("converged", sa.Boolean, nullable=False),
    sa.Column("reason", sa.Text, nullable=False, server_default=""),
    sa.Column("recorded_at", _Timestamp, nullable=False),
    sa.UniqueConstraint(
        "circuit", "loop", "prefix", "iteration", name="uq_loop_iterations_iteration"
    ),
)

# A lease: a unit (an Airflow task, a spark-submit driver) at work on a circuit, from
# ``started_at`` until it releases it or ``expires_at`` passes, both on the database's
# clock. Garbage collection keeps every unregistered path it first saw, and every batch
# superseded, after the oldest live lease started: that unit may be writing it or may
# have planned against it (``garbage_collect``).
leases_table = sa.Table(
    "leases",
    metadata,
    sa.Column("id", _Id, primary_key=True, autoincrement=True),
    sa.Column("circuit", sa.String(200), sa.ForeignKey("circuits.name"), nullable=False),
    sa.Column("holder", sa.String(500), nullable=False),
    sa.Column("started_at", _Timestamp, nullable=False),
    sa.Column("expires_at", _Timestamp, nullable=False),
    sa.Index("ix_leases_circuit", "circuit"),
)

# Unregistered paths garbage collection found, and when it first did (database clock):
# a path's age is measured from there, never from its mtime, which another host's clock
# wrote.
gc_marks_table = sa.Table(
    "gc_marks",
    metadata,
    sa.Column("circuit", sa.String(200), sa.ForeignKey("circuits.name"), primary_key=True),
    sa.Column("path", sa.String(1000), primary_key=True),
    sa.Column("first_seen", _Timestamp, nullable=False),
)


# --- statements run by every unit, built once ---------------------------------------------
# Built with bind parameters and reused: SQLAlchemy then neither constructs a statement
# nor computes its cache key on each call, which halves the cost of these small ones
# (about 0.3 -> 0.15 ms each, measured on SQLite; an epoch runs dozens of them).

_STAGE_RUN_ID = sa.select(stage_runs_table.c.id).where(
    stage_runs_table.c.circuit == sa.bindparam("circuit"),
    stage_runs_table.c.stage == sa.bindparam("stage"),
    stage_runs_table.c.time == sa.bindparam("time"),
)
_INPUT_FINGERPRINT = sa.select(unit_inputs_table.c.fingerprint).where(
    unit_inputs_table.c.circuit == sa.bindparam("circuit"),
    unit_inputs_table.c.stage == sa.bindparam("stage"),
    unit_inputs_table.c.time == sa.bindparam("time"),
)
_OPERATOR_BATCHES = (
    sa.select(batches_table)
    .where(
        batches_table.c.circuit == sa.bindparam("circuit"),
        batches_table.c.superseded_by.is_(None),
        ~batches_table.c.collection.like(coll.VIEW_LIKE),
        ~batches_table.c.collection.like(coll.INPUT_LOG_LIKE),
    )
    .order_by(batches_table.c.epoch, batches_table.c.id)
)
_INSERT_BATCHES = batches_table.insert()
_INSERT_UNIT_INPUT = unit_inputs_table.insert()
_BATCH_FILTERS = {
    "epoch": lambda t: t.c.epoch == sa.bindparam("epoch"),
    "max_epoch": lambda t: t.c.epoch <= sa.bindparam("max_epoch"),
    "time": lambda t: t.c.time == sa.bindparam("time"),
    "kind": lambda t: t.c.kind == sa.bindparam("kind"),
}


@functools.cache
def _batches_query(filters: tuple[str, ...], live_only: bool, several: bool) -> sa.Select:
    """The batches of one collection (``several``: of the ``collections`` list) with the
    ``filters`` of ``_BATCH_FILTERS`` that a call gives, oldest first."""
    t = batches_table
    collection = (
        t.c.collection.in_(sa.bindparam("collections", expanding=True))
        if several
        else t.c.collection == sa.bindparam("collection")
    )
    q = sa.select(t).where(t.c.circuit == sa.bindparam("circuit"), collection)
    for name in filters:
        q = q.where(_BATCH_FILTERS[name](t))
    if live_only:
        q = q.where(t.c.superseded_by.is_(None))
    return q.order_by(t.c.epoch, t.c.id)


# --- records -----------------------------------------------------------------------------


@dataclass(frozen=True)
class BatchRecord:
    """One immutable Parquet batch (a directory) and its catalog row.

    ``id`` is ``None`` until the batch is committed. ``path`` is relative to the
    warehouse root. ``time`` is the time of the stage that wrote it; every row in the
    batch is at that time or later (in the product order), which lets readers skip
    batches by their time alone.
    """

    circuit: str
    collection: str
    kind: str
    time: Time
    path: str
    rows: int
    bytes: int
    buckets: int = 0
    id: int | None = None
    superseded_by: int | None = None
    created_at: datetime | None = None
    created_by: int | None = None

    @property
    def epoch(self) -> int:
        return self.time[0]

    @property
    def live(self) -> bool:
        return self.superseded_by is None

    def with_id(self, id: int) -> BatchRecord:
        return replace(self, id=id)


@dataclass(frozen=True)
class LoopIteration:
    """What one iteration of a recursive subcircuit did, for convergence and for people."""

    loop: str
    prefix: Time
    iteration: int
    delta_rows: int
    converged: bool
    pending_depth: int | None = None
    reason: str = ""
    recorded_at: datetime | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Lease:
    """A unit at work on a circuit (see ``leases_table``)."""

    id: int
    circuit: str
    holder: str
    started_at: datetime
    expires_at: datetime


@dataclass(frozen=True)
class EpochRecord:
    """One epoch of a circuit: its state, what it stands for, when it opened and committed."""

    epoch: int
    state: str
    label: str | None
    opened_at: datetime
    committed_at: datetime | None


@dataclass(frozen=True)
class EpochRun:
    """An orchestrator run (an Airflow DAG run) that worked on an epoch."""

    epoch: int
    dag_id: str
    run_id: str
    recorded_at: datetime


@dataclass(frozen=True)
class StageOutput:
    """What one commit (a stage at a time) registered in one collection."""

    stage: str
    time: Time
    collection: str
    batches: int
    rows: int
    bytes: int

    @property
    def epoch(self) -> int:
        return self.time[0]


@dataclass(frozen=True)
class CollectionSize:
    """A collection's batches, live and superseded (kept until garbage collection)."""

    collection: str
    live_batches: int
    live_rows: int
    live_bytes: int
    superseded_batches: int
    superseded_rows: int
    superseded_bytes: int


# --- time encoding -----------------------------------------------------------------------


def encode_time(time: Sequence[int]) -> str:
    t = tuple(int(x) for x in time)
    if not t:
        raise ValueError("a time needs at least one coordinate (the epoch)")
    if any(x < 0 for x in t):
        raise ValueError(f"time coordinates are non-negative, got {list(t)}")
    return json.dumps(list(t), separators=(",", ":"))


def decode_time(text: str) -> Time:
    return tuple(int(x) for x in json.loads(text))


def _now() -> datetime:
    return datetime.now(UTC)


# --- the catalog -------------------------------------------------------------------------


#: How long a catalog statement waits for a lock (SQLite's busy timeout, PostgreSQL's
#: ``lock_timeout``) and runs at most (PostgreSQL's ``statement_timeout``), in seconds;
#: ``DBSPARK_CATALOG_LOCK_TIMEOUT`` and ``DBSPARK_CATALOG_STATEMENT_TIMEOUT`` override
#: them. Catalog statements are small: a longer one is a stuck lock or a sick server,
#: and failing lets the task's retry (``orchestration/airflow``) take over.
LOCK_TIMEOUT_SECONDS = 30.0
STATEMENT_TIMEOUT_SECONDS = 120.0
#: How long a new PostgreSQL connection may take (libpq's ``connect_timeout``).
CONNECT_TIMEOUT_SECONDS = 10

#: Garbage collection deletes nothing younger than this (seconds, on the database's
#: clock), leases or not: at least the longest default task timeout (rebuild and verify,
#: 6 h), so a writer or reader that holds no lease is covered too.
DEFAULT_GC_MIN_AGE_SECONDS = 6 * 3600.0
#: How long a lease lasts unless its holder says (``Catalog.acquire_lease``).
DEFAULT_LEASE_SECONDS = 24 * 3600.0

#: Set to ``allow`` to open a SQLite catalog although the warehouse or the database
#: file is on a shared (network) file system (``Catalog``'s ``allow_shared_sqlite``).
SHARED_SQLITE_SETTING = "DBSPARK_SQLITE_ON_SHARED_FILESYSTEM"


def _seconds_setting(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ValueError(f"{name} must be a number of seconds > 0, got {raw!r}")
    return value


def _check_new_batches(circuit: str, batches: list[BatchRecord]) -> None:
    """Refuse batches that cannot be registered by a commit of ``circuit``."""
    for b in batches:
        if b.id is not None:
            raise CatalogError(f"batch {b.path} is already registered (id {b.id})")
        if b.circuit != circuit:
            raise CatalogError(f"batch {b.path} belongs to circuit {b.circuit!r}, not {circuit!r}")
        if b.kind not in KINDS:
            raise CatalogError(f"batch kind must be one of {KINDS}, got {b.kind!r}")


class _CommitGroup:
    """The transaction and pending files of :meth:`Catalog.grouped`, begun at its first
    write, in the thread that opened the group."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.thread = threading.get_ident()
        self.paths: list[Path] = []
        self._conn: Connection | None = None
        # Each circuit's live operator batches as this transaction sees them, kept up
        # to date by the group's own stage commits (``Catalog.operator_batches``).
        self.operator_batches: dict[str, list[BatchRecord]] = {}

    @property
    def open(self) -> bool:
        return self._conn is not None

    def connection(self) -> Connection:
        if self._conn is None:
            conn = self.engine.connect()
            conn.execution_options(dbspark_write=True)
            conn.begin()
            self._conn = conn
        return self._conn

    def commit(self) -> None:
        assert self._conn is not None
        self._conn.commit()
        self.close()

    def rollback(self) -> None:
        if self._conn is not None:
            self._conn.rollback()
        self.close()

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        self.paths = []
        self.operator_batches = {}  # other writers may commit once the lock is released


class Catalog:
    """The trace catalog over any SQLAlchemy URL (tables are created if missing).

    Connections are checked before use (``pool_pre_ping``), so a pooled connection
    that a database restart closed is replaced instead of failing the next statement.
    A statement waits at most ``lock_timeout`` seconds for a lock and runs at most
    ``statement_timeout`` seconds (defaults above).

    ``warehouse`` is the root the batch paths are relative to: a commit then fsyncs the
    files it registers first (``storage/durability.py``). A SQLite catalog is refused
    when its file or ``warehouse`` is on a shared (network) file system, unless
    ``allow_shared_sqlite`` (or ``DBSPARK_SQLITE_ON_SHARED_FILESYSTEM=allow``): use
    PostgreSQL there."""

    def __init__(
        self,
        url: str,
        *,
        warehouse: str | os.PathLike[str] | None = None,
        engine_options: Mapping[str, Any] | None = None,
        lock_timeout: float | None = None,
        statement_timeout: float | None = None,
        allow_shared_sqlite: bool | None = None,
    ) -> None:
        self.url = url
        self.warehouse = None if warehouse is None else Path(warehouse).resolve()
        if sa.make_url(url).get_backend_name() == "sqlite":
            _refuse_shared_sqlite(sa.make_url(url).database, self.warehouse, allow_shared_sqlite)
        self.lock_timeout = (
            _seconds_setting("DBSPARK_CATALOG_LOCK_TIMEOUT", LOCK_TIMEOUT_SECONDS)
            if lock_timeout is None
            else lock_timeout
        )
        self.statement_timeout = (
            _seconds_setting("DBSPARK_CATALOG_STATEMENT_TIMEOUT", STATEMENT_TIMEOUT_SECONDS)
            if statement_timeout is None
            else statement_timeout
        )
        options: dict[str, Any] = {"pool_pre_ping": True, **(engine_options or {})}
        if sa.make_url(url).get_backend_name() == "postgresql":
            connect_args = dict(options.get("connect_args") or {})
            connect_args.setdefault("connect_timeout", CONNECT_TIMEOUT_SECONDS)
            options["connect_args"] = connect_args
        self.engine: Engine = sa.create_engine(url, **options)
        self._group: _CommitGroup | None = None
        if self.engine.dialect.name == "sqlite":
            _configure_sqlite(self.engine, self.lock_timeout, self.statement_timeout)
        elif self.engine.dialect.name == "postgresql":
            _configure_postgresql(self.engine, self.lock_timeout, self.statement_timeout)
        self._create_tables()

    def _create_tables(self) -> None:
        # Several tasks may open a fresh catalog at once; on PostgreSQL concurrent
        # CREATE TABLEs of one name make all but one fail. Checking again settles it.
        for attempt in range(3):
            try:
                with self._write() as conn:
                    metadata.create_all(conn)
                    _upgrade_schema(conn)
                return
            except sa.exc.DBAPIError:
                if attempt == 2:
                    raise
                _time.sleep(0.1 * (attempt + 1))

    @classmethod
    def for_warehouse(cls, path: str | os.PathLike[str]) -> Catalog:
        """The default catalog: a SQLite file ``<warehouse>/catalog.db`` (WAL mode)."""
        root = Path(path).resolve()
        root.mkdir(parents=True, exist_ok=True)
        return cls(f"sqlite:///{root / 'catalog.db'}", warehouse=root)

    # --- the database's clock ------------------------------------------------------------
    @property
    def _server_clock(self) -> bool:
        """Whether the database has a clock of its own (PostgreSQL). SQLite's clock is
        this host's, which is the database's: a SQLite catalog serves one host."""
        return self.engine.dialect.name == "postgresql"

    def _stamp(self) -> Any:
        """The current time on the database's clock, as a value to write in a statement
        (an expression the server evaluates, on PostgreSQL)."""
        return sa.func.clock_timestamp() if self._server_clock else _now()

    def clock(self, conn: Connection | None = None) -> datetime:
        """The time now on the database's clock (aware, UTC on SQLite)."""
        if not self._server_clock:
            return _now()
        if conn is not None:
            return conn.execute(sa.select(sa.func.clock_timestamp())).scalar_one()
        with self._read() as own:
            return own.execute(sa.select(sa.func.clock_timestamp())).scalar_one()

    def close(self) -> None:
        self.engine.dispose()

    @contextlib.contextmanager
    def _write(self, keeps_batches: bool = False) -> Iterator[Connection]:
        """A read-write transaction (on SQLite it takes the write lock up front); inside
        :meth:`grouped`, a savepoint of the group's transaction. ``keeps_batches``: the
        write brings the group's operator batches up to date itself (else they are read
        again)."""
        group = self._own_group()
        if group is not None:
            if not keeps_batches:
                group.operator_batches.clear()
            conn = group.connection()
            with conn.begin_nested():
                yield conn
            return
        with self.engine.connect() as conn:
            conn.execution_options(dbspark_write=True)
            with conn.begin():
                yield conn

    @contextlib.contextmanager
    def _read(self) -> Iterator[Connection]:
        """A connection to read with: the group's while it holds uncommitted writes (so
        this thread reads what it wrote), else a fresh one."""
        group = self._own_group()
        if group is not None and group.open:
            yield group.connection()
            return
        with self.engine.connect() as conn:
            yield conn

    def _own_group(self) -> _CommitGroup | None:
        group = self._group
        return group if group is not None and group.thread == threading.get_ident() else None

    @contextlib.contextmanager
    def grouped(self) -> Iterator[None]:
        """Group the commits made in this thread inside the block into one transaction:
        each keeps its own checks (a savepoint), and all become durable and visible
        together at :meth:`flush` or at the end of the block, whether it ends normally or
        by an exception (what committed stays committed, as without the group).

        One epoch's units in one process so cost one fsync pass over all their files and
        one database commit instead of one of each per unit. The group holds the
        database's write lock (SQLite) from its first write to the flush: flush before
        work that takes long, such as a Spark job. A commit's ``finished_at`` is when it
        ran in the group, at most that long before the flush; garbage collection's
        minimum age is hours (``gc_min_age_hours``)."""
        if self._group is not None:
            raise CatalogError("commit groups do not nest")
        group = _CommitGroup(self.engine)
        self._group = group
        try:
            yield
        except BaseException:
            try:
                self._flush_group(group)
            except Exception:
                group.rollback()
            raise
        else:
            self._flush_group(group)
        finally:
            group.close()
            self._group = None

    def flush(self) -> None:
        """Make the commits of this thread's group durable and visible now (a no-op
        outside :meth:`grouped`)."""
        group = self._own_group()
        if group is not None:
            self._flush_group(group)

    def _flush_group(self, group: _CommitGroup) -> None:
        if not group.open:
            return
        if group.paths and self.warehouse is not None:
            sync_trees(group.paths, up_to=self.warehouse)
        group.commit()

    def __enter__(self) -> Catalog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Catalog({self.engine.url.render_as_string(hide_password=True)!r})"

    # --- circuits ------------------------------------------------------------------------
    def register_circuit(self, name: str, fingerprint: str) -> None:
        """Record a circuit, or check that the stored one has the same definition."""
        _check_name(name, "circuit")
        try:
            with self._write() as conn:
                stored = self._fingerprint(conn, name)
                if stored is None:
                    conn.execute(
                        circuits_table.insert().values(
                            name=name, fingerprint=fingerprint, created_at=_now()
                        )
                    )
                    return
        except sa.exc.IntegrityError:
            # Registered concurrently by someone else: compare with theirs.
            with self._read() as conn:
                stored = self._fingerprint(conn, name)
        if stored != fingerprint:
            raise CircuitDefinitionChanged(
                f"the definition of circuit {name!r} changed (fingerprint {fingerprint}, "
                f"stored {stored}): the warehouse holds state of the old definition. "
                "Use a new circuit name or a new warehouse, or rebuild with a full refresh."
            )

    def evolve_circuit(
        self,
        circuit: str,
        *,
        old_fingerprint: str,
        new_fingerprint: str,
        stage: str,
        epoch: int,
        renames: Mapping[str, str],
        new_batches: Iterable[BatchRecord] = (),
        supersede: Iterable[int] = (),
        retire: Iterable[str] = (),
    ) -> bool:
        """Carry a circuit's state over to a new definition, in one transaction, as the
        commit ``stage`` at ``(epoch,)``: rename collections (``renames``, old name -> new:
        a node that computes the same thing under another id), register ``new_batches``
        (the new nodes' state, written already), supersede the batches ``supersede`` and
        forget the compaction frontiers of the collections ``retire``, then record
        ``new_fingerprint``. Returns False, changing nothing, when the circuit already has
        ``new_fingerprint`` (another process evolved it). Refused while an epoch is open
        (its units ran under the old definition), and when the stored fingerprint is
        neither ``old_fingerprint`` nor the new one."""
        batches = list(new_batches)
        supersede_ids = list(dict.fromkeys(int(i) for i in supersede))
        _check_new_batches(circuit, batches)
        self._make_durable(batches)
        committed = False
        bt, ft, et = batches_table, frontiers_table, epochs_table
        try:
            with self._write() as conn:
                self._lock_circuit(conn, circuit, exclusive=True)
                stored = self._fingerprint(conn, circuit)
                if stored == new_fingerprint:
                    return False
                if stored != old_fingerprint:
                    raise CircuitDefinitionChanged(
                        f"circuit {circuit!r} changed while evolving: its fingerprint is "
                        f"{stored}, expected {old_fingerprint} (or {new_fingerprint})"
                    )
                open_epochs = (
                    conn.execute(
                        sa.select(et.c.epoch).where(et.c.circuit == circuit, et.c.state == "open")
                    )
                    .scalars()
                    .all()
                )
                if open_epochs:
                    raise CatalogError(
                        f"circuit {circuit!r} cannot take a new definition while epoch "
                        f"{min(open_epochs)} is open: its units ran under the old one. "
                        "Finish (or clear) that epoch's run with the old definition first."
                    )
                run_id = conn.execute(
                    stage_runs_table.insert().values(
                        circuit=circuit,
                        stage=stage,
                        time=encode_time((epoch,)),
                        epoch=epoch,
                        finished_at=self._stamp(),
                    )
                ).inserted_primary_key[0]
                gone = list(dict.fromkeys(retire))
                for start in range(0, len(gone), 500):
                    conn.execute(
                        ft.delete().where(
                            ft.c.circuit == circuit, ft.c.collection.in_(gone[start : start + 500])
                        )
                    )
                # In two steps: a new name may be the old name of another node kept.
                steps = [
                    {old: f"{_EVOLVING}{new}" for old, new in renames.items()},
                    {f"{_EVOLVING}{new}": new for new in renames.values()},
                ]
                for step in steps:
                    for before, after in step.items():
                        for table in (bt, ft):
                            conn.execute(
                                table.update()
                                .where(table.c.circuit == circuit, table.c.collection == before)
                                .values(collection=after)
                            )
                if supersede_ids:
                    self._supersede(conn, circuit, supersede_ids, run_id, f"evolution {stage!r}")
                if batches:
                    now = _now()
                    conn.execute(
                        _INSERT_BATCHES,
                        [{**_batch_values(b, now), "created_by": run_id} for b in batches],
                    )
                conn.execute(
                    circuits_table.update()
                    .where(circuits_table.c.name == circuit)
                    .values(fingerprint=new_fingerprint)
                )
                committed = True
                return True
        finally:
            if not committed:
                self._forget_pending(batches)

    def circuit_fingerprint(self, name: str) -> str | None:
        with self._read() as conn:
            return self._fingerprint(conn, name)

    def circuits(self) -> list[str]:
        with self._read() as conn:
            rows = conn.execute(sa.select(circuits_table.c.name).order_by(circuits_table.c.name))
            return [r.name for r in rows]

    @staticmethod
    def _fingerprint(conn: Connection, name: str) -> str | None:
        return conn.execute(
            sa.select(circuits_table.c.fingerprint).where(circuits_table.c.name == name)
        ).scalar_one_or_none()

    # --- epochs --------------------------------------------------------------------------
    def open_epoch(self, circuit: str, epoch: int, label: str | None = None) -> str:
        """Open ``epoch`` (idempotent). Returns its state: ``'open'``, or ``'committed'``
        when it already ran (re-running a committed epoch is a no-op for the caller).

        ``label`` records what the epoch stands for (an Airflow data interval); it is
        set once, and opening the epoch under another label, or giving one label to a
        second epoch, raises ``CatalogError``."""
        if epoch < 0:
            raise ValueError(f"epochs are non-negative, got {epoch}")
        t = epochs_table
        try:
            with self._write() as conn:
                if label is not None:
                    self._label_epoch(conn, circuit, epoch, label)
                state = conn.execute(
                    sa.select(t.c.state).where(t.c.circuit == circuit, t.c.epoch == epoch)
                ).scalar_one_or_none()
                if state is not None:
                    return state
                conn.execute(
                    t.insert().values(circuit=circuit, epoch=epoch, state="open", opened_at=_now())
                )
                return "open"
        except sa.exc.IntegrityError:
            state = self.epoch_state(circuit, epoch)
            if state is None:
                raise CatalogError(
                    f"cannot open epoch {epoch}: circuit {circuit!r} is not registered"
                ) from None
            return state

    def commit_epoch(
        self,
        circuit: str,
        epoch: int,
        *,
        stages: Iterable[str] = (),
        loops: Iterable[str] = (),
    ) -> bool:
        """Mark an open epoch committed. Returns False if it already was (a no-op).

        ``stages`` are the units the epoch planned (stage names, ``publish``) and
        ``loops`` its loops: in the same transaction, every stage must have committed at
        ``(epoch,)`` and every loop recorded convergence there, or nothing changes and
        ``UncommittedUnits`` names what is missing. A unit that never committed (its task
        marked done without running) so never becomes part of a committed epoch."""
        t = epochs_table
        stages, loops = list(stages), list(loops)
        with self._write() as conn:
            state = conn.execute(
                sa.select(t.c.state).where(t.c.circuit == circuit, t.c.epoch == epoch)
            ).scalar_one_or_none()
            if state is None:
                raise CatalogError(f"epoch {epoch} of circuit {circuit!r} was never opened")
            if state == "committed":
                return False
            missing = self._missing_units(conn, circuit, epoch, stages, loops)
            if missing:
                raise UncommittedUnits(
                    f"epoch {epoch} of circuit {circuit!r} cannot commit: planned units have "
                    f"not committed at epoch {epoch}: {_listed(missing)}. The epoch stays "
                    "open and nothing was committed; run those units, then close it",
                    missing,
                )
            conn.execute(
                t.update()
                .where(t.c.circuit == circuit, t.c.epoch == epoch, t.c.state == "open")
                .values(state="committed", committed_at=self._stamp())
            )
            return True

    def missing_units(
        self, circuit: str, epoch: int, stages: Iterable[str] = (), loops: Iterable[str] = ()
    ) -> list[str]:
        """Of ``stages``, those not committed at ``(epoch,)``, then of ``loops``, those
        not converged there (as ``loop:<name>``), in the order given."""
        with self._read() as conn:
            return self._missing_units(conn, circuit, epoch, list(stages), list(loops))

    def require_units(
        self,
        circuit: str,
        epoch: int,
        what: str,
        stages: Iterable[str] = (),
        loops: Iterable[str] = (),
    ) -> None:
        """Raise ``UncommittedUnits`` unless every unit ``what`` reads (``stages`` and
        ``loops``) committed at ``epoch``: a unit must not run on missing input, which
        it would take for empty."""
        missing = self.missing_units(circuit, epoch, stages, loops)
        if missing:
            raise UncommittedUnits(
                f"{what} of circuit {circuit!r} cannot run at epoch {epoch}: the units it "
                f"reads have not committed: {_listed(missing)}. Nothing was written; run "
                "them first",
                missing,
            )

    @staticmethod
    def _missing_units(
        conn: Connection, circuit: str, epoch: int, stages: list[str], loops: list[str]
    ) -> list[str]:
        time_text = encode_time((epoch,))
        done: set[str] = set()
        converged: set[str] = set()
        if stages:
            rt = stage_runs_table
            done = set(
                conn.execute(
                    sa.select(rt.c.stage).where(
                        rt.c.circuit == circuit, rt.c.time == time_text, rt.c.stage.in_(stages)
                    )
                ).scalars()
            )
        if loops:
            lt = loop_iterations_table
            converged = set(
                conn.execute(
                    sa.select(lt.c.loop).where(
                        lt.c.circuit == circuit,
                        lt.c.prefix == time_text,
                        lt.c.converged.is_(True),
                        lt.c.loop.in_(loops),
                    )
                ).scalars()
            )
        return [s for s in dict.fromkeys(stages) if s not in done] + [
            f"loop:{name}" for name in dict.fromkeys(loops) if name not in converged
        ]

    @staticmethod
    def _label_epoch(conn: Connection, circuit: str, epoch: int, label: str) -> None:
        t = epoch_labels_table
        mine = conn.execute(
            sa.select(t.c.label).where(t.c.circuit == circuit, t.c.epoch == epoch)
        ).scalar_one_or_none()
        if mine is not None:
            if mine != label:
                raise CatalogError(f"epoch {epoch} of circuit {circuit!r} is {mine}, not {label}")
            return
        other = conn.execute(
            sa.select(t.c.epoch).where(t.c.circuit == circuit, t.c.label == label)
        ).scalar_one_or_none()
        if other is not None:
            raise CatalogError(f"{label} is already epoch {other} of circuit {circuit!r}")
        conn.execute(t.insert().values(circuit=circuit, epoch=epoch, label=label))

    def epoch_labels(self, circuit: str) -> dict[int, str]:
        """Every labelled epoch of ``circuit`` and its label."""
        t = epoch_labels_table
        with self._read() as conn:
            rows = conn.execute(
                sa.select(t.c.epoch, t.c.label).where(t.c.circuit == circuit).order_by(t.c.epoch)
            )
            return {int(epoch): label for epoch, label in rows}

    def epoch_state(self, circuit: str, epoch: int) -> str | None:
        t = epochs_table
        with self._read() as conn:
            return conn.execute(
                sa.select(t.c.state).where(t.c.circuit == circuit, t.c.epoch == epoch)
            ).scalar_one_or_none()

    def last_committed_epoch(self, circuit: str) -> int:
        """The greatest committed epoch, or -1 when none is."""
        t = epochs_table
        with self._read() as conn:
            value = conn.execute(
                sa.select(sa.func.max(t.c.epoch)).where(
                    t.c.circuit == circuit, t.c.state == "committed"
                )
            ).scalar_one_or_none()
        return -1 if value is None else int(value)

    def epochs(self, circuit: str) -> list[EpochRecord]:
        """Every epoch of ``circuit`` that was opened, oldest first, with its label."""
        t, lt = epochs_table, epoch_labels_table
        q = (
            sa.select(t.c.epoch, t.c.state, lt.c.label, t.c.opened_at, t.c.committed_at)
            .outerjoin(lt, (lt.c.circuit == t.c.circuit) & (lt.c.epoch == t.c.epoch))
            .where(t.c.circuit == circuit)
            .order_by(t.c.epoch)
        )
        with self._read() as conn:
            return [
                EpochRecord(int(r.epoch), r.state, r.label, r.opened_at, r.committed_at)
                for r in conn.execute(q)
            ]

    def record_epoch_run(self, circuit: str, epoch: int, dag_id: str, run_id: str) -> None:
        """Record that the DAG run ``run_id`` of ``dag_id`` worked on ``epoch`` (idempotent)."""
        t = epoch_runs_table
        recorded = sa.select(sa.func.count()).where(
            t.c.circuit == circuit, t.c.epoch == epoch, t.c.dag_id == dag_id, t.c.run_id == run_id
        )
        try:
            with self._write() as conn:
                if conn.execute(recorded).scalar_one():
                    return
                conn.execute(
                    t.insert().values(
                        circuit=circuit,
                        epoch=epoch,
                        dag_id=dag_id,
                        run_id=run_id,
                        recorded_at=_now(),
                    )
                )
        except sa.exc.IntegrityError:
            pass  # the same run's retry recorded it concurrently

    def epoch_runs(self, circuit: str) -> list[EpochRun]:
        """The DAG runs recorded for ``circuit``'s epochs, by epoch, then as recorded."""
        t = epoch_runs_table
        q = sa.select(t).where(t.c.circuit == circuit).order_by(t.c.epoch, t.c.recorded_at)
        with self._read() as conn:
            return [
                EpochRun(int(r.epoch), r.dag_id, r.run_id, r.recorded_at) for r in conn.execute(q)
            ]

    # --- the commit protocol -------------------------------------------------------------
    def commit(
        self,
        circuit: str,
        stage: str,
        time: Sequence[int],
        new_batches: Iterable[BatchRecord] = (),
        supersede: Iterable[int] = (),
        loop_iteration: LoopIteration | None = None,
        frontiers: Mapping[str, Iterable[Sequence[int]]] | None = None,
        input_fingerprint: str | None = None,
        supersede_in: str | None = None,
    ) -> bool:
        """Commit one stage's work at ``time`` in one transaction.

        Registers ``new_batches`` (files already written) as created by this commit, marks
        the batches whose ids are in ``supersede`` as replaced by it, records ``loop_iteration`` and
        ``frontiers`` (collection -> times) if given, the ``input_fingerprint`` of the
        batch an ingest unit consumed, and inserts the ``stage_runs`` row.
        Returns False, changing nothing, when this stage already committed at ``time``.
        Anything invalid (a superseded batch that is missing, already superseded or of
        another circuit; a batch of another circuit; with ``supersede_in``, one no longer
        in that collection, which an evolution renamed) raises and rolls everything back.
        """
        batches = list(new_batches)
        supersede_ids = list(dict.fromkeys(int(i) for i in supersede))
        _check_new_batches(circuit, batches)
        self._make_durable(batches)
        committed = False
        try:
            committed = self._commit_stage(
                circuit,
                stage,
                time,
                batches,
                supersede_ids,
                loop_iteration,
                frontiers,
                input_fingerprint,
                supersede_in,
            )
            return committed
        finally:
            if not committed:
                self._forget_pending(batches)

    def _forget_pending(self, batches: list[BatchRecord]) -> None:
        """Drop the files of a commit that did not happen from the group's pending fsync
        pass: their writer deletes them (``TraceStore._commit_or_discard``)."""
        group = self._own_group()
        if group is not None and batches and self.warehouse is not None:
            gone = {self.warehouse / b.path for b in batches}
            group.paths = [path for path in group.paths if path not in gone]

    def _commit_stage(
        self,
        circuit: str,
        stage: str,
        time: Sequence[int],
        batches: list[BatchRecord],
        supersede_ids: list[int],
        loop_iteration: LoopIteration | None,
        frontiers: Mapping[str, Iterable[Sequence[int]]] | None,
        input_fingerprint: str | None,
        supersede_in: str | None = None,
    ) -> bool:
        time_text = encode_time(time)
        epoch = int(next(iter(time)))
        try:
            with self._write(keeps_batches=not supersede_ids) as conn:
                now = _now()  # inside the transaction: SQLite's writers are serialised
                if self._stage_run_id(conn, circuit, stage, time_text) is not None:
                    return False
                if supersede_ids:
                    # Ordered against leases (acquire_lease): a reader's lease that started
                    # before this commit's finished_at may have planned against the batches
                    # it supersedes, and garbage collection keeps them while it lives.
                    self._lock_circuit(conn, circuit, exclusive=False)
                # The stage run goes first: a concurrent duplicate blocks on (or fails at)
                # its unique key before doing anything else.
                run_id = conn.execute(
                    stage_runs_table.insert().values(
                        circuit=circuit,
                        stage=stage,
                        time=time_text,
                        epoch=epoch,
                        finished_at=self._stamp(),  # the database's clock, a SQL expression
                    )
                ).inserted_primary_key[0]
                if batches:  # one statement for all of them
                    conn.execute(
                        _INSERT_BATCHES,
                        [{**_batch_values(b, now), "created_by": run_id} for b in batches],
                    )
                if supersede_ids:
                    self._supersede(
                        conn,
                        circuit,
                        supersede_ids,
                        run_id,
                        f"stage {stage!r} at {time_text}",
                        collection=supersede_in,
                    )
                if loop_iteration is not None:
                    self._insert_loop_iteration(conn, circuit, loop_iteration, now)
                if input_fingerprint is not None:
                    fingerprint = {
                        "circuit": circuit,
                        "stage": stage,
                        "time": time_text,
                        "fingerprint": input_fingerprint,
                    }
                    conn.execute(_INSERT_UNIT_INPUT, fingerprint)
                for collection, times in (frontiers or {}).items():
                    self._set_frontier(conn, circuit, collection, times, now)
                self._keep_operator_batches(conn, circuit, run_id, bool(batches))
                return True
        except sa.exc.IntegrityError as err:
            if self.stage_done(circuit, stage, time):
                return False  # lost a race against another attempt of the same stage
            raise CatalogError(f"commit of stage {stage!r} at {time_text} failed: {err}") from err

    def _keep_operator_batches(
        self, conn: Connection, circuit: str, run_id: int, wrote: bool
    ) -> None:
        """Add a group's new commit's operator batches (with their ids) to the group's
        list of them, if it keeps one."""
        group = self._own_group()
        kept = group.operator_batches.get(circuit) if group is not None else None
        if kept is None or not wrote:
            return
        query = _OPERATOR_BATCHES.where(batches_table.c.created_by == run_id)
        kept.extend(_batch_record(r) for r in conn.execute(query, {"circuit": circuit}))
        kept.sort(key=lambda b: (b.epoch, b.id or 0))

    def _make_durable(self, batches: list[BatchRecord]) -> None:
        """Durable before visible: a crash after the commit must not leave the catalog
        naming files the kernel never wrote out. A group syncs all of its files before
        its one database commit."""
        if not batches or self.warehouse is None:
            return
        paths = [self.warehouse / b.path for b in batches]
        group = self._own_group()
        if group is None:
            sync_trees(paths, up_to=self.warehouse)
        else:
            group.paths.extend(paths)

    @staticmethod
    def _supersede(
        conn: Connection,
        circuit: str,
        batch_ids: list[int],
        run_id: int,
        by: str,
        *,
        collection: str | None = None,
    ) -> None:
        """Mark the live batches ``batch_ids`` of ``circuit`` (of ``collection``, if given)
        replaced by stage run ``run_id`` (``by`` names it in the error when one is
        missing or already gone)."""
        bt = batches_table
        where = [bt.c.id.in_(batch_ids), bt.c.circuit == circuit, bt.c.superseded_by.is_(None)]
        if collection is not None:
            where.append(bt.c.collection == collection)
        done = conn.execute(bt.update().where(*where).values(superseded_by=run_id)).rowcount
        if done != len(batch_ids):
            raise CatalogError(
                f"{by} supersedes batches {batch_ids} of circuit {circuit!r}, but only {done} "
                "of them exist and are live"
            )

    def input_fingerprint(self, circuit: str, stage: str, time: Sequence[int]) -> str | None:
        """The fingerprint of the input a committed unit consumed, if it recorded one."""
        params = {"circuit": circuit, "stage": stage, "time": encode_time(time)}
        with self._read() as conn:
            return conn.execute(_INPUT_FINGERPRINT, params).scalar_one_or_none()

    def stage_done(self, circuit: str, stage: str, time: Sequence[int]) -> bool:
        with self._read() as conn:
            return self._stage_run_id(conn, circuit, stage, encode_time(time)) is not None

    def stage_runs(self, circuit: str, *, epoch: int | None = None) -> list[tuple[str, Time]]:
        """(stage, time) of every committed stage run, in commit order."""
        t = stage_runs_table
        q = sa.select(t.c.stage, t.c.time).where(t.c.circuit == circuit).order_by(t.c.id)
        if epoch is not None:
            q = q.where(t.c.epoch == epoch)
        with self._read() as conn:
            return [(r.stage, decode_time(r.time)) for r in conn.execute(q)]

    def stage_outputs(self, circuit: str) -> list[StageOutput]:
        """Per commit (stage and time) and collection: the batches, rows and bytes it
        registered, in commit order. Batches of catalogs older than ``created_by`` count
        nowhere."""
        rt, bt = stage_runs_table, batches_table
        q = (
            sa.select(
                rt.c.stage,
                rt.c.time,
                bt.c.collection,
                sa.func.count().label("batches"),
                sa.func.sum(bt.c.rows).label("rows"),
                sa.func.sum(bt.c.bytes).label("bytes"),
            )
            .join(bt, bt.c.created_by == rt.c.id)
            .where(rt.c.circuit == circuit)
            .group_by(rt.c.id, rt.c.stage, rt.c.time, bt.c.collection)
            .order_by(rt.c.id, bt.c.collection)
        )
        with self._read() as conn:
            return [
                StageOutput(
                    r.stage, decode_time(r.time), r.collection, r.batches, int(r.rows), int(r.bytes)
                )
                for r in conn.execute(q)
            ]

    @staticmethod
    def _stage_run_id(conn: Connection, circuit: str, stage: str, time_text: str) -> int | None:
        params = {"circuit": circuit, "stage": stage, "time": time_text}
        return conn.execute(_STAGE_RUN_ID, params).scalar_one_or_none()

    # --- batches -------------------------------------------------------------------------
    def batches(
        self,
        circuit: str,
        collection: str,
        *,
        epoch: int | None = None,
        max_epoch: int | None = None,
        time: Sequence[int] | None = None,
        kind: str | None = None,
        live_only: bool = True,
    ) -> list[BatchRecord]:
        """The batches of a collection, oldest first (by epoch, then commit order)."""
        given = {
            "epoch": epoch,
            "max_epoch": max_epoch,
            "time": None if time is None else encode_time(time),
            "kind": kind,
        }
        params = {k: v for k, v in given.items() if v is not None}
        q = _batches_query(tuple(params), live_only=live_only, several=False)
        params.update(circuit=circuit, collection=collection)
        with self._read() as conn:
            return [_batch_record(r) for r in conn.execute(q, params)]

    def live_batches(
        self,
        circuit: str,
        collections: Sequence[str],
        *,
        kind: str | None = None,
        epoch: int | None = None,
    ) -> list[BatchRecord]:
        """The live batches of several collections (of ``kind``, of ``epoch``, when
        given), oldest first (by epoch, then commit order), in one query."""
        if not collections:
            return []
        params: dict[str, Any] = {
            k: v for k, v in {"epoch": epoch, "kind": kind}.items() if v is not None
        }
        q = _batches_query(tuple(params), live_only=True, several=True)
        params.update(circuit=circuit, collections=list(collections))
        with self._read() as conn:
            return [_batch_record(r) for r in conn.execute(q, params)]

    def operator_batches(self, circuit: str) -> list[BatchRecord]:
        """The live batches of every collection an operator reads (deltas and arranged
        traces), oldest first, in one query: not the raw input logs nor the published
        views, which grow with every epoch and are read only by name.

        Inside a group holding uncommitted writes, the list is read once and then kept
        up to date by the group's own stage commits: an epoch's units each ask for it,
        and decoding every batch again per unit cost more than the unit's own work.
        (A compaction committed meanwhile by another thread is not seen: the batches it
        replaced hold the same rows at the times any unit of the epoch reads.)"""
        group = self._own_group()
        if group is not None and group.open and circuit in group.operator_batches:
            return list(group.operator_batches[circuit])
        with self._read() as conn:
            found = [
                _batch_record(r) for r in conn.execute(_OPERATOR_BATCHES, {"circuit": circuit})
            ]
        if group is not None and group.open:
            group.operator_batches[circuit] = found
        return list(found)

    def batch(self, id: int) -> BatchRecord | None:
        with self._read() as conn:
            row = conn.execute(sa.select(batches_table).where(batches_table.c.id == id)).first()
        return None if row is None else _batch_record(row)

    def collections(self, circuit: str) -> list[str]:
        t = batches_table
        q = sa.select(t.c.collection).where(t.c.circuit == circuit).distinct()
        with self._read() as conn:
            return sorted(r.collection for r in conn.execute(q))

    def all_collections(self, circuit: str) -> set[str]:
        """Every collection name ``circuit`` has a batch (live or not, ``collections``) or
        a compaction frontier of."""
        ft = frontiers_table
        with self._read() as conn:
            framed = conn.execute(sa.select(ft.c.collection).where(ft.c.circuit == circuit))
            names = set(framed.scalars())
        return names | set(self.collections(circuit))

    def all_batches(self, circuit: str | None = None) -> list[BatchRecord]:
        q = sa.select(batches_table).order_by(batches_table.c.id)
        if circuit is not None:
            q = q.where(batches_table.c.circuit == circuit)
        with self._read() as conn:
            return [_batch_record(r) for r in conn.execute(q)]

    def collection_sizes(self, circuit: str) -> list[CollectionSize]:
        """Every collection of ``circuit`` with the batches, rows and bytes it holds live
        and superseded (what compaction replaced and garbage collection has not deleted)."""
        t = batches_table
        live = t.c.superseded_by.is_(None)

        def total(column: Any, where: Any) -> Any:
            return sa.func.coalesce(sa.func.sum(sa.case((where, column), else_=0)), 0)

        q = (
            sa.select(
                t.c.collection,
                total(1, live).label("live_batches"),
                total(t.c.rows, live).label("live_rows"),
                total(t.c.bytes, live).label("live_bytes"),
                total(1, ~live).label("superseded_batches"),
                total(t.c.rows, ~live).label("superseded_rows"),
                total(t.c.bytes, ~live).label("superseded_bytes"),
            )
            .where(t.c.circuit == circuit)
            .group_by(t.c.collection)
            .order_by(t.c.collection)
        )
        with self._read() as conn:
            return [
                CollectionSize(r.collection, *(int(value) for value in r[1:]))
                for r in conn.execute(q)
            ]

    # --- frontiers -----------------------------------------------------------------------
    def set_frontier(
        self, circuit: str, collection: str, frontier: Iterable[Sequence[int]]
    ) -> None:
        with self._write() as conn:
            self._set_frontier(conn, circuit, collection, frontier, _now())

    def frontier(self, circuit: str, collection: str) -> list[Time] | None:
        """The stored frontier's times, or None if none was ever recorded."""
        t = frontiers_table
        with self._read() as conn:
            text = conn.execute(
                sa.select(t.c.frontier).where(t.c.circuit == circuit, t.c.collection == collection)
            ).scalar_one_or_none()
        return None if text is None else [tuple(int(x) for x in e) for e in json.loads(text)]

    def frontiers(self, circuit: str) -> dict[str, list[Time]]:
        """Every stored frontier of ``circuit``, by collection."""
        t = frontiers_table
        q = sa.select(t.c.collection, t.c.frontier).where(t.c.circuit == circuit)
        with self._read() as conn:
            return {
                r.collection: [tuple(int(x) for x in e) for e in json.loads(r.frontier)]
                for r in conn.execute(q.order_by(t.c.collection))
            }

    @staticmethod
    def _set_frontier(
        conn: Connection,
        circuit: str,
        collection: str,
        frontier: Iterable[Sequence[int]],
        now: datetime,
    ) -> None:
        times = sorted(tuple(int(x) for x in e) for e in frontier)
        text = json.dumps([list(e) for e in times], separators=(",", ":"))
        t = frontiers_table
        updated = conn.execute(
            t.update()
            .where(t.c.circuit == circuit, t.c.collection == collection)
            .values(frontier=text, updated_at=now)
        ).rowcount
        if not updated:
            conn.execute(
                t.insert().values(
                    circuit=circuit, collection=collection, frontier=text, updated_at=now
                )
            )

    # --- loops ---------------------------------------------------------------------------
    def record_loop_iteration(self, circuit: str, it: LoopIteration) -> None:
        with self._write() as conn:
            self._insert_loop_iteration(conn, circuit, it, _now())

    def loop_iterations(
        self, circuit: str, loop: str, prefix: Sequence[int]
    ) -> list[LoopIteration]:
        t = loop_iterations_table
        q = (
            sa.select(t)
            .where(t.c.circuit == circuit, t.c.loop == loop, t.c.prefix == encode_time(prefix))
            .order_by(t.c.iteration)
        )
        with self._read() as conn:
            return [_loop_iteration(r) for r in conn.execute(q)]

    def all_loop_iterations(self, circuit: str) -> list[LoopIteration]:
        """Every recorded iteration of every loop of ``circuit``, in the order recorded."""
        t = loop_iterations_table
        q = sa.select(t).where(t.c.circuit == circuit).order_by(t.c.id)
        with self._read() as conn:
            return [_loop_iteration(r) for r in conn.execute(q)]

    def loop_converged(self, circuit: str, loop: str, prefix: Sequence[int]) -> bool:
        t = loop_iterations_table
        q = sa.select(sa.func.count()).where(
            t.c.circuit == circuit,
            t.c.loop == loop,
            t.c.prefix == encode_time(prefix),
            t.c.converged.is_(True),
        )
        with self._read() as conn:
            return bool(conn.execute(q).scalar_one())

    @staticmethod
    def _insert_loop_iteration(
        conn: Connection, circuit: str, it: LoopIteration, now: datetime
    ) -> None:
        conn.execute(
            loop_iterations_table.insert().values(
                circuit=circuit,
                loop=it.loop,
                prefix=encode_time(it.prefix),
                iteration=it.iteration,
                delta_rows=it.delta_rows,
                pending_depth=it.pending_depth,
                converged=it.converged,
                reason=it.reason,
                recorded_at=now,
            )
        )

    # --- leases --------------------------------------------------------------------------
    def _lock_circuit(self, conn: Connection, circuit: str, *, exclusive: bool) -> None:
        """PostgreSQL: lock the circuit's row, shared by superseding commits, exclusive
        (but not against the foreign keys of other inserts) for a lease's start. SQLite
        serialises every write transaction already."""
        if not self._server_clock:
            return
        ct = circuits_table
        q = sa.select(ct.c.name).where(ct.c.name == circuit)
        q = q.with_for_update(key_share=True) if exclusive else q.with_for_update(read=True)
        conn.execute(q)

    def acquire_lease(
        self,
        circuit: str,
        holder: str,
        seconds: float = DEFAULT_LEASE_SECONDS,
        *,
        replaces: Sequence[str] = (),
    ) -> int:
        """Start a lease on ``circuit`` for ``holder`` (who, for people), lasting
        ``seconds`` on the database's clock unless released; returns its id. Take it
        before reading or writing anything: garbage collection keeps whatever the holder
        may be writing (unregistered paths first seen after the lease started) or may
        have planned against (batches superseded after it started).

        ``replaces`` ends, in the same transaction, the circuit's leases whose holder
        starts with one of these texts: those of earlier attempts of the same work,
        which are over (a task's earlier tries), but whose release may never have
        reached the catalog (it was down), and which would keep garbage until they
        expire."""
        if not seconds > 0:
            raise ValueError(f"a lease lasts a positive number of seconds, got {seconds}")
        with self._write() as conn:
            self._lock_circuit(conn, circuit, exclusive=True)
            _delete_leases(conn, circuit, replaces)
            if self._server_clock:
                started: Any = sa.func.clock_timestamp()
                expires: Any = started + sa.func.make_interval(0, 0, 0, 0, 0, 0, float(seconds))
            else:
                started = _now()
                expires = started + timedelta(seconds=seconds)
            try:
                return int(
                    conn.execute(
                        leases_table.insert().values(
                            circuit=circuit,
                            holder=holder[:500],
                            started_at=started,
                            expires_at=expires,
                        )
                    ).inserted_primary_key[0]
                )
            except sa.exc.IntegrityError:
                raise CatalogError(
                    f"cannot lease circuit {circuit!r}: it is not registered"
                ) from None

    def end_leases(self, circuit: str, prefixes: Sequence[str]) -> None:
        """End the circuit's leases whose holder starts with one of ``prefixes``: those of
        earlier attempts of work that is over (``acquire_lease``'s ``replaces``), when
        the attempt that finds it over takes no lease of its own (a retry with nothing
        left to do)."""
        if not prefixes:
            return
        with self._write() as conn:
            _delete_leases(conn, circuit, prefixes)

    def release_lease(self, lease: int) -> None:
        """End a lease (a no-op if it expired and was removed)."""
        with self._write() as conn:
            conn.execute(leases_table.delete().where(leases_table.c.id == int(lease)))

    @contextlib.contextmanager
    def exclusive(self, circuit: str, what: str) -> Iterator[None]:
        """Hold the lock named ``what`` of ``circuit`` for the block, against every other
        process that takes it through a catalog on the same database: for work whose
        effects are outside the catalog, which a commit's unique key cannot make happen
        once (a unit run twice at once, as a queue's redelivery does, publishing one
        epoch to a view's table). PostgreSQL: a session advisory lock on a connection of
        its own, which the server releases if this process dies. SQLite (one host): an
        ``flock`` on a file beside the database, which the kernel releases likewise."""
        name = f"dbspark/{circuit}/{what}"
        if self._server_clock:
            key = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)
            with self.engine.connect() as conn:
                # Waits as long as the holder works (up to the statement timeout), not
                # the lock timeout, which is for the catalog's short transactions.
                conn.execute(sa.text("SET LOCAL lock_timeout = 0"))
                conn.execute(sa.select(sa.func.pg_advisory_lock(key)))
                conn.commit()
                try:
                    yield
                finally:
                    try:
                        conn.execute(sa.select(sa.func.pg_advisory_unlock(key)))
                        conn.commit()
                    except sa.exc.DBAPIError:
                        conn.invalidate()  # the session is gone, and its lock with it
            return
        import fcntl

        database = self.engine.url.database
        if database in (None, "", ":memory:"):
            yield  # a database of this process only: nobody else can take it
            return
        digest = hashlib.sha256(name.encode()).hexdigest()[:16]
        with open(f"{database}.lock-{digest}", "a+b") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def leases(self, circuit: str) -> list[Lease]:
        """The live leases of ``circuit`` (not expired by the database's clock)."""
        lt = leases_table
        with self._read() as conn:
            now = self.clock(conn)
            q = sa.select(lt).where(lt.c.circuit == circuit, lt.c.expires_at > now)
            return [
                Lease(int(r.id), r.circuit, r.holder, _aware(r.started_at), _aware(r.expires_at))
                for r in conn.execute(q.order_by(lt.c.started_at))
            ]

    # --- garbage collection support ------------------------------------------------------
    def _gc_horizon(self, circuit: str, min_age_seconds: float) -> tuple[datetime, datetime | None]:
        """For garbage collection of ``circuit``, on the database's clock: the latest
        time a deletable thing may date from (now - ``min_age_seconds``), and when the
        oldest live lease started (None: no lease), before which it must also date.
        Expired leases are removed."""
        lt = leases_table
        with self._write() as conn:
            now = self.clock(conn)
            conn.execute(lt.delete().where(lt.c.circuit == circuit, lt.c.expires_at <= now))
            oldest = conn.execute(
                sa.select(sa.func.min(lt.c.started_at)).where(lt.c.circuit == circuit)
            ).scalar_one_or_none()
        return now - timedelta(seconds=min_age_seconds), None if oldest is None else _aware(oldest)

    def _purge_superseded(
        self, circuit: str, cutoff: datetime, lease_start: datetime | None
    ) -> list[BatchRecord]:
        """Superseded batches of ``circuit`` whose superseding commit finished at or
        before ``cutoff`` and before ``lease_start``."""
        bt, rt = batches_table, stage_runs_table
        q = (
            sa.select(bt)
            .join(rt, bt.c.superseded_by == rt.c.id)
            .where(bt.c.circuit == circuit, rt.c.finished_at <= cutoff)
            .order_by(bt.c.id)
        )
        if lease_start is not None:
            q = q.where(rt.c.finished_at < lease_start)
        with self._read() as conn:
            return [_batch_record(r) for r in conn.execute(q)]

    def _gc_marks(self, circuit: str, paths: Sequence[str]) -> dict[str, datetime]:
        """When garbage collection first saw each of ``paths`` unregistered: marks the
        ones it had not seen now (database clock) and forgets marks of other paths (gone,
        or registered since)."""
        gt = gc_marks_table
        with self._write() as conn:
            now = self.clock(conn)
            marks = {
                r.path: _aware(r.first_seen)
                for r in conn.execute(sa.select(gt).where(gt.c.circuit == circuit))
            }
            wanted = set(paths)
            stale = [p for p in marks if p not in wanted]
            for start in range(0, len(stale), 500):
                conn.execute(
                    gt.delete().where(
                        gt.c.circuit == circuit, gt.c.path.in_(stale[start : start + 500])
                    )
                )
            fresh = [p for p in paths if p not in marks]
            if fresh:
                conn.execute(
                    gt.insert(), [{"circuit": circuit, "path": p, "first_seen": now} for p in fresh]
                )
            return {p: marks.get(p, now) for p in paths}

    def _forget_marks(self, circuit: str, paths: Sequence[str]) -> None:
        gt = gc_marks_table
        with self._write() as conn:
            for start in range(0, len(paths), 500):
                conn.execute(
                    gt.delete().where(
                        gt.c.circuit == circuit, gt.c.path.in_(list(paths[start : start + 500]))
                    )
                )

    def _forget_batches(self, ids: Sequence[int]) -> None:
        if not ids:
            return
        with self._write() as conn:
            bt = batches_table
            for start in range(0, len(ids), 500):
                chunk = list(ids[start : start + 500])
                conn.execute(bt.delete().where(bt.c.id.in_(chunk), bt.c.superseded_by.is_not(None)))


def _aware(value: datetime) -> datetime:
    """A time read back from the catalog, aware (SQLite returns it naive, in UTC)."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


def _refuse_shared_sqlite(database: str | None, warehouse: Path | None, allow: bool | None) -> None:
    """Refuse a SQLite catalog whose file, or warehouse, is on a shared file system."""
    if database in (None, "", ":memory:"):
        places = [("the warehouse", warehouse)]
    else:
        places = [("the catalog file", Path(database)), ("the warehouse", warehouse)]
    if allow is None:
        allow = os.environ.get(SHARED_SQLITE_SETTING, "").strip().lower() == "allow"
    if allow:
        return
    for what, place in places:
        if place is None:
            continue
        kind = shared_filesystem(place)
        if kind is not None:
            raise UnsafeCatalog(
                f"refusing a SQLite catalog: {what} {place} is on a shared file system "
                f"({kind}). SQLite's locks do not hold across hosts and its file on one "
                "host is not the other hosts' catalog, so commits could be lost or "
                "doubled. Use PostgreSQL for the catalog (the catalog_conn_id connection, "
                "[dbspark] catalog_conn_id), or, if only this host uses the warehouse, set "
                f"{SHARED_SQLITE_SETTING}=allow ([dbspark] sqlite_on_shared_filesystem = allow)"
            )


def _batch_values(b: BatchRecord, now: datetime) -> dict[str, Any]:
    return {
        "circuit": b.circuit,
        "collection": b.collection,
        "kind": b.kind,
        "time": encode_time(b.time),
        "epoch": int(b.time[0]),
        "path": b.path,
        "rows": int(b.rows),
        "bytes": int(b.bytes),
        "buckets": int(b.buckets),
        "created_at": now,
    }


def _batch_record(r: Any) -> BatchRecord:
    return BatchRecord(
        id=r.id,
        circuit=r.circuit,
        collection=r.collection,
        kind=r.kind,
        time=decode_time(r.time),
        path=r.path,
        rows=r.rows,
        bytes=r.bytes,
        buckets=r.buckets,
        superseded_by=r.superseded_by,
        created_at=r.created_at,
        created_by=r.created_by,
    )


def _loop_iteration(r: Any) -> LoopIteration:
    return LoopIteration(
        loop=r.loop,
        prefix=decode_time(r.prefix),
        iteration=r.iteration,
        delta_rows=r.delta_rows,
        converged=bool(r.converged),
        pending_depth=r.pending_depth,
        reason=r.reason,
        recorded_at=r.recorded_at,
    )


def _listed(missing: Sequence[str]) -> str:
    return ", ".join(
        f"{name} (not converged)" if name.startswith("loop:") else name for name in missing
    )


_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


def _check_name(name: str, what: str) -> None:
    """Circuit and collection names become directory names in the warehouse.

    Letters, digits, ``_``, ``.`` and ``-`` only: nothing that Hadoop paths treat
    specially (``:``, glob characters such as ``*{[``) and no ``/``.
    """
    if not isinstance(name, str) or not _NAME.fullmatch(name) or len(name) > 200:
        raise ValueError(
            f"invalid {what} name {name!r}: use letters, digits, '_', '.' and '-' "
            "(it becomes a directory name in the warehouse)"
        )


def _upgrade_schema(conn: Connection) -> None:
    """Add what ``create_all`` does not to catalogs created before it existed: columns of
    tables that were already there (new tables it creates itself)."""
    columns = {c["name"] for c in sa.inspect(conn).get_columns("batches")}
    if "created_by" not in columns:
        id_type = _Id.compile(dialect=conn.dialect)
        conn.exec_driver_sql(
            f"ALTER TABLE batches ADD COLUMN created_by {id_type} REFERENCES stage_runs(id)"
        )
        conn.exec_driver_sql("CREATE INDEX ix_batches_created_by ON batches (created_by)")


def _configure_postgresql(engine: Engine, lock_timeout: float, statement_timeout: float) -> None:
    """Every session waits at most ``lock_timeout`` for a lock and runs a statement at
    most ``statement_timeout`` (set per connection, so a server-wide default stays as
    the database's owner set it)."""

    @event.listens_for(engine, "connect")
    def _connect(dbapi_conn: Any, _record: Any) -> None:
        cur = dbapi_conn.cursor()
        try:
            cur.execute(f"SET lock_timeout = {int(lock_timeout * 1000)}")
            cur.execute(f"SET statement_timeout = {int(statement_timeout * 1000)}")
        finally:
            cur.close()
        dbapi_conn.commit()


def _configure_sqlite(engine: Engine, lock_timeout: float, statement_timeout: float) -> None:
    """Foreign keys on, a busy timeout (``lock_timeout``), a statement timeout, WAL for
    files, and real transactions.

    pysqlite's own transaction handling begins transactions lazily (and not before
    SELECTs), so the read-check-write of ``commit`` would not be atomic across
    processes. We turn it off and emit ``BEGIN`` ourselves: ``BEGIN IMMEDIATE`` for
    writes (the write lock is taken up front, waiting for other writers up to the busy
    timeout, so a transaction never fails halfway on a lock upgrade), a deferred
    ``BEGIN`` for reads, which WAL lets run beside a writer.

    SQLite has no statement timeout of its own: a progress handler, which SQLite calls
    every few thousand virtual-machine steps, interrupts a statement running longer
    than ``statement_timeout`` (counted from when it was sent, its rows' fetching
    included), and the error says so.
    """
    in_memory = engine.url.database in (None, "", ":memory:")

    @event.listens_for(engine, "connect")
    def _connect(dbapi_conn: Any, record: Any) -> None:
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        try:
            cur.execute("PRAGMA foreign_keys = ON")
            cur.execute(f"PRAGMA busy_timeout = {int(lock_timeout * 1000)}")
            if not in_memory:
                cur.execute("PRAGMA journal_mode = WAL")
                # FULL: a commit is on disk when it returns (NORMAL in WAL mode may lose
                # the last commits on power loss, after their files were made durable).
                cur.execute("PRAGMA synchronous = FULL")
        finally:
            cur.close()
        info = record.info

        def overdue() -> int:
            started = info.get(_STATEMENT_STARTED)
            if started is None or _time.monotonic() - started <= statement_timeout:
                return 0
            info[_TIMED_OUT] = True
            return 1  # SQLite stops the statement: "interrupted"

        dbapi_conn.set_progress_handler(overdue, _PROGRESS_STEPS)

    @event.listens_for(engine, "before_cursor_execute")
    def _started(conn: Connection, *_args: Any) -> None:
        conn.info[_STATEMENT_STARTED] = _time.monotonic()
        conn.info.pop(_TIMED_OUT, None)

    @event.listens_for(engine, "handle_error")
    def _timed_out(context: Any) -> None:
        connection = context.connection
        if connection is not None and connection.info.pop(_TIMED_OUT, False):
            raise CatalogError(
                f"a catalog statement ran longer than {statement_timeout:g} s (the "
                "statement timeout, DBSPARK_CATALOG_STATEMENT_TIMEOUT) and was stopped: "
                f"{context.statement}"
            ) from context.original_exception

    @event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        write = conn.get_execution_options().get("dbspark_write", False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")


#: Keys of a pooled SQLite connection's ``info``: when its statement was sent, and
#: whether the progress handler stopped it.
_STATEMENT_STARTED = "dbspark_statement_started"
_TIMED_OUT = "dbspark_statement_timed_out"
#: SQLite calls the progress handler every this many virtual-machine steps (about a
#: millisecond's work): often enough to stop on time, rarely enough to cost nothing.
_PROGRESS_STEPS = 10_000


# --- garbage collection ------------------------------------------------------------------


@dataclass
class GCReport:
    """What :func:`garbage_collect` removed, and what it kept for now."""

    unregistered_dirs: list[str] = field(default_factory=list)
    superseded_batches: list[int] = field(default_factory=list)
    #: Unit files (``_units/<circuit>/``) of submissions that never cleaned up.
    unit_files: list[str] = field(default_factory=list)
    bytes_freed: int = 0
    #: Unregistered paths seen but kept: too young, or a live lease may own them.
    kept: list[str] = field(default_factory=list)

    def describe(self) -> str:
        return (
            f"{len(self.unregistered_dirs)} unregistered batch directories, "
            f"{len(self.superseded_batches)} superseded batches and {len(self.unit_files)} "
            f"unit files removed ({self.bytes_freed} bytes); {len(self.kept)} unregistered "
            "paths kept for now (younger than the minimum age, or a live lease may own them)"
        )


#: Where spark-submit unit files are written, under the warehouse (``orchestration/units``).
UNITS_FOLDER = "_units"


def garbage_collect(
    warehouse: Any,
    catalog: Catalog,
    *,
    min_age_seconds: float | None = None,
    circuit: str | None = None,
) -> GCReport:
    """Delete what no reader can see and no unit at work can own: superseded batches,
    unregistered batch directories (crashed or abandoned writes) and leftover unit files.

    ``warehouse`` is a :class:`~dbspark.storage.warehouse.Warehouse` or its root path.
    Only directories at batch depth under the folders of registered circuits
    (``<circuit>/<collection>/<kind>/t=<time>/<uuid>``) and files in
    ``_units/<circuit>/`` are considered, never ``catalog.db`` or anything else.

    Ages are on the database's clock (``Catalog.clock``), never a file's mtime, which
    another host's clock wrote: an unregistered path's age counts from when a garbage
    collection first saw it (``gc_marks``), a superseded batch's from the commit that
    superseded it. Deleted: what is at least ``min_age_seconds`` old (default
    ``DEFAULT_GC_MIN_AGE_SECONDS``) and dates from before the oldest live lease on the
    circuit started (``Catalog.acquire_lease``): a unit holding a lease may be writing
    any path first seen since, and may have listed any batch superseded since. So a
    path is deleted at the earliest on a second run, unless ``min_age_seconds`` is 0
    and no lease is live.
    """
    # (a Path has a ``root`` too: "/")
    root = Path(warehouse if isinstance(warehouse, (str, os.PathLike)) else warehouse.root)
    root = root.resolve()
    min_age = DEFAULT_GC_MIN_AGE_SECONDS if min_age_seconds is None else float(min_age_seconds)
    if min_age < 0:
        raise ValueError(f"min_age_seconds must be >= 0, got {min_age_seconds}")
    report = GCReport()
    names = [circuit] if circuit is not None else catalog.circuits()
    for name in names:
        # In this order, each step on the database's clock: list the unregistered
        # candidates, mark when each was first seen, read the horizon (leases), then
        # what is registered. A path seen before a lease started is not that unit's
        # (it takes its lease before writing); a unit that committed after the horizon
        # was read held a lease then, which keeps its paths.
        base = root / name
        listed = _gc_candidates(root, name)
        before = {b.path for b in catalog.all_batches(name)}
        listed = [rel for rel in listed if rel not in before]
        seen = catalog._gc_marks(name, listed)
        cutoff, lease_start = catalog._gc_horizon(name, min_age)

        def deletable(when: datetime, cutoff: datetime = cutoff, start: Any = lease_start) -> bool:
            return when <= cutoff and (start is None or when < start)

        # 1. superseded batches: delete their files, then forget them.
        purged = catalog._purge_superseded(name, cutoff, lease_start)
        for b in purged:
            report.bytes_freed += _remove_tree(root / b.path)
            report.superseded_batches.append(int(b.id or 0))
        catalog._forget_batches([int(b.id) for b in purged if b.id is not None])

        # 2. unregistered batch directories and unit files.
        registered = {b.path for b in catalog.all_batches(name)}
        removed = []
        for rel in listed:
            if rel in registered:
                continue
            if not deletable(seen[rel]):
                report.kept.append(rel)
                continue
            report.bytes_freed += _remove_tree(root / rel)
            removed.append(rel)
            unit_file = rel.startswith(UNITS_FOLDER + "/")
            (report.unit_files if unit_file else report.unregistered_dirs).append(rel)
        catalog._forget_marks(name, removed)
        if lease_start is None and base.is_dir():
            # A writer creates its folders before its files: with a unit at work, leave
            # empty folders for a later run.
            _remove_empty_dirs(base)
    return report


def _gc_candidates(root: Path, circuit: str) -> list[str]:
    """What garbage collection may delete of ``circuit`` unless it is registered: the
    directories at batch depth and what its ``_units/`` folder holds (unit files, and
    the scratch folders of SQL pulls), relative to ``root``."""
    base = root / circuit
    units = root / UNITS_FOLDER / circuit
    listed: list[str] = []
    if base.is_dir():
        listed.extend(
            p.relative_to(root).as_posix() for p in sorted(base.glob("*/*/t=*/*")) if p.is_dir()
        )
    if units.is_dir():
        listed.extend(p.relative_to(root).as_posix() for p in sorted(units.iterdir()))
    return listed


def _remove_tree(path: Path) -> int:
    size = 0
    if path.is_file() or path.is_symlink():
        with contextlib.suppress(FileNotFoundError):
            size = path.lstat().st_size
            path.unlink()
        return size
    if not path.exists():
        return 0
    for dirpath, _dirs, files in os.walk(path):
        for f in files:
            with contextlib.suppress(FileNotFoundError):
                size += os.stat(os.path.join(dirpath, f)).st_size
    shutil.rmtree(path, ignore_errors=True)
    return size


def _remove_empty_dirs(base: Path) -> None:
    """Remove empty collection/kind/time folders under ``base``; never ``base`` itself."""
    for dirpath, _dirs, _files in sorted(os.walk(base), key=lambda x: -len(x[0])):
        p = Path(dirpath)
        if p == base:
            continue
        with contextlib.suppress(OSError):
            p.rmdir()


def _delete_leases(conn: Any, circuit: str, prefixes: Sequence[str]) -> None:
    """Delete ``circuit``'s leases whose holder starts with one of ``prefixes``."""
    for prefix in prefixes:
        conn.execute(
            leases_table.delete().where(
                leases_table.c.circuit == circuit,
                leases_table.c.holder.startswith(prefix, autoescape=True),
            )
        )
