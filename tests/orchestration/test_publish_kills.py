"""A publish killed (SIGKILL) between the views' table commits and the catalog's epoch
commit, then retried as Airflow retries the task: the epoch's change is in every table
exactly once, and the catalog commits the epoch.

Each epoch runs in a child process, as an Airflow task does: the orders circuit's units
on the local tier (no JVM), then ``PublishUnit`` and ``CloseUnit``. The child kills
itself at one point, chosen by wrapping the function that ends just before it:

- ``after_changes``: the first view's change directory is written, no table commit;
- ``after_table``: the first view's table holds the epoch, the other views' do not;
- ``before_close``: every table holds the epoch, the catalog does not.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from deltalake import DeltaTable

from dbspark.core.zset import ZSet
from dbspark.engine.reference.full_refresh import full_refresh
from dbspark.examples.circuits import orders
from dbspark.orchestration.sinks.files import CHANGES, output_dir, read_change_rows
from dbspark.orchestration.sinks.tables import EPOCH_KEY, table_epoch, table_path, table_rows
from dbspark.storage.catalog import Catalog

pytestmark = pytest.mark.slow

BATCHES = [
    {
        "customers": [(1, "EU", 1, False), (2, "US", 1, False), (3, "EU", 1, False)],
        "orders": [(10, 1, 5, 1, None), (11, 2, 7, 1, None), (12, 3, 4, 1, None)],
    },
    {  # customer 1 moves to US; order 11 is deleted (tombstone); a new order
        "customers": [(1, "US", 2, False)],
        "orders": [(11, 2, 7, 2, 2), (13, 1, 9, 2, None)],
    },
]

CHILD = r"""
import json, os, signal, sys

from dbspark.engine.spark.executor import SparkEngine
from dbspark.examples.circuits import orders
from dbspark.orchestration import units
from dbspark.orchestration.sinks import export

warehouse, outputs, epoch, kill = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
batch = {name: [tuple(row) for row in rows] for name, rows in json.loads(sys.argv[5]).items()}


def kill_after(owner, name, point):
    real = getattr(owner, name)

    def wrapper(*args, **kwargs):
        result = real(*args, **kwargs)
        if kill == point:
            os.kill(os.getpid(), signal.SIGKILL)
        return result

    setattr(owner, name, wrapper)


kill_after(export, "export_changes", "after_changes")
kill_after(export, "publish_table", "after_table")
kill_after(units.PublishUnit, "run", "before_close")


def no_spark():
    raise RuntimeError("this small epoch should not need Spark")


engine = SparkEngine(orders(), warehouse, spark=no_spark)
if engine.open_epoch(epoch):
    checked = {name: engine.check_batch(name, rows) for name, rows in batch.items()}
    for stage in engine.plan.stages_in_scope(0):
        anchor = engine.circuit.node(stage.anchor)
        if anchor.op in ("zset_source", "upsert_source"):
            engine.ingest(anchor.label, epoch, checked.get(anchor.label))
        else:
            engine.run_stage(stage.id, (epoch,))
    units.PublishUnit(epoch, outputs).run(engine)
    units.CloseUnit(epoch).run(engine)
print("epoch done")
"""


def run_epoch(place: Path, epoch: int, kill: str = "none") -> subprocess.CompletedProcess:
    batch = json.dumps(BATCHES[epoch])
    command = [sys.executable, "-c", CHILD, str(place / "wh"), str(place / "out")]
    return subprocess.run(
        [*command, str(epoch), kill, batch], capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="module")
def after_epoch_0(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A warehouse and outputs with epoch 0 committed, copied by each test."""
    place = tmp_path_factory.mktemp("epoch0")
    done = run_epoch(place, 0)
    assert done.returncode == 0, done.stderr[-3000:]
    return place


def epoch_commits(path: Path, epoch: int) -> int:
    """How many commits of the table's log carry ``epoch``."""
    return sum(1 for c in DeltaTable(str(path)).history() if c.get(EPOCH_KEY) == epoch)


@pytest.mark.parametrize("point", ["after_changes", "after_table", "before_close"])
def test_a_publish_killed_before_the_catalog_commit_publishes_its_epoch_once_on_retry(
    after_epoch_0: Path, tmp_path: Path, point: str
) -> None:
    place = tmp_path / "place"
    shutil.copytree(after_epoch_0, place)
    circuit = orders()
    views = list(circuit.views)
    first = table_path(place / "out", "orders", views[0])

    killed = run_epoch(place, 1, kill=point)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    catalog = Catalog.for_warehouse(place / "wh")
    assert catalog.last_committed_epoch("orders") == 0
    # Where the kill left the tables: the window each point stands for.
    held = {
        view: table_epoch(table_path(place / "out", "orders", view), "orders", view)
        for view in views
    }
    if point == "after_changes":
        assert set(held.values()) == {0}
    elif point == "after_table":
        assert held[views[0]] == 1 and set(held[v] for v in views[1:]) == {0}
    else:
        assert set(held.values()) == {1}

    retried = run_epoch(place, 1)
    assert retried.returncode == 0, retried.stderr[-3000:]
    assert catalog.last_committed_epoch("orders") == 1
    catalog.close()
    expected = [full_refresh(circuit, BATCHES[: epoch + 1], epoch) for epoch in (0, 1)]
    for view in views:
        schema = circuit.node(circuit.views[view]).schema
        path = table_path(place / "out", "orders", view)
        assert epoch_commits(path, 1) == 1, view  # neither duplicated nor lost
        for epoch in (0, 1):
            assert ZSet(table_rows(path, schema, epoch)) == expected[epoch][view], (view, epoch)
        change = ZSet(
            read_change_rows(output_dir(place / "out", "orders", view, CHANGES, 1), schema)
        )
        assert change == expected[1][view] - expected[0][view], view
    assert epoch_commits(first, 0) == 1
