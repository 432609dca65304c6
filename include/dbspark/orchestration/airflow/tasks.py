"""What each task of an epoch's DAG run does.

Every task is idempotent because the engine's units are: a unit that committed is
skipped, and a unit that died before committing leaves only unregistered files, which
its retry overwrites. The tasks add the Airflow side:

- which epoch the run is (``epochs.py``; the open task records it, the others look it
  up), and a skip for every task of a run whose epoch already committed (but the close
  retried after its own commit, which finishes the compaction and the run);
- the loop's mapped task: each instance runs the next pending iteration (the catalog
  numbers them, so map-index order and retries do not matter) and skips once the loop
  converged; the convergence check fails loudly when the bound was reached;
- task logs that say what happened, in the words of the engine's reports;
- one asset event per view when ``publish`` succeeds (``assets.py``), none when it skips;
- the run's params (``build_dag``'s ``verify`` and ``rebuild``): checked by the open
  task before anything is written, acted on after the epoch commits.

Tasks that only consult the catalog (open, skipped iterations, the convergence check)
never start Spark.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import socket
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from dbspark.circuit.builder import Circuit
from dbspark.circuit.planner import LoopPlan, Plan, plan
from dbspark.core.errors import REDACT_SETTING
from dbspark.engine.epoch_units import (
    Units,
    epoch_units,
    loop_inputs,
    publish_inputs,
    stage_inputs,
)
from dbspark.orchestration.airflow.assets import (
    circuit_assets,
    correction_extra,
    event_extra,
    rebuild_alias,
)
from dbspark.orchestration.airflow.deployment import (
    Deployment,
    DeploymentOptions,
    maintenance_settings,
    resolve,
    spark_for,
)
from dbspark.orchestration.airflow.hook import connection, dbspark_flag, dbspark_setting
from dbspark.orchestration.airflow.lineage import report_ingest, report_publish
from dbspark.orchestration.airflow.ui.status import task_of_stage
from dbspark.orchestration.epochs import (
    EpochOfRun,
    EpochSequenceError,
    next_epoch,
    require_epoch,
)
from dbspark.orchestration.intervals import Interval
from dbspark.orchestration.sources.base import source_schema
from dbspark.orchestration.sources.records import (
    IngestRecords,
    late_changes_by_interval,
    late_window,
)
from dbspark.orchestration.spark_job import SPARK_JOB
from dbspark.orchestration.units import (
    CATALOG_URL_VARIABLE,
    SERVING_URL_VARIABLE,
    TABLE_CREDENTIALS_VARIABLE,
    UNIT_KEY_VARIABLE,
    CircuitRecipe,
    CloseUnit,
    CompactLogsUnit,
    EvolveUnit,
    IngestUnit,
    IterateUnit,
    PublishUnit,
    RebuildUnit,
    ShippedUnit,
    StageUnit,
    Unit,
    VerifyUnit,
    execute_unit,
    read_result_file,
    result_path,
    unit_directory,
    write_private_properties,
    write_unit_file,
)
from dbspark.storage.catalog import (
    DEFAULT_LEASE_SECONDS,
    SHARED_SQLITE_SETTING,
    Catalog,
    UncommittedUnits,
)
from dbspark.storage.durability import SYNC_METHOD_SETTING

log = logging.getLogger("dbspark.airflow")


def _with_backfill(err: EpochSequenceError, dag_id: str, interval: Interval) -> str:
    """``err``'s message, with the backfill that runs the missing intervals in order (this
    run's own included: it failed, so the backfill runs it again in its turn)."""
    if err.backfill_from is None:
        return str(err)
    return (
        f"{err}. With the scheduler running: airflow backfill create --dag-id {dag_id} "
        f"--from-date {err.backfill_from.isoformat()} --to-date {interval.start.isoformat()} "
        "--reprocess-behavior failed --max-active-runs 1"
    )


def _connection_password(conn_id: str | None) -> str | None:
    found = connection(conn_id, required=True)
    return None if found is None else (found.password or None)


def _skip(message: str) -> Exception:
    from airflow.sdk.exceptions import AirflowSkipException

    log.info("%s", message)
    return AirflowSkipException(message)


def submit_or_kill(hook: Any, application: str) -> None:
    """``hook.submit(application)``, killing what it started if this task is stopped
    meanwhile: Airflow's timeout (``AirflowTaskTimeout``) and a kill reach the task as a
    ``BaseException`` raised here, and the spark-submit process, with the driver it runs
    in client mode, would otherwise run on past its task and its lease."""
    try:
        hook.submit(application=application)
    except Exception:
        raise
    except BaseException:
        _kill_submission(hook)
        raise


def _kill_submission(hook: Any) -> None:
    """The provider's ``on_kill`` (the spark-submit process; a cluster's driver), then
    the processes spark-submit started: in client mode the Python driver is a child of
    its JVM, and outlives a JVM killed alone."""
    import psutil

    process = getattr(hook, "_submit_sp", None)
    children: list[Any] = []
    if process is not None and process.poll() is None:
        with contextlib.suppress(psutil.NoSuchProcess):
            children = psutil.Process(process.pid).children(recursive=True)
    hook.on_kill()
    for child in children:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()
    psutil.wait_procs(children, timeout=10)
    if children:
        log.warning(
            "stopped the spark-submit of this task and %d processes it started", len(children)
        )


def _fail(message: str) -> Exception:
    from airflow.sdk.exceptions import AirflowFailException

    log.error("%s", message)
    return AirflowFailException(message)


