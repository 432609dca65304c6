"""W1: a TPC-H Q3-like join and aggregate over three upsert sources.

Per scale factor: the base load (epoch 0), then epochs that change about 0.1% and 1%
of every table (updates, deletes, new orders), each against a full refresh of the same
snapshot. For alpha, one more epoch per scale factor changes a fixed number of rows
(0.1% of the smallest scale factor), so only the base size varies.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from benchmarks.circuits import tpch_q3
from benchmarks.data import land, tpch
from benchmarks.harness import Budget, Meter, Results
from benchmarks.workloads.compare import epoch_against_refresh, load, new_engine

WORKLOAD = "W1"
SEED = 20261123


def run(
    spark,
    meter: Meter,
    results: Results,
    budget: Budget,
    work: Path,
    cache: Path,
    *,
    scale_factors: list[float],
    fractions: list[float],
) -> dict[float, Path]:
    """Run W1 at each scale factor; the landing folder of each (for the SDP side)."""
    landings = {}
    smallest_rows = None
    for sf in scale_factors:
        base = tpch.base_tables(tpch.generate(sf, cache))
        rows = sum(t.num_rows for t in base.values())
        smallest_rows = smallest_rows or rows
        root = work / WORKLOAD / f"sf{sf:g}"
        shutil.rmtree(root, ignore_errors=True)
        landing = root / "landing"
        for name, table in base.items():
            land(landing, name, 0, table)
        engine = new_engine(tpch_q3(), root, spark)
        params = {"scale_factor": sf}
        loaded = load(engine, landing, meter, results, workload=WORKLOAD, size=rows, params=params)
        epoch = 1
        # 0.1% of the smallest scale factor: the same absolute delta at every size.
        plan = [(f, False) for f in fractions]
        if len(scale_factors) > 1:
            plan.append((fractions[0] * smallest_rows / rows, True))
        for fraction, fixed_delta in plan:
            if not budget.allows(2.5 * loaded.seconds):
                results.skip(f"W1 SF {sf:g}: epochs from fraction {fraction:g} on (time budget)")
                break
            for name, table in tpch.change_tables(base, fraction, epoch, SEED).items():
                land(landing, name, epoch, table)
            epoch_against_refresh(
                engine,
                epoch,
                landing,
                root,
                meter,
                results,
                workload=WORKLOAD,
                size=rows,
                params={**params, "fraction": fraction, "fixed_delta": fixed_delta},
            )
            epoch += 1
        landings[sf] = landing
    return landings
