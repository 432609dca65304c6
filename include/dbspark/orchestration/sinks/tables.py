"""Each view as a Delta table, one table version per epoch, written from the epoch's change.

``<root>/<circuit>/<view>/table/`` is a Delta Lake table (delta-rs, no JVM). Its columns
are the view's, plus ``__copies`` (BIGINT, at least 1): how many copies of the row the
view holds. A row of the view appears once, so a reader that wants a bag expands it and
one that wants a set ignores it; there is no signed weight to understand.

**One commit per epoch, applying only the change.** The first epoch a table sees is
written whole (epoch 0's change is the whole view; a table first published later is
loaded from the view as of that epoch). Every later epoch is one ``MERGE`` of the change
into the table, matched on every column NULL-safely: a matched row's copies move by the
change's weight and the row is deleted when none are left; an unmatched insertion is
added. An epoch that changed nothing still commits (no file), so every epoch has its
version. Each commit carries ``dbspark.circuit``, ``dbspark.view``, ``dbspark.epoch`` and
``dbspark.interval`` in its commit info, which is how :func:`table_versions` finds the
version of an epoch (maintenance adds versions that belong to no epoch).

**A retried publish commits nothing twice**: every epoch's commit also records the Delta
protocol's idempotent-write action (``txn``: app id ``dbspark/<circuit>/<view>``, version
= the epoch), in the same atomic commit as the data, and a publish whose epoch the table
already holds skips. An epoch beyond the next is refused, naming what is missing.

**A rebuild's correction is one more commit** (:func:`correct_table`): a merge of the
rows by which the rebuilt view differs from the table, carrying
``dbspark.corrected_epoch`` instead of an epoch. The view as of an epoch, the last
version before the next epoch's commit, includes it.

**The change feed** is the format's own (``delta.enableChangeDataFeed``): the merge
writes each epoch's inserted, deleted and updated rows (pre- and post-image of
``__copies``) beside the data, read with ``DeltaTable.load_cdf``.

**A merge reads only the files the change can touch.** Its predicate also bounds each
column of an ordered type by the change's range (:func:`target_bounds`), from which
delta-rs skips the files whose statistics lie outside it; the load writes the view
sorted by those columns, so each file holds a narrow range of the first. delta-rs writes
deletes copy-on-write: a merge rewrites every file that holds a changed row (see
ARCHITECTURE.md, "Published views as tables"). A merge writes its output in no key
order, so :func:`maintain_table` rewrites the table sorted again, in files of
``target_file_bytes``, once its files' ranges overlap or its files have multiplied
(and never otherwise), and vacuums files no version within ``retention_hours`` needs.
"""

from __future__ import annotations

import bisect
import itertools
import json
import logging
import os
import re
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError
from deltalake.schema import PrimitiveType

from dbspark.core.columns import COPIES, WEIGHT
from dbspark.core.types import (
    BIGINT,
    DATE,
    STRING,
    TIMESTAMP,
    Schema,
    decimal_parts,
    is_decimal,
    normalize_type,
)
from dbspark.engine.local.tier import arrow_schema
from dbspark.orchestration.sinks.files import RETIRED, WeightedRow, arrow_rows, retire_outputs
from dbspark.storage.durability import sync_trees

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger("dbspark.outputs")

TABLE = "table"
#: Where a table is: a local path, or a URI (``s3://bucket/prefix/...``) as a string.
TablePath = str | os.PathLike[str]
#: delta-rs storage options (``AWS_REGION``, ``AWS_ENDPOINT_URL``, ``timeout``...).
StorageOptions = Mapping[str, str]
#: Commit-info keys of an epoch's commit.
EPOCH_KEY = "dbspark.epoch"
INTERVAL_KEY = "dbspark.interval"
CIRCUIT_KEY = "dbspark.circuit"
VIEW_KEY = "dbspark.view"
#: On a rebuild's correction commit: the epoch it corrects (it carries no ``EPOCH_KEY``).
CORRECTED_EPOCH_KEY = "dbspark.corrected_epoch"


class TableError(RuntimeError):
    """A view's table cannot be written or read as asked."""


class TableEpochError(TableError):
    """The table is not at the epoch before the one being published."""


