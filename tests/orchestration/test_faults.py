"""Faults injected into DAG runs of a real Airflow deployment (issue 18): the scheduler
with the LocalExecutor (one process per task), api-server and dag-processor as child
processes (``devtools/airflow.py``), Airflow's metadata on one PostgreSQL server and
dbspark's catalog on another (``devtools/postgres.py``), which the test stops and starts
again: an outage of the catalog must cost the run a delay through task retries, and
the scheduler, whose own database stays up, must see it through. No ``dag.test()``.

The DAGs and the fault hooks are ``fault_dags/`` (read its docstring); every DAG has a
warehouse, outputs and catalog database of its own. Units run on the local tier (the
data is tiny), so no Spark is started. Every case ends with the published views (the
Delta table as of the epoch, and the epoch's change feed) equal to the reference full
refresh, and with no orphaned file after garbage collection: every batch directory in
the warehouse is registered, every registered batch is on disk, no unit file is left;
and after the maintenance task, every directory in the outputs' change, snapshot and
correction folders is a complete export (no killed export's ``.tmp-``/``.stale-``).

Cases, in order (one deployment for all; each case's DAG is independent of the others,
except that the GC case continues the outage case's DAG at epoch 1, and the late-file
case the mark-success case's DAG):

1. the catalog database stopped while a stage task waits to commit, and started again
   after the task failed twice: the retries complete the epoch, each unit committed once;
2. garbage collection (minimum age 0) beside a unit that wrote its files and has not
   committed: it keeps them, and the epoch then commits and reads them;
3. an ingest, a stage and a publish each run twice at once (a queue's redelivery): the
   two processes commit at the same moment, one commit wins, the other returns False
   and its process exits cleanly; the view tables hold the epoch once;
4. a full disk (ENOSPC from the Parquet writer) in an ingest and then in a publish: the
   task fails saying so, nothing of the epoch is committed, and once the disk is freed
   the cleared tasks complete the epoch;
5. a DST schedule (midnight in Berlin, across the change to summer time): a backfill's
   three runs ingest three contiguous intervals, the last 23 h long, each from the
   partition named by its start in UTC;
6. task processes killed (SIGKILL) at every kind of task in one epoch of a recursive
   circuit: an ingest, a stage and a loop iteration (a mapped task) at their catalog
   commits, the publish at its catalog commit, in its retry with the change directory
   written and not renamed into place (the hidden directory stays), and in the next
   after the view's table committed the epoch (the export), the close before the
   epoch's commit and, in its retry, at the compaction after it, and the maintenance
   task's garbage collection after its first deletion: Airflow's retries complete the
   run, and the maintenance task's retry removes the killed export's directory;
7. a failed ingest marked success through the REST API, as the UI does: the stage after
   it refuses to run, and with the publish marked success too the close refuses to
   commit, each naming the units that never ran; the epoch stays open until the input
   lands and the cleared tasks run;
8. after that epoch committed, a file lands in its partition and the file it read is
   rewritten in place: with ``late_files = fail`` the next run's ingest refuses, naming
   both; by default it warns, naming both, and the committed epochs stay as they were.
"""

from __future__ import annotations

import errno
import json
import os
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pendulum
import pytest
import sqlalchemy as sa
from scratch_databases import scratch_database

from dbspark.circuit.planner import plan
from dbspark.core.zset import ZSet
from dbspark.devtools.airflow import LocalAirflow
from dbspark.devtools.postgres import LocalPostgres, PostgresUnavailable
from dbspark.engine.reference.full_refresh import full_refresh
from dbspark.examples.circuits import orders, reachability, word_count
from dbspark.orchestration.intervals import Interval
from dbspark.orchestration.sinks.files import (
    CHANGES,
    CORRECTIONS,
    SNAPSHOT,
    output_dir,
    read_change_rows,
    read_marker,
)
from dbspark.orchestration.sinks.tables import table_path, table_rows, table_versions
from dbspark.orchestration.sources import LandingDirectory
from dbspark.storage.catalog import UNITS_FOLDER, Catalog, garbage_collect, stage_runs_table

pytestmark = pytest.mark.slow

