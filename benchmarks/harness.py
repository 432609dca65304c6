"""Measuring an epoch: wall time, the bytes Spark read and shuffled, the jobs it ran.

A :class:`Meter` reads Spark's own counters before and after a block of work: the
executors' ``totalInputBytes`` and shuffle totals (from the status store, which is kept
with the web UI off) and the number of jobs started. Parquet's vectored reads count
only the footers in ``bytesRead``, so the benchmark session turns them off
(``BENCH_SPARK_CONF``) and the input bytes are the column chunks actually read.

Every result is a :class:`Measurement`; :class:`Results` collects them, with the run's
settings and anything the run skipped, into ``results.json``.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil
from pyspark.sql import SparkSession

from dbspark.engine.local.tier import READS as LOCAL_READS

#: Settings of the benchmark's Spark session (besides dbspark's defaults).
BENCH_SPARK_CONF = {
    # Exact input bytes: vectored Parquet reads report only footer bytes.
    "spark.hadoop.parquet.hadoop.vectored.io.enabled": "false",
    "spark.driver.memory": "6g",
}


@dataclass
class Measurement:
    """One timed piece of work. ``variant`` says which side of a comparison it is."""

    workload: str
    variant: str
    seconds: float
    size: int | None = None  # the base size (rows, or edges) the work ran against
    delta: int | None = None  # rows changed in the epoch
    epoch: int | None = None
    input_bytes: int | None = None
    shuffle_bytes: int | None = None
    jobs: int | None = None
    stored_bytes: int | None = None  # live bytes in the warehouse after the epoch
    ok: bool | None = None  # the answers agreed (None: not a correctness check)
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class Counters:
    input_bytes: int
    shuffle_bytes: int
    jobs: int


class Meter:
    """Spark's cumulative counters of a classic session, read on the driver."""

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark
        self._store = spark.sparkContext._jsc.sc().statusStore()
        self._local_bytes = 0
        LOCAL_READS.enabled = True

    def counters(self) -> Counters:
        """Spark's counters, with the bytes the local tier's reads opened added to the
        input bytes (an epoch on the local tier runs no Spark job)."""
        local_bytes = LOCAL_READS.take()
        executors = self._store.executorList(True)
        input_bytes = shuffle = 0
        for i in range(executors.size()):
            summary = executors.apply(i)
            input_bytes += summary.totalInputBytes()
            shuffle += summary.totalShuffleRead()
        tracker = self.spark.sparkContext.statusTracker()
        ids = list(tracker.getJobIdsForGroup(None)) + list(tracker.getActiveJobsIds())
        self._local_bytes += local_bytes
        return Counters(input_bytes + self._local_bytes, shuffle, (max(ids) + 1) if ids else 0)

    @contextmanager
    def measure(self, measurement: Measurement) -> Iterator[Measurement]:
        """Time the block; fill in ``seconds``, ``input_bytes``, ``shuffle_bytes`` and
        ``jobs`` of ``measurement``. Dirty pages are written out first (``os.sync``):
        what the run wrote before (a warehouse copied for another measurement, the last
        one's output) must not be paid for by this one's fsyncs; and the Spark JVM's
        background work after the last measurement (JIT compilation, garbage collection)
        must not share the 2 cores with this one (``settle``)."""
        os.sync()
        measurement.params["settled_s"] = round(settle(), 2)
        before = self.counters()
        start = time.perf_counter()
        yield measurement
        measurement.seconds = time.perf_counter() - start
        after = self.counters()
        measurement.input_bytes = after.input_bytes - before.input_bytes
        measurement.shuffle_bytes = after.shuffle_bytes - before.shuffle_bytes
        measurement.jobs = after.jobs - before.jobs


