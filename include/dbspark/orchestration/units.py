"""One unit of an epoch's Spark work, run in the Airflow worker or by ``spark-submit``.

A unit is what one Spark-using task does: ingest a source's batch, run a stage, run
the loop's next pending iteration, publish and export the views, close the epoch, or,
when a run asks for them, rebuild views or verify them against a full refresh.
``execute_unit`` runs it on a ``SparkEngine``; the task calls it directly (local Spark
or Spark Connect), or ships it to ``orchestration/spark_job.py`` with ``spark-submit``
(a cluster), which calls the same function. No Airflow import here: a unit must run
where Airflow is not installed.

A shipped unit is a JSON file (``write_unit_file``), never a pickle: anyone who can
write where a driver unpickles runs code as that driver. It carries the circuit's
recipe (an importable factory, or the SQL files) and fingerprint, the unit's fields
(rows as tagged JSON values, a FileBatch as its paths), the warehouse, and the Airflow
connection ids of the catalog and the serving database; their URLs, with passwords,
reach the driver only in its environment. The file is private (0600 in a 0700
directory this user owns) and carries an HMAC-SHA256 under a key made for that one
submission and passed in the driver's environment, so a file changed by anyone else
is refused before anything in it is used. The driver writes its result beside it the
same way.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import hashlib
import hmac
import importlib
import importlib.machinery
import json
import logging
import math
import os
import stat
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, ClassVar

from dbspark.circuit.builder import Circuit
from dbspark.core.errors import InputError
from dbspark.engine.api import LoopDidNotConverge
from dbspark.engine.file_batches import FileBatch
from dbspark.storage.catalog import (
    UNITS_FOLDER,
    CircuitDefinitionChanged,
    UncommittedUnits,
    UnsafeCatalog,
)

log = logging.getLogger("dbspark.airflow")


@dataclass(frozen=True)
class IngestUnit:
    """Ingest ``source``'s batch for the epoch (and run the chain fused onto it)."""

    epoch: int
    source: str
    batch: Any = None
    kind: ClassVar[str] = "ingest"

    def run(self, engine: Any) -> dict[str, Any]:
        report = engine.ingest(self.source, self.epoch, self.batch)
        log.info("epoch %s, source %s: %s", self.epoch, self.source, report.describe())
        return {"epoch": self.epoch, "rows_in": report.rows_in, "rows_out": report.rows_out}


@dataclass(frozen=True)
class StageUnit:
    """Run one root-scope stage at the epoch."""

    epoch: int
    stage: int
    kind: ClassVar[str] = "stage"

    def run(self, engine: Any) -> dict[str, Any]:
        report = engine.run_stage(self.stage, (self.epoch,))
        log.info("epoch %s: %s", self.epoch, report.describe())
        for path in report.paths:
            log.info("wrote %s", engine.root / path)
        return {"epoch": self.epoch, "rows_in": report.rows_in, "rows_out": report.rows_out}


@dataclass(frozen=True)
class IterateUnit:
    """The loop's next pending iteration. The task of the last slot carries on inline, so
    a loop deeper than the DAG's iteration tasks still runs up to its own bound."""

    epoch: int
    loop: int
    iteration_tasks: int
    map_index: int | None = None
    kind: ClassVar[str] = "iterate"

    def run(self, engine: Any) -> dict[str, Any]:
        loop = engine.plan.loops[self.loop]
        ran = []
        while True:
            report = engine.run_iteration(loop, (self.epoch,))
            ran.append(report.iteration)
            log.info(
                "loop %s, epoch %s, iteration %s (task map index %s): delta %s rows; %s",
                loop.name,
                self.epoch,
                report.iteration,
                self.map_index,
                report.delta_rows,
                report.reason,
            )
            last_slot = report.iteration + 1 >= self.iteration_tasks
            if report.converged or not last_slot or report.iteration + 1 >= loop.max_iterations:
                break
        return {"epoch": self.epoch, "iterations": ran, "converged": report.converged}