def _units(missing: list[str]) -> str:
    return ", ".join(f"{m} (not converged)" if m.startswith("loop:") else m for m in missing)


def _clear_hint(missing: list[str]) -> str:
    """What to do about units that never committed, in the words of the DAG's tasks."""
    tasks = list(dict.fromkeys(task_of_stage(name) or name for name in missing))
    return (
        f" Their tasks: {', '.join(tasks)}. A task marked success without running commits "
        "nothing: clear those tasks (with their downstream tasks) so that they run, "
        "instead of marking them success."
    )


def interval_of(context: Mapping[str, Any]) -> Interval:
    """The run's data interval; a run without one (a zero-length interval) is refused."""
    start, end = context.get("data_interval_start"), context.get("data_interval_end")
    if start is None or end is None or end <= start:
        raise _fail(
            f"this run has no data interval ({start} to {end}): dbspark DAGs use "
            "data-interval schedules, and a manual run covers the last complete interval"
        )
    return Interval(start, end)


def apply_redaction_setting() -> None:
    """``[dbspark] redact_input_values`` from ``airflow.cfg`` (or
    ``AIRFLOW__DBSPARK__REDACT_INPUT_VALUES``), handed to the engine as the environment
    variable it reads (``core.errors.REDACT_SETTING``), so this task's errors, and those
    of a spark-submit job it starts, which inherits the environment, keep row values out
    of the task log. Already set in the environment, it stays as it is."""
    if dbspark_flag("redact_input_values"):
        os.environ[REDACT_SETTING] = "1"


def apply_storage_settings() -> None:
    """The storage settings of ``airflow.cfg``, handed to the catalog as the environment
    variables it reads: ``[dbspark] sqlite_on_shared_filesystem = allow``
    (``SHARED_SQLITE_SETTING``: a SQLite catalog is refused on a shared file system
    unless so allowed) and ``[dbspark] sync_method`` (``SYNC_METHOD_SETTING``: how
    committed files are made durable). A variable already set stays as it is."""
    value = dbspark_setting("sqlite_on_shared_filesystem")
    if (value or "").strip().lower() == "allow":
        os.environ[SHARED_SQLITE_SETTING] = "allow"
    method = (dbspark_setting("sync_method") or "").strip()
    if method:
        os.environ.setdefault(SYNC_METHOD_SETTING, method)


def _task_instance() -> Any | None:
    """The running task instance (its ids and ``try_number``), None outside a task."""
    try:
        from airflow.sdk import get_current_context

        ti = get_current_context()["ti"]
    except Exception:  # no task context here (a unit run by hand)
        return None
    return ti if isinstance(getattr(ti, "try_number", None), int) else None


def lease_seconds() -> float:
    """How long a task's lease lasts: its execution timeout and 10 minutes (the default
    lease when the task has none, or outside a task)."""
    try:
        from airflow.sdk import get_current_context

        timeout = get_current_context()["ti"].task.execution_timeout
    except Exception:  # no task context (a unit run by hand)
        timeout = None
    if timeout is None:
        return DEFAULT_LEASE_SECONDS
    return timeout.total_seconds() + 600.0


def _lease_names() -> tuple[str, list[str]]:
    """How the running task's leases are named: the prefix of this try's holder, and
    those of its earlier tries ("", [] outside a task)."""
    ti = _task_instance()
    if ti is None:
        return "", []
    task = f"task {ti.dag_id}/{ti.run_id}/{ti.task_id}[{ti.map_index}] try"
    return f"{task} {ti.try_number}: ", [f"{task} {n}: " for n in range(1, int(ti.try_number))]


@dataclass(frozen=True)
class _CommittedEpochs:
    """A circuit's committed epochs as ``maintain`` reads them once: when each committed,
    the last one, and the catalog's clock when read."""

    now: datetime
    committed_at: dict[int, datetime]

    @classmethod
    def read(cls, catalog: Catalog, circuit: str) -> _CommittedEpochs:
        epochs = catalog.epochs(circuit)
        return cls(
            catalog.clock(),
            {e.epoch: _aware(e.committed_at) for e in epochs if e.committed_at is not None},
        )

    @property
    def last(self) -> int:
        return max(self.committed_at, default=-1)

    def before(self, hours: float) -> tuple[datetime, list[int]]:
        """The time ``hours`` ago, and the epochs committed by then, the last one never."""
        horizon = self.now - timedelta(hours=hours)
        last = self.last
        return horizon, [e for e, at in self.committed_at.items() if e < last and at <= horizon]