@dataclass(frozen=True)
class TableSettings:
    """How published tables are kept.

    ``retention_hours``: files that no version of the last ``retention_hours`` needs are
    vacuumed, so the view as of an epoch older than that may no longer be readable.
    ``maintain_every``: housekeeping (:func:`maintain_table`: sort or compact, then
    vacuum) after every ``maintain_every``-th epoch (0: never). ``target_file_bytes``:
    the size the housekeeping's rewrite aims at; smaller files make a merge rewrite
    less for a change that touches few of them, larger ones read faster.
    ``location``: where the tables are (``<location>/<circuit>/<view>/table``), a path
    or an ``s3://bucket/prefix`` URI; None: under the outputs root, beside the change
    feed. ``storage_options``: delta-rs's options for that location (endpoint, region,
    timeouts, retries), never credentials: those come from the publishing process's
    environment (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``)
    or its instance role, which delta-rs reads itself, since these settings travel in
    unit files and task logs. ``credentials``: ``AWS_*`` credentials given apart from
    the settings (``[dbspark] table_conn_id``, for a process without them in its
    environment, such as a spark-submit driver in cluster mode); never printed.
    """

    retention_hours: int = 168
    maintain_every: int = 10
    target_file_bytes: int = 32 * 1024 * 1024
    location: str | None = None
    storage_options: dict[str, str] = field(default_factory=dict)
    credentials: dict[str, str] = field(default_factory=dict, repr=False)

    @classmethod
    def from_environment(
        cls,
        configured: Mapping[str, str] | None = None,
        *,
        credentials: Mapping[str, str] | None = None,
    ) -> TableSettings:
        """Each field from ``configured`` (the ``[dbspark]`` keys of ``airflow.cfg`` that
        are set, by key: :data:`SETTING_KEYS`), else from its environment variable
        (``DBSPARK_TABLE_RETENTION_HOURS``, ``DBSPARK_TABLE_MAINTAIN_EVERY``,
        ``DBSPARK_TABLE_TARGET_FILE_BYTES``), else the field's default; ``credentials``
        as given. A value that is not an integer in range is a ``ValueError`` naming the
        key or variable."""
        from dbspark.core.settings import checked_int, int_setting

        configured = configured or {}
        default = cls()
        values: dict[str, Any] = {}
        for name, (key, variable, minimum) in SETTING_KEYS.items():
            raw = (configured.get(key) or "").strip()
            if raw:
                values[name] = checked_int(f"[dbspark] {key}", raw, minimum=minimum)
            else:
                values[name] = int_setting(variable, getattr(default, name), minimum=minimum)
        for name, (key, variable) in TEXT_KEYS.items():
            raw, where = (configured.get(key) or "").strip(), f"[dbspark] {key}"
            if not raw:
                raw, where = os.environ.get(variable, "").strip(), variable
            if raw and name == "location":
                values[name] = raw
            elif raw:
                values[name] = _storage_options(where, raw)
        return cls(**values, credentials=dict(credentials or {}))

    def __post_init__(self) -> None:
        if self.retention_hours < 0:
            raise ValueError(f"table retention_hours must be >= 0, got {self.retention_hours}")
        if self.maintain_every < 0:
            raise ValueError(f"table maintain_every must be >= 0, got {self.maintain_every}")
        if self.target_file_bytes <= 0:
            raise ValueError(f"table target_file_bytes must be > 0, got {self.target_file_bytes}")
        for key in self.storage_options:
            if _CREDENTIAL.search(key):
                raise ValueError(
                    f"table storage option {key!r} is a credential: settings reach unit "
                    f"files and logs. Name an Airflow connection holding the keys in "
                    f"[dbspark] table_conn_id, or give the publishing process "
                    f"AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_SESSION_TOKEN) in "
                    f"its environment, or an instance role, which delta-rs reads itself"
                )

    @property
    def options(self) -> dict[str, str] | None:
        """The storage options as delta-rs takes them, credentials included (None:
        none)."""
        return {**self.storage_options, **self.credentials} or None


#: Each field of :class:`TableSettings`: its ``[dbspark]`` key in ``airflow.cfg``, its
#: environment variable and its least value.
SETTING_KEYS = {
    "retention_hours": ("table_retention_hours", "DBSPARK_TABLE_RETENTION_HOURS", 0),
    "maintain_every": ("table_maintain_every", "DBSPARK_TABLE_MAINTAIN_EVERY", 0),
    "target_file_bytes": ("table_target_file_bytes", "DBSPARK_TABLE_TARGET_FILE_BYTES", 1),
}


#: The text fields of :class:`TableSettings`: their ``[dbspark]`` key and variable.
TEXT_KEYS = {
    "location": ("table_location", "DBSPARK_TABLE_LOCATION"),
    "storage_options": ("table_storage_options", "DBSPARK_TABLE_STORAGE_OPTIONS"),
}
_CREDENTIAL = re.compile(r"secret|token|password|access_key|credential", re.IGNORECASE)


def _storage_options(name: str, raw: str) -> dict[str, str]:
    """A JSON object of option names to strings (numbers and booleans are written as
    text, as delta-rs takes them)."""
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError:
        parsed = None
    if not isinstance(parsed, dict) or not all(
        isinstance(v, str | int | float | bool) for v in parsed.values()
    ):
        raise ValueError(
            f'{name} must be a JSON object of option names to values, like {{"AWS_REGION": '
            f'"eu-west-1", "timeout": "30s"}}; got {raw!r}'
        )
    return {str(k): (str(v).lower() if isinstance(v, bool) else str(v)) for k, v in parsed.items()}


@dataclass
class TableCommit:
    """What one epoch's publish did to a view's table; ``describe()`` is for task logs."""

    view: str
    path: Path | str  # a URI as a string
    epoch: int
    version: int | None = None  # the epoch's version (a skip: the one that committed it)
    skipped: bool = False
    loaded: bool = False  # the whole view was written (the table's first epoch)
    inserted: int = 0  # rows (distinct rows of the view) added
    updated: int = 0  # rows whose copies changed
    deleted: int = 0  # rows removed
    files_added: int = 0  # data files, and the change feed's files of a merge
    files_removed: int = 0
    rows_copied: int = 0  # unchanged rows rewritten because a file held a changed row
    scan_ms: int = 0  # the merge's time reading the table (delta-rs's scan_time_ms)
    maintenance: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        if self.skipped:
            return f"table {self.path} already holds epoch {self.epoch}"
        how = "loaded" if self.loaded else "merged"
        text = (
            f"table {self.path} version {self.version}: {how} +{self.inserted} "
            f"~{self.updated} -{self.deleted} rows; files +{self.files_added}"
            f"/-{self.files_removed}, {self.rows_copied} unchanged rows rewritten"
        )
        if self.maintenance:
            text += f"; maintenance {self.maintenance}"
        return text


# ==================================================================================== paths
def table_path(root: str | os.PathLike[str], circuit: str, view: str) -> Path | str:
    """``<root>/<circuit>/<view>/table``: where the view's Delta table lives; a string
    when ``root`` is a URI (``s3://bucket/prefix``), which a ``Path`` would mangle."""
    if is_uri(root):
        return f"{str(root).rstrip('/')}/{circuit}/{view}/{TABLE}"
    return Path(root) / circuit / view / TABLE


def is_uri(where: str | os.PathLike[str]) -> bool:
    """Whether ``where`` names an object store location (``scheme://...``) rather than
    a local path."""
    return re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*://", str(where)) is not None


def app_id(circuit: str, view: str) -> str:
    """The Delta ``txn`` application id whose version is the last epoch committed."""
    return f"dbspark/{circuit}/{view}"


