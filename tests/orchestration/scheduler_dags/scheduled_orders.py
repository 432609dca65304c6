"""Airflow DAG for ``test_scheduler.py``: the orders circuit run by a real scheduler.

Differences from ``dags/orders_by_region.py``, all for the test:

- one retry after one second, so a killed task is retried at once;
- ``catchup=False`` and an ``end_date`` in the past: the scheduler creates no run of
  its own (``catchup=True`` would start one run per day since the start date); runs
  come only from ``airflow backfill create`` and from triggering, and a manual run's
  logical date may be at most the end date;
- a fault-injection hook (below) that kills the task process mid-stage.

The hook: with ``DBSPARK_TEST_KILL_DIR`` set, ``Catalog.commit`` of stage ``S`` at
epoch ``E`` first looks for the marker file ``<dir>/S@E``; if it is there, it deletes
it and SIGKILLs its own process, after the stage wrote its files and before the commit,
like a worker lost to the OOM killer. Deleting first makes it fire once: the retry
commits. It lives only here, in the test's DAG file, which every task process parses.
"""

from __future__ import annotations

import os
import signal
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from dbspark.examples.circuits import orders
from dbspark.orchestration import LandingDirectory, build_dag
from dbspark.storage.catalog import Catalog

DAG_ID = "scheduled_orders"
START = datetime(2026, 1, 1, tzinfo=UTC)
#: Intervals the test runs: three by backfill, the fourth and fifth triggered by hand.
INTERVALS = 5
KILL_DIR = "DBSPARK_TEST_KILL_DIR"


def _install_kill_switch() -> None:
    directory = os.environ.get(KILL_DIR)
    if not directory or getattr(Catalog.commit, "kill_switch", False):
        return
    commit = Catalog.commit

    def commit_or_die(
        self: Catalog, circuit: str, stage: str, time: Any, *args: Any, **kw: Any
    ) -> bool:
        marker = Path(directory) / f"{stage}@{next(iter(time))}"
        try:
            marker.unlink()  # test-and-clear in one step: only one attempt dies
        except FileNotFoundError:
            return commit(self, circuit, stage, time, *args, **kw)
        os.kill(os.getpid(), signal.SIGKILL)
        raise AssertionError("unreachable")

    commit_or_die.kill_switch = True  # type: ignore[attr-defined]
    Catalog.commit = commit_or_die  # type: ignore[method-assign]


_install_kill_switch()

landing = LandingDirectory()  # [dbspark] landing, from the deployment's environment

dag = build_dag(
    orders,
    dag_id=DAG_ID,
    schedule="@daily",
    start_date=START,
    end_date=START + timedelta(days=INTERVALS),
    catchup=False,
    sources={"customers": landing, "orders": landing},
    retries=1,
    retry_delay=timedelta(seconds=1),
)
