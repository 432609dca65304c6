"""``build_dag``: one circuit, one Airflow DAG; one DAG run, one epoch.

The graph mirrors the circuit's plan (``circuit/planner.py``)::

    open_epoch >> ingest.<source> ... >> <stage> ...                   (plan order)
               loop_<name>.iterate[0..k] >> loop_<name>.converged     (per top-level loop)
    ... >> publish >> close_epoch >> [rebuild, verify, serve, maintain]
    rebuild >> [verify, serve]

``publish`` has each view's Asset as an outlet (``assets.py``). ``close_epoch`` is a
branch to ``rebuild`` and ``verify``, which run only when the run's params ask (a manual
trigger's form; ``rebuild``'s outlet is the circuit's asset alias, through which it
emits events of the views whose outputs it corrected), ``serve`` (serving tables,
when there is a serving database) and ``maintain`` (garbage collection and
retention, every ``maintain_every``-th epoch); the scheduler skips the others without
starting a task process.

Task groups stay acyclic when collapsed, as the Graph view draws them (Airflow sorts a
group's children topologically and fails the whole view on a cycle): ``ingest`` only
follows ``open_epoch`` and each loop group is entered by its iterations and left by
its convergence check, while ``open_epoch``, the stages, ``publish`` and
``close_epoch`` stand at the top level. A ``stages`` group or an ``epoch`` group
holding both ends would be a cycle as soon as a loop, or the epoch itself, sat
between its members.

Dependencies follow the data: a stage waits for the tasks that produce what it reads,
a loop for the producers of what its body reads from outside, ``publish`` for all of
them. Runs are serialised (``max_active_runs=1``, ``depends_on_past``) and the catalog
enforces the epoch order again in the open task (``epochs.py``).

Schedules are data-interval schedules: a cron expression becomes a
``CronDataIntervalTimetable`` and a ``timedelta`` a ``DeltaDataIntervalTimetable``, so
each run covers ``[data_interval_start, data_interval_end)`` and a run triggered by
hand covers the last complete interval.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from dbspark.circuit.builder import Circuit
from dbspark.orchestration.airflow.assets import rebuild_alias
from dbspark.orchestration.airflow.deployment import DeploymentOptions
from dbspark.orchestration.airflow.policy import (
    MAX_RETRY_DELAY,
    RETRIES,
    RETRY_BACKOFF,
    RETRY_DELAY,
    retry_policy,
    task_timeouts,
)
from dbspark.orchestration.airflow.tasks import MAINTAIN, REBUILD, SERVE, VERIFY, EpochTasks
from dbspark.orchestration.sources import LandingDirectory, SourceConnector
from dbspark.orchestration.units import CircuitRecipe
from dbspark.sql import compile_files, explain

#: Mapped iteration tasks per loop when ``build_dag`` is not told otherwise.
DEFAULT_ITERATION_TASKS = 16

#: The circuit behind each DAG built in this process, by DAG id.
_CIRCUITS: dict[str, Circuit] = {}


def circuit_of(dag_id: str) -> Circuit:
    """The circuit a DAG built in this process runs (e.g. to read its views)."""
    try:
        return _CIRCUITS[dag_id]
    except KeyError:
        raise KeyError(f"no dbspark DAG {dag_id!r} was built in this process") from None


def run_params(circuit: Circuit) -> dict[str, Any]:
    """The params of every dbspark DAG, typed so the trigger form shows a checkbox and a
    multi-select of the circuit's views (Airflow's form picks a multi-select for an
    array with ``examples``). The defaults, which scheduled runs take, do neither.

    ``rebuild`` also accepts null: the form sends null once every choice is removed.
    The item ``enum`` makes Airflow refuse an unknown view when the run is created."""
    from airflow.sdk import Param

    views = sorted(circuit.views)
    return {
        VERIFY: Param(
            False,
            type="boolean",
            title="Verify the views",
            description=(
                "After the epoch commits, recompute every view from the raw input log "
                "(a full refresh on Spark) and fail the run, naming the views that differ."
            ),
        ),
        REBUILD: Param(
            [],
            type=["array", "null"],
            title="Rebuild views",
            description=(
                "After the epoch commits, replace these views with their full refresh over "
                f"the raw input log (views of circuit {circuit.name}: {', '.join(views)})."
            ),
            items={"type": "string", "enum": views},
            uniqueItems=True,
            examples=views,
        ),
    }


def _timetable(schedule: str | timedelta | Any, start_date: datetime) -> Any:
    from airflow.sdk import CronDataIntervalTimetable, DeltaDataIntervalTimetable

    if isinstance(schedule, timedelta):
        return DeltaDataIntervalTimetable(schedule)
    if isinstance(schedule, str):
        timezone = start_date.tzinfo or "UTC"
        return CronDataIntervalTimetable(schedule, timezone=timezone)
    return schedule  # a timetable object: the caller chose


def build_dag(
    circuit: Circuit | Callable[[], Circuit],
    *,
    schedule: str | timedelta | Any,
    start_date: datetime,
    sources: Mapping[str, Any],
    dag_id: str | None = None,
    warehouse: str | None = None,
    outputs: str | None = None,
    catalog_conn_id: str | None = None,
    spark_conn_id: str | None = None,
    serving_conn_id: str | None = None,
    serving_table_prefix: str = "dbspark_",
    iteration_tasks: int = DEFAULT_ITERATION_TASKS,
    retries: int = RETRIES,
    retry_delay: timedelta = RETRY_DELAY,
    execution_timeouts: Mapping[str, Any] | None = None,
    catchup: bool | None = None,
    tags: list[str] | None = None,
    circuit_recipe: CircuitRecipe | None = None,
    **dag_kwargs: Any,
) -> Any:
    """The Airflow DAG that runs ``circuit`` one epoch per data interval.

    ``sources`` maps every source of the circuit to a connector
    (``orchestration/sources/``). ``warehouse``, ``outputs`` and the connection ids
    default to ``airflow.cfg`` (``deployment.py``). Each top-level loop gets
    ``min(iteration_tasks, max_iterations)`` mapped iteration tasks; the last one
    carries on inline if the loop needs more. Each view is an Asset that ``publish``
    updates (``view_asset``); the DAG's params ``verify`` and ``rebuild``
    (:func:`run_params`) come on top of any ``params`` given. Under spark-submit the
    driver builds the circuit again from ``circuit_recipe``, by default the recipe of
    ``circuit`` when it is an importable module-level function (``units.CircuitRecipe``).

    Every task has an ``execution_timeout`` for its kind (``policy.py``: defaults,
    ``[dbspark] execution_timeouts``, then ``execution_timeouts`` here, e.g.
    ``{"ingest": timedelta(hours=4)}``). Retries back off exponentially from
    ``retry_delay``, sized so that a catalog outage of minutes costs a delay, not the
    run; bad input and units that never committed fail at once (``policy.retry_policy``).
    ``default_args`` may override any of it.

    ``catchup`` defaults to Airflow's (``[scheduler] catchup_by_default``: off in Airflow
    3, as its docs recommend), so unpausing a DAG whose start date is long past creates
    one run, not one per interval since. Epochs tile time, so that run's open task then
    refuses to skip the intervals before it and names the backfill that runs them in
    order; nothing is skipped without that choice. ``catchup=True`` runs every missed
    interval by itself (a deployment whose scheduler may stop for a while).
    """
    from airflow.sdk import DAG

    circuit, recipe = _circuit_and_recipe(circuit, circuit_recipe)
    start_date = _aware(start_date)
    _check_connectors(circuit, sources)
    timeouts = task_timeouts(execution_timeouts)
    if iteration_tasks < 1:
        raise ValueError("iteration_tasks must be at least 1")
    runner = EpochTasks(
        circuit=circuit,
        sources=dict(sources),
        options=DeploymentOptions(
            warehouse=warehouse,
            outputs=outputs,
            catalog_conn_id=catalog_conn_id,
            spark_conn_id=spark_conn_id,
            serving_conn_id=serving_conn_id,
            serving_table_prefix=serving_table_prefix,
        ),
        start_date=start_date,
        iteration_tasks=iteration_tasks,
        recipe=recipe,
    )
    dag = DAG(
        dag_id=dag_id or f"dbspark_{circuit.name}",
        schedule=_timetable(schedule, start_date),
        start_date=start_date,
        **({} if catchup is None else {"catchup": catchup}),
        max_active_runs=1,
        default_args=_default_args(retries, retry_delay, dag_kwargs.pop("default_args", {})),
        tags=tags or ["dbspark"],
        doc_md=_doc(circuit),
        params={**_user_params(dag_kwargs.pop("params", None)), **run_params(circuit)},
        **dag_kwargs,
    )
    _CIRCUITS[dag.dag_id] = circuit
    with dag:
        _EpochGraph(runner, iteration_tasks, timeouts).build()
    return dag


def _circuit_and_recipe(
    circuit: Circuit | Callable[[], Circuit], recipe: CircuitRecipe | None
) -> tuple[Circuit, CircuitRecipe | None]:
    """The circuit (built now if given as its factory) and how a spark-submit driver
    builds it again: ``recipe``, else a factory's own recipe."""
    if callable(circuit) and not isinstance(circuit, Circuit):
        return circuit(), recipe or CircuitRecipe.of_factory(circuit)
    return circuit, recipe


