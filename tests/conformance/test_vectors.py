"""Every public conformance vector, every way dbspark computes an answer.

One suite, parametrized over way × vector. The expected outputs come from the vectors
(the seeds' worked examples), never from an engine. The ways:

* ``reference``, ``spark-local``, ``spark-tier``: engines held as ``engine.api.Engine``
  (the Spark engine with its default threshold, and with every unit on Spark);
* ``reference-full-refresh``, ``spark-full-refresh``: each epoch recomputed from scratch;
* ``cli``: ``python -m dbspark.conformance`` as a user runs it, output compared exactly.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_conformance_cli import run_cli
from vectors import REPLAYED, SQL_VECTORS, VECTOR_DIR, VECTORS

from dbspark.conformance import compare, get_engine, parse_vector, run_epochs, zset_to_rows
from dbspark.conformance.vector import Vector
from dbspark.engine.api import Engine

Produced = list[dict[str, list[list[Any]]]]


def test_the_public_vectors_are_there() -> None:
    assert len(VECTORS) >= 6, f"too few conformance vectors in {VECTOR_DIR}"
    assert len(SQL_VECTORS) >= 4, "too few SQL conformance vectors"


def through_engine(engine: Engine, vector: Vector) -> Produced:
    produced = run_epochs(engine, vector.circuit, vector.epochs)
    # The engine agrees with its own full refresh after the last epoch.
    assert engine.verify() == {name: [] for name in vector.circuit.views}
    return produced


def reference(vector: Vector, path: Path, request: pytest.FixtureRequest) -> Produced:
    return through_engine(get_engine("reference").create(vector.circuit), vector)


def spark_engine(local_rows: int | None) -> Callable[..., Produced]:
    def run(vector: Vector, path: Path, request: pytest.FixtureRequest) -> Produced:
        from dbspark.engine.spark.executor import SparkEngine

        spark = request.getfixturevalue("spark")
        warehouse = request.getfixturevalue("warehouse_path")
        engine = SparkEngine(vector.circuit, warehouse, spark=spark, local_rows=local_rows)
        produced = run_epochs(engine, vector.circuit, vector.epochs)
        # Replaying a committed epoch changes nothing (the run is a no-op).
        again = SparkEngine(vector.circuit, warehouse, spark=spark, local_rows=local_rows)
        assert again.run_epoch(0, vector.epochs[0]).skipped
        assert {name: zset_to_rows(z) for name, z in again.views().items()} == produced[-1]
        return produced

    return run


def reference_full_refresh(vector: Vector, path: Path, request: pytest.FixtureRequest) -> Produced:
    from dbspark.engine.reference.full_refresh import FullRefresh, full_refresh

    whole = FullRefresh(vector.circuit, vector.epochs)
    produced = []
    for epoch in range(len(vector.epochs)):
        views = full_refresh(vector.circuit, vector.epochs[: epoch + 1])
        # The same answer from the whole history, asking for that epoch.
        assert whole.views(epoch) == views, f"epoch {epoch}"
        produced.append({name: zset_to_rows(z) for name, z in views.items()})
    return produced


def spark_full_refresh(vector: Vector, path: Path, request: pytest.FixtureRequest) -> Produced:
    from dbspark.engine.spark.frames import collect_zsets
    from dbspark.engine.spark.full_refresh import evaluate, source_frames

    spark = request.getfixturevalue("spark")
    circuit = vector.circuit
    frames = source_frames(spark, circuit, vector.epochs)
    produced = []
    for epoch in range(len(vector.epochs)):
        views = evaluate(spark, circuit, frames, epoch)
        schemas = {name: circuit.node(circuit.views[name]).schema for name in views}
        zsets = collect_zsets({name: (frame, schemas[name]) for name, frame in views.items()})
        produced.append({name: zset_to_rows(z) for name, z in zsets.items()})
    return produced


def cli(vector: Vector, path: Path, request: pytest.FixtureRequest) -> Produced:
    result = run_cli(path, "--engine", "reference")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    output = json.loads(result.stdout)  # exactly one JSON document, nothing else
    assert list(output) == ["epochs"]
    checked = run_cli(path, "--engine", "reference", "--check")
    assert checked.returncode == 0, checked.stderr
    return output["epochs"]


WAYS: dict[str, Callable[..., Produced]] = {
    "reference": reference,
    "spark-local": spark_engine(None),
    "spark-tier": spark_engine(0),
    "reference-full-refresh": reference_full_refresh,
    "spark-full-refresh": spark_full_refresh,
    "cli": cli,
}
SLOW = {"spark-local", "spark-tier"}


@pytest.mark.parametrize("path", REPLAYED, ids=[p.stem for p in REPLAYED])
@pytest.mark.parametrize(
    "way",
    [pytest.param(w, marks=pytest.mark.slow) if w in SLOW else w for w in WAYS],
)
def test_vector(way: str, path: Path, request: pytest.FixtureRequest) -> None:
    text = path.read_text(encoding="utf-8")
    vector = parse_vector(text)
    expected = json.loads(text)["expected"]
    produced = WAYS[way](vector, path, request)
    assert compare(produced, expected) is None
    # Exact equality: same epochs, same views, rows in the README's order (JSON text).
    assert produced == expected
