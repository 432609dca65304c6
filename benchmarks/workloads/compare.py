"""An epoch side by side with a full refresh of the same snapshot, and their answers.

The incremental side is ``SparkEngine.run_epoch`` on the landed batch: ingest, every
stage and loop, publishing the views, the commit and compaction. The full-refresh side
recomputes every view from the whole input history with Spark
(``SparkEngine.full_refresh``) and writes the results as Parquet, as publishing does.
The written results are then compared with the maintained views, outside the timing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession

from benchmarks.data import epoch_folder
from benchmarks.harness import Measurement, Meter, Results
from dbspark.circuit.builder import Circuit
from dbspark.engine.spark.executor import SparkEngine
from dbspark.engine.spark.full_refresh import verify


def new_engine(circuit: Circuit, work: Path, spark: SparkSession) -> SparkEngine:
    return SparkEngine(circuit, work / "warehouse", spark=spark)


def landed_inputs(
    spark: SparkSession, circuit: Circuit, landing: Path, epoch: int
) -> tuple[dict[str, DataFrame], int]:
    """The epoch's landed batches as DataFrames, and how many rows they hold."""
    inputs, rows = {}, 0
    for source in circuit.sources:
        folder = epoch_folder(landing, source, epoch)
        if folder.exists():
            inputs[source] = spark.read.parquet(str(folder))
            rows += sum(pq.read_metadata(f).num_rows for f in folder.glob("*.parquet"))
    return inputs, rows


def stored_bytes(engine: SparkEngine) -> int:
    """Live bytes of every batch of the circuit (traces, views, the raw input log)."""
    return sum(b.bytes for b in engine.catalog.all_batches(engine.circuit.name) if b.live)


def load(
    engine: SparkEngine,
    landing: Path,
    meter: Meter,
    results: Results,
    *,
    workload: str,
    size: int,
    params: dict[str, Any],
) -> Measurement:
    """Epoch 0: the base load (measured, but not part of any comparison)."""
    inputs, rows = landed_inputs(engine.spark, engine.circuit, landing, 0)
    measurement = Measurement(workload, "load", 0.0, size, rows, 0, params=dict(params))
    with meter.measure(measurement):
        engine.run_epoch(0, inputs)
    measurement.stored_bytes = stored_bytes(engine)
    return results.add(measurement)


def epoch_against_refresh(
    engine: SparkEngine,
    epoch: int,
    landing: Path,
    work: Path,
    meter: Meter,
    results: Results,
    *,
    workload: str,
    size: int,
    params: dict[str, Any],
) -> tuple[Measurement, Measurement]:
    """Run ``epoch`` incrementally, then a full refresh of the same snapshot; both
    measurements carry whether the answers agreed."""
    spark = engine.spark
    inputs, rows = landed_inputs(spark, engine.circuit, landing, epoch)
    incremental = Measurement(workload, "incremental", 0.0, size, rows, epoch, params=dict(params))
    with meter.measure(incremental):
        report = engine.run_epoch(epoch, inputs)
    incremental.stored_bytes = stored_bytes(engine)
    incremental.params["loop_iterations"] = len(report.iterations)

    refresh = Measurement(workload, "full_refresh", 0.0, size, rows, epoch, params=dict(params))
    target = work / "full_refresh" / f"epoch={epoch}"
    with meter.measure(refresh):
        for name, frame in engine.full_refresh().items():
            frame.write.mode("overwrite").parquet(str(target / name))

    differences = {}
    for name in engine.circuit.views:
        fresh = spark.read.parquet(str(target / name))
        count = verify(fresh, engine.view_frame(name)).count()
        if count:
            differences[name] = count
    for measurement in (incremental, refresh):
        measurement.ok = not differences
        if differences:
            measurement.params["difference"] = f"rows differing per view: {differences}"
    results.add(incremental)
    results.add(refresh)
    return incremental, refresh


def view_rows(engine: SparkEngine) -> dict[str, int]:
    return {name: engine.view_frame(name).count() for name in engine.circuit.views}
