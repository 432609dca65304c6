"""dbspark against Spark Declarative Pipelines (SDP), on the same landed files.

SDP's materialized views are recomputed in full on every pipeline run. For W1 and W3
(at their largest size) the landed epochs are replayed one by one into a folder SDP
reads, and after each the pipeline runs once: the time a user of SDP waits per epoch,
next to dbspark's epoch on the same data. At the end SDP's views must equal dbspark's.
Each SDP run is a ``spark-pipelines`` client process against one Spark Connect server
(its own JVM), started only for this part so it does not compete with the benchmark's
own Spark for the cores.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from pyspark.sql import functions as F

from benchmarks.circuits import flights, tpch_q3
from benchmarks.harness import Bench, Measurement
from benchmarks.sdp import SdpPipeline
from benchmarks.workloads.compare import warehouse_of
from dbspark.engine.spark.executor import SparkEngine
from dbspark.engine.spark.full_refresh import verify

PIPELINES = {"W1": ("tpch_q3", tpch_q3), "W3": ("flights", flights)}


def run(bench: Bench, landings: dict[str, Path]) -> None:
    spark, results = bench.spark, bench.results
    for workload, landing in landings.items():
        pipeline, circuit = PIPELINES[workload]
        last = max(int(p.name.split("=")[1]) for p in landing.glob("*/epoch=*"))
        root = bench.work / "sdp" / workload
        shutil.rmtree(root, ignore_errors=True)
        replay = root / "landing"
        # The same driver memory as the benchmark's own session.
        with SdpPipeline(pipeline, replay, root, conf={"spark.driver.memory": "6g"}) as sdp:
            for epoch in range(last + 1):
                if epoch and not bench.budget.allows(60):
                    results.skip(f"SDP {workload}: epochs {epoch}..{last} (time budget)")
                    last = epoch - 1
                    break
                _replay_epoch(landing, replay, epoch)
                done = sdp.run()
                results.add(
                    Measurement(
                        workload,
                        "sdp" if epoch else "sdp_load",
                        done.seconds,
                        epoch=epoch,
                        input_bytes=done.input_bytes,
                        shuffle_bytes=done.shuffle_bytes,
                        params={"graph_seconds": done.graph_seconds, "pipeline": pipeline},
                    )
                )
            # dbspark's views as of the same epoch (its warehouse under the workload's work).
            engine = SparkEngine(circuit(), warehouse_of(landing), spark=spark)
            differences = {}
            if engine.last_committed_epoch() == last:
                for name in engine.circuit.views:
                    theirs = spark.read.parquet(str(sdp.view_path(name)))
                    theirs = theirs.withColumn("__w", F.lit(1).cast("bigint"))
                    count = verify(theirs, engine.view_frame(name)).count()
                    if count:
                        differences[name] = count
            else:
                results.skip(f"SDP {workload}: no dbspark epoch {last} to compare with")
            for measurement in results.of(workload):
                if measurement.variant in ("sdp", "sdp_load"):
                    measurement.ok = not differences
                    if differences:
                        measurement.params["difference"] = f"rows differing per view: {differences}"
            if differences:
                results.failures.append(
                    f"SDP {workload}: views differ from dbspark's: {differences}"
                )


def _replay_epoch(landing: Path, replay: Path, epoch: int) -> None:
    """Make ``epoch``'s landed files visible to SDP (hard links: no copying)."""
    for folder in landing.glob(f"*/epoch={epoch}"):
        target = replay / folder.parent.name / folder.name
        target.mkdir(parents=True, exist_ok=True)
        for file in folder.iterdir():
            os.link(file, target / file.name)
