"""W1: a TPC-H Q3-like join and aggregate over three upsert sources.

Per scale factor: the base load (epoch 0), then epochs that change about 0.1% and 1%
of every table (updates, deletes, new orders): per size a warm-up epoch and three more,
whose median is compared against a full refresh of the same snapshot and against a warm
batch of Q3 over the current tables. For alpha (with more
than one scale factor), epochs of each scale factor change a fixed number of rows (0.1%
of the smallest scale factor), so only the base size varies. They run on a copy of the
warehouse made right after the load, so that their traces hold the load and nothing
else at every scale factor (after the 1% epochs, they would also hold batches of 1% of
each base), and their median is of ``ALPHA_RUNS`` epochs. The largest scale
factor also runs the sweep's larger deltas (default 5%, past the local tier's
threshold), for the plot of epoch time against delta size.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

from benchmarks import queries
from benchmarks.circuits import TPCH_KEYS, tpch_q3
from benchmarks.data import tpch
from benchmarks.harness import Bench
from benchmarks.workloads.compare import Series, copy_warehouse, room_for_next
from benchmarks.workloads.warm_batch import WarmBatch

WORKLOAD = "W1"
SEED = 20261123
#: Q3 as a plain Spark query over the current customer, orders and lineitem tables.
WARM_BATCH = WarmBatch(TPCH_KEYS, queries.TPCH_Q3)
#: Epochs of each size after the warm-up one; the median is compared (as the warm batch).
RUNS = 3
#: Epochs of the fixed delta after its warm-up: one point of a slope across scale
#: factors, and a small epoch's time varies more than a large one's.
ALPHA_RUNS = 5
#: Sizes up to this fraction also take the median of ``ALPHA_RUNS`` epochs: a 0.1%
#: epoch (0.1-0.2 s) varies by +-30% from one epoch to the next, more than its target's
#: margin, and five more of them cost a second.
SMALL_FRACTION = 0.001


def run(
    bench: Bench,
    cache: Path,
    *,
    scale_factors: list[float],
    fractions: list[float],
    sweep_fractions: Sequence[float] = (),
    airflow: bool = False,
    spark_only_first: bool = False,
    runs: int = RUNS,
) -> dict[float, Path]:
    """Run W1 at each scale factor; the landing folder of each (for the SDP side). The
    largest scale factor also gets a size per ``sweep_fractions`` (the plot against
    delta size). Each size is ``runs`` + 1 epochs: a warm-up, then ``runs`` whose median
    is compared (``Series.compare``). With ``airflow``, the first size's epochs at the
    largest scale factor also run through Airflow once they were measured
    (``w1_airflow.py``: the first in the tasks, the others in a unit worker); with
    ``spark_only_first``, the first compared one also with the local tier off."""
    landings = {}
    smallest_rows = None
    previous = None
    for sf in scale_factors:
        if not room_for_next(bench, previous, f"{WORKLOAD} SF {sf:g} and larger"):
            break
        base = tpch.base_tables(tpch.generate(sf, cache))
        rows = sum(t.num_rows for t in base.values())
        smallest_rows = smallest_rows or rows
        series = Series(
            bench, WORKLOAD, f"sf{sf:g}", tpch_q3(), rows, {"scale_factor": sf}, WARM_BATCH
        )
        previous = series
        series.land(0, base)
        series.load()
        largest = sf == max(scale_factors)
        loaded = None
        if airflow and largest:  # the base load, for the Airflow side
            loaded = bench.work / WORKLOAD / "airflow-base"
            shutil.rmtree(loaded, ignore_errors=True)
            copy_warehouse(series.root / "warehouse", loaded)
        plan = [(series, f, False) for f in fractions]
        if len(scale_factors) > 1:
            alpha = series.branch(f"sf{sf:g}-alpha")
            plan.append((alpha, fractions[0] * smallest_rows / rows, True))
        if largest:
            plan.extend((series, f, False) for f in sweep_fractions)
        last: dict[str, int] = {}  # each series' last epoch
        for step, (on, fraction, fixed_delta) in enumerate(plan):
            if not series.fits(f"SF {sf:g}: epochs from fraction {fraction:g} on", 2.5):
                break
            # (--quick's single compared epoch stays one.)
            small = fixed_delta or (fraction <= SMALL_FRACTION and runs > 1)
            size_runs = max(runs, ALPHA_RUNS) if small else runs
            first = last.get(on.name, 0) + 1
            epochs = range(first, first + 1 + size_runs)
            last[on.name] = epochs[-1]
            for epoch in epochs:
                on.land(epoch, tpch.change_tables(base, fraction, epoch, SEED))
            params = {"fraction": fraction, "fixed_delta": fixed_delta}
            if fixed_delta:
                on.warm()
            earlier = []
            for epoch in epochs[:-1]:
                earlier.append(on.advance(epoch, **params))
            on.compare(
                epochs[-1],
                earlier=earlier,
                # The first size at the largest SF also runs with the local tier off.
                spark_only=spark_only_first and largest and step == 0,
                not_resident=largest and not fixed_delta,
                **params,
            )
            if fixed_delta:
                on.close()  # its resident traces are not needed again
            if loaded is not None and step == 0:
                # After the size's measurements, so that Airflow's processes slow none.
                from benchmarks.workloads import w1_airflow

                w1_airflow.run(bench, series, loaded, list(epochs))
        series.close()  # the next scale factor's traces take its memory
        landings[sf] = series.landing
    return landings
