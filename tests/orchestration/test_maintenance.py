"""After the close (issue 18): serving tables caught up by their own task from the change
feed (finding 16), storage kept bounded by ``maintain`` (finding 14), exports on disk
before they are visible (finding 5).

The sink tests write a view's change directories and Delta table by hand, as the publish
task does, and need no Spark; the one DAG-run test runs the word count DAG through
``dag.test()`` on the local tier."""

from __future__ import annotations

import os
import random
import string
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pytest
import sqlalchemy as sa

from dbspark.core.columns import WEIGHT
from dbspark.core.types import Schema
from dbspark.core.zset import ZSet
from dbspark.orchestration.intervals import Interval
from dbspark.orchestration.sinks.files import (
    CHANGES,
    _publish_dir,
    exported_epochs,
    output_dir,
    prune_exports,
)
from dbspark.orchestration.sinks.serving import ServingCatchUpError, ServingTarget, catch_up
from dbspark.orchestration.sinks.tables import publish_table, table_path
from dbspark.storage import collection_names as coll
from tests.fsync_recording import recorded_fsyncs

SCHEMA = Schema.of({"k": "bigint", "s": "string"}, what="test")


class Outputs:
    """A view's outputs as the publish task leaves them: a change directory per epoch
    and a Delta table version per epoch."""

    def __init__(self, root: Path, view: str = "v", circuit: str = "c") -> None:
        self.root, self.view, self.circuit = root, view, circuit
        self.history: list[ZSet] = []

    def export(self, change: dict[tuple, int]) -> int:
        epoch = len(self.history)
        before = self.history[-1] if self.history else ZSet()
        self.history.append(before + ZSet(change))
        rows = list(change.items())
        table = pa.table(
            {
                "k": pa.array([r[0] for r, _ in rows], pa.int64()),
                "s": pa.array([r[1] for r, _ in rows], pa.string()),
                WEIGHT: pa.array([w for _, w in rows], pa.int64()),
            }
        )
        import pyarrow.parquet as pq

        def write(tmp: Path) -> dict[str, int]:
            tmp.mkdir()
            pq.write_table(table, tmp / "part-00000.parquet")
            return {"rows": len(rows)}

        final = output_dir(self.root, self.circuit, self.view, CHANGES, epoch)
        _publish_dir(final, write, {"epoch": epoch})
        publish_table(
            table_path(self.root, self.circuit, self.view),
            circuit=self.circuit,
            view=self.view,
            schema=SCHEMA,
            epoch=epoch,
            change=table,
            whole_view=lambda: table,
        )
        return epoch


@pytest.fixture(params=["sqlite", "postgres"])
def serving(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ServingTarget]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'serving.db'}"
    else:
        url = request.getfixturevalue("postgres_url")
    tag = uuid.uuid4().hex[:8]
    target = ServingTarget(url, prefix=f"t{tag}_", epochs_table=f"epochs_{tag}")
    yield target
    target.engine.dispose()


def test_serving_enabled_on_a_view_with_history_loads_it_then_follows_the_feed(
    serving: ServingTarget, tmp_path: Path
) -> None:
    out = Outputs(tmp_path / "published")
    out.export({(1, "a"): 1, (2, "b"): 2})
    out.export({(2, "b"): -1, (3, "c"): 1})
    last = out.export({(1, "a"): -1, (4, None): 3})
    # A fresh table far into the history (the publish task refused this, for good).
    result = catch_up(serving, "c", {"v": SCHEMA}, out.root, last)["v"]
    assert result.initialized and result.epoch == last
    assert ZSet(serving.contents("c", "v", SCHEMA)) == out.history[last]
    # Then epoch after epoch from the change directories.
    out.export({(3, "c"): -1, (5, "e"): 1})
    last = out.export({(5, "e"): 1})
    result = catch_up(serving, "c", {"v": SCHEMA}, out.root, last)["v"]
    assert not result.initialized and result.epoch == last
    assert ZSet(serving.contents("c", "v", SCHEMA)) == out.history[last]
    assert catch_up(serving, "c", {"v": SCHEMA}, out.root, last)["v"].skipped
    # Feeds pruned by retention while the table was behind: loaded from the table again.
    out.export({(6, "f"): 1})
    last = out.export({(6, "f"): -1, (7, "g"): 1})
    assert prune_exports(out.root, "c", "v", [last - 1])
    result = catch_up(serving, "c", {"v": SCHEMA}, out.root, last)["v"]
    assert result.initialized and ZSet(serving.contents("c", "v", SCHEMA)) == out.history[last]