FAULT_DAGS = Path(__file__).parent / "fault_dags"
DAG_IDS = (
    "fault_outage",
    "fault_twice",
    "fault_disk",
    "fault_dst",
    "fault_kills",
    "fault_marked",
)
START = datetime(2026, 1, 1, tzinfo=UTC)
CUSTOMERS = ["cust_id", "region", "ts", "deleted"]
ORDERS = ["order_id", "cust_id", "amount", "ts", "deleted_at"]
#: The orders circuit's upserts per epoch (as in test_scheduler.py).
ORDER_BATCHES = [
    {
        "customers": [(1, "EU", 1, False), (2, "US", 1, False), (3, "EU", 1, False)],
        "orders": [(10, 1, 5, 1, None), (11, 2, 7, 1, None), (12, 3, 4, 1, None)],
    },
    {  # customer 1 moves to US; order 11 is deleted (tombstone); a new order
        "customers": [(1, "US", 2, False)],
        "orders": [(11, 2, 7, 2, 2), (13, 1, 9, 2, None)],
    },
]
#: The word count's words per epoch, with weights.
WORD_BATCHES = [
    {"words": [(("a",), 1), (("b",), 2)]},
    {"words": [(("b",), -1), (("c",), 1)]},
    {"words": [(("a",), 1), (("d",), 3)]},
]
#: Reachability from a, along a chain of edges: five iterations at epoch 0.
REACH_BATCHES = [
    {
        "edges": [(("a", "b"), 1), (("b", "c"), 1), (("c", "d"), 1), (("x", "y"), 1)],
        "roots": [(("a",), 1)],
    },
]
WAIT = 180.0


def day(n: int) -> Interval:
    return Interval(START + timedelta(days=n), START + timedelta(days=n + 1))


def join_stage(circuit) -> str:
    (stage,) = [s.name for s in plan(circuit).stages if s.name.startswith("join")]
    return stage


# ----------------------------------------------------------------------------- the deployment
@pytest.fixture(scope="module")
def airflow_database(postgres_url):
    with scratch_database(postgres_url, "airflow") as url:
        yield url


@pytest.fixture(scope="module")
def catalog_server():
    """dbspark's catalog on a PostgreSQL server of its own, which the outage case stops:
    stopping Airflow's would stop the scheduler too."""
    server = LocalPostgres()
    try:
        server.start()
    except PostgresUnavailable as err:
        if os.environ.get("CI", "").lower() not in ("", "0", "false", "no"):
            pytest.fail(f"no PostgreSQL server for the catalog: {err}")
        pytest.skip(f"no PostgreSQL server for the catalog: {err}")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, airflow_database, catalog_server):
    root = tmp_path_factory.mktemp("faults")
    hooks = root / "hooks"
    for folder in ("pause", "paused", "go", "twice", "race", "kill", "killed", "settings"):
        (hooks / folder).mkdir(parents=True)
    env = {
        "DBSPARK_FAULT_ROOT": str(root),
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": "0.2",
        "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "600",
    }
    place = SimpleNamespace(root=root, hooks=hooks, server=catalog_server, dags={})
    for dag_id in DAG_IDS:
        url = catalog_server.create_database(dag_id)
        plain = url.replace("postgresql+psycopg://", "postgresql://")
        env[f"AIRFLOW_CONN_{dag_id.upper()}_CATALOG"] = plain
        place.dags[dag_id] = SimpleNamespace(
            catalog_url=url,
            warehouse=root / dag_id / "warehouse",
            outputs=root / dag_id / "published",
            landing=LandingDirectory(root / dag_id / "landing"),
        )
    began = time.monotonic()
    airflow = LocalAirflow(
        root / "airflow", FAULT_DAGS, env=env, parallelism=2, database_url=airflow_database
    )
    try:
        airflow.start()
        airflow.wait_for_dags(*DAG_IDS)
        for dag_id in DAG_IDS:
            airflow.api.unpause(dag_id)
        place.airflow = airflow
        place.api = airflow.api
        print(f"\ndeployment started in {time.monotonic() - began:.1f} s")
        yield place
    finally:
        airflow.stop()


# ----------------------------------------------------------------------------- helpers
def land(where, circuit, interval: Interval, batch: dict[str, Any]) -> None:
    """Land one epoch's batch; a source with nothing gets an empty, complete partition."""
    for source in circuit.sources:
        rows = batch.get(source)
        if rows is None:
            where.landing.complete(source, interval)
            continue
        if source == "customers":
            where.landing.land(source, interval, rows, CUSTOMERS, "jsonl")
        elif source == "orders":
            where.landing.land(source, interval, rows, ORDERS, "jsonl")
        else:  # a Z-set source: (row, weight) pairs
            columns = [*circuit.node(circuit.sources[source]).schema.names, "__w"]
            flat = [(*row, weight) for row, weight in rows]
            where.landing.land(source, interval, flat, columns, "parquet")


