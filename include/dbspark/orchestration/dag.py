"""``build_dag``: one circuit, one Airflow DAG; one DAG run, one epoch.

The graph mirrors the circuit's plan (``circuit/planner.py``)::

    epoch.open >> ingest.<source> ... >> stages.<stage> ...            (plan order)
               loop_<name>.iterate[0..k] >> loop_<name>.converged     (per top-level loop)
    ... >> publish >> epoch.close

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

from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

from dbspark.circuit.builder import Circuit
from dbspark.orchestration.deployment import DeploymentOptions
from dbspark.orchestration.tasks import EpochTasks

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
    retries: int = 2,
    retry_delay: timedelta = timedelta(seconds=30),
    catchup: bool = True,
    tags: list[str] | None = None,
    **dag_kwargs: Any,
) -> Any:
    """The Airflow DAG that runs ``circuit`` one epoch per data interval.

    ``sources`` maps every source of the circuit to a connector
    (``orchestration/connectors.py``). ``warehouse``, ``outputs`` and the connection ids
    default to ``airflow.cfg`` (``deployment.py``). Each top-level loop gets
    ``min(iteration_tasks, max_iterations)`` mapped iteration tasks; the last one
    carries on inline if the loop needs more.
    """
    from airflow.sdk import DAG, TaskGroup, task

    circuit = circuit() if callable(circuit) and not isinstance(circuit, Circuit) else circuit
    if start_date.tzinfo is None:
        raise ValueError(f"start_date {start_date} needs a time zone (e.g. tzinfo=UTC)")
    import pendulum

    start_date = pendulum.instance(start_date)  # Airflow serialises pendulum zones only
    missing = sorted(set(circuit.sources) - set(sources))
    extra = sorted(set(sources) - set(circuit.sources))
    if missing or extra:
        raise ValueError(
            f"circuit {circuit.name!r}: every source needs exactly one connector; "
            f"missing {missing or 'none'}, unknown {extra or 'none'} "
            f"(sources: {sorted(circuit.sources)})"
        )
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
    )
    the_plan = runner.plan
    default_args = {
        "depends_on_past": True,
        "retries": retries,
        "retry_delay": retry_delay,
        **dag_kwargs.pop("default_args", {}),
    }
    dag = DAG(
        dag_id=dag_id or f"dbspark_{circuit.name}",
        schedule=_timetable(schedule, start_date),
        start_date=start_date,
        catchup=catchup,
        max_active_runs=1,
        default_args=default_args,
        tags=tags or ["dbspark"],
        doc_md=_doc(circuit, the_plan),
        **dag_kwargs,
    )
    _CIRCUITS[dag.dag_id] = circuit
    with dag:
        with TaskGroup("epoch", tooltip="open and commit the epoch") as epoch_group:

            @task(task_id="open")
            def open_epoch(**context: Any) -> int:
                return runner.open_epoch(context)

            @task(task_id="close", trigger_rule="all_success")
            def close_epoch(**context: Any) -> int:
                return runner.close_epoch(context)

            opened = open_epoch()
            closed = close_epoch()
        del epoch_group

        producers: dict[int, Any] = {}  # node id -> the task after which it exists
        every: list[Any] = []
        with TaskGroup("ingest", tooltip="one task per source"):
            for stage in the_plan.stages_in_scope(0):
                anchor = circuit.node(stage.anchor)
                if anchor.op not in ("zset_source", "upsert_source"):
                    continue
                source = anchor.label

                @task(task_id=source)
                def ingest(source: str = source, **context: Any) -> dict[str, Any]:
                    return runner.ingest(source, context)

                ingested = ingest()
                opened >> ingested
                for node_id in stage.nodes:
                    producers[node_id] = ingested
                every.append(ingested)

        stages_group = TaskGroup("stages", tooltip="fused operator chains, in plan order")
        for stage in the_plan.stages_in_scope(0):
            anchor = circuit.node(stage.anchor)
            if anchor.op in ("zset_source", "upsert_source"):
                continue
            if anchor.op == "leave":
                scope = anchor.params["loop"]
                loop = the_plan.loops[scope]
                slots = min(iteration_tasks, loop.max_iterations)
                with TaskGroup(f"loop_{loop.name}", tooltip=f"fixed point {loop.name}"):

                    @task(task_id="iterate", max_active_tis_per_dagrun=1)
                    def iterate(slot: int, scope: int = scope, **context: Any) -> dict[str, Any]:
                        return runner.iterate(scope, context)

                    @task(task_id="converged", trigger_rule="none_failed")
                    def converged(scope: int = scope, **context: Any) -> dict[str, Any]:
                        return runner.check_convergence(scope, context)

                    iterations = iterate.expand(slot=list(range(slots)))
                    checked = converged()
                    iterations >> checked
                inside = set(circuit.nodes_within(scope))
                reads = {
                    n
                    for s in the_plan.stages
                    if s.anchor in inside
                    for n in s.inputs
                    if n not in inside
                }
                for upstream in {id(producers[n]): producers[n] for n in reads}.values():
                    upstream >> iterations
                if not reads:
                    opened >> iterations
                every.append(checked)
                producers.update(dict.fromkeys(inside, checked))

            with stages_group:

                @task(task_id=stage.name)
                def run_stage(stage_id: int = stage.id, **context: Any) -> dict[str, Any]:
                    return runner.stage(stage_id, context)

                ran = run_stage()
            upstreams = {id(producers[n]): producers[n] for n in stage.inputs}
            for upstream in upstreams.values():
                upstream >> ran
            if not upstreams:
                opened >> ran
            for node_id in stage.nodes:
                producers[node_id] = ran
            every.append(ran)

        @task(task_id="publish")
        def publish(**context: Any) -> dict[str, Any]:
            return runner.publish(context)

        published = publish()
        for upstream in every:
            upstream >> published
        published >> closed
    return dag


def _doc(circuit: Circuit, the_plan: Any) -> str:
    sources = ", ".join(sorted(circuit.sources))
    views = ", ".join(sorted(circuit.views))
    return (
        f"### dbspark circuit `{circuit.name}`\n\n"
        f"Each run is one epoch: it ingests the run's data interval from {sources}, runs the "
        f"plan below incrementally on Spark and publishes {views}.\n\n"
        f"```\n{the_plan.describe()}\n```\n"
    )