def test_a_failing_serving_table_is_reported_and_the_others_catch_up(
    postgres_url: str, tmp_path: Path
) -> None:
    tag = uuid.uuid4().hex[:8]
    serving = ServingTarget(postgres_url, prefix=f"t{tag}_", epochs_table=f"epochs_{tag}")
    wide, fine = Outputs(tmp_path / "out", "wide"), Outputs(tmp_path / "out", "fine")
    for out in (wide, fine):
        out.export({(1, "a"): 1})
    assert catch_up(serving, "c", {"wide": SCHEMA, "fine": SCHEMA}, wide.root, 0)
    # A string over PostgreSQL's btree limit (~2.7 kB, incompressible) in the indexed view.
    long = "".join(random.Random(1).choices(string.ascii_letters, k=9000))
    wide.export({(2, long): 1})
    fine.export({(2, "b"): 1})
    with pytest.raises(ServingCatchUpError) as failed:
        catch_up(serving, "c", {"wide": SCHEMA, "fine": SCHEMA}, wide.root, 1)
    assert set(failed.value.failures) == {"wide"}
    message = str(failed.value)
    assert f"t{tag}_wide" in message and "view 'wide'" in message
    assert "at epoch 0, catching up to epoch 1" in message and "btree" in message
    assert serving.epoch_of("wide") == 0 and serving.epoch_of("fine") == 1
    assert ZSet(serving.contents("c", "fine", SCHEMA)) == fine.history[1]
    serving.engine.dispose()


def test_an_export_is_fsynced_before_it_is_renamed_into_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced = recorded_fsyncs(monkeypatch)  # each file, in order
    out = Outputs(tmp_path / "published")
    out.export({(1, "a"): 1})
    final = output_dir(out.root, "c", "v", CHANGES, 0)
    # The hidden directory's files and itself, then the folders the rename changed.
    assert any(p.endswith("part-00000.parquet") and "/.epoch=0.tmp-" in p for p in synced)
    assert any(p.endswith("_dbspark.json") and "/.epoch=0.tmp-" in p for p in synced)
    after = synced[[i for i, p in enumerate(synced) if "/.epoch=0.tmp-" in p][-1] + 1 :]
    assert str(final.parent) in after and str(out.root) in after


def test_prune_exports_removes_whole_epochs_marker_first(tmp_path: Path) -> None:
    out = Outputs(tmp_path / "published")
    for n in range(3):
        out.export({(n, "x"): 1})
    removed = prune_exports(out.root, "c", "v", [0, 1, 7])
    assert removed == [output_dir(out.root, "c", "v", CHANGES, e) for e in (0, 1)]
    assert exported_epochs(out.root, "c", "v") == [2]


# ============================================================================ a DAG run
START = datetime(2026, 1, 1, tzinfo=UTC)


def day(n: int) -> Interval:
    return Interval(START + timedelta(days=n), START + timedelta(days=n + 1))


def run(dag, epoch: int, **conf) -> tuple[str, dict[str, str]]:
    dag_run = dag.test(logical_date=day(epoch).end, run_conf=conf or None)
    states = {
        ti.task_id: str(getattr(ti.state, "value", ti.state)) for ti in dag_run.get_task_instances()
    }
    return str(getattr(dag_run.state, "value", dag_run.state)), states