def table_exists(path: TablePath, *, storage_options: StorageOptions | None = None) -> bool:
    """Whether a Delta table is at ``path``. A location that cannot be reached is an
    error (``OSError``/``DeltaError``), not a missing table."""
    return _open(path, storage_options) is not None


def _open(path: TablePath, options: StorageOptions | None) -> DeltaTable | None:
    """The table at ``path``, None when there is none (delta-rs's is_deltatable says
    False for an unreachable store too; opening tells the two apart)."""
    try:
        return DeltaTable(str(path), storage_options=dict(options) if options else None)
    except TableNotFoundError:
        return None


def table_epoch(
    path: TablePath, circuit: str, view: str, *, storage_options: StorageOptions | None = None
) -> int | None:
    """The last epoch committed to the table at ``path``; None when there is no table."""
    return _checked(path, circuit, view, storage_options)[1]


def _checked(
    path: TablePath, circuit: str, view: str, options: StorageOptions | None = None
) -> tuple[DeltaTable | None, int | None]:
    """The table at ``path`` (None if there is none) and the last epoch it holds, read
    from that one snapshot of its log."""
    table = _open(path, options)
    if table is None:
        return None, None
    version = table.transaction_version(app_id(circuit, view))
    if version is None:
        raise TableError(
            f"{path} is a Delta table that no dbspark publish of view {view!r} of circuit "
            f"{circuit!r} wrote (no transaction {app_id(circuit, view)!r}); move it away"
        )
    return table, int(version)


# ==================================================================================== writing
def publish_table(
    path: TablePath,
    *,
    circuit: str,
    view: str,
    schema: Schema,
    epoch: int,
    change: pa.Table,
    whole_view: Callable[[], pa.Table],
    interval: str | None = None,
    settings: TableSettings | None = None,
) -> TableCommit:
    """Commit ``epoch`` of ``view`` to its table at ``path``, once.

    ``change`` is the epoch's consolidated change: the view's columns and ``__w``.
    ``whole_view`` gives the view as of ``epoch`` in the same shape, called only when
    the table does not exist yet and ``epoch`` is not 0. Skips when the table already
    holds ``epoch``; refuses when it does not hold ``epoch - 1``.
    """
    path = path if is_uri(path) else Path(path)
    settings = settings or TableSettings()
    options = settings.options
    try:
        table, committed = _checked(path, circuit, view, options)
    except (DeltaError, OSError) as err:
        raise TableError(
            f"could not read the table of view {view!r} at {path} to publish epoch {epoch} "
            f"(nothing was committed; a retry publishes it): {_said(err)}"
        ) from err
    if committed is not None and committed >= epoch:
        version = _epoch_version(path, epoch, options)
        return TableCommit(view, path, epoch, version=version, skipped=True)
    try:
        result = _commit(
            path,
            table,
            circuit,
            view,
            schema,
            epoch,
            committed,
            change,
            whole_view,
            interval,
            settings,
        )
    except (CommitFailedError, DeltaError, OSError) as err:
        # Another publisher of this epoch may have committed since the snapshot checked
        # above: delta-rs refuses a merge over a table changed since that snapshot, and
        # a second creation of the table. Then the epoch is done once, by the winner.
        # Anything else is a real failure, and nothing of the epoch was committed.
        try:
            after = table_epoch(path, circuit, view, storage_options=options)
        except (DeltaError, OSError):
            # Unreachable still: a request that timed out may yet have landed, so say
            # only what a retry does (its txn check finds a commit that did land).
            raise TableError(
                f"could not commit epoch {epoch} of view {view!r} to its table at {path}, "
                f"nor check whether the attempt landed (the store did not answer); a retry "
                f"publishes the epoch once, or finds it published: {_said(err)}"
            ) from err
        if after is None or after < epoch:
            raise TableError(
                f"could not commit epoch {epoch} of view {view!r} to its table at {path} "
                f"(nothing was committed; a retry publishes it): {_said(err)}"
            ) from err
        log.info("view %s, epoch %s: another publisher committed it first (%s)", view, epoch, err)
        version = _epoch_version(path, epoch, options)
        return TableCommit(view, path, epoch, version=version, skipped=True)
    sync_version(path, result.version)
    if settings.maintain_every and epoch % settings.maintain_every == 0:
        result.maintenance = maintain_table(path, settings)
    log.info("view %s, epoch %s: %s", view, epoch, result.describe())
    return result


def correct_table(
    path: TablePath,
    *,
    circuit: str,
    view: str,
    schema: Schema,
    epoch: int,
    rows: pa.Table,
    settings: TableSettings | None = None,
) -> TableCommit:
    """Merge a rebuild's correction of ``epoch`` into the table: ``rows`` (the view's
    columns and ``__w``) is the rebuilt view minus the table, so a retry that computes it
    again after this commit finds nothing to merge."""
    path = path if is_uri(path) else Path(path)
    settings = settings or TableSettings()
    metadata = _correction_properties(circuit, view, epoch)
    what = f"the rebuild's correction of view {view!r} at epoch {epoch}"
    try:
        table = _reopened(path, settings.options)
        weighted = _weighted(rows, schema, what)
        result = _merge(path, table, weighted, schema, metadata, view=view, epoch=epoch)
    except (CommitFailedError, DeltaError, OSError) as err:
        raise TableError(
            f"could not commit {what} to its table at {path} (a retry computes it again "
            f"and commits it once): {_said(err)}"
        ) from err
    sync_version(path, result.version)
    log.info("view %s, rebuild of epoch %s: %s", view, epoch, result.describe())
    return result


def table_columns(path: TablePath, *, storage_options: StorageOptions | None = None) -> list[str]:
    """The columns of the table at ``path`` (the view's and ``__copies``), from its log."""
    return [f.name for f in _reopened(path, storage_options).schema().fields]


