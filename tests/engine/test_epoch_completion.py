"""An epoch commits only when every unit it planned committed, and a unit runs only after
the units it reads (issue 18, finding 6). A task marked done without running (Airflow's
"mark success") used to let the epoch commit without its unit: a missing delta reads as
empty. On the local tier: no Spark session is started (one would fail the test)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dbspark.engine.reference.full_refresh import full_refresh
from dbspark.engine.spark.executor import SparkEngine
from dbspark.examples.circuits import reachability, word_count
from dbspark.storage.catalog import UncommittedUnits


def local_engine(circuit, warehouse: Path) -> SparkEngine:
    def no_spark():
        pytest.fail("these epochs are small: every unit must run on the local tier")

    return SparkEngine(circuit, warehouse, spark=no_spark)


def stage_named(engine: SparkEngine, prefix: str):
    (stage,) = [s for s in engine.plan.stages_in_scope(0) if s.name.startswith(prefix)]
    return stage


def test_a_stage_publish_and_close_refuse_before_their_units_committed(warehouse_path: Path):
    engine = local_engine(word_count(), warehouse_path)
    batch = [(("a",), 1), (("b",), 2)]
    assert engine.open_epoch(0)
    aggregate = stage_named(engine, "aggregate")
    distinct = stage_named(engine, "distinct")

    # The ingest's task was marked success without running: its readers refuse.
    with pytest.raises(UncommittedUnits, match=f"stage {aggregate.name} of circuit") as err:
        engine.run_stage(aggregate.id, (0,))
    assert err.value.missing == ["ingest_words"]
    assert "ingest_words" in str(err.value) and "Nothing was written" in str(err.value)
    with pytest.raises(UncommittedUnits, match="publish of circuit 'word_count'") as err:
        engine.publish(0)
    assert err.value.missing == ["ingest_words", aggregate.name, distinct.name]
    with pytest.raises(UncommittedUnits, match="epoch 0 of circuit 'word_count' cannot") as err:
        engine.close_epoch(0)
    assert err.value.missing == ["ingest_words", aggregate.name, distinct.name, "publish"]
    assert engine.catalog.stage_runs("word_count") == []

    engine.ingest("words", 0, batch)
    engine.run_stage(aggregate.id, (0,))
    # A stage and the publish were skipped: the close names exactly them.
    with pytest.raises(UncommittedUnits) as err:
        engine.close_epoch(0)
    assert err.value.missing == [distinct.name, "publish"]
    assert engine.catalog.epoch_state("word_count", 0) == "open"
    assert engine.last_committed_epoch() == -1

    engine.run_stage(distinct.id, (0,))
    engine.publish(0)
    engine.close_epoch(0)
    assert engine.views() == full_refresh(word_count(), [{"words": batch}], 0)


def test_a_loop_and_its_reader_refuse_before_their_units_committed(warehouse_path: Path):
    circuit = reachability()
    engine = local_engine(circuit, warehouse_path)
    inputs = {"edges": [(("a", "b"), 1), (("b", "c"), 1)], "roots": [(("a",), 1)]}
    loop = next(iter(engine.plan.loops.values()))
    leave = stage_named(engine, "leave")
    assert engine.open_epoch(0)
    with pytest.raises(UncommittedUnits, match="loop reach of circuit") as err:
        engine.run_iteration(loop, (0,))
    assert err.value.missing == ["ingest_edges", "ingest_roots"]
    for source, batch in inputs.items():
        engine.ingest(source, 0, batch)
    with pytest.raises(UncommittedUnits, match=f"stage {leave.name}") as err:
        engine.run_stage(leave.id, (0,))
    assert err.value.missing == ["loop:reach"]
    engine.run_iteration(loop, (0,))  # one iteration: not converged yet
    with pytest.raises(UncommittedUnits, match=r"loop:reach \(not converged\)"):
        engine.close_epoch(0)

    engine.run_loop(loop, (0,))
    for stage in engine.plan.stages_in_scope(0):
        if not stage.name.startswith("ingest_"):
            engine.run_stage(stage.id, (0,))
    engine.publish(0)
    engine.close_epoch(0)
    assert engine.views() == full_refresh(circuit, [inputs], 0)