def run_epoch(place, dag_id: str, interval: Interval, *, expect: str = "success"):
    """Trigger the run of ``interval`` (a manual run covers the interval ending at its
    logical date) and wait until it finishes."""
    api = place.api
    run = api.trigger(dag_id, logical_date=interval.end)
    (run,) = api.wait_for_runs(dag_id, run_ids=[run.run_id], timeout=WAIT, poll=0.5)
    assert run.state == expect, api.explain(dag_id, [run])
    return run


def catalog_of(where) -> Catalog:
    return Catalog(where.catalog_url, warehouse=where.warehouse)


def check_views(where, circuit, history, epoch: int) -> None:
    """The published table as of ``epoch`` and the epoch's change feed of every view
    equal the full refresh of ``history`` (and its difference to the epoch before)."""
    expected = full_refresh(circuit, history, epoch)
    before = full_refresh(circuit, history, epoch - 1) if epoch else {}
    for view in circuit.views:
        schema = circuit.node(circuit.views[view]).schema
        table = table_path(where.outputs, circuit.name, view)
        assert ZSet(table_rows(table, schema, epoch)) == expected[view], (epoch, view)
        change_dir = output_dir(where.outputs, circuit.name, view, CHANGES, epoch)
        change = expected[view] - before.get(view, ZSet())
        assert ZSet(read_change_rows(change_dir, schema)) == change, (epoch, view)
        # The epoch went into the table once: one version carries it.
        assert epoch in table_versions(table), (epoch, view)


def committed_once(where, circuit, epochs: int) -> None:
    """Epochs 0..epochs-1 committed, each unit committed once per epoch, and each loop's
    iterations once each, numbered from 0, the last (only) converged."""
    planned = plan(circuit)
    catalog = catalog_of(where)
    try:
        assert catalog.last_committed_epoch(circuit.name) == epochs - 1
        t = stage_runs_table
        with catalog.engine.connect() as conn:
            rows = conn.execute(
                sa.select(t.c.stage, t.c.epoch, sa.func.count())
                .where(t.c.circuit == circuit.name, ~t.c.stage.startswith("loop:"))
                .group_by(t.c.stage, t.c.epoch)
            ).all()
        iterations = {
            (loop.name, epoch): catalog.loop_iterations(circuit.name, loop.name, (epoch,))
            for loop in planned.loops.values()
            for epoch in range(epochs)
        }
    finally:
        catalog.close()
    assert {count for _, _, count in rows} == {1}, rows
    units = [s.name for s in planned.stages_in_scope(0)] + ["publish"]
    for epoch in range(epochs):
        assert {s for s, e, _ in rows if e == epoch} >= set(units), (epoch, rows)
    for key, done in iterations.items():
        assert [it.iteration for it in done] == list(range(len(done))), (key, done)
        assert [it.converged for it in done] == [False] * (len(done) - 1) + [True], (key, done)


def unfinished_exports(where, circuit) -> list[str]:
    """The directories in the views' change, snapshot and correction folders that are
    not a complete export: a killed export's ``.epoch=<n>.tmp-<id>``, a ``.stale-<id>``
    moved aside, a directory without its marker."""
    found = []
    for view in circuit.views:
        for kind in (CHANGES, SNAPSHOT, CORRECTIONS):
            folder = where.outputs / circuit.name / view / kind
            for child in sorted(folder.iterdir()) if folder.is_dir() else []:
                complete = child.name.startswith(("epoch=", "rebuild=")) and read_marker(child)
                if not complete:
                    found.append(child.relative_to(where.outputs).as_posix())
    return found