def replace_table(
    path: TablePath,
    *,
    circuit: str,
    view: str,
    schema: Schema,
    epoch: int,
    rows: pa.Table,
    settings: TableSettings | None = None,
) -> TableCommit:
    """Overwrite the table of a view that an evolution at ``epoch`` gave other columns
    with ``rows`` (its whole contents then, the view's columns and ``__w``): one commit,
    in the new columns, that still says the table holds ``epoch``; the versions before
    it keep the old columns for time travel. Skipped when the table has the new columns
    already (a retry)."""
    path = path if is_uri(path) else Path(path)
    settings = settings or TableSettings()
    wanted = [*schema.names, COPIES]
    what = f"view {view!r} as of epoch {epoch}, in its new columns"
    try:
        if table_columns(path, storage_options=settings.options) == wanted:
            version = _version(path, settings.options)
            return TableCommit(view, path, epoch, version=version, skipped=True)
        weighted = _weighted(rows, schema, what)
        table = _sorted_for_bounds(weighted, schema).rename_columns(wanted)
        write_deltalake(
            str(path),
            table,
            mode="overwrite",
            schema_mode="overwrite",
            storage_options=settings.options,
            target_file_size=settings.target_file_bytes,
            # The epoch's transaction again: the table still holds that epoch.
            commit_properties=_correction_properties(circuit, view, epoch, holds_epoch=True),
        )
        version = _version(path, settings.options)
    except (CommitFailedError, DeltaError, OSError) as err:
        raise TableError(
            f"could not replace the table of view {view!r} at {path} with {what} (a retry "
            f"replaces it once): {_said(err)}"
        ) from err
    sync_version(path, version)
    log.info("view %s: table %s replaced at epoch %s (new columns)", view, path, epoch)
    return TableCommit(view, path, epoch, version=version, loaded=True, inserted=len(table))


def retire_table(
    location: str | os.PathLike[str],
    circuit: str,
    view: str,
    epoch: int,
    *,
    storage_options: StorageOptions | None = None,
) -> Path | str | None:
    """Move the table of ``view`` (removed from its circuit by an evolution at
    ``epoch``), kept at ``location`` apart from the outputs, to
    ``<location>/<circuit>/_retired/<view>@epoch=<epoch>/``, where it still reads as of
    each epoch it holds (a Delta log names its files relative to the table); None when
    there is nothing left to move. So the view's place is free for a view of that name
    added later, which starts a table of its own.

    A local location is one rename. On an object store, where nothing renames a
    folder, each object is moved on its own (a copy, then a delete), the log first, so
    the old place stops being a table before its files go; a move cut short leaves the
    rest where it was, and a retry moves it into the same place."""
    if not is_uri(location):
        return retire_outputs(location, circuit, view, epoch)
    from deltalake.fs import DeltaStorageHandler
    from pyarrow import fs

    root = f"{str(location).rstrip('/')}/{circuit}"
    retired = f"{RETIRED}/{view}@epoch={int(epoch)}"
    store = fs.PyFileSystem(DeltaStorageHandler(root, dict(storage_options or {})))
    try:
        found = store.get_file_info(fs.FileSelector(view, allow_not_found=True, recursive=True))
        moving = sorted(
            (item.path for item in found if item.type == fs.FileType.File),
            key=lambda name: (f"/{TABLE}/_delta_log/" not in f"/{name}", name),
        )
        for name in moving:
            store.move(name, f"{retired}/{name[len(view) + 1 :]}")
    except (DeltaError, OSError) as err:
        raise TableError(
            f"could not move the table of removed view {view!r} from {root}/{view} to "
            f"{root}/{retired} (what moved stays moved; a retry moves the rest): {_said(err)}"
        ) from err
    if not moving:
        return None
    log.info("view %s removed at epoch %s: its table moved to %s/%s", view, epoch, root, retired)
    return f"{root}/{retired}"


def _commit(
    path: Path | str,
    table: DeltaTable | None,
    circuit: str,
    view: str,
    schema: Schema,
    epoch: int,
    committed: int | None,
    change: pa.Table,
    whole_view: Callable[[], pa.Table],
    interval: str | None,
    settings: TableSettings,
) -> TableCommit:
    """Create the table (``table`` is None), or merge through ``table``, the snapshot
    whose last epoch ``committed`` was checked."""
    metadata = _commit_properties(circuit, view, epoch, interval)
    what = f"the change of view {view!r} at epoch {epoch}"
    if table is None or committed is None:
        if epoch == 0:
            rows = _weighted(change, schema, what)
        else:
            rows = _weighted(whole_view(), schema, f"view {view!r} as of epoch {epoch}")
        return _load(path, rows, schema, metadata, settings, view=view, epoch=epoch)
    if committed != epoch - 1:
        raise TableEpochError(
            f"the table of view {view!r} of circuit {circuit!r} at {path} holds epochs up "
            f"to {committed}; epoch {epoch} can only follow epoch {epoch - 1}. Publish "
            f"epochs {committed + 1}..{epoch - 1} first, or move the table away to reload "
            f"it from the view"
        )
    rows = _weighted(change, schema, what)
    return _merge(path, table, rows, schema, metadata, view=view, epoch=epoch)


def _commit_properties(
    circuit: str, view: str, epoch: int, interval: str | None
) -> CommitProperties:
    return CommitProperties(
        custom_metadata={
            CIRCUIT_KEY: circuit,
            VIEW_KEY: view,
            EPOCH_KEY: int(epoch),
            INTERVAL_KEY: interval,
        },
        app_transactions=[Transaction(app_id(circuit, view), int(epoch))],
    )


def _correction_properties(
    circuit: str, view: str, epoch: int, *, holds_epoch: bool = False
) -> CommitProperties:
    """A commit that corrects or replaces the view as of ``epoch`` (not an epoch's
    publish); ``holds_epoch`` also records ``epoch``'s transaction, for a commit that
    rewrites the whole table."""
    return CommitProperties(
        custom_metadata={CIRCUIT_KEY: circuit, VIEW_KEY: view, CORRECTED_EPOCH_KEY: int(epoch)},
        app_transactions=[Transaction(app_id(circuit, view), int(epoch))] if holds_epoch else None,
    )