@dataclass(frozen=True)
class PublishUnit:
    """Publish the epoch's view changes, then export them to ``outputs`` (each view's
    Delta table and change feed; no whole-view snapshot, which the table replaces) and to
    the serving database at ``serving_url``, when there is one. The tables are kept as
    ``tables`` (the ``[dbspark] table_*`` keys set in ``airflow.cfg``) and otherwise the
    ``DBSPARK_TABLE_*`` variables say (``TableSettings.from_environment``)."""

    epoch: int
    outputs: str
    serving_url: str | None = None
    serving_prefix: str = "dbspark_"
    tables: dict[str, str] | None = None
    #: The tables' object store credentials (``[dbspark] table_conn_id``), never in a
    #: unit file: a driver takes them from its environment, as ``serving_url``.
    table_credentials: dict[str, str] | None = field(default=None, repr=False)
    kind: ClassVar[str] = "publish"

    def run(self, engine: Any) -> dict[str, Any]:
        from dbspark.orchestration.sinks.export import export_epoch
        from dbspark.orchestration.sinks.serving import ServingTarget

        serving = None
        if self.serving_url:
            serving = ServingTarget(self.serving_url, prefix=self.serving_prefix)
        # One publisher of the circuit at a time: the same unit run twice at once (a
        # queue's redelivery) would otherwise load a view's new table twice, each from
        # a snapshot without it (delta-rs puts the second creation on top of the first).
        # The second finds the epoch published and its outputs complete, and skips.
        with engine.catalog.exclusive(engine.circuit.name, "publish"):
            report = engine.publish(self.epoch)
            log.info("epoch %s: %s", self.epoch, report.describe())
            exported = export_epoch(
                engine,
                self.epoch,
                root=self.outputs,
                serving=serving,
                tables=_table_settings(self),
                snapshots=False,
            )
        log.info("epoch %s outputs:\n%s", self.epoch, exported.describe())
        # Per view, what its asset event tells consumers (orchestration/airflow/assets.py).
        # The counts come from the change feed's marker, so a retry that finds the
        # outputs complete reports what the first attempt wrote.
        views = {}
        for name, item in exported.views.items():
            changes, table = item.changes, item.table
            views[name] = {
                "rows": changes.rows if changes else 0,
                "inserted": changes.inserted if changes else 0,
                "deleted": changes.deleted if changes else 0,
                "changes": str(changes.path) if changes and changes.path else None,
                "table": str(table.path) if table else None,
                "table_version": table.version if table else None,
            }
        return {"epoch": self.epoch, "view_changes": report.rows_out, "views": views}


@dataclass(frozen=True)
class CloseUnit:
    """Commit the epoch (then compact)."""

    epoch: int
    kind: ClassVar[str] = "close"

    def run(self, engine: Any) -> dict[str, Any]:
        engine.close_epoch(self.epoch)
        log.info("circuit %s: epoch %s committed", engine.circuit.name, self.epoch)
        return {"epoch": self.epoch}


@dataclass(frozen=True)
class RebuildUnit:
    """Replace each of ``views`` with its full refresh over the raw input log, at the last
    committed epoch (``SparkEngine.rebuild``; the engine's rule, as ``python -m
    dbspark.refresh rebuild`` runs it), then correct the views' outputs under
    ``outputs`` (``sinks.export.correct_views``: the change feed's correction and the
    table's commit; the DAG's ``serve`` task then repairs the serving tables). ``by``
    names the DAG run that asked (``dag_id/run_id``), recorded on the catalog's commit."""

    epoch: int
    views: tuple[str, ...]
    outputs: str | None = None
    tables: dict[str, str] | None = None
    by: str | None = None
    table_credentials: dict[str, str] | None = field(default=None, repr=False)
    kind: ClassVar[str] = "rebuild"

    def run(self, engine: Any) -> dict[str, Any]:
        from dbspark.orchestration.sinks.export import rebuild_views

        at = engine.last_committed_epoch()
        if self.outputs is None:
            rows = {name: engine.rebuild(name, by=self.by) for name in self.views}
            return {"epoch": at, "rows": rows, "corrections": {}}
        tables = _table_settings(self)
        rows, done = rebuild_views(engine, self.views, root=self.outputs, tables=tables, by=self.by)
        corrections: dict[str, Any] = {}
        for name, item in done.items():
            log.info("rebuild of epoch %s: %s", at, item.describe())
            corrections[name] = item.summary() if item.changed else None
        return {"epoch": at, "rows": rows, "corrections": corrections}