def no_orphans(where, circuit) -> None:
    """The outputs as the maintenance task (or no task) left them hold complete exports
    only; maintenance (garbage collection, no minimum age: no unit is at work) leaves
    every batch directory registered, every live batch on disk, and no unit file."""
    assert unfinished_exports(where, circuit) == []
    catalog = catalog_of(where)
    try:
        assert catalog.leases(circuit.name) == [], "a lease outlived its unit"
        garbage_collect(where.warehouse, catalog, circuit=circuit.name, min_age_seconds=0)
        batches = catalog.all_batches(circuit.name)
        registered = {b.path for b in batches}
        live = {b.path for b in batches if b.live}
    finally:
        catalog.close()
    base = where.warehouse / circuit.name
    on_disk = {p.relative_to(where.warehouse).as_posix() for p in base.glob("*/*/t=*/*")}
    assert on_disk == registered, (on_disk - registered, registered - on_disk)
    assert all((where.warehouse / p).is_dir() for p in live)
    units = where.warehouse / UNITS_FOLDER / circuit.name
    assert not units.is_dir() or not list(units.iterdir()), list(units.iterdir())


def wait_for_file(path: Path, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.1)


def task_log(
    place, dag_id: str, run_id: str, task_id: str, attempt: int, map_index: int = -1
) -> str:
    path = place.airflow.logs / f"dag_id={dag_id}" / f"run_id={run_id}" / f"task_id={task_id}"
    if map_index >= 0:
        path = path / f"map_index={map_index}"
    return (path / f"attempt={attempt}.log").read_text(errors="replace")


def try_states(place, dag_id: str, run_id: str, task_id: str, map_index: int = -1) -> list[str]:
    """The states of every try of a task instance, first try first."""
    tries = place.api.tries(dag_id, run_id, task_id, map_index)
    return [t["state"] for t in sorted(tries, key=lambda t: t["try_number"])]


def settings(place, dag_id: str, **values: str) -> None:
    """``[dbspark]`` settings of the DAG's task processes from now on (``fault_dags``)."""
    path = place.hooks / "settings" / dag_id
    variables = {f"AIRFLOW__DBSPARK__{k.upper()}": v for k, v in values.items()}
    path.write_text(json.dumps(variables))


def instance(place, dag_id: str, run_id: str, task_id: str) -> dict[str, Any]:
    (found,) = [ti for ti in place.api.task_instances(dag_id, run_id) if ti["task_id"] == task_id]
    return found


# ----------------------------------------------------------------------------- 1. outage
def test_the_catalog_database_stopped_mid_epoch_costs_retries_not_the_run(deployment):
    place, dag_id = deployment, "fault_outage"
    where, circuit = place.dags[dag_id], orders()
    stage = join_stage(circuit)
    key = f"{dag_id}.{stage}@0"
    (place.hooks / "pause" / key).touch()
    land(where, circuit, day(0), ORDER_BATCHES[0])
    run = place.api.trigger(dag_id, logical_date=day(0).end)

    # The join wrote its files and waits to commit: the catalog goes down under it.
    wait_for_file(place.hooks / "paused" / key)
    place.server.halt()
    (place.hooks / "go" / key).touch()
    try:
        # Down until the stage failed twice (its commit, then the retry's first read).
        deadline = time.monotonic() + WAIT
        while True:
            ti = instance(place, dag_id, run.run_id, stage)
            if ti["try_number"] >= 2 and ti["state"] in ("up_for_retry", "failed"):
                break
            assert time.monotonic() < deadline, place.api.explain(dag_id)
            time.sleep(0.2)
    finally:
        place.server.resume()

    (run,) = place.api.wait_for_runs(dag_id, run_ids=[run.run_id], timeout=WAIT, poll=0.5)
    assert run.state == "success", place.api.explain(dag_id, [run])
    tries = place.api.tries(dag_id, run.run_id, stage)
    states = [t["state"] for t in sorted(tries, key=lambda t: t["try_number"])]
    assert states[:2] == ["failed", "failed"] and states[-1] == "success", states
    first = task_log(place, dag_id, run.run_id, stage, 1)
    assert "OperationalError" in first and "connection" in first.lower(), first[-3000:]

    committed_once(where, circuit, 1)
    check_views(where, circuit, ORDER_BATCHES[:1], 0)
    no_orphans(where, circuit)


