"""Compaction in the background (``BackgroundCompaction``): the same merges as in the
foreground, in another thread, while the next epoch runs; its files kept by garbage
collection while it works; its failure raised at the next close, and made up for by the
compaction after it."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from dbspark.engine.spark.executor import SparkEngine
from dbspark.engine.spark.maintenance import Maintenance
from dbspark.examples.circuits import NAMED_CIRCUITS
from dbspark.storage import garbage_collect
from dbspark.storage.traces import TraceStore


def _epochs(n: int) -> list[dict[str, list[Any]]]:
    """Orders that come, change and go, and customers that move region."""
    epochs = []
    for e in range(n):
        orders = [(o, o % 5, 10 * e + o, e, None) for o in range(e, e + 6)]
        orders += [(o, o % 5, 0, e, e) for o in range(max(0, e - 4), e)]  # deleted
        customers = [(c, "EU" if (c + e) % 2 else "US", e, False) for c in range(5)]
        epochs.append({"orders": orders, "customers": customers})
    return epochs


def _live(engine: SparkEngine) -> list[tuple[str, tuple[int, ...], int]]:
    batches = engine.catalog.operator_batches(engine.circuit.name)
    return sorted((b.collection, tuple(b.time), b.rows) for b in batches if b.kind == "trace")


def _in_thread() -> bool:
    return threading.current_thread().name.startswith("dbspark-compaction")


def test_the_background_compacts_as_the_foreground_does(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DBSPARK_COMPACTION_FANOUT", "2")  # a merge at most epochs
    threads: set[str] = set()
    merge = TraceStore.commit_merge

    def noted(self: TraceStore, *args: Any, **kwargs: Any) -> Any:
        threads.add(threading.current_thread().name)
        return merge(self, *args, **kwargs)

    monkeypatch.setattr(TraceStore, "commit_merge", noted)
    engines = {
        background: SparkEngine(
            NAMED_CIRCUITS["orders"](),
            tmp_path / str(background),
            spark=lambda: spark,
            background_compaction=background,
        )
        for background in (False, True)
    }
    for batch in _epochs(12):
        for engine in engines.values():
            engine.run_epoch(engine.last_committed_epoch() + 1, batch)
    quiet, busy = engines[False], engines[True]
    busy.wait_for_compaction()
    assert any(name.startswith("dbspark-compaction") for name in threads), threads
    assert busy._background is not None and busy._background.seconds > 0
    assert _live(busy) == _live(quiet)  # the same merges, committed
    assert busy.views() == quiet.views()
    assert busy.verify(tier="local") == {name: [] for name in busy.circuit.views}


def test_garbage_collection_keeps_what_a_compaction_in_the_background_writes(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DBSPARK_COMPACTION_FANOUT", "2")
    written, release = threading.Event(), threading.Event()
    merge = TraceStore.commit_merge

    def paused(self: TraceStore, *args: Any, **kwargs: Any) -> Any:
        if _in_thread() and not release.is_set():
            written.set()  # its batch is on disk, not yet in the catalog
            assert release.wait(60)
        return merge(self, *args, **kwargs)

    monkeypatch.setattr(TraceStore, "commit_merge", paused)
    engine = SparkEngine(
        NAMED_CIRCUITS["orders"](), tmp_path / "wh", spark=lambda: spark, background_compaction=True
    )
    epochs = iter(_epochs(8))
    while not written.wait(5):
        engine.run_epoch(engine.last_committed_epoch() + 1, next(epochs))
    report = garbage_collect(engine.root, engine.catalog, min_age_seconds=0)
    release.set()
    engine.wait_for_compaction()
    assert report.kept, "the compaction's unregistered batch was not kept"
    for batch in engine.catalog.operator_batches(engine.circuit.name):
        assert (engine.root / batch.path).is_dir(), batch.path
    for rest in epochs:
        engine.run_epoch(engine.last_committed_epoch() + 1, rest)
    assert engine.verify(tier="local") == {name: [] for name in engine.circuit.views}


def test_a_failed_compaction_is_raised_at_the_next_close_and_made_up_for(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DBSPARK_COMPACTION_FANOUT", "2")
    compact = Maintenance.compact
    failures = [1]

    def failing(self: Any, epoch: int) -> None:
        if _in_thread() and failures:
            failures.pop()
            raise OSError(28, "No space left on device")
        compact(self, epoch)

    monkeypatch.setattr(Maintenance, "compact", failing)
    engine = SparkEngine(
        NAMED_CIRCUITS["orders"](), tmp_path / "wh", spark=lambda: spark, background_compaction=True
    )
    epochs = _epochs(8)
    engine.run_epoch(0, epochs[0])  # its compaction fails in the thread
    with pytest.raises(OSError, match="No space left on device"):
        engine.run_epoch(1, epochs[1])  # committed; its close reports the failure
    assert engine.last_committed_epoch() == 1
    for epoch in range(2, 8):
        engine.run_epoch(epoch, epochs[epoch])
    engine.wait_for_compaction()
    assert engine.verify(tier="local") == {name: [] for name in engine.circuit.views}
    frontiers = engine.catalog.frontiers(engine.circuit.name)
    assert frontiers and all(f[0][0] == 7 for f in frontiers.values()), frontiers


def test_a_compaction_that_loses_the_race_to_another_steps_aside(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two compactions of one epoch (a worker's in the background and another process's):
    the one that commits second finds its batches superseded, deletes its files and
    goes on, instead of failing the close it ran in."""
    monkeypatch.setenv("DBSPARK_COMPACTION_FANOUT", "2")
    root = tmp_path / "wh"
    engine = SparkEngine(NAMED_CIRCUITS["orders"](), root, spark=lambda: spark)
    rival = SparkEngine(NAMED_CIRCUITS["orders"](), root, spark=lambda: spark)
    merge = TraceStore.commit_merge
    raced: list[int] = []

    def beaten(self: TraceStore, collection: str, frontier: Any, stage: str, meet: Any, *rest: Any):
        if self is engine.traces and not raced:
            raced.append(meet[0])
            rival.compact(meet[0])  # commits the same merges first
        return merge(self, collection, frontier, stage, meet, *rest)

    monkeypatch.setattr(TraceStore, "commit_merge", beaten)
    for epoch, batch in enumerate(_epochs(6)):
        engine.run_epoch(epoch, batch)
    assert raced, "no compaction merged anything"
    garbage_collect(root, engine.catalog, min_age_seconds=0)
    for batch in engine.catalog.operator_batches(engine.circuit.name):
        assert (root / batch.path).is_dir(), batch.path
    assert engine.verify(tier="local") == {name: [] for name in engine.circuit.views}