@dataclass(frozen=True)
class EvolveUnit:
    """Let the circuit's new definition take its warehouse's state over (the engine is
    built with ``evolve=True``: views added or changed rebuilt from the raw input log,
    the others continuing, ``engine/spark/evolve.py``), then bring the views' outputs
    under ``outputs`` along (``sinks.export.evolve_outputs``) and record that they are
    (the commit ``evolve-outputs:<fingerprint>`` at the epoch it evolved at). Run again
    after a failure, it finds the circuit evolved and completes the outputs. ``epoch``
    is the epoch the DAG run opens."""

    epoch: int
    outputs: str | None = None
    tables: dict[str, str] | None = None
    table_credentials: dict[str, str] | None = field(default=None, repr=False)
    kind: ClassVar[str] = "evolve"
    #: The engine this unit runs on is built to evolve (``SparkEngine(evolve=True)``).
    evolves: ClassVar[bool] = True

    def run(self, engine: Any) -> dict[str, Any]:
        from dbspark.circuit.fingerprint import circuit_fingerprint
        from dbspark.engine.circuits import pending_evolution
        from dbspark.orchestration.sinks.export import evolve_outputs
        from dbspark.storage import collection_names as coll

        report = engine.evolved
        said = report.describe() if report is not None else None
        pending = pending_evolution(engine.catalog, engine.root, engine.circuit)
        if pending is None:
            return {"evolved": report is not None, "description": said, "outputs": {}}
        evolution, at = pending
        name = engine.circuit.name
        stage = coll.evolve_outputs_stage(circuit_fingerprint(engine.circuit))
        done: dict[str, str] = {}
        if self.outputs is not None:
            tables = _table_settings(self)
            done = evolve_outputs(engine, evolution, at, root=self.outputs, tables=tables)
        engine.catalog.commit(name, stage, (at,))
        return {
            "evolved": report is not None,
            "epoch": at,
            "description": said or evolution.describe(),
            "outputs": done,
        }


@dataclass(frozen=True)
class VerifyUnit:
    """Recompute every view from the raw input log and compare it with the maintained
    view, at the last committed epoch (``SparkEngine.verify``). Returns per view the
    number of differing rows (at most the engine's listing limit) and the first few."""

    epoch: int
    kind: ClassVar[str] = "verify"
    shown: ClassVar[int] = 10

    def run(self, engine: Any) -> dict[str, Any]:
        at = engine.last_committed_epoch()
        differences = engine.verify()
        return {
            "epoch": at,
            "differing": {name: len(rows) for name, rows in differences.items() if rows},
            "examples": {
                name: [
                    f"{row[:-1]} weight(full refresh - maintained) = {row[-1]}"
                    for row in rows[: self.shown]
                ]
                for name, rows in differences.items()
                if rows
            },
            "views": sorted(differences),
        }


@dataclass(frozen=True)
class CompactLogsUnit:
    """Merge the sources' raw input log batches of epochs up to ``through_epoch``, or up
    to the latest the circuit's delays allow (input log retention,
    ``SparkEngine.compact_input_logs``), for the ``maintain`` task of the run of
    ``epoch``. Reports the merges, and the batches and rows they replaced."""

    epoch: int
    through_epoch: int
    kind: ClassVar[str] = "compact-logs"

    def run(self, engine: Any) -> dict[str, Any]:
        through = min(self.through_epoch, engine.latest_mergeable_epoch())
        done = engine.compact_input_logs(through) if through >= 0 else []
        merged = [c for c in done if c.committed]
        return {
            "through_epoch": through,
            "merges": len(merged),
            "batches_replaced": sum(len(c.inputs) for c in merged),
            "rows_replaced": sum(c.input_rows for c in merged),
            "rows_kept": sum(c.output.rows for c in merged if c.output is not None),
            "replayable_from": engine.replayable_from(),
        }


