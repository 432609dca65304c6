"""The README's main command: the example DAGs run by Airflow, verified per epoch."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _demo(home: Path, *args: str) -> subprocess.CompletedProcess:
    # A process of its own: Airflow's home is fixed per process, and this one's is the tests'.
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env["PYSPARK_PYTHON"] = sys.executable
    return subprocess.run(
        [sys.executable, "-m", "dbspark.devtools.demo", "--home", str(home), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=1200,
    )


@pytest.mark.slow
def test_the_main_command_runs_the_example_dags_through_airflow_and_verifies(tmp_path):
    home = tmp_path / "airflow"
    first = _demo(home, "--epochs", "2")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    out = first.stdout
    for dag_id in (
        "dbspark_orders_by_region",
        "dbspark_reachability",
        "dbspark_orders_sql",
        "dbspark_reachable_sql",
    ):
        assert f"DAG {dag_id}" in out
    assert out.count("DAG run manual__") == 8
    assert out.count(": success") == 8
    assert out.count("verified: every view equals the full refresh") == 8
    assert "loop reach: " in out and "stopped because converged" in out
    assert "loop reachable_r: " in out  # the recursive CTE of dags/sql/reachable.sql
    assert "Spark full refresh over the warehouse's input log agrees" in out
    assert "all epochs verified" in out
    assert (home / "airflow.db").exists()
    # The runs carry their real start and end (dag.test() starts them at the logical date).
    with sqlite3.connect(home / "airflow.db") as db:
        spans = db.execute(
            "SELECT julianday(end_date) - julianday(start_date) FROM dag_run"
        ).fetchall()
    assert len(spans) == 8 and all(0 < days * 86400 < 600 for (days,) in spans), spans

    # Again, one more epoch: the two committed epochs are not run again.
    again = _demo(home, "--epochs", "3", "--dag", "dbspark_orders_by_region")
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert again.stdout.count("already committed in the warehouse") == 2
    assert again.stdout.count("DAG run manual__") == 1
    assert "all epochs verified" in again.stdout
