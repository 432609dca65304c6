"""``bin/bench --quick``: every workload at its smallest size, through the real command.

It runs as a child process, as a user runs it (its own Spark session and Connect
server), and must exit 0 with every answer checked and equal: each incremental epoch
against a full refresh of the same snapshot, the warm batch (the views' queries over the
current tables, W1 and W3) against the maintained views, and Spark Declarative
Pipelines' views against dbspark's. The numbers themselves are not asserted (speed is never a test).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def test_quick_mode_checks_every_workload(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    env = dict(os.environ)
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--out", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    results = json.loads((out / "results.json").read_text())
    assert results["failures"] == []
    measured = {(m["workload"], m["variant"]) for m in results["measurements"]}
    for workload in ("W1", "W2", "W3"):
        assert (workload, "incremental") in measured
        assert (workload, "full_refresh") in measured
        checks = [
            m["ok"]
            for m in results["measurements"]
            if m["workload"] == workload and m["ok"] is not None
        ]
        assert checks and all(checks), workload
    for workload in ("W1", "W3"):
        batches = [
            m
            for m in results["measurements"]
            if m["workload"] == workload and m["variant"] == "warm_batch"
        ]
        assert batches and all(m["ok"] for m in batches), workload
        assert all(len(m["params"]["runs_s"]) == 3 for m in batches), workload
        assert results["summary"][workload]["headline_B"] is not None, workload
        sdp = [
            m
            for m in results["measurements"]
            if m["workload"] == workload and m["variant"] == "sdp"
        ]
        assert sdp and all(m["ok"] for m in sdp), workload
    # W1 measures each size as a warm-up epoch and then the compared one (quick: one).
    w1_epochs = [
        m
        for m in results["measurements"]
        if m["workload"] == "W1" and m["variant"] == "incremental"
    ]
    assert w1_epochs and all(len(m["params"]["runs_s"]) == 2 for m in w1_epochs)
    # P: a view's Delta commits for a small and a large delta, next to its snapshot.
    commits = [m for m in results["measurements"] if m["variant"] == "table_commit"]
    assert len({m["delta"] for m in commits}) == 2 and all(m["ok"] for m in commits)
    assert ("P", "snapshot_write") in measured
    assert all(row["over_snapshot"] is not None for row in results["summary"]["P"])
    assert {
        ("W0", "trivial_job"),
        ("W0", "empty_epoch_engine"),
        ("W0", "empty_epoch_airflow"),
    } <= measured
    for workload in ("W1", "W2"):  # the same first epoch with the local tier off
        alone = [
            m
            for m in results["measurements"]
            if m["workload"] == workload and m["variant"] == "spark_only"
        ]
        assert len(alone) == 1 and alone[0]["ok"], workload
        assert alone[0]["jobs"] > 0 and alone[0]["params"]["tiers"] == "spark", workload
    summary = (out / "summary.md").read_text()
    assert "| W1 |" in summary and "Spark Declarative Pipelines" in summary
    assert "The Spark tier alone" in summary
    assert "warm batch s" in summary
    assert "## P: publishing an epoch, Delta commit against the whole-view snapshot" in summary
    for plot in ("ratio_R.png", "bytes.png", "sdp.png"):
        assert (out / plot).stat().st_size > 1000
