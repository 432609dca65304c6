"""``python -m dbspark.devtools.engine_demo``: every example circuit runs and verifies on
the reference engine; on Spark, state persists in the warehouse, a second run
of the same epochs does nothing, more epochs continue from the catalog, and a view that
disagrees with full refresh makes the demo fail (so its verification can fail)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dbspark.devtools.engine_demo import SCENARIOS, main
from dbspark.engine.spark.executor import SparkEngine
from dbspark.examples.circuits import NAMED_CIRCUITS


def test_every_circuit_verifies_on_the_reference_engine(capsys) -> None:
    assert main(["--engine", "reference", "--epochs", "6"]) == 0
    out = capsys.readouterr().out
    assert out.count("verified against full refresh") == 6 * len(SCENARIOS)
    assert "MISMATCH" not in out
    assert "loop reach at time [2]" in out  # the loop explains itself


@pytest.mark.slow
def test_spark_demo_persists_continues_and_fails_on_a_wrong_view(
    spark, tmp_path: Path, capsys
) -> None:
    warehouse = tmp_path / "demo"
    args = ["--circuit", "word_count", "--warehouse", str(warehouse)]
    assert main([*args, "--epochs", "2"]) == 0
    first = capsys.readouterr().out
    assert "word_count, epoch 1:" in first
    assert first.count("verified against full refresh (Spark") == 2

    # The same epochs again: nothing runs, the views are shown as they stand.
    assert main([*args, "--epochs", "2"]) == 0
    again = capsys.readouterr().out
    assert "epochs 0..1 are already committed" in again
    assert "verified against full refresh" not in again

    # Damage the published view behind the engine's back; the next epoch must fail.
    engine = SparkEngine(NAMED_CIRCUITS["word_count"](), warehouse, spark=spark)
    bogus = spark.createDataFrame(
        [("zebra", 1, 1, 1)], "word string, n bigint, __w bigint, __epoch bigint"
    )
    record = engine.traces.write("view.counts", bogus, (1,))
    engine.catalog.commit("word_count", "damage", (1,), [record])
    assert main([*args, "--epochs", "3"]) == 1
    damaged = capsys.readouterr().out
    assert "epochs 0..1: already committed" in damaged
    assert "word_count, epoch 2:" in damaged and "word_count, epoch 0:" not in damaged
    assert "MISMATCH" in damaged and "zebra" in damaged
    assert engine.last_committed_epoch() == 2