def _weighted(rows: pa.Table, schema: Schema, what: str) -> pa.Table:
    """``rows`` with exactly the view's columns and ``__w``, in their Arrow types."""
    expected = [*schema.names, WEIGHT]
    missing = [name for name in expected if name not in rows.column_names]
    if missing:
        raise TableError(f"{what} lacks columns {missing} (it has {rows.column_names})")
    return rows.select(expected).cast(arrow_schema([*schema.fields, (WEIGHT, BIGINT)]))


def _load(
    path: Path | str,
    rows: pa.Table,
    schema: Schema,
    metadata: CommitProperties,
    settings: TableSettings,
    *,
    view: str,
    epoch: int,
) -> TableCommit:
    """Create the table holding ``rows`` (a whole view: every weight positive)."""
    weights = rows.column(WEIGHT)
    if len(rows) and pc.min(weights).as_py() <= 0:
        raise TableError(
            f"view {view!r} at epoch {epoch} has rows of weight <= 0; a view to load "
            f"into a table holds each row a positive number of times"
        )
    table = _sorted_for_bounds(rows, schema).rename_columns([*schema.names, COPIES])
    write_deltalake(
        str(path),
        table,
        mode="error",
        storage_options=settings.options,
        target_file_size=settings.target_file_bytes,
        configuration={
            "delta.enableChangeDataFeed": "true",
            "delta.targetFileSize": str(settings.target_file_bytes),
        },
        commit_properties=metadata,
    )
    return TableCommit(
        view,
        path,
        epoch,
        version=_version(path, settings.options),
        loaded=True,
        inserted=len(table),
        files_added=len(_reopened(path, settings.options).file_uris()),
    )


def _merge(
    path: Path | str,
    table: DeltaTable,
    rows: pa.Table,
    schema: Schema,
    metadata: CommitProperties,
    *,
    view: str,
    epoch: int,
) -> TableCommit:
    if len(rows) == 0:
        # A merge of nothing commits nothing; the epoch still gets its version. This
        # commit adds no file, but its txn makes delta-rs refuse it over a table another
        # publisher of the epoch committed to since the check (a concurrent transaction
        # of the same application): the loser skips, as after a merge.
        table.create_write_transaction(
            [], mode="append", schema=table.schema(), commit_properties=metadata
        )
        return TableCommit(view, path, epoch, version=_reloaded(table))
    names = [_quoted(name) for name in schema.names]
    copies, weight = _quoted(COPIES), _quoted(WEIGHT)
    matches = [f"(t.{n} IS NOT DISTINCT FROM s.{n})" for n in names]
    metrics = (
        table.merge(
            rows,
            predicate=" AND ".join([*matches, *target_bounds(rows, schema)]),
            source_alias="s",
            target_alias="t",
            commit_properties=metadata,
        )
        .when_matched_delete(predicate=f"t.{copies} + s.{weight} <= 0")
        .when_matched_update(updates={copies: f"t.{copies} + s.{weight}"})
        .when_not_matched_insert(
            updates={**{n: f"s.{n}" for n in names}, copies: f"s.{weight}"},
            predicate=f"s.{weight} > 0",
        )
        .execute()
    )
    result = TableCommit(
        view,
        path,
        epoch,
        version=_reloaded(table),
        inserted=metrics["num_target_rows_inserted"],
        updated=metrics["num_target_rows_updated"],
        deleted=metrics["num_target_rows_deleted"],
        files_added=metrics["num_target_files_added"],
        files_removed=metrics["num_target_files_removed"],
        rows_copied=metrics["num_target_rows_copied"],
        scan_ms=metrics["scan_time_ms"],
    )
    applied = result.inserted + result.updated + result.deleted
    if applied != len(rows):
        # Committed already (the merge cannot refuse), so say how to repair it.
        raise TableError(
            f"the table of view {view!r} at {path} disagreed with the view at epoch "
            f"{epoch}: {len(rows) - applied} of the change's {len(rows)} rows deleted "
            f"copies it did not hold. Move the table away to reload it from the view"
        )
    return result


def target_bounds(change: pa.Table, schema: Schema) -> list[str]:
    """Conjuncts on the target alone, implied by the merge's match, that let delta-rs
    skip files by their statistics: for each column of an ordered type, the change's
    range of values (``t.c >= min AND t.c <= max``, ``OR t.c IS NULL`` when the change
    has NULLs there). A row matches a change row only if it equals it in every column,
    so it lies in every range and the bounds drop no match.

    delta-rs infers such a filter itself from ``t.c = s.c``, but not from the NULL-safe
    ``IS NOT DISTINCT FROM`` a multiset needs, so without these it read every file of
    the table at each merge. Doubles (NaN, -0.0), booleans and arrays get no bound; a
    string bound is written only when it has no control character or backslash (its
    side of the range is left open otherwise: a wider range is still sound).
    """
    conjuncts = []
    for name, kind in schema.fields:
        literal = _literal_writer(kind)
        if literal is None:
            continue
        column = change.column(name)
        column_sql = f"t.{_quoted(name)}"
        nulls = column.null_count > 0
        if column.null_count == len(column):
            conjuncts.append(f"({column_sql} IS NULL)")
            continue
        low, high = pc.min_max(column).values()
        sides = [
            f"{column_sql} {op} {text}"
            for op, value in ((">=", low), ("<=", high))
            if (text := literal(value.as_py())) is not None
        ]
        if not sides:
            continue
        bound = " AND ".join(sides)
        conjuncts.append(f"(({bound}) OR {column_sql} IS NULL)" if nulls else f"({bound})")
    return conjuncts


