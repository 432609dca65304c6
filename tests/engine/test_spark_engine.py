"""The Spark engine as a user runs it: persisted state, retries, verify and rebuild,
bad input, and a PostgreSQL catalog. Oracles: the vectors' expected outputs and
full refresh (a from-scratch evaluation over the raw input log)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from vectors import VECTOR_DIR

from dbspark.conformance.runner import zset_to_rows
from dbspark.conformance.vector import parse_vector
from dbspark.core.upsert import UpsertConflict
from dbspark.engine.api import EpochOrderError
from dbspark.engine.spark.executor import SparkEngine

pytestmark = pytest.mark.slow


def load(name: str):
    path = VECTOR_DIR / name
    return parse_vector(path.read_text()), json.loads(path.read_text())["expected"]


def rows(engine: SparkEngine) -> dict:
    return {name: zset_to_rows(z) for name, z in engine.views().items()}


def test_state_survives_the_process_and_epochs_continue(spark, warehouse_path: Path) -> None:
    vector, expected = load("word_count_retractions.json")
    first = SparkEngine(vector.circuit, warehouse_path, spark=spark)
    first.step(vector.epochs[0])
    # A new engine object (a new task, a new process) continues from the catalog.
    second = SparkEngine(vector.circuit, warehouse_path, spark=spark)
    assert second.last_committed_epoch() == 0
    assert second.run_epoch(0, vector.epochs[0]).skipped  # a committed epoch is a no-op
    with pytest.raises(EpochOrderError, match="epoch 2 cannot run before epoch 1"):
        second.run_epoch(2, vector.epochs[2])
    for epoch in (1, 2):
        second.step(vector.epochs[epoch])
        assert rows(second) == expected[epoch]
    assert all(not diff for diff in second.verify().values())


def test_verify_finds_a_damaged_view_and_rebuild_repairs_it(spark, warehouse_path: Path) -> None:
    vector, expected = load("word_count_retractions.json")
    engine = SparkEngine(vector.circuit, warehouse_path, spark=spark)
    engine.step(vector.epochs[0])
    # Damage the published view behind the engine's back: one bogus committed row.
    bogus = spark.createDataFrame(
        [("zebra", 1, 1, 0)], "word string, n bigint, __w bigint, __epoch bigint"
    )
    record = engine.traces.write("view.counts", bogus, (0,))
    engine.catalog.commit(engine.circuit.name, "damage", (0,), [record])
    differences = engine.verify()
    assert differences["counts"] == [("zebra", 1, -1)]
    assert differences["distinct_words"] == []
    engine.rebuild("counts")
    assert all(not diff for diff in engine.verify().values())
    assert rows(engine) == expected[0]


def test_an_upsert_conflict_commits_nothing(spark, warehouse_path: Path) -> None:
    vector, _ = load("upsert_sequence.json")
    engine = SparkEngine(vector.circuit, warehouse_path, spark=spark)
    engine.step(vector.epochs[0])
    clash = {"accounts": [(1, "open", 99, 1, 0)]}  # same watermark as the stored row, new data
    with pytest.raises(UpsertConflict, match="id=1"):
        engine.step(clash)
    assert engine.last_committed_epoch() == 0
    assert not engine.catalog.batches(
        engine.circuit.name, f"n{engine.circuit.sources['accounts']}.input", epoch=1
    )
    # Fixed input completes the epoch.
    engine.run_epoch(1, vector.epochs[1])
    assert engine.last_committed_epoch() == 1


def test_bad_row_is_rejected_before_anything_runs(spark, warehouse_path: Path) -> None:
    vector, _ = load("join_bilinear.json")
    engine = SparkEngine(vector.circuit, warehouse_path, spark=spark)
    with pytest.raises(ValueError, match=r"source 'left'.*column 'k' is BIGINT"):
        engine.step({"left": [(("one", "x"), 1)]})
    assert engine.catalog.stage_runs(engine.circuit.name) == []


def test_postgres_catalog(spark, warehouse_path: Path, postgres_url: str) -> None:
    vector, expected = load("join_bilinear.json")
    engine = SparkEngine(vector.circuit, warehouse_path, spark=spark, catalog_url=postgres_url)
    for epoch, inputs in enumerate(vector.epochs):
        engine.step(inputs)
        assert rows(engine) == expected[epoch]
    assert not (warehouse_path / "catalog.db").exists()


def test_a_rebuild_while_an_epoch_is_open_keeps_that_epochs_change(
    spark, warehouse_path: Path
) -> None:
    """Issue 18, finding 7: a rebuild (as of the last committed epoch) between an open
    epoch's publish and its close replaced the open epoch's published change as well, so
    the close committed the epoch without it."""
    vector, expected = load("word_count_retractions.json")
    engine = SparkEngine(vector.circuit, warehouse_path, spark=spark)
    engine.step(vector.epochs[0])
    # Epoch 1 runs up to its publish; its close is still to come (a failed close task).
    assert engine.open_epoch(1)
    for stage in engine.plan.stages_in_scope(0):
        anchor = engine.circuit.node(stage.anchor)
        if anchor.op in ("zset_source", "upsert_source"):
            engine.ingest(anchor.label, 1, vector.epochs[1].get(anchor.label))
        else:
            engine.run_stage(stage.id, (1,))
    engine.publish(1)
    assert engine.rebuild("counts") == len(expected[0]["counts"])
    assert rows(engine) == expected[0]  # as of epoch 0, rebuilt
    engine.close_epoch(1)
    assert rows(engine) == expected[1]
    assert all(not diff for diff in engine.verify().values())
