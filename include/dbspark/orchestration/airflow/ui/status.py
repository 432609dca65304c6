"""What the dbspark page shows, read from the catalog alone.

Nothing here opens a Parquet file, starts Spark or asks Airflow: every number is a
catalog row. An epoch's interval is its label, its duration the time between opening
and committing, its rows in what each source's ingest commit wrote to the source's
input log, its rows changed what the publish commit appended to each view; a loop's
convergence is its ``loop_iterations``; a trace's size sums its batches, live and
superseded (compacted away, not yet garbage collected), next to its frontier.

Links into the Airflow UI come from the DAG runs the open task records per epoch
(``Catalog.record_epoch_run``); which task committed what follows from the stage names
the catalog records (:func:`task_of_stage`).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import quote

from dbspark.orchestration.intervals import Interval
from dbspark.storage import collection_names as coll
from dbspark.storage.catalog import (
    Catalog,
    CollectionSize,
    EpochRecord,
    EpochRun,
    StageOutput,
    Time,
)

#: Epochs shown per circuit unless asked otherwise (the newest ones).
DEFAULT_EPOCHS = 50

# A root-scope stage is named after its anchor operator (``circuit/planner.py``).
_ANCHOR_STAGE = re.compile(r"[a-z_]+?_(?P<node>\d+)")


def task_of_stage(stage: str) -> str | None:
    """The task of a dbspark DAG run (``build_dag``) that commits the catalog stage
    ``stage``: ``ingest_<source>`` is ``ingest.<source>``, a loop's iterations
    (``loop:<name>``) are the mapped ``loop_<name>.iterate``, compaction and retired
    deltas happen in ``close_epoch``, a root-scope stage is the task of its name. A
    rebuild is the ``rebuild`` task of the run its stage names (:func:`rebuild_run`), or
    ran outside any DAG run (None)."""
    if stage.startswith("ingest_"):
        return f"ingest.{stage.removeprefix('ingest_')}"
    if stage.startswith("loop:"):
        return f"loop_{stage.removeprefix('loop:')}.iterate"
    if stage.startswith("compact:") or stage == "retire-deltas":
        return "close_epoch"
    if stage.startswith(coll.REBUILD_PREFIX):
        return REBUILD_TASK if rebuild_run(stage) else None
    return stage


REBUILD_TASK = "rebuild"


def rebuild_run(stage: str) -> tuple[str, str] | None:
    """(dag_id, run_id) of the DAG run whose rebuild task committed ``stage``."""
    by = coll.rebuild_by(stage)
    if by is None or "/" not in by:
        return None
    dag_id, run_id = by.split("/", 1)
    return dag_id, run_id


@dataclass(frozen=True)
class AirflowLinks:
    """Addresses of the Airflow UI's pages, under its base path (``[api] base_url``)."""

    base: str = "/"

    def _path(self, *parts: str) -> str:
        return self.base.rstrip("/") + "/" + "/".join(quote(p, safe="") for p in parts)

    def dag(self, dag_id: str) -> str:
        return self._path("dags", dag_id)

    def run(self, dag_id: str, run_id: str) -> str:
        return self._path("dags", dag_id, "runs", run_id)

    def task(self, dag_id: str, run_id: str, task_id: str) -> str:
        """The task instance's page, which opens on its log; a mapped task's list of
        instances (the loop's iterations) for ``*.iterate``."""
        path = self._path("dags", dag_id, "runs", run_id, "tasks", task_id)
        return f"{path}/mapped" if task_id.endswith(".iterate") else path


# --- the model ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Link:
    label: str
    url: str


@dataclass(frozen=True)
class EpochStatus:
    epoch: int
    state: str
    #: What the epoch stands for (an Airflow data interval ``start/end``), if recorded.
    label: str | None
    interval_start: datetime | None
    interval_end: datetime | None
    opened_at: datetime
    committed_at: datetime | None
    #: From opening to committing; None while the epoch is open.
    duration_seconds: float | None
    #: Rows each source's ingest wrote to its input log (sources that ingested).
    rows_in: dict[str, int]
    #: Rows of each view's change at this epoch (once published).
    rows_changed: dict[str, int]
    #: The DAG runs that worked on the epoch, oldest first.
    runs: list[Link]
    #: The logs of the tasks of the latest run that committed something, in order.
    task_logs: list[Link]


@dataclass(frozen=True)
class IterationStatus:
    iteration: int
    delta_rows: int
    converged: bool
    reason: str


@dataclass(frozen=True)
class LoopRun:
    """One loop's iterations at one outer time (an epoch, or an outer iteration)."""

    prefix: Time
    iterations: list[IterationStatus]

    @property
    def epoch(self) -> int:
        return self.prefix[0]

    @property
    def converged(self) -> bool:
        return bool(self.iterations) and self.iterations[-1].converged