def settle(*, window_s: float = 0.1, idle_share: float = 0.05, at_most_s: float = 5.0) -> float:
    """Wait until this process's children (the local Spark JVM and its helpers) use less
    than ``idle_share`` of one core over ``window_s``, for at most ``at_most_s``; the
    seconds waited. After a heavy job, a JVM keeps compiling and collecting for a second
    or more, which on a 2-core machine slowed a 0.2 s epoch measured right after by
    30–40 ms: that belongs to the job before, not to the measured one."""
    started = time.monotonic()
    children = psutil.Process().children(recursive=True)
    while time.monotonic() - started < at_most_s:
        before = _cpu_seconds(children)
        time.sleep(window_s)
        if _cpu_seconds(children) - before < idle_share * window_s:
            break
    return time.monotonic() - started


def _cpu_seconds(processes: list[psutil.Process]) -> float:
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.Error:  # gone since it was listed
            continue
        total += times.user + times.system
    return total


class Budget:
    """The run's time limit: workloads ask before each optional step."""

    def __init__(self, minutes: float) -> None:
        self.deadline = time.monotonic() + minutes * 60
        self.minutes = minutes

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def allows(self, seconds: float) -> bool:
        """Whether ``seconds`` more work still fits."""
        return self.remaining() > seconds


class Results:
    """Everything a run measured, skipped and checked; saved as ``results.json``."""

    def __init__(self, out: Path, settings: dict[str, Any]) -> None:
        self.out = out
        self.settings = settings
        self.measurements: list[Measurement] = []
        self.skipped: list[str] = []
        self.failures: list[str] = []
        self.summary: dict[str, dict[str, Any]] = {}
        self.started = time.time()

    def add(self, measurement: Measurement) -> Measurement:
        self.measurements.append(measurement)
        if measurement.ok is False:
            self.failures.append(
                f"{measurement.workload} {measurement.variant} epoch {measurement.epoch}: "
                f"the answers differ ({measurement.params.get('difference', '')})"
            )
        return measurement

    def skip(self, what: str) -> None:
        self.skipped.append(what)

    def of(self, workload: str, variant: str | None = None) -> list[Measurement]:
        return [
            m
            for m in self.measurements
            if m.workload == workload and (variant is None or m.variant == variant)
        ]

    def save(self) -> Path:
        self.out.mkdir(parents=True, exist_ok=True)
        path = self.out / "results.json"
        document = {
            "settings": self.settings,
            "machine": machine(),
            "seconds": round(time.time() - self.started, 1),
            "summary": self.summary,
            "skipped": self.skipped,
            "failures": self.failures,
            "measurements": [asdict(m) for m in self.measurements],
        }
        path.write_text(json.dumps(document, indent=2, default=str) + "\n")
        return path


@dataclass
class Bench:
    """What every workload measures with: one Spark session and its meter, the results,
    the time budget, and the work folder for warehouses and landed data."""

    spark: SparkSession
    meter: Meter
    results: Results
    budget: Budget
    work: Path


def machine() -> dict[str, Any]:
    import pyspark

    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "pyspark": pyspark.__version__,
        "platform": platform.platform(),
        "load_average": os.getloadavg(),
    }


def median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def timed(work: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    value = work()
    return time.perf_counter() - start, value


def loglog_slope(sizes: list[float], seconds: list[float]) -> float | None:
    """The least-squares slope of log(seconds) against log(size) (alpha)."""
    points = [(math.log(s), math.log(t)) for s, t in zip(sizes, seconds, strict=True) if s and t]
    if len({x for x, _ in points}) < 2:
        return None
    mean_x = sum(x for x, _ in points) / len(points)
    mean_y = sum(y for _, y in points) / len(points)
    sxx = sum((x - mean_x) ** 2 for x, _ in points)
    sxy = sum((x - mean_x) * (y - mean_y) for x, y in points)
    return sxy / sxx


def linear_fit(sizes: list[float], seconds: list[float]) -> tuple[float, float] | None:
    """``seconds = fixed + per_unit * size`` by least squares: (fixed, per_unit)."""
    if len(set(sizes)) < 2:
        return None
    mean_x = sum(sizes) / len(sizes)
    mean_y = sum(seconds) / len(seconds)
    sxx = sum((x - mean_x) ** 2 for x in sizes)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(sizes, seconds, strict=True)) / sxx
    return mean_y - slope * mean_x, slope