def _literal_writer(kind: str) -> Callable[[Any], str | None] | None:
    """How a value of ``kind`` is written as an exact delta-rs SQL literal (None: the
    type gets no bound)."""
    if kind == BIGINT:
        return lambda value: str(int(value))
    if kind == STRING:
        return _string_literal
    if kind == DATE:
        return lambda value: f"CAST('{value.isoformat()}' AS DATE)"
    if kind == TIMESTAMP:
        # Text the column's type coerces (CAST AS TIMESTAMP would go through
        # nanoseconds, which overflow outside 1677..2262).
        return lambda value: (
            f"'{value.year:04d}-{value.month:02d}-{value.day:02d}T{value.hour:02d}:"
            f"{value.minute:02d}:{value.second:02d}.{value.microsecond:06d}Z'"
        )
    if is_decimal(kind):
        precision, scale = decimal_parts(kind)
        return lambda value: f"CAST('{value:f}' AS DECIMAL({precision},{scale}))"
    return None


def _string_literal(value: str) -> str | None:
    if any(char < " " or "\x7f" <= char <= "\x9f" or char == "\\" for char in value):
        return None
    return "'" + value.replace("'", "''") + "'"


def _sorted_for_bounds(rows: pa.Table, schema: Schema) -> pa.Table:
    """``rows`` ordered by the columns :func:`target_bounds` bounds, in the view's
    order (NULLs last), so that each file written holds a narrow range of the first."""
    keys = [(name, "ascending", "at_end") for name, kind in schema.fields if _literal_writer(kind)]
    if not keys or len(rows) < 2:
        return rows
    return rows.take(pc.sort_indices(rows, sort_keys=keys))


def _quoted(name: str) -> str:
    """A column name as a SQL identifier for delta-rs predicates (which fold unquoted
    names to lower case)."""
    return '"' + name.replace('"', '""') + '"'


def _said(err: BaseException) -> str:
    """An error's text on one line, without the terminal colours delta-rs adds."""
    return " ".join(re.sub(r"\x1b\[[0-9;]*m|\u21b3", " ", str(err)).split())


def _reopened(path: Path | str, options: StorageOptions | None) -> DeltaTable:
    table = _open(path, options)
    if table is None:
        raise TableError(f"the table at {path} disappeared while it was being published")
    return table


def _version(path: Path | str, options: StorageOptions | None) -> int:
    return _reopened(path, options).version()


def _reloaded(table: DeltaTable) -> int:
    """The latest version of ``table``'s log (after a commit through it)."""
    table.update_incremental()
    return table.version()


def _epoch_version(path: Path | str, epoch: int, options: StorageOptions | None) -> int | None:
    """The version that committed ``epoch`` (None when the log no longer lists it)."""
    return table_versions(path, storage_options=options).get(epoch)


def sync_version(path: TablePath, version: int | None) -> None:
    """fsync what commit ``version`` of the local table at ``path`` wrote: its log entry,
    the data and change files it added, a checkpoint of that version and
    ``_last_checkpoint``, and the directories up to the table's (delta-rs does not), so
    that a table version the catalog counts on outlives a crash. An object store's table
    is durable when its writes return."""
    if is_uri(path) or version is None:
        return
    root = Path(path)
    log_dir = root / "_delta_log"
    entry = log_dir / f"{version:020d}.json"
    written = [entry]
    for line in entry.read_text().splitlines():
        action = json.loads(line)
        for kind in ("add", "cdc"):
            if kind in action:
                written.append(root / urllib.parse.unquote(action[kind]["path"]))
    written += [
        extra
        for extra in (log_dir / f"{version:020d}.checkpoint.parquet", log_dir / "_last_checkpoint")
        if extra.exists()
    ]
    # The first version also made the table's folder, and perhaps the view's and the
    # circuit's above it (``<root>/<circuit>/<view>/table``).
    up_to = root if version > 0 else root.parents[min(2, len(root.parents) - 1)]
    sync_trees(written, up_to=up_to)


# ==================================================================================== reading
def table_versions(
    path: TablePath, *, storage_options: StorageOptions | None = None
) -> dict[int, int]:
    """Epoch -> the table version its publish committed, for every epoch in the log."""
    table = _open(path, storage_options)
    if table is None:
        raise TableError(f"no published table at {path}")
    versions = {}
    for commit in table.history():
        if EPOCH_KEY in commit:
            versions[int(commit[EPOCH_KEY])] = int(commit["version"])
    return dict(sorted(versions.items()))


def open_table(
    path: TablePath, epoch: int | None = None, *, storage_options: StorageOptions | None = None
) -> DeltaTable:
    """The ``DeltaTable`` at ``path`` as of ``epoch`` (default: the latest version): the
    last version before the next epoch's commit."""
    table = _open(path, storage_options)
    if table is None:
        raise TableError(f"no published table at {path}")
    if epoch is None:
        return table
    versions = table_versions(path, storage_options=storage_options)
    if epoch not in versions:
        raise TableError(
            f"the table at {path} has no version of epoch {epoch} (epochs in its log: "
            f"{_ranges(versions)})"
        )
    # The last version before the next epoch's commit shows the same view with the
    # files that maintenance (compaction) wrote since, which vacuum keeps.
    later = [version for other, version in versions.items() if other > epoch]
    table.load_as_version(min(later) - 1 if later else table.version())
    return table


def read_table(
    path: TablePath, epoch: int | None = None, *, storage_options: StorageOptions | None = None
) -> pa.Table:
    """The published view at ``path`` as of ``epoch``: its columns and ``__copies``."""
    table = open_table(path, epoch, storage_options=storage_options)
    try:
        return pa.table(table.to_pyarrow_table())
    except OSError as err:
        raise TableError(
            f"the table at {path} as of epoch {epoch} can no longer be read: its files "
            f"were vacuumed (older than the retention setting) ({err})"
        ) from err


def table_rows(
    path: TablePath,
    schema: Schema,
    epoch: int | None = None,
    *,
    storage_options: StorageOptions | None = None,
) -> Iterator[WeightedRow]:
    """The rows of the published view at ``path`` as of ``epoch``, each with its copies
    as its weight, one Arrow batch in memory at a time (for loading a serving table)."""
    dataset = open_table(path, epoch, storage_options=storage_options).to_pyarrow_dataset()
    try:
        for batch in dataset.to_batches(columns=[*schema.names, COPIES]):
            table = pa.Table.from_batches([batch]).rename_columns([*schema.names, WEIGHT])
            yield from arrow_rows(table, schema)
    except OSError as err:
        raise TableError(
            f"the table at {path} as of epoch {epoch} can no longer be read: its files "
            f"were vacuumed (older than the retention setting) ({err})"
        ) from err