@dataclass(frozen=True)
class LoopStatus:
    name: str
    runs: list[LoopRun]


@dataclass(frozen=True)
class CollectionStatus(CollectionSize):
    #: What the collection holds, in words ("input log of source edges", ...).
    role: str
    #: Compaction: times at or below which the trace is advanced and merged (None: the
    #: collection is not compacted).
    frontier: list[Time] | None


@dataclass(frozen=True)
class CircuitSummary:
    name: str
    dags: list[Link]
    epochs: int
    last_committed_epoch: int
    open_epochs: list[int]
    last_label: str | None
    live_bytes: int
    superseded_bytes: int


@dataclass(frozen=True)
class CircuitStatus:
    summary: CircuitSummary
    sources: list[str]
    views: list[str]
    #: The newest epochs first (at most the number asked for).
    epochs: list[EpochStatus]
    loops: list[LoopStatus]
    collections: list[CollectionStatus]


# --- reading the catalog -----------------------------------------------------------------


def circuit_names(catalog: Catalog) -> list[str]:
    return catalog.circuits()


def dag_ids(catalog: Catalog, circuit: str) -> list[str]:
    """The DAGs whose runs worked on ``circuit``'s epochs (usually one)."""
    return list(dict.fromkeys(run.dag_id for run in catalog.epoch_runs(circuit)))


def summarize(catalog: Catalog, circuit: str, links: AirflowLinks) -> CircuitSummary:
    epochs = catalog.epochs(circuit)
    sizes = catalog.collection_sizes(circuit)
    return CircuitSummary(
        name=circuit,
        dags=[Link(d, links.dag(d)) for d in dag_ids(catalog, circuit)],
        epochs=len(epochs),
        last_committed_epoch=catalog.last_committed_epoch(circuit),
        open_epochs=[e.epoch for e in epochs if e.state != "committed"],
        last_label=epochs[-1].label if epochs else None,
        live_bytes=sum(s.live_bytes for s in sizes),
        superseded_bytes=sum(s.superseded_bytes for s in sizes),
    )


def circuit_status(
    catalog: Catalog, circuit: str, links: AirflowLinks, *, limit: int = DEFAULT_EPOCHS
) -> CircuitStatus:
    """Everything the page shows of ``circuit``: its newest ``limit`` epochs, the loops'
    iterations at those epochs, and every collection."""
    records = catalog.epochs(circuit)
    shown = list(reversed(records))[: max(limit, 0)]
    shown_numbers = {e.epoch for e in shown}
    outputs = catalog.stage_outputs(circuit)
    committed = catalog.stage_runs(circuit)  # read second: it holds every output's stage
    outputs_by_epoch: dict[int, list[StageOutput]] = defaultdict(list)
    for output in outputs:
        outputs_by_epoch[output.epoch].append(output)
    stages_by_epoch: dict[int, list[str]] = defaultdict(list)
    for stage, time in committed:
        stages_by_epoch[time[0]].append(stage)
    runs_by_epoch: dict[int, list[EpochRun]] = defaultdict(list)
    for run in catalog.epoch_runs(circuit):
        runs_by_epoch[run.epoch].append(run)
    sizes = catalog.collection_sizes(circuit)
    sources = sorted({s.removeprefix("ingest_") for s, _ in committed if s.startswith("ingest_")})
    views = [name for s in sizes if (name := coll.view_name(s.collection)) is not None]
    epochs = [
        _epoch_status(
            record,
            outputs_by_epoch.get(record.epoch, []),
            stages_by_epoch.get(record.epoch, []),
            runs_by_epoch.get(record.epoch, []),
            views,
            links,
        )
        for record in shown
    ]
    loops: dict[str, list[LoopRun]] = defaultdict(list)
    by_prefix: dict[tuple[str, Time], list[IterationStatus]] = defaultdict(list)
    for it in catalog.all_loop_iterations(circuit):
        if it.prefix[0] in shown_numbers:
            step = IterationStatus(it.iteration, it.delta_rows, it.converged, it.reason)
            by_prefix[(it.loop, it.prefix)].append(step)
    for (loop, prefix), iterations in sorted(by_prefix.items()):
        loops[loop].append(LoopRun(prefix, sorted(iterations, key=lambda i: i.iteration)))
    frontiers = catalog.frontiers(circuit)
    names = _node_names(outputs)
    collections = [
        CollectionStatus(
            **vars(s), role=_role(s.collection, names), frontier=frontiers.get(s.collection)
        )
        for s in sorted(sizes, key=lambda s: _collection_order(s.collection))
    ]
    return CircuitStatus(
        summary=summarize(catalog, circuit, links),
        sources=sources,
        views=views,
        epochs=epochs,
        loops=[LoopStatus(name, runs) for name, runs in sorted(loops.items())],
        collections=collections,
    )