Unit = (
    IngestUnit
    | StageUnit
    | IterateUnit
    | PublishUnit
    | CloseUnit
    | RebuildUnit
    | EvolveUnit
    | VerifyUnit
    | CompactLogsUnit
)


def _table_settings(unit: PublishUnit | RebuildUnit | EvolveUnit) -> Any:
    """The published tables' settings of ``unit``: its ``[dbspark]`` keys, the
    ``DBSPARK_TABLE_*`` variables of this process, and its credentials."""
    from dbspark.orchestration.sinks.tables import TableSettings

    return TableSettings.from_environment(unit.tables, credentials=unit.table_credentials)


def execute_unit(engine: Any, unit: Unit) -> dict[str, Any]:
    """Run ``unit`` on ``engine`` and return what the task reports (JSON-serialisable)."""
    return unit.run(engine)


# ------------------------------------------------------------------ shipping to spark-submit
#: Environment variables the submitting task sets for the spark-submit driver only.
UNIT_KEY_VARIABLE = "DBSPARK_UNIT_KEY"
CATALOG_URL_VARIABLE = "DBSPARK_UNIT_CATALOG_URL"
SERVING_URL_VARIABLE = "DBSPARK_UNIT_SERVING_URL"
#: The published tables' credentials (JSON of ``AWS_*`` names), for a unit whose
#: ``table_credentials`` the unit file leaves out.
TABLE_CREDENTIALS_VARIABLE = "DBSPARK_UNIT_TABLE_CREDENTIALS"
UNIT_FORMAT = "dbspark-unit/1"
RESULT_FORMAT = "dbspark-unit-result/1"
UNIT_KINDS: dict[str, type] = {
    cls.kind: cls
    for cls in (
        IngestUnit,
        StageUnit,
        IterateUnit,
        PublishUnit,
        CloseUnit,
        RebuildUnit,
        EvolveUnit,
        VerifyUnit,
        CompactLogsUnit,
    )
}


#: Failures of a spark-submitted unit that a retry would repeat (the retry policy's
#: ``FAIL`` rules, ``airflow/policy.py``): the driver sends them back in its result file.
FINAL_ERRORS = (
    InputError,
    UncommittedUnits,
    LoopDidNotConverge,
    CircuitDefinitionChanged,
    UnsafeCatalog,
)


class UnitFileError(RuntimeError):
    """A unit file (or its result) that must not be run or believed: not private, changed
    since it was written, or not what this code reads. The message says which."""


@dataclass(frozen=True)
class CircuitRecipe:
    """How a spark-submit driver builds the task's circuit again, instead of receiving
    it as a pickle: ``factory`` (``"module:qualname"``, a module-level function that
    returns the circuit, importable on the driver), or ``sql`` and ``sources`` (the files
    ``sql_dag`` compiled, with the circuit's ``name``)."""

    factory: str | None = None
    sql: str | None = None
    sources: str | None = None
    name: str | None = None

    @classmethod
    def of_factory(cls, factory: Any) -> CircuitRecipe | None:
        """The recipe of a circuit factory, or None when a new process could not import
        it (a lambda, a nested function, a function of a DAG file, which Airflow loads
        under a name of its own)."""
        module, qualname = (
            getattr(factory, "__module__", None),
            getattr(factory, "__qualname__", ""),
        )
        if not module or module == "__main__" or "<" in qualname:
            return None
        if importlib.machinery.PathFinder.find_spec(module.partition(".")[0]) is None:
            return None
        return cls(factory=f"{module}:{qualname}")

    def build(self) -> Circuit:
        if self.factory:
            module, _, qualname = self.factory.partition(":")
            target: Any = importlib.import_module(module)
            for part in qualname.split("."):
                target = getattr(target, part)
            circuit = target()
        elif self.sql and self.sources:
            from dbspark.sql.files import compile_files

            circuit = compile_files(self.sql, self.sources, self.name)
        else:
            raise UnitFileError(f"the unit file's circuit recipe names nothing to build: {self}")
        if not isinstance(circuit, Circuit):
            raise UnitFileError(f"{self.factory} returned {type(circuit).__name__}, not a Circuit")
        return circuit