def _aware(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


#: The tasks after the close that every dbspark DAG has besides rebuild and verify.
SERVE = "serve"
MAINTAIN = "maintain"

#: The run params every dbspark DAG has (``build_dag``): their names.
VERIFY = "verify"
REBUILD = "rebuild"


@dataclass(frozen=True)
class Maintenance:
    """What a run asked for besides its epoch: verify the views, rebuild some."""

    verify: bool = False
    rebuild: tuple[str, ...] = ()

    @property
    def tasks(self) -> list[str]:
        """The ids of the tasks that do what was asked (``close_epoch`` branches to them)."""
        return [
            name for name, asked in (("rebuild", self.rebuild), ("verify", self.verify)) if asked
        ]


def maintenance_of(circuit: Circuit, dag_id: str, params: Mapping[str, Any]) -> Maintenance:
    """The run's ``verify`` and ``rebuild`` params, checked against the circuit's views.

    Airflow already refuses a value outside the param's schema when the run is created
    (the trigger form, the API, ``dag.test``); this check is for a run whose conf was
    accepted by an older version of the DAG (a view since removed), and it names the DAG
    and its views, which Airflow's schema error does not."""
    raw = params.get(REBUILD) or []
    names = (raw,) if isinstance(raw, str) else tuple(raw)
    unknown = [name for name in names if name not in circuit.views]
    if unknown:
        raise ValueError(
            f"DAG {dag_id!r}: param {REBUILD!r} names {', '.join(map(repr, unknown))}, not a "
            f"view of circuit {circuit.name!r} (its views: {', '.join(sorted(circuit.views))}); "
            "nothing was written"
        )
    return Maintenance(verify=bool(params.get(VERIFY, False)), rebuild=tuple(dict.fromkeys(names)))


@dataclass
class EpochTasks:
    """The bodies of one circuit's tasks (``build_dag`` wires them into a DAG)."""

    circuit: Circuit
    sources: Mapping[str, Any]
    options: DeploymentOptions
    start_date: datetime
    iteration_tasks: int
    #: How a spark-submit driver builds the circuit again (None: it cannot).
    recipe: CircuitRecipe | None = None
    plan: Plan = field(init=False)
    #: Each view's Airflow Asset, by view name: the outlets of ``publish``.
    assets: dict[str, Any] = field(init=False)

    def __post_init__(self) -> None:
        self.plan = plan(self.circuit)
        self.assets = circuit_assets(self.circuit)

    # ------------------------------------------------------------------ plumbing
    @property
    def name(self) -> str:
        return self.circuit.name

    def _deployment(self) -> Deployment:
        return resolve(self.options)

    @staticmethod
    def _catalog(deployment: Deployment) -> Catalog:
        apply_storage_settings()
        if deployment.catalog_url:
            return Catalog(deployment.catalog_url, warehouse=deployment.warehouse)
        return Catalog.for_warehouse(deployment.warehouse)

    @contextmanager
    def _lease(self, deployment: Deployment, unit: Unit) -> Iterator[None]:
        """Hold a lease on the circuit while ``unit`` runs (here or under spark-submit),
        so garbage collection keeps what it writes and what it reads (issue 18, finding
        4). It lasts the task's execution timeout and 10 minutes more: Airflow kills the
        task by then, and a task killed harder leaves a lease that expires."""
        seconds = lease_seconds()
        catalog = self._catalog(deployment)
        try:
            holder = (
                f"{unit.kind} unit of epoch {unit.epoch} of {self.name} "
                f"({socket.gethostname()}, pid {os.getpid()})"
            )
            # Named by its task instance and try: this try ends the leases of the
            # earlier ones, whose release a catalog outage (or a kill) may have lost
            # (they would keep garbage for the lease's length). A second process of
            # the same try (a redelivery) keeps its lease.
            this_try, replaces = _lease_names()
            if this_try:
                holder = f"{this_try}{holder}"
            lease = catalog.acquire_lease(self.name, holder, seconds, replaces=replaces)
            try:
                yield
            finally:
                catalog.release_lease(lease)
        finally:
            catalog.close()

    @contextmanager
    def _engine(self, deployment: Deployment, *, evolve: bool = False) -> Iterator[Any]:
        from dbspark.engine.spark.executor import SparkEngine

        # Spark is opened only if a unit needs it: a small epoch's units run on the local
        # tier, in this task, and start no session (no JVM for local Spark).
        with ExitStack() as opened:
            engine = SparkEngine(
                self.circuit,
                deployment.warehouse,
                spark=lambda: opened.enter_context(spark_for(deployment)),
                catalog_url=deployment.catalog_url,
                resident_bytes=0,  # a task is one unit's process: nothing to keep
                evolve=evolve,
            )
            try:
                yield engine
            finally:
                engine.catalog.close()

    def _epoch_of_run(self, context: Mapping[str, Any]) -> tuple[Deployment, EpochOfRun]:
        """The run's epoch. A retry first ends its earlier tries' leases: a try killed
        (or cut off from the catalog) never released its own, and this one may take
        none (it skips, having nothing left to do): they would keep garbage until they
        expire, hours later."""
        deployment = self._deployment()
        catalog = self._catalog(deployment)
        try:
            run = require_epoch(catalog, self.name, interval_of(context))
            catalog.end_leases(self.name, _lease_names()[1])
        finally:
            catalog.close()
        return deployment, run

    def _current(self, context: Mapping[str, Any]) -> tuple[Deployment, EpochOfRun]:
        """The run's epoch, or a skip when it already committed."""
        deployment, run = self._epoch_of_run(context)
        if run.committed:
            raise _skip(f"epoch {run.epoch} {run.interval} is already committed: nothing to do")
        return deployment, run

    def _iterations(self, deployment: Deployment, loop: LoopPlan, epoch: int) -> list[Any]:
        """The loop's iterations at ``epoch`` so far, from the catalog (no Spark)."""
        catalog = self._catalog(deployment)
        try:
            return catalog.loop_iterations(self.name, loop.name, (epoch,))
        finally:
            catalog.close()

    def loop(self, scope: int) -> LoopPlan:
        return self.plan.loops[scope]

    # ------------------------------------------------------------------ tasks
    def maintenance(self, context: Mapping[str, Any]) -> Maintenance:
        """The run's ``verify`` and ``rebuild`` params; a bad one fails the task."""
        try:
            return maintenance_of(self.circuit, context["ti"].dag_id, context.get("params") or {})
        except ValueError as err:
            raise _fail(str(err)) from None

    def open_epoch(self, context: Mapping[str, Any]) -> int:
        # Before the catalog is touched: a run asking to rebuild an unknown view writes nothing.
        self.maintenance(context)
        deployment = self._deployment()
        interval = interval_of(context)
        log.info("deployment: %s", deployment.describe())
        catalog = self._catalog(deployment)
        try:
            if self._evolving(catalog, deployment):
                unit = EvolveUnit(
                    -1,  # the epoch it evolves at is the last committed one
                    outputs=str(deployment.outputs),
                    tables=deployment.table_settings or None,
                    table_credentials=deployment.table_credentials or None,
                )
                result = self._execute(deployment, unit)
                log.info(
                    "circuit %s: %s; outputs: %s",
                    self.name,
                    result["description"],
                    "; ".join(f"{v} {what}" for v, what in result["outputs"].items()) or "none",
                )
            try:
                run = next_epoch(catalog, self.name, interval, self.start_date)
            except EpochSequenceError as err:
                raise _fail(_with_backfill(err, context["ti"].dag_id, interval)) from None
            # The dbspark page of the Airflow UI links each epoch to the runs of its
            # interval: one that found it committed too (a re-run, a rebuild or verify).
            ti = context["ti"]
            if run.committed:
                catalog.record_epoch_run(self.name, run.epoch, ti.dag_id, ti.run_id)
                raise _skip(f"epoch {run.epoch} {interval} is already committed: nothing to do")
            catalog.open_epoch(self.name, run.epoch, interval.label)
            catalog.record_epoch_run(self.name, run.epoch, ti.dag_id, ti.run_id)
        finally:
            catalog.close()
        log.info("circuit %s: epoch %s opened for %s", self.name, run.epoch, interval)
        return run.epoch

    def _evolving(self, catalog: Catalog, deployment: Deployment) -> bool:
        """Whether this run first evolves the circuit in place: its definition changed
        since the warehouse's state was kept (an ``EvolveUnit`` either takes the state
        over, or fails saying why it cannot), or an evolution's outputs are not all
        brought along yet (a task that failed after the evolution's commit)."""
        from dbspark.engine.circuits import CircuitChangedError, pending_evolution, register

        try:
            register(catalog, deployment.warehouse, self.circuit)  # says what changed
        except CircuitChangedError:
            return True
        return pending_evolution(catalog, deployment.warehouse, self.circuit) is not None

    def _execute(self, deployment: Deployment, unit: Unit) -> dict[str, Any]:
        """Run a unit here (local Spark or Spark Connect) or with spark-submit, under a
        lease (``_lease``)."""
        with self._lease(deployment, unit):
            return self._execute_leased(deployment, unit)

    def _execute_leased(self, deployment: Deployment, unit: Unit) -> dict[str, Any]:
        if deployment.spark_submit_conn_id:
            return self._submit(deployment, unit)
        if deployment.worker_socket is not None:
            handed = self._hand_to_worker(deployment, unit)
            if handed is not None:
                return handed
        with self._engine(deployment, evolve=getattr(unit, "evolves", False)) as engine:
            try:
                return execute_unit(engine, unit)
            except UncommittedUnits as err:  # the engine's own check, in its transaction
                raise _fail(f"{err}{_clear_hint(err.missing)}") from None

    def _require(self, deployment: Deployment, run: EpochOfRun, what: str, units: Units) -> None:
        """Fail this task at once, naming the units and their tasks, unless the units it
        reads committed at the run's epoch. The engine checks again (the close in the
        transaction that commits); this check also covers spark-submit, whose driver's
        error reaches the task only as a failed submission, and starts no Spark."""
        missing = self._missing(deployment, run, units)
        if missing:
            raise _fail(
                f"{what} of circuit {self.name!r} cannot run at epoch {run.epoch} "
                f"{run.interval}: the units it reads have not committed: "
                f"{_units(missing)}.{_clear_hint(missing)}"
            )

    def _missing(self, deployment: Deployment, run: EpochOfRun, units: Units) -> list[str]:
        """Which of ``units`` have not committed at the run's epoch (the catalog's answer)."""
        catalog = self._catalog(deployment)
        try:
            return catalog.missing_units(self.name, run.epoch, units.stages, units.loops)
        finally:
            catalog.close()

    def _hand_to_worker(self, deployment: Deployment, unit: Unit) -> dict[str, Any] | None:
        """Run the unit in the long-lived worker at ``[dbspark] worker_socket``; None
        when no worker answers there, or it cannot build this circuit (the task then
        runs the unit itself, and says why)."""
        from dbspark.orchestration.worker import WorkerUnavailable, run_in_worker

        socket_path = deployment.worker_socket
        if self.recipe is None:
            log.info(
                "running %s here, not in the dbspark worker at %s: the worker builds the "
                "circuit again, and build_dag was given an object (or a function a new "
                "process cannot import)",
                unit.kind,
                socket_path,
            )
            return None
        try:
            result = run_in_worker(
                socket_path,
                self._shipped(deployment, unit),
                unit_directory(deployment.warehouse, self.name),
                catalog_url=deployment.catalog_url,
                serving_url=deployment.serving_url,
                table_credentials=deployment.table_credentials,
            )
        except WorkerUnavailable as err:
            log.warning("%s: running the %s unit in this task instead", err, unit.kind)
            return None
        except UncommittedUnits as err:
            raise _fail(f"{err}{_clear_hint(err.missing)}") from None
        log.info("the %s unit ran in the dbspark worker at %s", unit.kind, socket_path)
        return json.loads(json.dumps(result))

    def _shipped(self, deployment: Deployment, unit: Unit) -> ShippedUnit:
        """``unit`` as a unit file carries it (for spark-submit or the worker)."""
        from dbspark.engine.spark.executor import circuit_fingerprint

        assert self.recipe is not None
        return ShippedUnit(
            recipe=self.recipe,
            fingerprint=circuit_fingerprint(self.circuit),
            unit=unit,
            warehouse=str(deployment.warehouse),
            catalog_conn_id=deployment.catalog_conn_id if deployment.catalog_url else None,
            serving_conn_id=deployment.serving_conn_id if deployment.serving_url else None,
            table_conn_id=deployment.table_conn_id if deployment.table_credentials else None,
        )

    def _submit(self, deployment: Deployment, unit: Unit) -> dict[str, Any]:
        """``spark-submit`` of the package's ``spark_job`` module, with the unit in a
        private JSON file the job reads (``units.write_unit_file``; the driver must see
        the warehouse: client mode or shared storage). The file names connections; their
        URLs and the file's HMAC key reach the driver in its environment only."""
        import secrets
        import sys

        from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

        from dbspark.engine.spark import class_archive

        if self.recipe is None:
            raise _fail(
                f"circuit {self.name!r} cannot run under spark-submit: the driver builds the "
                "circuit again, and it was given to build_dag as an object (or a function a "
                "new process cannot import). Pass build_dag a module-level function that "
                "returns the circuit, importable where the driver runs, or use sql_dag"
            )
        key = secrets.token_bytes(32)
        shipped = self._shipped(deployment, unit)
        stage = write_unit_file(unit_directory(deployment.warehouse, self.name), shipped, key)
        venv_bin = os.path.dirname(sys.executable)
        env_vars = {
            "PATH": venv_bin + os.pathsep + os.environ.get("PATH", ""),
            # The job imports dbspark: it runs on this interpreter, found first on PATH.
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
            UNIT_KEY_VARIABLE: key.hex(),
        }
        archive = class_archive.java_options()
        if archive and "SPARK_SUBMIT_OPTS" not in os.environ:
            # A client-mode driver starts on this machine: a third off its JVM's start.
            env_vars["SPARK_SUBMIT_OPTS"] = " ".join(archive)
        if deployment.catalog_url:
            env_vars[CATALOG_URL_VARIABLE] = deployment.catalog_url
        if deployment.serving_url:
            env_vars[SERVING_URL_VARIABLE] = deployment.serving_url
        if deployment.table_credentials:
            # A driver in cluster mode does not have this worker's AWS_* environment.
            env_vars[TABLE_CREDENTIALS_VARIABLE] = json.dumps(deployment.table_credentials)
        # A cluster with spark.authenticate: its secret is the connection's password,
        # handed to the driver in a private properties file (never on the command line).
        secret = _connection_password(deployment.spark_submit_conn_id)
        properties = None
        if secret:
            properties = write_private_properties(
                stage.parent, {"spark.authenticate": "true", "spark.authenticate.secret": secret}
            )
        hook = SparkSubmitHook(
            conn_id=deployment.spark_submit_conn_id,
            name=f"dbspark-{self.name}-{unit.kind}-{unit.epoch}",
            application_args=["--unit-file", str(stage)],
            env_vars=env_vars,
            properties_file=None if properties is None else str(properties),
        )
        try:
            try:
                submit_or_kill(hook, str(SPARK_JOB))
            except Exception:
                if result_path(stage).exists():
                    # The driver's own error when no retry can fix it (bad input, say):
                    # raised here so the retry policy fails the task at once.
                    read_result_file(stage, key)
                raise
            return json.loads(json.dumps(read_result_file(stage, key)))
        finally:
            for leftover in (stage, result_path(stage), properties):
                if leftover is not None:
                    leftover.unlink(missing_ok=True)

    def ingest(self, source: str, context: Mapping[str, Any]) -> dict[str, Any]:
        apply_redaction_setting()
        deployment, run = self._current(context)
        connector = self.sources[source]
        log.info("%s", connector.describe(source, run.interval))
        records = IngestRecords(deployment.warehouse, self.name)
        late = self._late_input(deployment, connector, source, run.epoch, records)
        schema = source_schema(self.circuit, source)
        # A connector may write the batch here (a large SQL pull): private, like the unit
        # files beside it, and gone after the unit (garbage collection takes what a
        # killed task left).
        scratch = unit_directory(deployment.warehouse, self.name) / f"pull-{uuid.uuid4().hex}"
        try:
            batch = connector.batch(
                source, run.interval, columns=schema.names, scratch=scratch, schema=schema
            )
            # Recorded before the unit runs, so every committed ingest has its record.
            record = connector.record(source, run.interval, batch)
            if record is not None:
                records.write(source, run.interval, record)
            unit = IngestUnit(run.epoch, source, batch)
            result = {**self._execute(deployment, unit), "late_input": late}
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        self._lineage(report_ingest, self.name, source, connector.dataset(source), schema)
        return result

    def _lineage(self, report: Callable[..., None], *args: Any) -> None:
        """Report the task's lineage (``lineage.py``); a failure to is a warning, never the
        task's failure: the work it describes is committed."""
        try:
            report(self, *args)
        except Exception as err:
            log.warning(
                "circuit %s: lineage not reported: %s: %s", self.name, type(err).__name__, err
            )

    def _late_input(
        self,
        deployment: Deployment,
        connector: Any,
        source: str,
        epoch: int,
        records: IngestRecords,
    ) -> list[str]:
        """What arrived or changed in earlier, committed intervals after their ingest:
        logged as a warning, or the ingest refused when the connector's policy says so."""
        catalog = self._catalog(deployment)
        try:
            labels = catalog.epoch_labels(self.name)
        finally:
            catalog.close()
        committed = [Interval.parse(labels[e]) for e in sorted(labels) if e < epoch]
        by_interval = late_changes_by_interval(connector, source, records, committed)
        late = [line for _, lines in by_interval for line in lines]
        window = late_window(connector, committed)
        records.forget(source, committed[: len(committed) - len(window)])
        if not late:
            return []
        listed = "\n  ".join(late)
        if connector.late_files == "fail":
            raise _fail(
                f"source {source!r}: input of committed intervals changed after their "
                f"ingest and was never read:\n  {listed}\nA committed epoch's input cannot "
                "change: move late files into a current interval's partition (or remove "
                "them), then clear this task. Nothing of this epoch was written."
            )
        # Each late file is warned about once, not at every ingest of the late window.
        fresh = []
        for interval, lines in by_interval:
            reported = records.reported(source, interval)
            fresh.append((interval, [line for line in lines if line not in reported]))
        news = [line for _, lines in fresh for line in lines]
        if news:
            log.warning(
                "source %r: input of committed intervals changed after their ingest and was "
                "never read (set late_files='fail' to refuse):\n  %s",
                source,
                "\n  ".join(news),
            )
            for interval, lines in fresh:
                records.add_reported(source, interval, lines)
        return late

    def stage(self, stage_id: int, context: Mapping[str, Any]) -> dict[str, Any]:
        deployment, run = self._current(context)
        stage = self.plan.stages[stage_id]
        self._require(deployment, run, f"stage {stage.name}", stage_inputs(self.plan, stage))
        return self._execute(deployment, StageUnit(run.epoch, stage_id))

    def iterate(self, scope: int, context: Mapping[str, Any]) -> dict[str, Any]:
        """Run the loop's next pending iteration; skip once it converged."""
        loop = self.loop(scope)
        deployment, run = self._current(context)
        done = self._iterations(deployment, loop, run.epoch)
        if done and done[-1].converged:
            raise _skip(
                f"loop {loop.name} at epoch {run.epoch} converged after "
                f"{len(done)} iterations: {done[-1].reason}"
            )
        if len(done) >= loop.max_iterations:
            raise _skip(
                f"loop {loop.name} at epoch {run.epoch} reached max_iterations="
                f"{loop.max_iterations} without converging (the convergence check fails)"
            )
        if not done:
            self._require(deployment, run, f"loop {loop.name}", loop_inputs(self.plan, loop))
        unit = IterateUnit(
            run.epoch,
            loop=scope,
            iteration_tasks=self.iteration_tasks,
            map_index=context["ti"].map_index,
        )
        return self._execute(deployment, unit)

    def check_convergence(self, scope: int, context: Mapping[str, Any]) -> dict[str, Any]:
        loop = self.loop(scope)
        deployment, run = self._current(context)
        done = self._iterations(deployment, loop, run.epoch)
        sizes = ", ".join(f"{it.iteration}: {it.delta_rows}" for it in done) or "none"
        if not done or not done[-1].converged:
            last = done[-1].reason if done else "no iteration ran"
            raise _fail(
                f"loop {loop.name} of circuit {self.name} did not converge at epoch "
                f"{run.epoch} within max_iterations={loop.max_iterations} "
                f"({len(done)} iterations ran; last: {last}). Delta rows per iteration: "
                f"{sizes}. Raise the loop's max_iterations or check the recursion "
                "for a divergent rule; the epoch stays open and uncommitted."
            )
        log.info(
            "loop %s at epoch %s converged after %s iterations. Delta rows per iteration: "
            "%s. Why it stopped: %s",
            loop.name,
            run.epoch,
            len(done),
            sizes,
            done[-1].reason,
        )
        return {"epoch": run.epoch, "iterations": len(done), "reason": done[-1].reason}

    def publish(self, context: Mapping[str, Any]) -> dict[str, Any]:
        """Publish and export the epoch's views, then give each view's asset event its
        ``extra``. Airflow records the events when this task succeeds; a run whose epoch
        is already committed skips here, and a skipped task emits no event."""
        deployment, run = self._current(context)
        self._require(deployment, run, "publish", publish_inputs(self.plan))
        # Serving tables are not this task's: ``serve`` catches them up after the close,
        # so a serving failure never keeps an epoch from committing (finding 16).
        unit = PublishUnit(
            run.epoch,
            outputs=str(deployment.outputs),
            serving_url=None,
            tables=deployment.table_settings or None,
            table_credentials=deployment.table_credentials or None,
        )
        result = self._execute(deployment, unit)
        sources = {name: source_schema(self.circuit, name) for name in self.circuit.sources}
        tables = {
            view: (result["views"][view]["table"], self.circuit.node(node).schema)
            for view, node in self.circuit.views.items()
        }
        self._lineage(report_publish, self.name, sources, tables)
        events = context["outlet_events"]
        for view, asset in self.assets.items():
            extra = event_extra(self.name, view, run.epoch, run.interval, result["views"][view])
            events[asset].extra = extra
            log.info(
                "asset %s: epoch %s, +%s/-%s in %s rows",
                asset.uri,
                run.epoch,
                extra["rows_inserted"],
                extra["rows_deleted"],
                extra["rows_changed"],
            )
        return result

    def close_epoch(self, context: Mapping[str, Any]) -> int:
        """Commit the epoch, then compact. It commits only if every unit it planned
        committed, checked in the transaction that commits it: a task marked success
        without running committed nothing, and this task then fails at once, naming it.

        The epoch found committed, and the last one, is this run's: a try of this task
        committed it and was stopped before it finished (killed, or timed out while
        compacting). This try then finishes the compaction, and the run goes on to the
        tasks after the close (``serve``, ``maintain``) instead of skipping them."""
        deployment, run = self._epoch_of_run(context)
        if run.committed:
            if self._last_committed(deployment) != run.epoch:
                raise _skip(f"epoch {run.epoch} {run.interval} is already committed: nothing to do")
            log.info(
                "circuit %s: epoch %s %s was committed by an earlier try of this task; "
                "finishing what it left (compaction)",
                self.name,
                run.epoch,
                run.interval,
            )
            missing = []
        else:
            missing = self._missing(deployment, run, epoch_units(self.plan))
        if missing:
            raise _fail(
                f"epoch {run.epoch} {run.interval} of circuit {self.name!r} cannot commit: "
                f"planned units have not committed: {_units(missing)}. The epoch stays "
                f"open and nothing was committed.{_clear_hint(missing)}"
            )
        self._execute(deployment, CloseUnit(run.epoch))
        log.info("circuit %s: epoch %s %s committed", self.name, run.epoch, run.interval)
        return run.epoch

    # ------------------------------------------------------------------ after the epoch
    def after_close(self, context: Mapping[str, Any], epoch: int) -> list[str]:
        """The tasks ``close_epoch`` branches to after committing ``epoch``: what the
        run's params ask (``rebuild``, ``verify``), ``serve`` when there is a serving
        database, and ``maintain`` after every ``[dbspark] maintain_every``-th epoch."""
        tasks = self.maintenance(context).tasks
        if self._deployment().serving_url:
            tasks.append(SERVE)
        if epoch % maintenance_settings().every == 0:
            tasks.append(MAINTAIN)
        return tasks

    def serve(self, context: Mapping[str, Any]) -> dict[str, Any]:
        """Bring every serving table to the last committed epoch from the exported change
        feed, or load it from the view's Delta table (fresh, far behind, or feeds gone:
        serving enabled on a DAG with history). A table that fails fails this task, with
        each view's error, and no epoch: the next run tries again from where it stands."""
        from dbspark.orchestration.sinks.serving import (
            ServingCatchUpError,
            ServingTarget,
            catch_up,
            reconcile_with_tables,
            retire_removed,
        )
        from dbspark.orchestration.sinks.tables import TableSettings

        deployment = self._deployment()
        if not deployment.serving_url:
            raise _skip("no serving database ([dbspark] serving_conn_id): nothing to serve")
        epoch = self._last_committed(deployment)
        if epoch < 0:
            raise _skip(f"circuit {self.name!r} has no committed epoch yet: nothing to serve")
        target = ServingTarget(deployment.serving_url, prefix=deployment.serving_table_prefix)
        schemas = {
            view: self.circuit.node(node).schema for view, node in self.circuit.views.items()
        }
        # The run's rebuild (upstream) corrected these views' tables: the serving tables
        # follow, whatever else they may have lost.
        rebuilt = {view: schemas[view] for view in self.maintenance(context).rebuild}
        try:
            tables = TableSettings.from_environment(
                deployment.table_settings, credentials=deployment.table_credentials
            )
            results = catch_up(target, self.name, schemas, deployment.outputs, epoch, tables=tables)
            retired = retire_removed(target, self.name, schemas)
            if rebuilt:
                reconciled = reconcile_with_tables(
                    target, self.name, rebuilt, deployment.outputs, epoch, tables=tables
                )
        except ServingCatchUpError as err:
            raise RuntimeError(str(err)) from None  # retried: a database may come back
        finally:
            target.engine.dispose()
        for result in results.values():
            log.info("%s", result.describe())
        served = {"epoch": epoch, "tables": {v: r.epoch for v, r in results.items()}}
        if retired:
            served["retired"] = retired  # the serving tables of views removed
        if rebuilt:
            served["reconciled"] = {
                view: None if r is None else [r.inserted, r.updated, r.deleted]
                for view, r in reconciled.items()
            }
        return served

    def maintain(self, context: Mapping[str, Any]) -> dict[str, Any]:
        """Keep storage bounded (issue 18, finding 14): garbage-collect the warehouse
        (crashed units' files, superseded batches, leftover unit files; leases keep what
        units at work use), remove exported change directories past their retention, and
        the hidden directories killed exports left in the outputs, as old as garbage
        collection's minimum age. Compaction already runs in ``close_epoch``, table
        compaction and vacuum in ``publish``."""
        from dbspark.orchestration.sinks.files import prune_exports, sweep_unfinished_exports
        from dbspark.storage.catalog import garbage_collect

        deployment = self._deployment()
        settings = maintenance_settings()
        catalog = self._catalog(deployment)
        try:
            committed = _CommittedEpochs.read(catalog, self.name)
            hours = settings.input_log_retention_hours
            logs = self._retain_input_logs(deployment, committed, hours)
            report = garbage_collect(
                deployment.warehouse,
                catalog,
                circuit=self.name,
                min_age_seconds=settings.gc_min_age_hours * 3600,
            )
            log.info("circuit %s, garbage collection: %s", self.name, report.describe())
        finally:
            catalog.close()
        horizon, old = committed.before(settings.changes_retention_hours)
        pruned = []
        for view in self.circuit.views:
            pruned += prune_exports(deployment.outputs, self.name, view, old)
        log.info(
            "circuit %s: %s exported directories of epochs committed before %s removed",
            self.name,
            len(pruned),
            horizon.isoformat(),
        )
        unfinished = sweep_unfinished_exports(
            deployment.outputs,
            self.name,
            self.circuit.views,
            min_age_seconds=settings.gc_min_age_hours * 3600,
        )
        log.info(
            "circuit %s: %s unfinished export directories (killed exports' .tmp-/.stale-) "
            "older than %s h removed%s",
            self.name,
            len(unfinished),
            settings.gc_min_age_hours,
            "".join(f"\n  {path}" for path in unfinished),
        )
        return {
            "input_logs": logs,
            "unregistered_dirs": len(report.unregistered_dirs),
            "superseded_batches": len(report.superseded_batches),
            "unit_files": len(report.unit_files),
            "bytes_freed": report.bytes_freed,
            "kept": len(report.kept),
            "exports_removed": len(pruned),
            "unfinished_exports_removed": len(unfinished),
        }

    def _retain_input_logs(
        self, deployment: Deployment, committed: _CommittedEpochs, hours: float
    ) -> dict[str, Any] | None:
        """Merge the raw input logs of the epochs committed more than ``hours`` ago (on the
        catalog's clock) and before the last (input log retention); None when no such
        epoch exists. Before garbage collection, which deletes the merged-away batches
        once they are ``gc_min_age_hours`` old."""
        horizon, old = committed.before(hours)
        if not old:
            log.info(
                "circuit %s: no epoch committed before %s (input_log_retention_hours = %s): "
                "the raw input logs stay as they are",
                self.name,
                horizon.isoformat(),
                hours,
            )
            return None
        result = self._execute(deployment, CompactLogsUnit(committed.last, max(old)))
        log.info(
            "circuit %s: raw input logs of epochs up to %s (committed before %s) merged: "
            "%s merges replaced %s batches of %s rows by %s rows; full refresh can replay "
            "from epoch %s",
            self.name,
            result["through_epoch"],
            horizon.isoformat(),
            result["merges"],
            result["batches_replaced"],
            result["rows_replaced"],
            result["rows_kept"],
            result["replayable_from"],
        )
        return result

    def _last_committed(self, deployment: Deployment) -> int:
        catalog = self._catalog(deployment)
        try:
            return catalog.last_committed_epoch(self.name)
        finally:
            catalog.close()

    def rebuild(self, context: Mapping[str, Any]) -> dict[str, Any]:
        """Rebuild the views the run's ``rebuild`` param names (skip when it names none),
        from the raw input log at the last committed epoch: this run's, or the latest
        when the run was for an epoch committed earlier."""
        views = self.maintenance(context).rebuild
        if not views:
            raise _skip("no view to rebuild (the run's 'rebuild' param is empty)")
        deployment = self._deployment()
        epoch = self._last_committed(deployment)
        log.info("circuit %s: rebuilding %s at epoch %s", self.name, ", ".join(views), epoch)
        ti = context["ti"]
        unit = RebuildUnit(
            epoch,
            views,
            outputs=str(deployment.outputs),
            tables=deployment.table_settings or None,
            table_credentials=deployment.table_credentials or None,
            # On the catalog's commit: the dbspark page links it to this task's log.
            by=f"{ti.dag_id}/{ti.run_id}",
        )
        result = self._execute(deployment, unit)
        alias = context["outlet_events"][rebuild_alias(self.name)]
        for view, correction in result["corrections"].items():
            if correction is None:
                log.info("view %s: its outputs already held the rebuilt view", view)
                continue
            extra = correction_extra(self.name, view, result["epoch"], correction)
            alias.add(self.assets[view], extra=extra)
            log.info(
                "asset %s: the rebuild at epoch %s corrected its outputs (%s)",
                self.assets[view].uri,
                result["epoch"],
                ", ".join(f"{k}={v}" for k, v in correction.items()),
            )
        return result

    def verify(self, context: Mapping[str, Any]) -> dict[str, Any]:
        """With the run's ``verify`` param, recompute every view from the raw input log and
        fail, naming the views that differ, unless each equals its maintained view."""
        if not self.maintenance(context).verify:
            raise _skip("no verification asked (the run's 'verify' param is false)")
        deployment = self._deployment()
        epoch = self._last_committed(deployment)
        result = self._execute(deployment, VerifyUnit(epoch))
        differing = result["differing"]
        if differing:
            listed = "\n".join(
                f"  {view}: {count} rows differ, e.g.\n    "
                + "\n    ".join(result["examples"][view])
                for view, count in sorted(differing.items())
            )
            raise _fail(
                f"DAG {context['ti'].dag_id!r}, circuit {self.name!r}, epoch {result['epoch']}: "
                f"views {', '.join(sorted(differing))} differ from a full refresh over the "
                f"input log:\n{listed}\nTrigger a run with rebuild={sorted(differing)} "
                "to replace them with the full refresh."
            )
        log.info(
            "circuit %s, epoch %s: every view (%s) equals its full refresh over the input log",
            self.name,
            result["epoch"],
            ", ".join(result["views"]),
        )
        return result