@pytest.mark.slow
def test_serving_failures_never_block_epochs_and_maintain_bounds_storage(
    test_dags, place, spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dbspark.orchestration.airflow.dag import circuit_of
    from dbspark.storage.catalog import Catalog

    monkeypatch.setenv("AIRFLOW__DBSPARK__MAINTAIN_EVERY", "1")
    monkeypatch.setenv("AIRFLOW__DBSPARK__GC_MIN_AGE_HOURS", "0")
    monkeypatch.setenv("AIRFLOW__DBSPARK__CHANGES_RETENTION_HOURS", "0")
    monkeypatch.setenv("AIRFLOW__DBSPARK__INPUT_LOG_RETENTION_HOURS", "0")
    dag, circuit = test_dags["test_word_count"], circuit_of("test_word_count")
    schemas = {v: circuit.node(n).schema for v, n in circuit.views.items()}
    for n, words in enumerate([["a", "b", "a"], ["b", "c"], ["d"]]):
        place.landing.land("words", day(n), [(w,) for w in words], ["word"], "parquet")

    state, tasks = run(dag, 0)
    assert state == "success", tasks
    assert tasks["maintain"] == "success" and tasks["serve"] == "skipped"  # no serving yet

    # Serving enabled on a DAG with history; one view's table is in the way (other columns).
    database = tmp_path / "serving.db"
    monkeypatch.setenv("AIRFLOW_CONN_DBSPARK_SERVING", f"sqlite:///{database}")
    monkeypatch.setenv("AIRFLOW__DBSPARK__SERVING_CONN_ID", "dbspark_serving")
    blocker = sa.create_engine(f"sqlite:///{database}")
    with blocker.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE dbspark_distinct_words (x TEXT)")
    # What a crashed unit and a driver that died leave behind.
    crashed = place.warehouse / "word_count" / "n9.delta" / "delta" / "t=0" / uuid.uuid4().hex
    crashed.mkdir(parents=True)
    (crashed / "part-0.parquet").write_bytes(b"half")
    leftover = place.warehouse / "_units" / "word_count" / "dead.unit.json"
    leftover.parent.mkdir(parents=True, exist_ok=True)
    leftover.write_text("{}")

    state, tasks = run(dag, 1)
    assert tasks["serve"] == "failed" and state == "failed", tasks
    catalog = Catalog.for_warehouse(place.warehouse)
    assert catalog.last_committed_epoch("word_count") == 1  # committed all the same
    target = ServingTarget(f"sqlite:///{database}")
    assert target.epoch_of("counts") == 1  # loaded from the table as of epoch 1
    assert ZSet(target.contents("word_count", "counts", schemas["counts"])) == ZSet(
        {("a", 2): 1, ("b", 2): 1, ("c", 1): 1}
    )
    assert tasks["maintain"] == "success"
    assert not crashed.exists() and not leftover.exists()
    assert exported_epochs(place.outputs, "word_count", "counts") == [1]  # retention

    with blocker.begin() as conn:
        conn.exec_driver_sql("DROP TABLE dbspark_distinct_words")
    state, tasks = run(dag, 2)
    assert state == "success", tasks
    assert catalog.last_committed_epoch("word_count") == 2
    # Input log retention: epochs 0 and 1 merged into one batch at epoch 1, the merged
    # batches' files deleted by the same maintain task's garbage collection.
    log_name = coll.input_log(circuit.sources["words"])
    logs = catalog.batches("word_count", log_name)
    assert [b.time for b in logs] == [(1,), (2,)], logs
    assert catalog.frontier("word_count", log_name) == [(1,)]
    assert sorted(
        p.name for p in (place.warehouse / "word_count" / log_name).glob("*/*/*")
    ) == sorted(Path(b.path).name for b in logs)
    assert target.epoch_of("counts") == target.epoch_of("distinct_words") == 2
    assert ZSet(target.contents("word_count", "distinct_words", schemas["distinct_words"])) == ZSet(
        {(w,): 1 for w in "abcd"}
    )

    # A serving row lost behind dbspark's back: a run for the committed epoch asking to
    # rebuild the view repairs it, in its serve task (the table and feed were right).
    with target.engine.begin() as conn:
        conn.exec_driver_sql("DELETE FROM dbspark_counts WHERE word = 'a'")
    state, tasks = run(dag, 2, rebuild=["counts"])
    assert state == "success", tasks
    assert (tasks["close_epoch"], tasks["rebuild"], tasks["serve"]) == (
        "skipped",
        "success",
        "success",
    )
    assert ZSet(target.contents("word_count", "counts", schemas["counts"])) == ZSet(
        {("a", 2): 1, ("b", 2): 1, ("c", 1): 1, ("d", 1): 1}
    )
    # Without a rebuild, a run for a committed epoch still serves nothing. (The conf
    # says so: dag.test() keeps the last run's params on the DAG object it reuses.)
    state, tasks = run(dag, 2, rebuild=[])
    assert state == "success", tasks
    assert tasks["rebuild"] == tasks["serve"] == "skipped", tasks
    catalog.close()
    blocker.dispose()
    target.engine.dispose()


def _word_count_tasks(tmp_path: Path) -> tuple[Any, Any]:
    """Word count's task bodies, and a deployment whose warehouse is under ``tmp_path``."""
    from dbspark.examples.circuits import word_count
    from dbspark.orchestration.airflow.deployment import Deployment, DeploymentOptions
    from dbspark.orchestration.airflow.tasks import EpochTasks

    tasks = EpochTasks(
        circuit=word_count(),
        sources={},
        options=DeploymentOptions(),
        start_date=START,
        iteration_tasks=1,
    )
    where = tmp_path / "warehouse"
    return tasks, Deployment(where, tmp_path / "out", None, None, None, None, "dbspark_")


def test_a_task_holds_a_lease_while_its_unit_runs(tmp_path: Path) -> None:
    from dbspark.orchestration.units import StageUnit
    from dbspark.storage.catalog import DEFAULT_LEASE_SECONDS, Catalog

    tasks, deployment = _word_count_tasks(tmp_path)
    catalog = Catalog.for_warehouse(deployment.warehouse)
    catalog.register_circuit("word_count", "fp")
    with tasks._lease(deployment, StageUnit(3, 1)):
        (lease,) = catalog.leases("word_count")
        assert lease.holder.startswith("stage unit of epoch 3 of word_count (")
        lasts = (lease.expires_at - lease.started_at).total_seconds()
        assert lasts == pytest.approx(DEFAULT_LEASE_SECONDS)  # no task: the default
    assert catalog.leases("word_count") == []
    catalog.close()


def _retried_tasks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, try_number: int) -> Any:
    """Word count's task bodies in try ``try_number`` of a task, the catalog of their
    warehouse, and the context of a run for ``day(0)`` whose epoch 0 is committed."""
    from dbspark.orchestration.airflow import tasks as tasks_module
    from dbspark.storage.catalog import Catalog

    tasks, deployment = _word_count_tasks(tmp_path)
    tasks._deployment = lambda: deployment  # type: ignore[method-assign]
    ti = SimpleNamespace(dag_id="d", run_id="r", task_id="t", map_index=-1, try_number=try_number)
    monkeypatch.setattr(tasks_module, "_task_instance", lambda: ti)
    catalog = Catalog.for_warehouse(deployment.warehouse)
    catalog.register_circuit("word_count", "fp")
    catalog.open_epoch("word_count", 0, day(0).label)
    catalog.commit_epoch("word_count", 0)
    context = {
        "data_interval_start": day(0).start,
        "data_interval_end": day(0).end,
        "ti": ti,
        "params": {},
    }
    return tasks, catalog, context