@dataclass(frozen=True)
class ShippedUnit:
    """What ``orchestration/spark_job.py`` needs, as a unit file carries it: the circuit's
    recipe and fingerprint, the unit, the warehouse, and the Airflow connection ids of the
    catalog and the serving database (None: SQLite in the warehouse; none) whose URLs the
    submitting task passes to the driver in its environment, never in the file."""

    recipe: CircuitRecipe
    fingerprint: str
    unit: Unit
    warehouse: str
    catalog_conn_id: str | None = None
    serving_conn_id: str | None = None
    #: The connection of the published tables' credentials (``[dbspark] table_conn_id``).
    table_conn_id: str | None = None


def _encode(value: Any, where: str) -> Any:
    """A value of a unit or a batch as JSON data that decodes to an equal value:
    non-JSON types are tagged objects (``{"$date": ...}``); a type outside the row types
    is refused instead of being pickled."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"$float": repr(value)}
    if isinstance(value, Decimal):
        return {"$decimal": str(value)}
    if isinstance(value, datetime):
        return {"$datetime": value.isoformat()}
    if isinstance(value, date):
        return {"$date": value.isoformat()}
    if isinstance(value, bytes):
        return {"$bytes": base64.b64encode(value).decode("ascii")}
    if isinstance(value, tuple):
        return {"$tuple": [_encode(v, where) for v in value]}
    if isinstance(value, list):
        return [_encode(v, where) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {"$dict": {k: _encode(v, where) for k, v in value.items()}}
    if isinstance(value, FileBatch):
        return {"$files": {"paths": list(value.paths), "format": value.format}}
    raise UnitFileError(
        f"{where}: a {type(value).__name__} cannot go into a unit file (JSON: rows of "
        "column values, or a FileBatch); spark-submit needs a connector that returns those"
    )


def _decode(value: Any) -> Any:
    if isinstance(value, list):
        return [_decode(v) for v in value]
    if not isinstance(value, dict):
        return value
    if len(value) != 1:
        raise UnitFileError(f"unit file: an object that is no tagged value: {sorted(value)}")
    ((tag, inner),) = value.items()
    decoders: dict[str, Any] = {
        "$float": float,
        "$decimal": Decimal,
        "$datetime": datetime.fromisoformat,
        "$date": date.fromisoformat,
        "$bytes": lambda v: base64.b64decode(v.encode("ascii")),
        "$tuple": lambda v: tuple(_decode(x) for x in v),
        "$dict": lambda v: {k: _decode(x) for k, x in v.items()},
        "$files": lambda v: FileBatch(v["paths"], v["format"]),
    }
    if tag not in decoders:
        raise UnitFileError(f"unit file: unknown tagged value {tag!r}")
    return decoders[tag](inner)


def _canonical(body: Any) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def _mac(key: bytes, body: Any) -> str:
    return hmac.new(key, _canonical(body), hashlib.sha256).hexdigest()


def unit_key_from_environment(environ: Mapping[str, str] | None = None) -> bytes:
    """The unit files' HMAC key the submitting task passed in ``DBSPARK_UNIT_KEY``."""
    text = (os.environ if environ is None else environ).get(UNIT_KEY_VARIABLE, "")
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) < 32:
        raise UnitFileError(
            f"{UNIT_KEY_VARIABLE} does not hold the unit files' key (64 hex digits): the "
            "task that spark-submits a unit passes it, and a unit is never run without it"
        )
    return key