def _epoch_status(
    record: EpochRecord,
    outputs: Sequence[StageOutput],
    stages: Sequence[str],
    runs: Sequence[EpochRun],
    views: Sequence[str],
    links: AirflowLinks,
) -> EpochStatus:
    rows_in: dict[str, int] = {}
    for stage in stages:
        if stage.startswith("ingest_"):
            # An ingest whose batch was empty wrote nothing: zero rows in.
            rows_in.setdefault(stage.removeprefix("ingest_"), 0)
    rows_changed: dict[str, int] = dict.fromkeys(views, 0) if "publish" in stages else {}
    for output in outputs:
        view = coll.view_name(output.collection)
        if output.stage.startswith("ingest_") and coll.is_input_log(output.collection):
            source = output.stage.removeprefix("ingest_")
            rows_in[source] = rows_in.get(source, 0) + output.rows
        elif output.stage == "publish" and view is not None:
            rows_changed[view] = output.rows
    opened, committed = _utc(record.opened_at), _utc(record.committed_at)
    start, end = _interval(record.label)
    task_logs: list[Link] = []
    if runs:
        latest = runs[-1]
        tasks = ["open_epoch", *(task_of_stage(s) for s in stages)]
        if record.state == "committed":
            tasks.append("close_epoch")
        task_logs = [
            Link(task, links.task(latest.dag_id, latest.run_id, task))
            for task in dict.fromkeys(t for t in tasks if t not in (None, REBUILD_TASK))
        ]
    # A rebuild's log is in the run that asked for it, which may be a later run's.
    rebuilds = [run for run in map(rebuild_run, stages) if run is not None]
    for dag_id, run_id in dict.fromkeys(rebuilds):
        task_logs.append(Link(REBUILD_TASK, links.task(dag_id, run_id, REBUILD_TASK)))
    return EpochStatus(
        epoch=record.epoch,
        state=record.state,
        label=record.label,
        interval_start=start,
        interval_end=end,
        opened_at=opened,
        committed_at=committed,
        duration_seconds=(committed - opened).total_seconds() if committed else None,
        rows_in=dict(sorted(rows_in.items())),
        rows_changed=rows_changed,
        runs=[Link(r.run_id, links.run(r.dag_id, r.run_id)) for r in runs],
        task_logs=task_logs,
    )


def _utc(moment: datetime | None) -> datetime | None:
    """SQLite hands timestamps back without their zone; the catalog writes UTC."""
    if moment is None:
        return None
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _interval(label: str | None) -> tuple[datetime | None, datetime | None]:
    """A data interval's bounds, when the label is one (epochs run by hand may carry
    any label, or none)."""
    if not label:
        return None, None
    try:
        interval = Interval.parse(label)
    except ValueError:
        return None, None
    return interval.start, interval.end


def _node_names(outputs: Iterable[StageOutput]) -> dict[int, str]:
    """Names of nodes the catalog reveals: a source by the collections its ingest wrote,
    a root-scope stage's anchor by its stage name (``join_6``)."""
    names: dict[int, str] = {}
    for output in outputs:
        parsed = coll.parse(output.collection)
        if parsed is not None and parsed.node is not None and output.stage.startswith("ingest_"):
            names.setdefault(parsed.node, f"source {output.stage.removeprefix('ingest_')}")
    for output in outputs:
        anchor = _ANCHOR_STAGE.fullmatch(output.stage)
        if anchor and not output.stage.startswith("ingest_"):
            names.setdefault(int(anchor["node"]), output.stage)
    return names


_ROLES = {
    "delta": "delta of {name}",
    "arranged": "arranged input {port} of {name} (trace)",
    "state": "upsert state of {name}",
    "input": "input log of {name}",
    "scheduled": "scheduled output of {name}",
}


def _role(collection: str, names: dict[int, str]) -> str:
    parsed = coll.parse(collection)
    if parsed is None:
        return ""
    if parsed.node is None:
        return f"view {parsed.view} (published changes)"
    name = names.get(parsed.node, f"node {parsed.node}")
    return _ROLES[parsed.kind].format(name=name, port=parsed.port)


def _collection_order(collection: str) -> tuple[int, int, str]:
    """Views last; node collections by node id."""
    parsed = coll.parse(collection)
    if parsed is not None and parsed.node is None:
        return (1, 0, collection)
    return (0, parsed.node if parsed is not None and parsed.node is not None else -1, collection)