def test_a_retry_with_nothing_left_to_do_ends_the_leases_of_its_killed_tries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Try 1 was killed holding its lease; try 2 finds its work done (an iteration that
    another task ran, an epoch committed) and skips, taking no lease: it ends try 1's,
    which would otherwise hold back garbage collection until it expired."""
    from airflow.sdk.exceptions import AirflowSkipException

    tasks, catalog, context = _retried_tasks(tmp_path, monkeypatch, try_number=2)
    catalog.acquire_lease("word_count", "task d/r/t[-1] try 1: stage unit (pid 1)", 3600)
    other = catalog.acquire_lease("word_count", "task d/r/u[-1] try 1: stage unit (pid 2)", 3600)
    with pytest.raises(AirflowSkipException, match="already committed"):
        tasks.stage(1, context)
    assert [lease.id for lease in catalog.leases("word_count")] == [other]
    catalog.close()


def test_a_close_retried_after_its_commit_finishes_and_goes_on_to_maintenance(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Try 1 of close_epoch committed the epoch and was killed while compacting: try 2
    runs the close unit again (its commit a no-op, its compaction finished) and branches
    to the tasks after the close, as try 1 would have, instead of skipping them. The
    close of an epoch with later epochs committed (a cleared old run) still skips."""
    from airflow.sdk.exceptions import AirflowSkipException

    from dbspark.orchestration.units import CloseUnit

    tasks, catalog, context = _retried_tasks(tmp_path, monkeypatch, try_number=2)
    ran = []
    tasks._execute = lambda deployment, unit: ran.append(unit) or {}  # type: ignore[method-assign]
    assert tasks.close_epoch(context) == 0
    assert ran == [CloseUnit(0)]
    assert tasks.after_close(context, 0) == ["maintain"]  # epoch 0: maintenance is due

    catalog.open_epoch("word_count", 1, day(1).label)
    catalog.commit_epoch("word_count", 1)
    with pytest.raises(AirflowSkipException, match="already committed"):
        tasks.close_epoch(context)
    assert ran == [CloseUnit(0)]
    catalog.close()