def _require_private(path: Path, what: str) -> None:
    """Refuse ``path`` unless this user owns it and nobody else may read or write it."""
    info = path.lstat()
    if stat.S_ISLNK(info.st_mode):
        raise UnitFileError(f"refused {what} {path}: it is a symbolic link")
    mode = stat.S_IMODE(info.st_mode)
    if info.st_uid != os.getuid() or mode & 0o077:
        raise UnitFileError(
            f"refused {what} {path}: owned by uid {info.st_uid} with mode {mode:04o}; unit "
            f"files must be this user's (uid {os.getuid()}) and private (files 0600 in "
            "directories 0700)"
        )


def unit_directory(warehouse: Path | str, circuit: str) -> Path:
    """``<warehouse>/_units/<circuit>/``, created or made private (mode 0700). A
    directory there that another user owns is refused: it would let them read and
    replace what a driver runs."""
    folder = Path(warehouse)
    folder.mkdir(parents=True, exist_ok=True)
    for part in (UNITS_FOLDER, circuit):
        folder = folder / part
        folder.mkdir(mode=0o700, exist_ok=True)
        info = folder.lstat()
        if info.st_uid == os.getuid() and not stat.S_ISLNK(info.st_mode):
            # mkdir's mode is masked, and a folder made by an older version was 2775.
            folder.chmod(0o700)
        _require_private(folder, "the unit directory")
    return folder


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)


def write_private_properties(directory: Path, settings: Mapping[str, str]) -> Path:
    """A new Spark properties file of ``settings`` in the private ``directory``
    (``unit_directory``), mode 0600: how a secret reaches spark-submit without showing on
    its command line (``ps``) or in the task log."""
    lines = []
    for key, value in settings.items():
        if any(c in f"{key}{value}" for c in "\n\r"):
            raise ValueError(f"the Spark setting {key!r} holds a line break")
        # Java's properties format: a backslash escapes, so it is doubled.
        lines.append(f"{key}={value.replace(chr(92), chr(92) * 2)}")
    path = Path(directory) / f"{uuid.uuid4().hex}.properties"
    _write_private(path, "\n".join(lines) + "\n")
    return path


def write_unit_file(directory: Path, shipped: ShippedUnit, key: bytes) -> Path:
    """Write ``shipped`` as a new JSON unit file in the private ``directory``
    (``unit_directory``), mode 0600, with an HMAC-SHA256 of its body under ``key``."""
    unit = shipped.unit
    fields_ = {f.name: getattr(unit, f.name) for f in dataclasses.fields(unit)}
    if isinstance(unit, PublishUnit):
        # The driver takes the serving database's URL from its environment.
        fields_["serving_url"] = None
    if "table_credentials" in fields_:  # ... and the tables' credentials
        fields_["table_credentials"] = None
    body = {
        "circuit": {
            "recipe": dataclasses.asdict(shipped.recipe),
            "fingerprint": shipped.fingerprint,
        },
        "unit": {
            "kind": unit.kind,
            "fields": {k: _encode(v, f"{unit.kind} unit, {k}") for k, v in fields_.items()},
        },
        "engine": {"warehouse": shipped.warehouse},
        "connections": {
            "catalog": {"conn_id": shipped.catalog_conn_id, "url_from": CATALOG_URL_VARIABLE},
            "serving": {"conn_id": shipped.serving_conn_id, "url_from": SERVING_URL_VARIABLE},
            "tables": {"conn_id": shipped.table_conn_id, "from": TABLE_CREDENTIALS_VARIABLE},
        },
    }
    document = {"format": UNIT_FORMAT, "body": body, "hmac_sha256": _mac(key, body)}
    path = Path(directory) / f"{uuid.uuid4().hex}.unit.json"
    _write_private(path, json.dumps(document, indent=1, allow_nan=False))
    return path


