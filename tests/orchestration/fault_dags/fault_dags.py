"""Airflow DAGs for ``test_faults.py``: example circuits run by a real scheduler while
the test injects faults. Every DAG has a warehouse, outputs, landing directory and
catalog database (the connection ``<dag_id>_catalog``) of its own, so the cases do not
share state; the test sets the connections and ``DBSPARK_FAULT_ROOT``.

The faults are installed here, at parse time, in every task process (never in the
scheduler's sense of a mock: the tasks run dbspark's own code; the hooks only stop it at
a point, or make a system call fail). Each is armed by a marker file under
``<root>/hooks`` and keyed by the catalog database's name (one per DAG), the stage the
catalog commits and the epoch:

- ``pause/<db>.<stage>@<epoch>``: ``Catalog.commit`` of that stage, after the unit wrote
  its files and before the commit, creates ``paused/<key>`` and waits until
  ``go/<key>`` exists. The test meanwhile stops the catalog database, or runs garbage
  collection beside the unit.
- ``twice/<db>.<unit>@<epoch>`` (``<unit>``: ``ingest.<source>``, a stage's name,
  ``publish``): the task runs its unit, and a second process runs the same unit at the
  same time, through the unit-file path a worker or a spark-submit driver takes
  (``units.run_unit_file``), as a queue's redelivery of the task would. Both wait for
  each other at their first catalog commit (``race/<key>/``) and commit at once; each
  writes what its commit returned there.
- ``enospc``: while it exists, every Parquet file pyarrow writes under a path holding
  the marker's text fails with ``OSError(ENOSPC)`` after writing part of the file, as
  a full disk does.
- ``kill/<key>``: the task process SIGKILLs itself at that point, once (test-and-clear;
  ``killed/<key>`` then holds its pid), as the OOM killer or a lost host stops it:
  ``<db>.<stage>@<time>`` in ``Catalog.commit`` of that stage (or loop iteration:
  ``loop:<name>@<epoch>.<iteration>``) after the unit wrote its files;
  ``<db>.compact@<epoch>`` at the epoch's first compaction commit (after its close);
  ``<db>.close@<epoch>`` before ``Catalog.commit_epoch``; ``<dag>.export@<epoch>`` after
  a view's Delta table committed the epoch (``publish_table``);
  ``<dag>.<kind>.tmp@<n>`` (``<kind>``: ``changes``, ``snapshot``, ``corrections``) after
  an export wrote its hidden directory (``.epoch=<n>.tmp-<id>``) and before it renames
  it into place (``files._publish_dir``); ``<dag>.gc`` after garbage collection deleted
  its first path.
- ``settings/<dag>`` (JSON: variable -> value): set in the environment of that DAG's task
  processes, as ``airflow.cfg`` would set ``[dbspark]`` keys (``late_files``,
  ``gc_min_age_hours``); a variable no longer listed is unset again.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import fault_hooks  # noqa: F401  (installs the hooks in this process)
import pendulum

from dbspark.examples.circuits import orders, reachability, word_count
from dbspark.orchestration import LandingDirectory, build_dag

ROOT = Path(os.environ.get("DBSPARK_FAULT_ROOT", "/nonexistent/dbspark-faults"))
START = datetime(2026, 1, 1, tzinfo=UTC)


def _fault_dag(dag_id: str, circuit: Any, sources: list[str], retries: int, **options: Any) -> Any:
    """A DAG of ``circuit`` with a warehouse, outputs, catalog connection and landing
    directory of its own (every source lands there), daily from ``START`` for three
    days unless ``options`` say otherwise."""
    landing = LandingDirectory(ROOT / dag_id / "landing")
    schedule = {
        "schedule": "@daily",
        "start_date": START,
        "end_date": START + timedelta(days=3),
        **options,
    }
    return build_dag(
        circuit,
        dag_id=dag_id,
        warehouse=str(ROOT / dag_id / "warehouse"),
        outputs=str(ROOT / dag_id / "published"),
        catalog_conn_id=f"{dag_id}_catalog",
        catchup=False,
        sources=dict.fromkeys(sources, landing),
        retries=retries,
        **({"retry_delay": timedelta(seconds=1)} if retries else {}),
        **schedule,
    )


# The catalog database stopped mid-epoch: retries one second apart, doubling, five times.
outage_dag = _fault_dag("fault_outage", orders, ["customers", "orders"], retries=5)

# Units run twice at once.
twice_dag = _fault_dag("fault_twice", orders, ["customers", "orders"], retries=1)

# A full disk: no retries, so the failure stays until the test frees the disk and
# clears the task, as a person would.
disk_dag = _fault_dag("fault_disk", word_count, ["words"], retries=0)

# Midnight to midnight in Berlin, which changes to summer time on 29 March 2026.
dst_dag = _fault_dag(
    "fault_dst",
    word_count,
    ["words"],
    retries=1,
    schedule="0 0 * * *",
    start_date=pendulum.datetime(2026, 3, 27, tz="Europe/Berlin"),
    end_date=pendulum.datetime(2026, 3, 31, tz="Europe/Berlin"),
)

# Task processes killed (SIGKILL) at every kind of task, retried: a recursive circuit, so
# that an iteration (a mapped task) is killed too; three iteration tasks, the last
# carrying on inline. Three retries: publish is killed three times, close twice.
kills_dag = _fault_dag(
    "fault_kills", reachability, ["edges", "roots"], retries=3, iteration_tasks=3
)

# Tasks marked success by hand, then late and rewritten files: no retries, so a failure
# stays until the test fixes the input and clears the tasks, as a person would.
marked_dag = _fault_dag("fault_marked", word_count, ["words"], retries=0)
