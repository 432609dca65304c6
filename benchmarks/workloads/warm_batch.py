"""The warm batch: each view's own query over the sources' current tables, timed.

A user without dbspark does not replay an input log to refresh a view (the full-refresh
side of :mod:`benchmarks.workloads.compare`): their tables already hold the current
state, one row per key, and their Spark session is already up. They run the view's
query over those tables and write the result. That is the alternative maintaining a
view has to beat, and B = incremental epoch time / warm batch time says whether it does.

Per compared epoch, outside the timing, :meth:`WarmBatch.write_current` writes every
source's state as of the epoch as plain Parquet (``<series>/current/epoch=<n>/<source>/``)
from the landed batches of epochs 0..n: per key the latest row unless it is a tombstone,
the rule of the SDP side (``benchmarks.pipelines.upserts.live_rows``). Only the user
columns are kept: ``ts`` and ``deleted`` are the feed's, not the table's.

Timed (:meth:`WarmBatch.measure`): one warm-up run, then :data:`RUNS` runs, each reading
those files with ``spark.read.parquet``, computing every view with its query from
:mod:`benchmarks.queries` and writing it as Parquet (overwrite,
``<series>/warm_batch/epoch=<n>/<view>/``). The run with the median time is the
measurement, in the same Spark session and settings as the engine's epoch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from benchmarks.harness import Measurement, Meter
from benchmarks.pipelines.upserts import live_rows
from benchmarks.queries import Query

#: Timed runs after the warm-up; the median one is kept.
RUNS = 3


@dataclass(frozen=True)
class WarmBatch:
    """What a workload supplies: each upsert source's key (to build its current table)
    and each view's query over the current tables, by view name."""

    keys: Mapping[str, tuple[str, ...]]
    views: Mapping[str, Query]

    def write_current(self, spark: SparkSession, landing: Path, epoch: int, folder: Path) -> None:
        """Write each source's live rows after ``epoch`` to ``folder/<source>`` (Parquet).
        Later epochs may have landed already (W3 lands all of them up front): only
        ``epoch=0..epoch`` are read."""
        for source, key in self.keys.items():
            landed = spark.read.parquet(str(landing / source)).where(F.col("epoch") <= epoch)
            live_rows(landed, *key).write.mode("overwrite").parquet(str(folder / source))

    def run(self, spark: SparkSession, current: Path, target: Path) -> None:
        """One batch: read the current tables, compute every view, write it to
        ``target/<view>``."""
        tables = {source: spark.read.parquet(str(current / source)) for source in self.keys}
        for name, query in self.views.items():
            query(tables).write.mode("overwrite").parquet(str(target / name))

    def measure(
        self,
        spark: SparkSession,
        meter: Meter,
        current: Path,
        target: Path,
        template: Measurement,
        runs: int = RUNS,
    ) -> Measurement:
        """A warm-up run, then ``runs`` measured ones: the median run (a copy of
        ``template`` with its counters), with every run's seconds in ``params["runs_s"]``.
        The warm-up takes the first run's extra costs (file listings, code generation)
        out of the comparison: the user's session has run the query before."""
        self.run(spark, current, target)
        timed = []
        for _ in range(runs):
            measurement = replace(template, params=dict(template.params))
            with meter.measure(measurement):
                self.run(spark, current, target)
            timed.append(measurement)
        median = sorted(timed, key=lambda m: m.seconds)[len(timed) // 2]
        median.params["runs_s"] = [round(m.seconds, 3) for m in timed]
        return median