def _verified_body(path: Path, key: bytes, expected_format: str, what: str) -> dict[str, Any]:
    _require_private(path.parent, "the unit directory")
    _require_private(path, what)
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
        body, mac, format_ = document["body"], document["hmac_sha256"], document["format"]
    except (ValueError, KeyError, TypeError) as err:
        raise UnitFileError(f"refused {what} {path}: not a dbspark unit file ({err})") from None
    if format_ != expected_format:
        raise UnitFileError(f"refused {what} {path}: format {format_!r}, not {expected_format}")
    if not isinstance(mac, str) or not hmac.compare_digest(mac, _mac(key, body)):
        raise UnitFileError(
            f"refused {what} {path}: its HMAC does not match, so it was changed after the "
            "submitting task wrote it (or written with another key); nothing was run"
        )
    return dict(body)


def read_unit_file(path: Path, key: bytes) -> ShippedUnit:
    """The unit in ``path``, after checking that it is private and unchanged (its HMAC
    under ``key``); a :class:`UnitFileError` otherwise, before anything is decoded."""
    body = _verified_body(path, key, UNIT_FORMAT, "the unit file")
    circuit, unit, connections = body["circuit"], body["unit"], body["connections"]
    cls = UNIT_KINDS.get(unit["kind"])
    if cls is None:
        raise UnitFileError(f"unit file {path}: unknown unit kind {unit['kind']!r}")
    fields_ = {k: _decode(v) for k, v in unit["fields"].items()}
    return ShippedUnit(
        recipe=CircuitRecipe(**circuit["recipe"]),
        fingerprint=circuit["fingerprint"],
        unit=cls(**fields_),
        warehouse=body["engine"]["warehouse"],
        catalog_conn_id=connections["catalog"]["conn_id"],
        serving_conn_id=connections["serving"]["conn_id"],
        table_conn_id=connections.get("tables", {}).get("conn_id"),
    )


def _passed(conn_id: str | None, variable: str, environ: Mapping[str, str]) -> str | None:
    if conn_id is None:
        return None
    url = environ.get(variable)
    if not url:
        raise UnitFileError(
            f"the unit uses the Airflow connection {conn_id!r}, which the submitting task "
            f"passes to the driver in {variable}; it is not set"
        )
    return url


@contextlib.contextmanager
def unit_lease(engine: Any, unit: Unit) -> Iterator[None]:
    """Hold a lease on the circuit while ``unit`` runs in this process (a driver, the unit
    worker), so garbage collection keeps what it writes and reads even when the task
    that handed it over stopped meanwhile (its own lease released); one that dies leaves
    a lease that expires (``DEFAULT_LEASE_SECONDS``)."""
    import socket

    holder = (
        f"{unit.kind} unit of epoch {unit.epoch} of {engine.circuit.name} "
        f"({socket.gethostname()}, pid {os.getpid()})"
    )
    lease = engine.catalog.acquire_lease(engine.circuit.name, holder)
    try:
        yield
    finally:
        engine.catalog.release_lease(lease)


def run_unit_file(
    path: Path,
    spark: Any,
    environ: Mapping[str, str] | None = None,
    *,
    engines: EngineSource | None = None,
) -> dict[str, Any]:
    """Run a unit written by ``write_unit_file`` and write its result beside it (JSON,
    with an HMAC under the same key, mode 0600). The key and the databases' URLs come
    from ``environ`` (default: this process's environment). ``engines`` gives the engine
    to run it on (default: a new one that keeps nothing, closed after the unit; a
    long-lived worker keeps its own, ``orchestration/worker.py``)."""
    from dbspark.engine.spark.executor import circuit_fingerprint

    environ = os.environ if environ is None else environ
    key = unit_key_from_environment(environ)
    shipped = read_unit_file(path, key)
    circuit = shipped.recipe.build()
    if circuit_fingerprint(circuit) != shipped.fingerprint:
        raise UnitFileError(
            f"the circuit built from {shipped.recipe} is not the one the task ran (another "
            "version of the code on the driver or worker?): deploy the same code to both, "
            "and restart a long-lived worker"
        )
    unit = shipped.unit
    if isinstance(unit, PublishUnit) and shipped.serving_conn_id:
        serving_url = _passed(shipped.serving_conn_id, SERVING_URL_VARIABLE, environ)
        unit = dataclasses.replace(unit, serving_url=serving_url)
    if shipped.table_conn_id and hasattr(unit, "table_credentials"):
        held = _passed(shipped.table_conn_id, TABLE_CREDENTIALS_VARIABLE, environ)
        unit = dataclasses.replace(unit, table_credentials=json.loads(held or "{}"))
    catalog_url = _passed(shipped.catalog_conn_id, CATALOG_URL_VARIABLE, environ)
    source = engines or _fresh_engine(spark)
    try:
        with source(shipped, circuit, catalog_url) as engine, unit_lease(engine, unit):
            result = execute_unit(engine, unit)
    except FINAL_ERRORS as err:
        # The task cannot see this process's exception, only its exit status: the error
        # goes back in the result file, so the task raises it and fails at once.
        _write_result(path, key, {"error": final_error_document(err)})
        raise
    _write_result(path, key, json.loads(json.dumps(result, default=str)))
    return result