def _user_params(params: Mapping[str, Any] | None) -> dict[str, Any]:
    """The user's DAG params, refused when one takes the name of dbspark's own."""
    params = dict(params or {})
    taken = sorted({VERIFY, REBUILD} & set(params))
    if taken:
        raise ValueError(f"params {taken} are dbspark's own (see build_dag); rename yours")
    return params


def _default_args(
    retries: int, retry_delay: timedelta, overrides: Mapping[str, Any]
) -> dict[str, Any]:
    """Every task's arguments: an epoch waits for the one before, and retries back off
    (``policy.retry_policy``); ``overrides`` (the caller's ``default_args``) win."""
    return {
        "depends_on_past": True,
        "retries": retries,
        "retry_delay": retry_delay,
        "retry_exponential_backoff": RETRY_BACKOFF,
        "max_retry_delay": MAX_RETRY_DELAY,
        "retry_policy": retry_policy(),
        **overrides,
    }


def sql_dag(
    sql: str | os.PathLike[str],
    *,
    sources: str | os.PathLike[str],
    schedule: str | timedelta | Any,
    start_date: datetime,
    connectors: SourceConnector | Mapping[str, SourceConnector] | None = None,
    name: str | None = None,
    **options: Any,
) -> Any:
    """The DAG of the views in the script ``sql`` (``CREATE VIEW`` statements) over the
    sources declared in the JSON file ``sources`` (as ``python -m dbspark.sql explain
    --sources`` reads it: per source its ``columns`` and, for upserts, ``key``,
    ``watermark`` and ``tombstone``), so a DAG file names two files and a schedule.

    Relative paths are read next to the file that calls ``sql_dag`` (the DAG file), as
    Airflow reads a templated ``.sql`` next to its DAG, whatever the process's working
    directory. ``connectors`` says where batches come from: one connector for every
    source, or one per source; by default every source lands in the landing directory
    (``LandingDirectory()``). The circuit is called ``name`` (default: the script's file
    name without ``.sql``); ``options`` are ``build_dag``'s (``dag_id``, ``warehouse``,
    ``iteration_tasks``, ...). SQL that does not compile raises a ``SqlError`` naming
    the file, the view, the construct and its line, which Airflow shows as this DAG
    file's import error.
    """
    folder = _caller_folder()
    circuit = compile_files(folder / sql, folder / sources, name)
    recipe = CircuitRecipe(sql=str(folder / sql), sources=str(folder / sources), name=name)
    if connectors is None:
        connectors = LandingDirectory()
    if isinstance(connectors, SourceConnector):
        connectors = dict.fromkeys(circuit.sources, connectors)
    return build_dag(
        circuit,
        schedule=schedule,
        start_date=start_date,
        sources=connectors,
        circuit_recipe=recipe,
        **options,
    )


