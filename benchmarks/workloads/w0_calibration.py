"""W0: the fixed floor of an epoch, so the other workloads can be read against it.

- an empty epoch through the stage executor (``SparkEngine.run_epoch`` with nothing
  landed), side by side with an empty epoch through Airflow (``dag.test`` of a one-source
  DAG in a child process: the task runner, the metadata database, every task);
- a trivial Spark job, side by side with writing and reading 1M rows of Parquet (the
  plan's ``w0_rows``).

Each is repeated after a warm-up and the median kept (the first Spark job of a JVM
compiles code the later ones reuse).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from pyspark.sql import functions as F

from benchmarks.harness import Bench, Measurement, Meter, Results, median, timed
from dbspark.engine.spark.executor import SparkEngine
from dbspark.examples.circuits import word_count

WORKLOAD = "W0"
REPO = Path(__file__).resolve().parents[2]


def run(bench: Bench, *, repeats: int, rows: int, airflow: bool) -> None:
    spark, meter, results = bench.spark, bench.meter, bench.results
    root = bench.work / WORKLOAD
    shutil.rmtree(root, ignore_errors=True)
    _spark_floor(spark, meter, results, root, repeats, rows)
    _empty_epochs(spark, meter, results, root, repeats)
    if airflow:
        _airflow_epochs(results, root, repeats)
    else:
        results.skip("W0: the empty epoch through Airflow (--no-airflow)")


def _spark_floor(
    spark, meter: Meter, results: Results, root: Path, repeats: int, rows: int
) -> None:
    spark.range(1).count()  # warm-up
    trivial = [timed(lambda: spark.range(1).count())[0] for _ in range(repeats)]
    results.add(Measurement(WORKLOAD, "trivial_job", median(trivial), params={"runs": trivial}))
    frame = spark.range(rows).select(
        "id", (F.col("id") % 1000).alias("k"), F.sha2(F.col("id").cast("string"), 256).alias("s")
    )
    path = root / "parquet"
    write = Measurement(WORKLOAD, "parquet_write", 0.0, size=rows)
    with meter.measure(write):
        frame.write.mode("overwrite").parquet(str(path))
    results.add(write)
    read = Measurement(WORKLOAD, "parquet_read", 0.0, size=rows)
    with meter.measure(read):
        spark.read.parquet(str(path)).groupBy("k").agg(F.sum("id"), F.count("s")).collect()
    results.add(read)


def _empty_epochs(spark, meter: Meter, results: Results, root: Path, repeats: int) -> None:
    engine = SparkEngine(word_count(), root / "engine", spark=spark)
    engine.run_epoch(0, {"words": [[("a",), 1], [("b",), 2]]})
    seconds, jobs = [], []
    for epoch in range(1, repeats + 1):
        measurement = Measurement(WORKLOAD, "empty_epoch_engine", 0.0, epoch=epoch)
        with meter.measure(measurement):
            engine.run_epoch(epoch, {})
        seconds.append(measurement.seconds)
        jobs.append(measurement.jobs or 0)
    results.add(
        Measurement(
            WORKLOAD,
            "empty_epoch_engine",
            median(seconds),
            jobs=int(median(jobs)),
            params={"runs": seconds},
        )
    )


def _airflow_epochs(results: Results, root: Path, repeats: int) -> None:
    home = root / "airflow"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    command = [sys.executable, "-m", "benchmarks.airflow_epochs", str(home), str(repeats + 1)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO)
    if done.returncode != 0:
        results.failures.append(f"W0 Airflow empty epochs failed:\n{done.stderr[-3000:]}")
        return
    runs = json.loads(done.stdout.strip().splitlines()[-1])
    warm = runs[1:]  # the first run starts Spark
    results.add(
        Measurement(
            WORKLOAD,
            "empty_epoch_airflow",
            median(warm),
            params={"runs": warm, "first_run": runs[0]},
        )
    )