#: Gives the engine a shipped unit runs on: called with the unit, its circuit (built
#: and checked) and the catalog's URL, it returns a context manager yielding the engine.
EngineSource = Callable[[ShippedUnit, Circuit, "str | None"], AbstractContextManager[Any]]


def _fresh_engine(spark: Any) -> EngineSource:
    @contextlib.contextmanager
    def engine_for(
        shipped: ShippedUnit, circuit: Circuit, catalog_url: str | None
    ) -> Iterator[Any]:
        from dbspark.engine.spark.executor import SparkEngine

        engine = SparkEngine(
            circuit,
            shipped.warehouse,
            spark=spark,
            catalog_url=catalog_url,
            resident_bytes=0,  # one unit per process: nothing to keep across epochs
            evolve=getattr(shipped.unit, "evolves", False),
        )
        try:
            yield engine
        finally:
            engine.catalog.close()

    return engine_for


def _write_result(unit_file: Path, key: bytes, body: dict[str, Any]) -> None:
    document = {"format": RESULT_FORMAT, "body": body, "hmac_sha256": _mac(key, body)}
    _write_private(result_path(unit_file), json.dumps(document))


def read_result_file(unit_file: Path, key: bytes) -> dict[str, Any]:
    """The result the driver wrote for ``unit_file``, checked as the unit file is. A unit
    that failed in a way no retry can fix (:data:`FINAL_ERRORS`) raises its error again
    here; a driver that wrote no result is a :class:`UnitFileError` (from the check)."""
    body = _verified_body(result_path(unit_file), key, RESULT_FORMAT, "the unit's result")
    if set(body) == {"error"}:
        raise final_error(body["error"])
    return body


def final_error_document(err: BaseException) -> dict[str, Any]:
    """``err`` (one of :data:`FINAL_ERRORS`) as JSON: its kind and what rebuilds it."""
    document: dict[str, Any] = {"kind": type(err).__name__, "message": str(err)}
    if isinstance(err, InputError):
        document.update(source=err.source, detail=err.message, file=err.file)
    elif isinstance(err, UncommittedUnits):
        document["missing"] = list(err.missing)
    return document


def final_error(document: Mapping[str, Any]) -> Exception:
    """The exception ``final_error_document`` described, of the same family, so the
    task's retry policy treats it as the driver's own."""
    kind, message = document.get("kind"), str(document.get("message", ""))
    if kind == "InputError":
        return InputError(document["source"], document["detail"], document.get("file"))
    if kind == "UncommittedUnits":
        return UncommittedUnits(message, document.get("missing", []))
    if kind == "LoopDidNotConverge":
        return LoopDidNotConverge(message)
    if kind == "UnsafeCatalog":
        return UnsafeCatalog(message)
    if kind in ("CircuitDefinitionChanged", "CircuitChangedError"):
        return CircuitDefinitionChanged(message)
    return UnitFileError(f"the driver reported an error of unknown kind {kind!r}: {message}")


def result_path(unit_file: Path) -> Path:
    return unit_file.with_name(unit_file.name.removesuffix(".unit.json") + ".result.json")