def spark_table(
    spark: SparkSession,
    path: TablePath,
    epoch: int | None = None,
    *,
    storage_options: StorageOptions | None = None,
) -> DataFrame:
    """The published view at ``path`` as of ``epoch`` as a Spark frame (its columns and
    ``__copies``), without Delta Lake's Spark connector: the Parquet data files of that
    version, as the Delta log lists them. Exact for dbspark's tables, which have no
    partition columns, no column mapping and no deletion vectors (delta-rs writes
    deletes copy-on-write); any other Delta table needs ``delta-spark``'s reader.

    A table on object storage (``s3://...``, read with ``storage_options`` as published)
    is read by delta-rs and handed to Spark as Arrow, through the driver: the pyspark
    wheel has no S3 connector (``hadoop-aws``). Where the cluster has one, reading
    ``open_table(...).file_uris()`` with ``spark.read.parquet`` (as ``s3a://``) spreads
    the read over the executors instead."""
    table = open_table(path, epoch, storage_options=storage_options)
    files = table.file_uris()
    if not files or is_uri(path):  # an empty view has no data file, only a schema
        return spark.createDataFrame(pa.table(table.to_pyarrow_table()))
    return spark.read.parquet(*files)


def _ranges(versions: dict[int, int]) -> str:
    epochs = sorted(versions)
    return f"{epochs[0]}..{epochs[-1]}" if epochs else "none"


# ==================================================================================== housekeeping
#: Housekeeping sorts the table again when it has drifted more than this factor from
#: the layout its last sort left: in :func:`file_overlap`, or in number of files.
SORT_WHEN_DRIFTED = 2.0
#: Commit-info key of a housekeeping sort: the column it sorted by.
SORTED_BY_KEY = "dbspark.sorted_by"
#: delta-rs's z-order keys a value by the first 16 bytes of its Arrow row form, which
#: hold a string's first 14 bytes (a sentinel, 8 bytes, a continuation byte, 6 bytes).
ZORDER_STRING_BYTES = 14
#: A data file's range of a column: its least and greatest value, bytes and rows.
FileRange = tuple[Any, Any, int, int]


def maintain_table(path: TablePath, settings: TableSettings) -> dict[str, Any]:
    """Keep the table's files in order on the column its merges are bounded by first,
    then delete the files no version within ``retention_hours`` uses. Each step is its
    own commit, carrying no epoch.

    The rule: the table is rewritten sorted by its first bounded column (the load's
    first sort key, :func:`_sorted_for_bounds`) in files of ``target_file_bytes`` when,
    against the last version written in order (the last such sort, else the load or an
    evolution's replacement), its :func:`file_overlap` on that column is more than
    :data:`SORT_WHEN_DRIFTED` (2) times as large, or it has more than 2 times as many
    files. Otherwise nothing is rewritten. Twice the overlap means that a change on a
    few neighbouring values reads twice the bytes: a merge writes its output in no key
    order, so after a change spread over the table each file spans most of it and the
    merge's bounds (:func:`target_bounds`) skip little (overlap 1.0 -> 10.5 in 11-14
    files of a 1M-row view, where a clustered 0.1% commit then read 7-8 files, not 1).
    Twice the files means that merges left as many small files as the sort wrote. The
    sort is one rewrite of the table, 2-3 times a commit of a change spread over it
    (0.40 s there, against 0.13-0.18 s), so it waits for a drift that costs every later
    commit as much again; small files must have doubled first, so their rewrites cost
    about one file per file added. Measured against the last sort, a column the sort
    orders only in part (strings sharing their first 14 bytes in large groups) is not
    rewritten again for nothing.

    There is no compaction by size then: delta-rs bins small files in the order the log
    added them, which joins files of distant ranges (it took tables in order, overlap
    1.02-1.05, to 2.2-3.9). A table with no bounded column, or whose column is a string
    all of whose values share their first 14 bytes (all a z-order sees of them, so the
    sort would scatter the files), has no order housekeeping can keep: it is compacted
    by size, as before.

    Returns ``files_compacted`` and ``files_written`` (by the sort or the compaction),
    ``files_vacuumed``, ``sorted`` (0 or 1) and ``overlap_before``/``overlap_after``
    (None: no bounded column, or no file with a value in it)."""
    table = _reopened(path, settings.options)
    column = _first_bounded_column(table)
    ranges = _file_ranges(table, column) if column else []
    before = _overlap(ranges)
    sort = False
    rewritten: dict[str, Any] = {}
    if column is None or not _sort_can_order(ranges):
        rewritten = table.optimize.compact(target_size=settings.target_file_bytes)
    else:
        sort = _drifted(table, column, before, settings.options)
        if sort:
            # delta-rs's z-order of one column is a sort by the first 16 bytes of its
            # values' binary row form: exact for BIGINT, DATE and TIMESTAMP, the first
            # 14 bytes of a STRING, all but the last byte of a DECIMAL. As an OPTIMIZE
            # it marks its files dataChange=false: the change feed, the epochs' versions
            # and their txn are untouched, and older versions keep their own files. A
            # rewrite by hand (write_deltalake's overwrite) would put the whole view in
            # the change feed, deleted and inserted again.
            rewritten = table.optimize.z_order(
                [column],
                target_size=settings.target_file_bytes,
                commit_properties=CommitProperties(custom_metadata={SORTED_BY_KEY: column}),
            )
    table = _reopened(path, settings.options)
    after = file_overlap(table, column) if column else None
    sync_version(path, table.version())
    removed = table.vacuum(
        retention_hours=settings.retention_hours,
        dry_run=False,
        enforce_retention_duration=False,
    )
    return {
        "files_compacted": int(rewritten.get("numFilesRemoved", 0)),
        "files_written": int(rewritten.get("numFilesAdded", 0)),
        "files_vacuumed": len(removed),
        "sorted": int(sort),
        "overlap_before": before,
        "overlap_after": after,
    }