# ----------------------------------------------------------------------------- 2. GC beside
def test_garbage_collection_beside_a_live_unit_keeps_what_it_writes(deployment):
    """Epoch 1 of the outage case's DAG: its join stage wrote its files, holds its lease
    and has not committed when a garbage collection with no minimum age runs."""
    place, dag_id = deployment, "fault_outage"
    where, circuit = place.dags[dag_id], orders()
    stage = join_stage(circuit)
    catalog = catalog_of(where)
    assert catalog.last_committed_epoch(circuit.name) == 0, "the outage case runs first"
    key = f"{dag_id}.{stage}@1"
    (place.hooks / "pause" / key).touch()
    land(where, circuit, day(1), ORDER_BATCHES[1])
    run = place.api.trigger(dag_id, logical_date=day(1).end)
    try:
        wait_for_file(place.hooks / "paused" / key)
        holders = [lease.holder for lease in catalog.leases(circuit.name)]
        assert any("stage unit of epoch 1 of orders" in h for h in holders), holders
        registered = {b.path for b in catalog.all_batches(circuit.name)}
        base = where.warehouse / circuit.name
        written = {
            p.relative_to(where.warehouse).as_posix() for p in base.glob("*/*/t=1/*")
        } - registered
        assert written, "the paused stage wrote nothing"
        report = garbage_collect(where.warehouse, catalog, circuit=circuit.name, min_age_seconds=0)
        assert written <= set(report.kept), (written, report)
        assert not set(report.unregistered_dirs) & written
        assert all((where.warehouse / p).is_dir() for p in written)
    finally:
        (place.hooks / "go" / key).touch()
        catalog.close()
    (run,) = place.api.wait_for_runs(dag_id, run_ids=[run.run_id], timeout=WAIT, poll=0.5)
    assert run.state == "success", place.api.explain(dag_id, [run])
    assert instance(place, dag_id, run.run_id, stage)["try_number"] == 1
    committed_once(where, circuit, 2)
    for epoch in range(2):
        check_views(where, circuit, ORDER_BATCHES, epoch)
    no_orphans(where, circuit)


# ----------------------------------------------------------------------------- 3. twice
def test_a_unit_run_twice_at_once_commits_once(deployment):
    place, dag_id = deployment, "fault_twice"
    where, circuit = place.dags[dag_id], orders()
    units = ["ingest.orders", join_stage(circuit), "publish"]
    for unit in units:
        (place.hooks / "twice" / f"{dag_id}.{unit}@0").touch()
    land(where, circuit, day(0), ORDER_BATCHES[0])
    run = run_epoch(place, dag_id, day(0))

    for unit in units:
        race = place.hooks / "race" / f"{dag_id}.{unit}@0"
        twin_log = (race / "twin.log").read_text(errors="replace")
        assert (race / "twin.exit").read_text() == "0", twin_log[-3000:]
        results = sorted(json.loads(p.read_text()) for p in race.glob("*.result"))
        if unit == "publish":
            # One publisher at a time (``Catalog.exclusive``): the second waits for the
            # first, then finds the epoch published and commits nothing.
            assert results in ([True], [False, True]), (unit, results, twin_log[-2000:])
            continue
        # Both wrote their files and committed at the same moment: one commit won.
        arrived = sorted(race.glob("*.arrived"))
        assert len(arrived) == 2, (unit, arrived)
        assert results == [False, True], (unit, results, twin_log[-2000:])
    ti = {t["task_id"]: t for t in place.api.task_instances(dag_id, run.run_id)}
    assert {ti[u]["try_number"] for u in units} == {1}, ti

    committed_once(where, circuit, 1)
    check_views(where, circuit, ORDER_BATCHES[:1], 0)
    for view in circuit.views:
        versions = table_versions(table_path(where.outputs, circuit.name, view))
        assert list(versions) == [0], (view, versions)
    no_orphans(where, circuit)


