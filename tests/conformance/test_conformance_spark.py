"""Every public conformance vector through the engine, epoch by epoch, on both tiers.

The expected outputs come from the vectors (the seeds' worked examples), not from
the engine; a second run over the same warehouse must be a no-op that keeps the views.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from vectors import VECTORS, replay_vector

from dbspark.conformance.runner import zset_to_rows
from dbspark.conformance.vector import parse_vector
from dbspark.engine.spark.executor import SparkEngine

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("local_rows", [None, 0], ids=["local-tier", "spark-tier"])
@pytest.mark.parametrize("path", VECTORS, ids=[p.stem for p in VECTORS])
def test_vector_on_spark(spark, warehouse_path: Path, path: Path, local_rows: int | None) -> None:
    replay_vector(spark, warehouse_path, path, local_rows)
    vector = parse_vector(path.read_text(encoding="utf-8"))
    expected = json.loads(path.read_text(encoding="utf-8"))["expected"]
    # Replaying a committed epoch changes nothing (the run is a no-op).
    again = SparkEngine(vector.circuit, warehouse_path, spark=spark)
    assert again.run_epoch(0, vector.epochs[0]).skipped
    final = {name: zset_to_rows(z) for name, z in again.views().items()}
    assert final == expected[-1]