def file_overlap(table: DeltaTable, column: str) -> float | None:
    """How many times its own file's bytes a change inside one file's range of
    ``column`` reads, averaged over the table's rows: the bytes of the files whose range
    of ``column`` (from their statistics) overlaps that file's, itself included, over
    that file's. 1.0 when no two files' ranges overlap (the table in order), up to the
    number of files when each spans them all. Ranges that only touch (one's maximum is
    the next one's minimum) do not overlap, since a sort leaves equal values on both
    sides; a file whose ``column`` is all NULL overlaps none. None: no file has values."""
    return _overlap(_file_ranges(table, column))


def _file_ranges(table: DeltaTable, column: str) -> list[FileRange]:
    """Each data file's range of ``column``, from its statistics; files without a
    value there (all NULL, or no statistics) are left out."""
    actions = pa.table(table.get_add_actions(flatten=True))
    if f"min.{column}" not in actions.column_names:
        return []
    return [
        (low, high, size, rows)
        for low, high, size, rows in zip(
            actions.column(f"min.{column}").to_pylist(),
            actions.column(f"max.{column}").to_pylist(),
            actions.column("size_bytes").to_pylist(),
            actions.column("num_records").to_pylist(),
            strict=True,
        )
        if low is not None and high is not None and rows
    ]


def _overlap(files: list[FileRange]) -> float | None:
    """:func:`file_overlap` of files' ranges (None: no file)."""
    if not files:
        return None
    # A file's range overlaps every file's except those wholly above it (min >= its
    # max) and wholly below it (max <= its min): sums over the files sorted by min and
    # by max, found by bisection, so thousands of files cost milliseconds.
    by_low = sorted((low, size) for low, _, size, _ in files)
    by_high = sorted((high, size) for _, high, size, _ in files)
    lows, highs = [low for low, _ in by_low], [high for high, _ in by_high]
    above = list(itertools.accumulate((size for _, size in reversed(by_low)), initial=0))[::-1]
    below = list(itertools.accumulate((size for _, size in by_high), initial=0))
    # A file of one value is both above and below the files of that value, itself too.
    single: dict[Any, int] = {}
    for low, high, size, _ in files:
        if low == high:
            single[low] = single.get(low, 0) + size
    total = sum(size for _, _, size, _ in files)
    read = own = 0
    for low, high, size, rows in files:
        reach = total - above[bisect.bisect_left(lows, high)]
        reach -= below[bisect.bisect_right(highs, low)]
        if low == high:
            reach += single[low] + size
        read += rows * reach
        own += rows * size
    return round(read / own, 2)


def _sort_can_order(files: list[FileRange]) -> bool:
    """Whether a z-order sorts values in these ranges at all: not strings whose least
    and greatest (so all of them) share the first :data:`ZORDER_STRING_BYTES` bytes."""
    if not files or not isinstance(files[0][0], str):
        return True
    least = min(low for low, _, _, _ in files).encode()
    greatest = max(high for _, high, _, _ in files).encode()
    return least[:ZORDER_STRING_BYTES] != greatest[:ZORDER_STRING_BYTES]


def _first_bounded_column(table: DeltaTable) -> str | None:
    """The table's first column of a type :func:`target_bounds` bounds, which the load
    sorts by first; from the table's own schema (the view's, after an evolution too)."""
    for item in table.schema().fields:
        if item.name == COPIES or not isinstance(item.type, PrimitiveType):
            continue
        try:
            kind = normalize_type(item.type.type)
        except TypeError:  # a Delta type dbspark does not write
            continue
        if _literal_writer(kind) is not None:
            return item.name
    return None


def _newest_first(table: DeltaTable, first: int = 64) -> Iterator[dict[str, Any]]:
    """The table's commit infos, newest first, read ``first`` at a time and then in
    growing pages: the commit :func:`_drifted` looks for is usually recent, and each
    version's log entry is one request on an object store."""
    seen, limit = 0, first
    while True:
        page = table.history(limit)
        yield from page[seen:]
        if len(page) < limit:
            return
        seen, limit = len(page), limit * 4


def _drifted(
    table: DeltaTable, column: str, overlap: float | None, options: StorageOptions | None
) -> bool:
    """Whether ``table``, whose :func:`file_overlap` on ``column`` is ``overlap``, has
    more than :data:`SORT_WHEN_DRIFTED` times the overlap or the files of its last
    version written in order: its last housekeeping sort, else its last whole write (the
    load, or an evolution's replacement, both sorted fully: overlap 1.0). The files it
    wrote are in its commit's metrics; the overlap a sort left is measured on its
    version, read only when the rule needs it. When the log no longer holds that version,
    the overlap is compared with 1.0."""
    for commit in _newest_first(table):
        version = int(commit["version"])
        by_us = SORTED_BY_KEY in commit
        mode = (commit.get("operationParameters") or {}).get("mode")
        if not (by_us or mode in ("Overwrite", "ErrorIfExists") or version == 0):
            continue
        metrics = commit.get("operationMetrics") or {}
        files = metrics.get("numFilesAdded", metrics.get("num_added_files"))
        if files is not None and len(table.file_uris()) > SORT_WHEN_DRIFTED * max(int(files), 1):
            return True
        if overlap is None or overlap <= SORT_WHEN_DRIFTED:  # no layout has less than 1.0
            return False
        if not by_us:
            return True
        try:
            then = DeltaTable(
                table.table_uri, version=version, storage_options=dict(options) if options else None
            )
        except (DeltaError, OSError):
            break  # its log entries were cleaned up
        return overlap > SORT_WHEN_DRIFTED * (file_overlap(then, column) or 1.0)
    return overlap is not None and overlap > SORT_WHEN_DRIFTED