def _caller_folder() -> Path:
    """The folder of the file that called our caller (for ``sql_dag``: the DAG file)."""
    caller = sys._getframe(2).f_globals.get("__file__")
    return Path(caller).resolve().parent if caller else Path.cwd()


def _aware(start_date: datetime) -> Any:
    """``start_date`` as pendulum (Airflow serialises pendulum zones only); a naive one
    is refused rather than guessed."""
    import pendulum

    if start_date.tzinfo is None:
        raise ValueError(f"start_date {start_date} needs a time zone (e.g. tzinfo=UTC)")
    return pendulum.instance(start_date)


def _check_connectors(circuit: Circuit, sources: Mapping[str, Any]) -> None:
    missing = sorted(set(circuit.sources) - set(sources))
    extra = sorted(set(sources) - set(circuit.sources))
    if missing or extra:
        raise ValueError(
            f"circuit {circuit.name!r}: every source needs exactly one connector; "
            f"missing {missing or 'none'}, unknown {extra or 'none'} "
            f"(sources: {sorted(circuit.sources)})"
        )


class _EpochGraph:
    """The tasks of one epoch, built group by group inside a ``with dag:`` block.

    ``producers`` maps each node id to the task after which its delta exists, so every
    task waits for exactly the tasks that produce what it reads; ``publish`` waits for
    all of them (``every``)."""

    def __init__(
        self, runner: EpochTasks, iteration_tasks: int, timeouts: Mapping[str, timedelta]
    ) -> None:
        self.runner = runner
        self.timeouts = dict(timeouts)
        self.circuit = runner.circuit
        self.plan = runner.plan
        self.iteration_tasks = iteration_tasks
        self.producers: dict[int, Any] = {}
        self.every: list[Any] = []

    def build(self) -> None:
        opened, closed = self._epoch()
        self._ingest(opened)
        for stage in self.plan.stages_in_scope(0):
            anchor = self.circuit.node(stage.anchor)
            if anchor.op in ("zset_source", "upsert_source"):
                continue
            if anchor.op == "leave":
                self._loop(anchor.params["loop"], opened)
            ran = self._stage(stage.id)
            self._after(stage.inputs, ran, opened)
            self.producers.update(dict.fromkeys(stage.nodes, ran))
            self.every.append(ran)
        published = self._publish()
        for upstream in self.every:
            upstream >> published
        rebuilt, verified = self._maintenance()
        served, maintained = self._after_close()
        published >> closed >> [rebuilt, verified, served, maintained]
        # A rebuild's correction reaches the serving tables in the same run.
        rebuilt >> [verified, served]

    def _epoch(self) -> tuple[Any, Any]:
        """``open_epoch`` and ``close_epoch``, the first and the last task."""
        from airflow.sdk import task

        runner = self.runner

        @task(task_id="open_epoch", execution_timeout=self.timeouts["open"])
        def open_epoch(**context: Any) -> int:
            return runner.open_epoch(context)

        # A branch: it names the maintenance tasks the run's params ask for, and the
        # scheduler marks the others skipped without starting a process for them (two
        # task processes a run, about 2.4 s of every epoch through Airflow).
        @task.branch(
            task_id="close_epoch",
            trigger_rule="all_success",
            execution_timeout=self.timeouts["close"],
        )
        def close_epoch(**context: Any) -> list[str]:
            epoch = runner.close_epoch(context)
            return runner.after_close(context, epoch)

        return open_epoch(), close_epoch()

    def _ingest(self, opened: Any) -> None:
        """``ingest.<source>``: one task per source, running the chain fused onto it."""
        from airflow.sdk import TaskGroup, task

        runner = self.runner
        with TaskGroup("ingest", tooltip="one task per source"):
            for stage in self.plan.stages_in_scope(0):
                anchor = self.circuit.node(stage.anchor)
                if anchor.op not in ("zset_source", "upsert_source"):
                    continue

                @task(task_id=anchor.label, execution_timeout=self.timeouts["ingest"])
                def ingest(source: str = anchor.label, **context: Any) -> dict[str, Any]:
                    return runner.ingest(source, context)

                ingested = ingest()
                opened >> ingested
                self.producers.update(dict.fromkeys(stage.nodes, ingested))
                self.every.append(ingested)

    def _loop(self, scope: int, opened: Any) -> None:
        """``loop_<name>``: mapped ``iterate`` tasks, then ``converged``."""
        from airflow.sdk import TaskGroup, task

        runner = self.runner
        loop = self.plan.loops[scope]
        slots = min(self.iteration_tasks, loop.max_iterations)
        with TaskGroup(f"loop_{loop.name}", tooltip=f"fixed point {loop.name}"):

            @task(
                task_id="iterate",
                max_active_tis_per_dagrun=1,
                execution_timeout=self.timeouts["iterate"],
            )
            def iterate(slot: int, scope: int = scope, **context: Any) -> dict[str, Any]:
                return runner.iterate(scope, context)

            @task(
                task_id="converged",
                trigger_rule="none_failed",
                execution_timeout=self.timeouts["converged"],
            )
            def converged(scope: int = scope, **context: Any) -> dict[str, Any]:
                return runner.check_convergence(scope, context)

            iterations = iterate.expand(slot=list(range(slots)))
            checked = converged()
            iterations >> checked
        inside = set(self.circuit.nodes_within(scope))
        reads = {
            n for s in self.plan.stages if s.anchor in inside for n in s.inputs if n not in inside
        }
        self._after(reads, iterations, opened)
        self.every.append(checked)
        self.producers.update(dict.fromkeys(inside, checked))

    def _stage(self, stage_id: int) -> Any:
        """``<stage>``: one fused chain of operators (named by the plan)."""
        from airflow.sdk import task

        runner = self.runner

        @task(task_id=self.plan.stages[stage_id].name, execution_timeout=self.timeouts["stage"])
        def run_stage(stage_id: int = stage_id, **context: Any) -> dict[str, Any]:
            return runner.stage(stage_id, context)

        return run_stage()

    def _publish(self) -> Any:
        from airflow.sdk import task

        runner = self.runner

        @task(
            task_id="publish",
            outlets=list(runner.assets.values()),
            execution_timeout=self.timeouts["publish"],
        )
        def publish(**context: Any) -> dict[str, Any]:
            return runner.publish(context)

        return publish()

    def _maintenance(self) -> tuple[Any, Any]:
        """``rebuild`` then ``verify``, after the epoch committed, when the run's params
        ask (``close_epoch`` branches to them). They also run when ``close_epoch``
        skipped (a manual run for a committed epoch: the way to verify or rebuild without
        new data; each then skips itself unless asked), and they never wait for the
        previous run's (``depends_on_past=False``): a failed verification must not block
        every later epoch."""
        from airflow.sdk import task

        runner = self.runner

        @task(
            task_id="rebuild",
            trigger_rule="none_failed",
            depends_on_past=False,
            execution_timeout=self.timeouts["rebuild"],
            # Events of only the views whose outputs the rebuild corrected (assets.py).
            outlets=[rebuild_alias(runner.name)],
        )
        def rebuild(**context: Any) -> dict[str, Any]:
            return runner.rebuild(context)

        @task(
            task_id="verify",
            trigger_rule="none_failed",
            depends_on_past=False,
            execution_timeout=self.timeouts["verify"],
        )
        def verify(**context: Any) -> dict[str, Any]:
            return runner.verify(context)

        return rebuild(), verify()

    def _after_close(self) -> tuple[Any, Any]:
        """``serve`` (serving tables caught up from the change feed) and ``maintain``
        (garbage collection, retention), after the epoch committed, in every DAG. A
        failure of either fails that task, never an epoch: they do not wait for the
        previous run's (``depends_on_past=False``), and the next run's catches up. Unlike
        ``rebuild`` and ``verify`` they skip when ``close_epoch`` skipped: a run for a
        committed epoch is a no-op, except that ``serve`` runs after a ``rebuild`` that
        ran, to apply its correction."""
        from airflow.sdk import task

        runner = self.runner

        @task(
            task_id=SERVE,
            trigger_rule="none_failed_min_one_success",
            depends_on_past=False,
            execution_timeout=self.timeouts["serve"],
        )
        def serve(**context: Any) -> dict[str, Any]:
            return runner.serve(context)

        @task(
            task_id=MAINTAIN,
            trigger_rule="none_failed_min_one_success",
            depends_on_past=False,
            execution_timeout=self.timeouts["maintain"],
        )
        def maintain(**context: Any) -> dict[str, Any]:
            return runner.maintain(context)

        return serve(), maintain()

    def _after(self, reads: Any, task_: Any, opened: Any) -> None:
        """``task_`` waits for the producers of ``reads`` (or for ``open_epoch``)."""
        upstreams = {id(self.producers[n]): self.producers[n] for n in reads}
        for upstream in upstreams.values():
            upstream >> task_
        if not upstreams:
            opened >> task_


def _doc(circuit: Circuit) -> str:
    """The DAG's docs in the UI: what a run does, and the plan as ``explain`` prints it
    (stages, traces and their keys, loops), so the Docs tab says what a run costs."""
    sources = ", ".join(sorted(circuit.sources))
    views = ", ".join(sorted(circuit.views))
    return (
        f"### dbspark circuit `{circuit.name}`\n\n"
        f"Each run is one epoch: it ingests the run's data interval from {sources}, runs the "
        f"plan below incrementally on Spark and publishes {views}.\n\n"
        f"```\n{explain(circuit)}\n```\n"
    )
