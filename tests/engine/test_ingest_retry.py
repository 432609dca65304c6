"""Retrying an ingest: the same batch is a no-op, a different one is refused; and a
view's change is readable between publish and close."""

from __future__ import annotations

import pytest

from dbspark.core.zset import ZSet
from dbspark.engine.api import EpochOrderError, InputError
from dbspark.engine.spark.executor import SparkEngine
from dbspark.examples.circuits import word_count


def test_a_committed_ingest_accepts_its_own_batch_again_and_refuses_another(spark, warehouse_path):
    engine = SparkEngine(word_count(), warehouse_path, spark=spark)
    engine.open_epoch(0, "day 0")
    batch = [(("a",), 1), (("b",), 2)]
    assert not engine.ingest("words", 0, batch).skipped
    again = engine.ingest("words", 0, [(("b",), 2), (("a",), 1)])  # same rows, other order
    assert again.skipped
    with pytest.raises(InputError, match="epoch 0 already ingested a different batch"):
        engine.ingest("words", 0, [(("a",), 1), (("b",), 3)])

    for stage in engine.plan.stages_in_scope(0)[1:]:
        engine.run_stage(stage.id, (0,))
    with pytest.raises(EpochOrderError, match="not published"):
        engine.view_change("counts", 0)
    engine.publish(0)
    change = engine.view_change("counts", 0).collect()
    assert {(r["word"], r["n"], r["__w"]) for r in change} == {("a", 1, 1), ("b", 2, 1)}
    assert engine.view_frame("counts", 0).count() == 2
    assert engine.views()["counts"] == ZSet()  # epoch 0 is not committed yet
    engine.close_epoch(0)
    with pytest.raises(EpochOrderError, match="is committed"):
        engine.view_change("counts", 0)
    assert engine.catalog.epoch_labels("word_count") == {0: "day 0"}