# ----------------------------------------------------------------------------- 4. full disk
def test_a_full_disk_fails_the_task_commits_nothing_and_a_clear_completes(deployment):
    place, dag_id = deployment, "fault_disk"
    where, circuit = place.dags[dag_id], word_count()
    marker = place.hooks / "enospc"
    history = WORD_BATCHES[:2]
    for epoch, (failing, writer) in enumerate(
        [("ingest.words", where.warehouse), ("publish", where.outputs)]
    ):
        marker.write_text(f"{writer}{os.sep}")
        land(where, circuit, day(epoch), history[epoch])
        run = run_epoch(place, dag_id, day(epoch), expect="failed")
        ti = instance(place, dag_id, run.run_id, failing)
        assert (ti["state"], ti["try_number"]) == ("failed", 1), place.api.explain(dag_id, [run])
        assert os.strerror(errno.ENOSPC) in task_log(place, dag_id, run.run_id, failing, 1)

        # Nothing of the epoch is committed: no epoch, and for the ingest no unit at all.
        catalog = catalog_of(where)
        try:
            assert catalog.last_committed_epoch(circuit.name) == epoch - 1
            done = {s for s, t in catalog.stage_runs(circuit.name) if t[0] == epoch}
        finally:
            catalog.close()
        if failing == "ingest.words":
            assert done == set(), done
        else:  # the views' tables and change feeds do not hold the epoch
            for view in circuit.views:
                table = table_path(where.outputs, circuit.name, view)
                assert epoch not in table_versions(table), view
                change = output_dir(where.outputs, circuit.name, view, CHANGES, epoch)
                assert not change.exists(), change

        # The disk is freed; the failed task and those after it are cleared.
        marker.unlink()
        cleared = place.api.clear(dag_id, run.run_id)
        assert failing in cleared, cleared
        (run,) = place.api.wait_for_runs(dag_id, run_ids=[run.run_id], timeout=WAIT, poll=0.5)
        assert run.state == "success", place.api.explain(dag_id, [run])
        check_views(where, circuit, history, epoch)
    committed_once(where, circuit, 2)
    no_orphans(where, circuit)


# ----------------------------------------------------------------------------- 5. DST
def test_a_berlin_schedule_across_the_dst_change_ingests_every_interval_once(deployment):
    place, dag_id = deployment, "fault_dst"
    where, circuit = place.dags[dag_id], word_count()
    midnights = [pendulum.datetime(2026, 3, 27 + n, tz="Europe/Berlin") for n in range(4)]
    intervals = [Interval(midnights[n], midnights[n + 1]) for n in range(3)]
    assert [i.end - i.start for i in intervals] == [timedelta(hours=h) for h in (24, 24, 23)]
    names = [where.landing.partition("words", i).name for i in intervals]
    assert names == [
        "interval=20260326T230000Z",
        "interval=20260327T230000Z",
        "interval=20260328T230000Z",
    ]
    for interval, batch in zip(intervals, WORD_BATCHES, strict=True):
        land(where, circuit, interval, batch)
    place.api.backfill(dag_id, midnights[0], midnights[2])  # logical dates, both inclusive
    runs = place.api.wait_for_runs(dag_id, run_type="backfill", count=3, timeout=WAIT, poll=0.5)
    assert [r.state for r in runs] == ["success"] * 3, place.api.explain(dag_id, runs)
    starts = [datetime.fromisoformat(r.data_interval_start) for r in runs]
    ends = [datetime.fromisoformat(r.data_interval_end) for r in runs]
    assert [Interval(s, e) for s, e in zip(starts, ends, strict=True)] == intervals

    catalog = catalog_of(where)
    try:
        labels = catalog.epoch_labels(circuit.name)
    finally:
        catalog.close()
    assert labels == {epoch: interval.label for epoch, interval in enumerate(intervals)}
    committed_once(where, circuit, 3)
    for epoch in range(3):
        check_views(where, circuit, WORD_BATCHES, epoch)
    no_orphans(where, circuit)


