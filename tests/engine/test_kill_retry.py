"""Kill-and-retry at the engine level, with real process deaths.

A subprocess (``kill_retry_child.py``, its own JVM) runs a vector's epochs with
SparkEngine on a warehouse and dies with ``os._exit(137)`` just before or just after
the K-th catalog commit of a chosen kind of unit (wrapped by the harness in the child
only). Then, in this process, ``garbage_collect`` removes the dead unit's unregistered
files, and a fresh SparkEngine on the same warehouse reruns every epoch: committed units
are skipped, the rest recomputed. Oracles: the vector's expected output after every
epoch the retry runs, and full refresh (``verify``) at the end.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from vectors import VECTOR_DIR

from dbspark.conformance.runner import zset_to_rows
from dbspark.conformance.vector import parse_vector
from dbspark.storage.catalog import garbage_collect

CHILD = Path(__file__).with_name("kill_retry_child.py")

pytestmark = pytest.mark.slow


def batch_dirs(warehouse: Path, circuit: str) -> set[str]:
    base = warehouse / circuit
    return {p.relative_to(warehouse).as_posix() for p in base.glob("*/*/t=*/*") if p.is_dir()}


def run_child(
    vector: str, warehouse: Path, prefix: str, k: int, when: str, epochs: int, at: int
) -> dict:
    started = time.monotonic()
    args = [str(VECTOR_DIR / vector), str(warehouse), prefix, str(k), when, str(epochs), str(at)]
    done = subprocess.run(
        [sys.executable, str(CHILD), *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert done.returncode == 137, (
        f"the child should have died at commit {k} of {prefix!r} (exit {done.returncode}):\n"
        f"{done.stderr[-3000:]}"
    )
    killed = json.loads((warehouse / "killed.json").read_text())
    killed["seconds"] = round(time.monotonic() - started, 1)
    return killed


# (vector, epochs run, stage prefix, K, before/after the commit, epoch whose commits count)
KILLS = [
    # the 3rd loop iteration of epoch 0 dies before committing: a kill inside an iteration
    ("reachability_shortcut.json", 2, "loop:", 3, "before", 0),
    # the 2nd loop iteration of epoch 1 dies right after committing
    ("reachability_shortcut.json", 2, "loop:", 2, "after", 1),
    # the orders ingest of epoch 2 dies before committing (customers already ingested)
    ("watermarks_and_tombstones.json", 3, "ingest_orders", 1, "before", 2),
    # publish of epoch 1 committed, the epoch itself not yet
    ("watermarks_and_tombstones.json", 3, "publish", 1, "after", 1),
    # publish of epoch 1 committed in run_epoch's commit group, which was never flushed:
    # none of epoch 1's units reached the disk
    ("watermarks_and_tombstones.json", 3, "publish", 1, "grouped", 1),
]


@pytest.mark.parametrize(
    ("vector_name", "epochs", "prefix", "k", "when", "at"),
    KILLS,
    ids=[f"{v.split('.')[0]}-{p.rstrip(':_')}-{k}-{w}-e{a}" for v, _, p, k, w, a in KILLS],
)
def test_a_killed_unit_retried_gives_the_same_committed_result(
    spark,
    warehouse_path: Path,
    vector_name: str,
    epochs: int,
    prefix: str,
    k: int,
    when: str,
    at: int,
) -> None:
    from dbspark.engine.spark.executor import SparkEngine

    text = (VECTOR_DIR / vector_name).read_text()
    vector = parse_vector(text)
    expected = json.loads(text)["expected"][:epochs]
    vector.epochs = vector.epochs[:epochs]
    name = vector.circuit.name

    killed = run_child(vector_name, warehouse_path, prefix, k, when, epochs, at)
    assert killed["stage"].startswith(prefix) and killed["time"][0] == at
    dead_epoch = killed["time"][0]

    engine = SparkEngine(vector.circuit, warehouse_path, spark=spark)
    committed = engine.last_committed_epoch()
    assert committed < len(vector.epochs) - 1 or killed["stage"].startswith("compact:")
    runs_before = set(engine.catalog.stage_runs(name))
    # Readers see the last committed epoch, never a published but uncommitted one.
    if committed >= 0:
        assert {v: zset_to_rows(z) for v, z in engine.views().items()} == expected[committed]
    dead_unit = (killed["stage"], tuple(killed["time"]))
    # The dead unit's run row exists exactly when it died after its commit was flushed.
    assert (dead_unit in runs_before) == (when == "after")
    if when == "grouped":
        assert not [r for r in runs_before if r[1][0] == dead_epoch], "the group was lost"

    # Garbage collection removes only unregistered directories (the dead unit's files),
    # and never a registered batch.
    registered = {b.path for b in engine.catalog.all_batches(name)}
    on_disk = batch_dirs(warehouse_path, name)
    report = garbage_collect(engine.warehouse, engine.catalog, circuit=name, min_age_seconds=0)
    assert set(report.unregistered_dirs) == on_disk - registered
    if when == "before" and not killed["stage"].startswith("compact:"):
        assert report.unregistered_dirs, "the dead unit wrote files before its commit"
    # (superseded batches are purged too, so compare with what is registered now)
    assert batch_dirs(warehouse_path, name) == {b.path for b in engine.catalog.all_batches(name)}

    # The retry: committed units are skipped, the rest recomputed.
    for epoch, inputs in enumerate(vector.epochs):
        report_epoch = engine.run_epoch(epoch, inputs)
        assert report_epoch.skipped == (epoch <= committed)
        if epoch > committed:
            assert {v: zset_to_rows(z) for v, z in engine.views().items()} == expected[epoch], epoch
        if epoch == dead_epoch and epoch > committed:
            skipped = {u.unit for u in report_epoch.units if u.skipped}
            if when == "after" and not killed["stage"].startswith(("loop:", "compact:")):
                assert killed["stage"] in skipped
    assert engine.last_committed_epoch() == len(vector.epochs) - 1
    assert all(not diff for diff in engine.verify().values())
    # Nothing the retry committed is missing, nothing left unregistered.
    registered = {b.path for b in engine.catalog.all_batches(name)}
    assert all((warehouse_path / p).is_dir() for p in registered)
    print(f"child ran {killed['seconds']}s and died at {killed}")