def test_a_table_version_is_fsynced_before_publish_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What each commit wrote: its log entry, its data and change files, and the folders
    up to the table's (the first one: up to the outputs' circuit folder)."""
    synced = recorded_fsyncs(monkeypatch)  # each file, visibly
    out = Outputs(tmp_path / "published")
    table = table_path(out.root, "c", "v")
    out.export({(1, "a"): 1, (2, "b"): 1})
    log = table / "_delta_log"
    assert str(log / f"{0:020d}.json") in synced
    assert {str(p) for p in table.glob("*.parquet")} <= set(synced)
    assert {str(table), str(log), str(table.parent), str(table.parent.parent)} <= set(synced)
    synced.clear()
    out.export({(1, "a"): -1, (3, "c"): 1})  # a merge: data and change data files
    assert str(log / f"{1:020d}.json") in synced
    added = [p for p in synced if p.endswith(".parquet") and p.startswith(str(table))]
    assert added and all(Path(p).exists() for p in added)
    assert any("_change_data" in p for p in added)
    assert str(table) in synced


def test_a_large_change_is_counted_and_served_a_chunk_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 18, finding 15: neither the export's counts nor a serving table's catch-up
    holds a whole change in memory."""
    from dbspark.orchestration.sinks import files
    from dbspark.orchestration.sinks import serving as serving_module

    monkeypatch.setattr(files, "CHUNK_ROWS", 10)
    monkeypatch.setattr(serving_module, "CHUNK_ROWS", 10)
    out = Outputs(tmp_path / "published")
    out.export({(k, "x"): 1 for k in range(5)})
    out.export({**{(k, "x"): -1 for k in range(3)}, **{(k, "y"): 2 for k in range(22)}})
    feed = output_dir(out.root, "c", "v", CHANGES, 1)
    assert files.weight_sums(feed) == (44, 3)
    chunks = [len(chunk) for chunk in files.iter_change_rows(feed, SCHEMA)]
    assert chunks == [10, 10, 5]

    applied: list[int] = []
    real = serving_module._apply_rows

    def counted(conn, table, schema, chunk, what, before):  # type: ignore[no-untyped-def]
        applied.append(len(chunk))
        return real(conn, table, schema, chunk, what, before)

    monkeypatch.setattr(serving_module, "_apply_rows", counted)
    target = ServingTarget(f"sqlite:///{tmp_path / 'serving.db'}")
    catch_up(target, "c", {"v": SCHEMA}, out.root, 0)  # loaded whole from the table
    catch_up(target, "c", {"v": SCHEMA}, out.root, 1)  # epoch 1 from its change feed
    assert applied == [10, 10, 5]
    assert ZSet(target.contents("c", "v", SCHEMA)) == out.history[1]
    target.engine.dispose()


# ============================================================================ killed exports
def _killed_export(final: Path) -> Path:
    """What ``_publish_dir`` leaves when its process is SIGKILLed (its ``finally`` does
    not run) after writing a file into its hidden directory: that directory."""
    import signal

    def write(tmp: Path) -> dict[str, int]:
        tmp.mkdir()
        (tmp / "part-00000.parquet").write_bytes(b"half")
        os.kill(os.getpid(), signal.SIGKILL)
        raise AssertionError("not reached")

    pid = os.fork()
    if pid == 0:  # the exporting process, killed mid-write
        try:
            _publish_dir(final, write, {"epoch": 0})
        finally:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status), status
    (left,) = [p for p in final.parent.iterdir() if p.name.startswith(f".{final.name}.tmp-")]
    return left


def _age(path: Path, seconds: float) -> Path:
    """Date ``path`` and everything under it ``seconds`` back (in the future if < 0)."""
    import time

    when = time.time() - seconds
    for entry in [path, *path.rglob("*")]:
        os.utime(entry, (when, when), follow_symlinks=False)
    return path