# ----------------------------------------------------------------------------- 6. kills
def test_a_task_killed_at_every_kind_of_task_is_retried_to_the_full_refresh(deployment):
    """One epoch of reachability, whose task processes are killed at nine points. Each
    kill is a SIGKILL (no handler runs, no lease is released); the retries, one second
    apart, complete the run. Garbage collection runs with no minimum age here, so that
    its kill falls between deletions, and so that the maintenance task removes the
    hidden directory of the export killed before its rename."""
    place, dag_id = deployment, "fault_kills"
    where, circuit = place.dags[dag_id], reachability()
    settings(place, dag_id, gc_min_age_hours="0")
    kills = {  # kill marker -> the task it kills
        f"{dag_id}.ingest_edges@0": "ingest.edges",  # wrote its files, not committed
        f"{dag_id}.leave_9@0": "leave_9",  # a root stage (the loop's result), ditto
        f"{dag_id}.loop:reach@0.1": "loop_reach.iterate",  # iteration 1, ditto
        f"{dag_id}.publish@0": "publish",  # the view's delta written, not committed
        f"{dag_id}.changes.tmp@0": "publish",  # its retry: the feed written, not renamed
        f"{dag_id}.export@0": "publish",  # the next: the table holds the epoch
        f"{dag_id}.close@0": "close_epoch",  # before the epoch's commit
        f"{dag_id}.compact@0": "close_epoch",  # its retry: committed, compacting
        f"{dag_id}.gc": "maintain",  # one path deleted of several
    }
    for key in kills:
        (place.hooks / "kill" / key).touch()
    land(where, circuit, day(0), REACH_BATCHES[0])
    run = run_epoch(place, dag_id, day(0))

    killed = {p.name for p in (place.hooks / "killed").glob(f"{dag_id}.*")}
    assert killed == set(kills), (killed, place.api.explain(dag_id, [run]))
    ti = {(t["task_id"], t["map_index"]): t for t in place.api.task_instances(dag_id, run.run_id)}
    expected = {"ingest.edges": 2, "leave_9": 2, "publish": 4, "close_epoch": 3, "maintain": 2}
    for task_id, tries in expected.items():
        states = try_states(place, dag_id, run.run_id, task_id)
        assert states == ["failed"] * (tries - 1) + ["success"], (task_id, states)
        for attempt in range(1, tries):
            log = task_log(place, dag_id, run.run_id, task_id, attempt)
            assert "SIGKILL" in log, (task_id, attempt, log[-2000:])
    # The close's last try found the epoch committed by the one before: it finished the
    # compaction, and the run went on to the maintenance task (whose kill fired).
    log = task_log(place, dag_id, run.run_id, "close_epoch", 3)
    assert "was committed by an earlier try of this task" in log, log[-3000:]
    assert ti[("maintain", -1)]["state"] == "success"
    # The export killed before its rename left its hidden directory; the maintenance
    # task's retry (garbage collection's minimum age, 0 here) removed it.
    log = task_log(place, dag_id, run.run_id, "maintain", 2)
    assert "1 unfinished export directories" in log and ".epoch=0.tmp-" in log, log[-3000:]
    # The iteration task that ran iteration 1 was killed; its retry ran the next
    # pending iteration, or skipped when another slot had carried the loop on.
    retried = [i for (t, i), v in ti.items() if t == "loop_reach.iterate" and v["try_number"] > 1]
    assert len(retried) == 1, ti
    states = try_states(place, dag_id, run.run_id, "loop_reach.iterate", retried[0])
    assert states[0] == "failed" and states[-1] in ("success", "skipped"), states
    log = task_log(place, dag_id, run.run_id, "loop_reach.iterate", 1, retried[0])
    assert "SIGKILL" in log, log[-2000:]
    others = {t for (t, i), v in ti.items() if t not in expected and v["try_number"] > 1}
    assert others <= {"loop_reach.iterate"}, others

    committed_once(where, circuit, 1)
    check_views(where, circuit, REACH_BATCHES, 0)
    (view,) = circuit.views
    assert table_versions(table_path(where.outputs, circuit.name, view)) == {0: 0}
    no_orphans(where, circuit)


# ----------------------------------------------------------------------------- 7. marked
def test_a_failed_task_marked_success_never_commits_the_epoch(deployment):
    place, dag_id = deployment, "fault_marked"
    where, circuit, api = place.dags[dag_id], word_count(), place.api
    stages = [s.name for s in plan(circuit).stages_in_scope(0)]  # the ingest's first
    # Nothing landed for the interval: the ingest fails (its partition is required).
    run = run_epoch(place, dag_id, day(0), expect="failed")
    ingest = instance(place, dag_id, run.run_id, "ingest.words")
    assert (ingest["state"], ingest["try_number"]) == ("failed", 1)
    assert "nothing landed for" in task_log(place, dag_id, run.run_id, "ingest.words", 1)

    def marked_success(task_id: str) -> dict[str, Any]:
        """Mark ``task_id`` success; Airflow runs again the failed tasks after it."""
        (marked,) = api.set_state(dag_id, run.run_id, task_id, "success")
        assert marked["task_id"] == task_id, marked
        (done,) = api.wait_for_runs(dag_id, run_ids=[run.run_id], timeout=WAIT, poll=0.5)
        assert done.state == "failed", api.explain(dag_id, [done])
        return {t["task_id"]: t for t in api.task_instances(dag_id, run.run_id)}

    def log_of(ti: dict[str, Any]) -> str:
        return task_log(place, dag_id, run.run_id, ti["task_id"], ti["try_number"])

    # The ingest marked success: the stage reading it refuses, naming it and its task.
    ti = marked_success("ingest.words")
    assert ti["ingest.words"]["state"] == "success"
    assert ti[stages[1]]["state"] == "failed", ti
    assert ti["close_epoch"]["state"] == "upstream_failed", ti
    log = log_of(ti[stages[1]])
    assert f"stage {stages[1]} of circuit 'word_count' cannot run at epoch 0" in log, log
    assert "have not committed: ingest_words. Their tasks: ingest.words" in log, log

    # The publish marked success too: the close runs, and refuses, naming every unit.
    ti = marked_success("publish")
    assert ti["close_epoch"]["state"] == "failed", ti
    log = log_of(ti["close_epoch"])
    missing = ", ".join([*stages, "publish"])
    assert f"cannot commit: planned units have not committed: {missing}" in log, log
    assert "clear those tasks" in log
    catalog = catalog_of(where)
    try:
        assert catalog.epoch_state(circuit.name, 0) == "open"
        assert catalog.last_committed_epoch(circuit.name) == -1
        assert catalog.stage_runs(circuit.name) == []
    finally:
        catalog.close()
    assert not table_path(where.outputs, circuit.name, "counts").exists()

    # The input lands and every task of the run is cleared: the epoch commits.
    land(where, circuit, day(0), WORD_BATCHES[0])
    api.clear(dag_id, run.run_id, only_failed=False)
    (run,) = api.wait_for_runs(dag_id, run_ids=[run.run_id], timeout=WAIT, poll=0.5)
    assert run.state == "success", api.explain(dag_id, [run])
    committed_once(where, circuit, 1)
    check_views(where, circuit, WORD_BATCHES, 0)
    no_orphans(where, circuit)


