"""What each task of an epoch's DAG run does.

Every task is idempotent because the engine's units are: a unit that committed is
skipped, and a unit that died before committing leaves only unregistered files, which
its retry overwrites. The tasks add the Airflow side:

- which epoch the run is (``epochs.py``; the open task records it, the others look it
  up), and a skip for every task of a run whose epoch already committed;
- the loop's mapped task: each instance runs the next pending iteration (the catalog
  numbers them, so map-index order and retries do not matter) and skips once the loop
  converged; the convergence check fails loudly when the bound was reached;
- task logs that say what happened, in the words of the engine's reports.

Tasks that only consult the catalog (open, skipped iterations, the convergence check)
never start Spark.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from dbspark.circuit.builder import Circuit
from dbspark.circuit.planner import LoopPlan, Plan, plan
from dbspark.orchestration.airflow.deployment import (
    Deployment,
    DeploymentOptions,
    resolve,
    spark_for,
)
from dbspark.orchestration.epochs import EpochOfRun, next_epoch, require_epoch
from dbspark.orchestration.intervals import Interval
from dbspark.orchestration.sources.base import source_columns
from dbspark.orchestration.units import (
    CloseUnit,
    IngestUnit,
    IterateUnit,
    PublishUnit,
    StageUnit,
    Unit,
    execute_unit,
    result_path,
    write_unit_file,
)
from dbspark.storage.catalog import Catalog

log = logging.getLogger("dbspark.airflow")

#: The spark-submit entry point (``spark_jobs/`` beside ``include/`` in the project).
SPARK_JOB = Path(__file__).resolve().parents[4] / "spark_jobs" / "run_unit.py"


def _skip(message: str) -> Exception:
    from airflow.sdk.exceptions import AirflowSkipException

    log.info("%s", message)
    return AirflowSkipException(message)


def _fail(message: str) -> Exception:
    from airflow.sdk.exceptions import AirflowFailException

    log.error("%s", message)
    return AirflowFailException(message)


def interval_of(context: Mapping[str, Any]) -> Interval:
    """The run's data interval; a run without one (a zero-length interval) is refused."""
    start, end = context.get("data_interval_start"), context.get("data_interval_end")
    if start is None or end is None or end <= start:
        raise _fail(
            f"this run has no data interval ({start} to {end}): dbspark DAGs use "
            "data-interval schedules, and a manual run covers the last complete interval"
        )
    return Interval(start, end)


@dataclass
class EpochTasks:
    """The bodies of one circuit's tasks (``build_dag`` wires them into a DAG)."""

    circuit: Circuit
    sources: Mapping[str, Any]
    options: DeploymentOptions
    start_date: datetime
    iteration_tasks: int
    plan: Plan = field(init=False)

    def __post_init__(self) -> None:
        self.plan = plan(self.circuit)

    # ------------------------------------------------------------------ plumbing
    @property
    def name(self) -> str:
        return self.circuit.name

    def _deployment(self) -> Deployment:
        return resolve(self.options)

    @staticmethod
    def _catalog(deployment: Deployment) -> Catalog:
        if deployment.catalog_url:
            return Catalog(deployment.catalog_url)
        return Catalog.for_warehouse(deployment.warehouse)

    @contextmanager
    def _engine(self, deployment: Deployment) -> Iterator[Any]:
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
            )
            try:
                yield engine
            finally:
                engine.catalog.close()

    def _current(self, context: Mapping[str, Any]) -> tuple[Deployment, EpochOfRun]:
        """The run's epoch, or a skip when it already committed."""
        deployment = self._deployment()
        catalog = self._catalog(deployment)
        try:
            run = require_epoch(catalog, self.name, interval_of(context))
        finally:
            catalog.close()
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
    def open_epoch(self, context: Mapping[str, Any]) -> int:
        from dbspark.engine.spark.executor import circuit_fingerprint

        deployment = self._deployment()
        interval = interval_of(context)
        log.info("deployment: %s", deployment.describe())
        catalog = self._catalog(deployment)
        try:
            catalog.register_circuit(self.name, circuit_fingerprint(self.circuit))
            run = next_epoch(catalog, self.name, interval, self.start_date)
            if run.committed:
                raise _skip(f"epoch {run.epoch} {interval} is already committed: nothing to do")
            catalog.open_epoch(self.name, run.epoch, interval.label)
            # The dbspark page of the Airflow UI links each epoch to the runs that worked on it.
            ti = context["ti"]
            catalog.record_epoch_run(self.name, run.epoch, ti.dag_id, ti.run_id)
        finally:
            catalog.close()
        log.info("circuit %s: epoch %s opened for %s", self.name, run.epoch, interval)
        return run.epoch

    def _execute(self, deployment: Deployment, unit: Unit) -> dict[str, Any]:
        """Run a unit here (local Spark or Spark Connect) or with spark-submit."""
        if deployment.spark_submit_conn_id:
            return self._submit(deployment, unit)
        with self._engine(deployment) as engine:
            return execute_unit(engine, unit)

    def _submit(self, deployment: Deployment, unit: Unit) -> dict[str, Any]:
        """``spark-submit spark_jobs/run_unit.py`` with the unit in a file the job reads
        (the driver must see the warehouse and this file: client mode or shared storage)."""
        import json
        import os
        import sys
        import uuid

        from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

        stage = deployment.warehouse / "_units" / self.name / f"{uuid.uuid4().hex}.unit"
        options = {"warehouse": str(deployment.warehouse), "catalog_url": deployment.catalog_url}
        write_unit_file(stage, self.circuit, unit, options)
        venv_bin = os.path.dirname(sys.executable)
        hook = SparkSubmitHook(
            conn_id=deployment.spark_submit_conn_id,
            name=f"dbspark-{self.name}-{unit.kind}-{unit.epoch}",
            application_args=["--unit-file", str(stage)],
            # The job imports dbspark: it runs on this interpreter, found first on PATH.
            env_vars={
                "PATH": venv_bin + os.pathsep + os.environ.get("PATH", ""),
                "PYSPARK_PYTHON": sys.executable,
                "PYSPARK_DRIVER_PYTHON": sys.executable,
            },
        )
        try:
            hook.submit(application=str(SPARK_JOB))
            return json.loads(result_path(stage).read_text())
        finally:
            for leftover in (stage, result_path(stage)):
                leftover.unlink(missing_ok=True)

    def ingest(self, source: str, context: Mapping[str, Any]) -> dict[str, Any]:
        deployment, run = self._current(context)
        connector = self.sources[source]
        log.info("%s", connector.describe(source, run.interval))
        columns = source_columns(self.circuit, source)
        batch = connector.batch(source, run.interval, columns=columns)
        unit = IngestUnit(run.epoch, source, batch)
        return self._execute(deployment, unit)

    def stage(self, stage_id: int, context: Mapping[str, Any]) -> dict[str, Any]:
        deployment, run = self._current(context)
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
        deployment, run = self._current(context)
        unit = PublishUnit(
            run.epoch,
            outputs=str(deployment.outputs),
            serving_url=deployment.serving_url,
            serving_prefix=deployment.serving_table_prefix,
        )
        return self._execute(deployment, unit)

    def close_epoch(self, context: Mapping[str, Any]) -> int:
        deployment, run = self._current(context)
        self._execute(deployment, CloseUnit(run.epoch))
        log.info("circuit %s: epoch %s %s committed", self.name, run.epoch, run.interval)
        return run.epoch