def test_killed_exports_hidden_directories_are_swept_once_older_than_the_min_age(
    tmp_path: Path,
) -> None:
    """Issue 18: a SIGKILLed export leaves ``.epoch=<n>.tmp-<id>`` (or a ``.stale-<id>``)
    in its view's snapshot, changes or corrections folder. The sweep removes those older
    than the minimum age and nothing else: not complete exports, not a young one (an
    export in flight), not one with a recent file inside (a long write going on), not
    one dated in the future (clock skew), not other hidden files."""
    from dbspark.orchestration.sinks.files import (
        CORRECTIONS,
        SNAPSHOT,
        corrections_dir,
        read_marker,
        sweep_unfinished_exports,
    )

    hours = 3600.0
    out = Outputs(tmp_path / "published")
    for n in range(2):
        out.export({(n, "x"): 1})
    changes = output_dir(out.root, "c", "v", CHANGES, 2).parent
    old = [
        _age(_killed_export(output_dir(out.root, "c", "v", CHANGES, 2)), 7 * hours),
        _age(_killed_export(output_dir(out.root, "c", "v", SNAPSHOT, 1)), 7 * hours),
        _age(_killed_export(corrections_dir(out.root, "c", "v") / "rebuild=1"), 7 * hours),
    ]
    # Moved aside (a marker-less directory in the way) and not yet deleted.
    for stale in (changes / ".epoch=0.stale-0123456789ab", old[2].parent / ".rebuild=1.stale-ab"):
        stale.mkdir()
        (stale / "part-0.parquet").write_bytes(b"old")
        old.append(_age(stale, 7 * hours))
    fresh = _killed_export(output_dir(out.root, "c", "v", CHANGES, 3))  # just written
    writing = _age(_killed_export(output_dir(out.root, "c", "v", CHANGES, 4)), 7 * hours)
    (writing / "part-00001.parquet").write_bytes(b"new")  # a file written just now
    skewed = _age(_killed_export(output_dir(out.root, "c", "v", CHANGES, 5)), -2 * hours)
    other = changes / ".keep"  # not dbspark's
    other.mkdir()
    _age(other, 7 * hours)
    complete = _age(output_dir(out.root, "c", "v", CHANGES, 0), 7 * hours)
    elsewhere = _age(_killed_export(output_dir(out.root, "c", "w", CHANGES, 0)), 7 * hours)
    kept = [fresh, writing, skewed, other, complete, elsewhere]

    removed = sweep_unfinished_exports(out.root, "c", ["v"], min_age_seconds=6 * hours)
    assert sorted(removed) == sorted(old)
    assert not any(p.exists() for p in old)
    assert all(p.exists() for p in kept)
    assert exported_epochs(out.root, "c", "v") == [0, 1]
    assert read_marker(complete) is not None
    assert {p.name for p in out.root.glob(f"c/v/{CORRECTIONS}/*")} == set()
    # Once old enough (here: no minimum age), the young and the skewed go too.
    again = sweep_unfinished_exports(out.root, "c", ["v", "w"], min_age_seconds=0)
    assert sorted(again) == sorted([fresh, writing, elsewhere])  # skewed: in the future
    assert skewed.exists() and other.exists()


def test_maintain_sweeps_killed_exports_older_than_gc_min_age(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The maintenance task removes a killed export's hidden directory as old as garbage
    collection's minimum age (``gc_min_age_hours``, default 6 h) and keeps a young one,
    and says how many it removed."""
    monkeypatch.delenv("AIRFLOW__DBSPARK__GC_MIN_AGE_HOURS", raising=False)
    tasks, catalog, context = _retried_tasks(tmp_path, monkeypatch, try_number=1)
    outputs = tmp_path / "out"
    old = _age(_killed_export(output_dir(outputs, "word_count", "counts", CHANGES, 0)), 7 * 3600)
    young = _age(
        _killed_export(output_dir(outputs, "word_count", "distinct_words", CHANGES, 0)), 5 * 3600
    )
    result = tasks.maintain(context)
    assert result["unfinished_exports_removed"] == 1, result
    assert not old.exists() and young.exists()
    catalog.close()