# ----------------------------------------------------------------------------- 8. late
def test_a_late_file_and_a_file_rewritten_in_place_are_refused_or_warned_about(deployment):
    """Epoch 1 of the mark-success case's DAG: after epoch 0 committed, a file lands in
    its partition and the file it read is rewritten with other rows."""
    place, dag_id = deployment, "fault_marked"
    where, circuit, api = place.dags[dag_id], word_count(), place.api
    catalog = catalog_of(where)
    try:
        assert catalog.last_committed_epoch(circuit.name) == 0, "the mark-success case runs first"
    finally:
        catalog.close()
    columns = ["word", "__w"]
    (read,) = where.landing.partition("words", day(0)).glob("part-*")
    late = where.landing.land("words", day(0), [("late", 1)], columns, "parquet", name="late")
    rewritten = where.landing.land("words", day(0), [("b", 5)], columns, "parquet", name=read.stem)
    assert rewritten == read
    land(where, circuit, day(1), WORD_BATCHES[1])
    lines = [
        f"{late} arrived after interval {day(0)} was ingested",
        f"{rewritten} was replaced after interval {day(0)} was ingested",
    ]

    # [dbspark] late_files = fail: the ingest refuses, naming both; nothing is written.
    settings(place, dag_id, late_files="fail")
    run = run_epoch(place, dag_id, day(1), expect="failed")
    ingest = instance(place, dag_id, run.run_id, "ingest.words")
    assert (ingest["state"], ingest["try_number"]) == ("failed", 1)
    log = task_log(place, dag_id, run.run_id, "ingest.words", 1)
    assert all(line in log for line in lines), log[-3000:]
    catalog = catalog_of(where)
    try:
        assert catalog.last_committed_epoch(circuit.name) == 0
        assert {s for s, t in catalog.stage_runs(circuit.name) if t[0] == 1} == set()
    finally:
        catalog.close()
    check_views(where, circuit, WORD_BATCHES, 0)

    # The default ('warn'): the cleared ingest warns, naming both, and the run goes on
    # without them: a committed epoch's input does not change.
    settings(place, dag_id)
    assert "ingest.words" in api.clear(dag_id, run.run_id)
    (run,) = api.wait_for_runs(dag_id, run_ids=[run.run_id], timeout=WAIT, poll=0.5)
    assert run.state == "success", api.explain(dag_id, [run])
    log = task_log(place, dag_id, run.run_id, "ingest.words", 2)
    assert "set late_files='fail' to refuse" in log and all(line in log for line in lines), log
    committed_once(where, circuit, 2)
    for epoch in range(2):
        check_views(where, circuit, WORD_BATCHES, epoch)
    assert list(table_versions(table_path(where.outputs, circuit.name, "counts"))) == [0, 1]
    no_orphans(where, circuit)
