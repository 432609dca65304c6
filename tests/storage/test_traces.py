"""Durable traces: compaction agrees with the core Trace, and storage stays bounded."""

from __future__ import annotations

from collections import defaultdict

import pytest
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

from dbspark.core.antichain import Antichain
from dbspark.core.timestamps import less_equal
from dbspark.core.trace import Trace
from dbspark.storage import BatchRecord, CatalogError, TraceStore, garbage_collect, time_columns
from dbspark.storage.traces import _tiered_choice, log_merge_runs

NESTED = StructType(
    [
        StructField("k", LongType(), True),
        StructField("v", StringType(), True),
        StructField("__epoch", LongType(), False),
        StructField("__iter", IntegerType(), False),
        StructField("__w", LongType(), False),
    ]
)
FLAT = StructType([f for f in NESTED.fields if f.name != "__iter"])
DATA = "k long, v string, __w long"


def updates_of(df) -> dict[tuple, int]:
    """Consolidated ``(row, time) -> weight`` of a trace DataFrame (user columns k, v)."""
    tcols = [c for c in df.columns if c.startswith(("__epoch", "__iter"))]
    out: dict[tuple, int] = defaultdict(int)
    for r in df.collect():
        out[((r["k"], r["v"]), tuple(r[c] for c in tcols))] += r["__w"]
    return {key: w for key, w in out.items() if w}


def accumulate(updates: dict[tuple, int], t: tuple[int, ...]) -> dict[tuple, int]:
    out: dict[tuple, int] = defaultdict(int)
    for (row, time), w in updates.items():
        if all(a <= b for a, b in zip(time, t, strict=True)):
            out[row] += w
    return {row: w for row, w in out.items() if w}


# Updates at nested times (epoch, iteration), with cancellations across times.
NESTED_UPDATES = [
    ((1, "a"), (0, 0), 1),
    ((2, "b"), (0, 0), 1),
    ((1, "a"), (0, 1), -1),
    ((1, "a2"), (0, 1), 1),
    ((3, "c"), (0, 2), 2),
    ((2, "b"), (1, 0), -1),
    ((1, "a"), (1, 0), 1),
    ((3, "c"), (1, 1), -1),
    ((None, "n"), (1, 1), 1),
    ((1, "a2"), (1, 2), -1),
    ((2, "b"), (2, 0), 1),
    ((3, "c"), (2, 1), -1),
    ((4, "d"), (2, 2), 1),
]


def load(store: TraceStore, collection: str, updates) -> Trace:
    """Append the updates, one batch per time, and build the same core Trace."""
    by_time: dict[tuple, list] = defaultdict(list)
    for row, t, w in updates:
        by_time[t].append((*row, w))
    for t, rows in sorted(by_time.items()):
        # Unbucketed (cheaper to write): compaction output is bucketed either way.
        assert store.append(collection, store.spark.createDataFrame(rows, DATA), t)
    trace = Trace()
    trace.extend(updates)
    return trace


def test_compaction_matches_the_core_trace(store: TraceStore) -> None:
    trace = load(store, "n5.trace", NESTED_UPDATES)
    before = updates_of(store.read("n5.trace", NESTED))
    assert before == {(row, t): w for row, t, w in trace.updates()}

    # A two-element frontier first (the least upper bounds of its elements matter),
    # then frontiers further on: each step must agree with the core Trace's compact.
    for frontier in ([(1, 2), (2, 0)], [(2, 0)], [(3, 0)]):
        f = Antichain(frontier)
        n_before = len(store.batches("n5.trace"))
        result = store.compact("n5.trace", f, NESTED, ["k"], time_columns(2))
        assert result is not None and result.committed and result.output is not None
        trace.compact(f)

        after = updates_of(store.read("n5.trace", NESTED))
        assert after == {(row, t): w for row, t, w in trace.updates()}, frontier
        # Accumulations at times beyond the frontier are unchanged.
        for t in [(1, 2), (1, 5), (2, 0), (2, 1), (2, 2), (3, 0), (3, 5)]:
            if f.less_equal(t):
                assert accumulate(after, t) == accumulate(before, t), (frontier, t)
        # What was not beyond the frontier became one batch, with the batches of the
        # frontier's own epoch (merged as they are); the rest was left alone.
        live = store.batches("n5.trace")
        assert len(live) == n_before - len(result.inputs) + 1
        assert [b.path for b in live if not f.less_equal(b.time)] in ([], [result.output.path])
        assert store.catalog.frontier("c", "n5.trace") == sorted(frontier)
        # Every row of the new batch is at or after the batch's time (readers rely on it).
        out = updates_of(store.warehouse.read(store.spark, [result.output], NESTED))
        assert all(less_equal(result.output.time, t) for (_, t) in out)

    # Reading up to a time sees exactly the accumulation there.
    got = updates_of(store.read("n5.trace", NESTED, max_time=(3, 1)))
    assert accumulate(got, (3, 1)) == accumulate(before, (3, 1))
    assert store.read("n5.trace", NESTED, max_time=(2, 9)).count() == 0  # all in epoch 3 now

    # Again at the same frontier: nothing to do. A frontier going backwards: refused.
    assert store.compact("n5.trace", Antichain([(3, 0)]), NESTED, ["k"], time_columns(2)) is None
    with pytest.raises(ValueError, match="backwards"):
        store.compact("n5.trace", Antichain([(2, 5)]), NESTED, ["k"], time_columns(2))


def test_storage_tracks_the_collection_not_the_number_of_epochs(store: TraceStore) -> None:
    keys, epochs = 5, 6
    spark = store.spark
    live_batches, live_rows, dirs_on_disk = [], [], []
    for e in range(epochs):
        rows = [(k, f"v{e}", 1) for k in range(keys)]
        if e:
            rows += [(k, f"v{e - 1}", -1) for k in range(keys)]
        store.append("hot.trace", spark.createDataFrame(rows, DATA), (e,), ["k"])
        store.compact("hot.trace", Antichain([(e,)]), FLAT, ["k"], time_columns(1))
        garbage_collect(store.warehouse, store.catalog, min_age_seconds=0)
        batches = store.batches("hot.trace")
        live_batches.append(len(batches))
        live_rows.append(sum(b.rows for b in batches))
        dirs_on_disk.append(len(list(store.warehouse.root.glob("c/hot.trace/*/t=*/*"))))

    assert max(live_batches) <= 2, live_batches
    assert max(live_rows) <= 3 * keys, live_rows
    assert dirs_on_disk == live_batches  # superseded files are gone from disk
    assert len(store.catalog.all_batches("c")) == live_batches[-1]  # and from the catalog
    final = accumulate(updates_of(store.read("hot.trace", FLAT)), (epochs,))
    assert final == {(k, f"v{epochs - 1}"): 1 for k in range(keys)}


def test_append_is_idempotent_and_empty_appends_commit(store: TraceStore) -> None:
    df = store.spark.createDataFrame([(1, "a", 1)], DATA)
    assert store.append("t", df, (0,), ["k"]) is True
    assert store.append("t", df, (0,), ["k"]) is False  # the retried task does nothing
    assert len(store.batches("t")) == 1
    empty = store.spark.createDataFrame([], DATA)
    assert store.append("t", empty, (1,), ["k"]) is True
    assert store.catalog.stage_done("c", "append:t", (1,))
    assert len(store.batches("t")) == 1
    assert updates_of(store.read("t", FLAT)) == {((1, "a"), (0,)): 1}
    keys = store.spark.createDataFrame([(1,), (2,)], "k long")
    assert updates_of(store.read("t", FLAT, keys=keys, bucket_by=["k"])) == {((1, "a"), (0,)): 1}


def test_an_epochs_iteration_batches_merge_at_its_close(store: TraceStore) -> None:
    """A loop writes a batch per iteration, each larger than the ones before (which the
    binary counter alone never merges); closing the epoch merges them into one batch,
    rows keeping their iterations, so later reads open one batch per epoch."""
    updates = [((k, "a"), (0, i), 1) for i in range(4) for k in range(2**i)]
    load(store, "loop.trace", updates)
    before = updates_of(store.read("loop.trace", NESTED))
    assert len(store.batches("loop.trace")) == 4
    result = store.compact(
        "loop.trace", Antichain([(0, 0)]), NESTED, ["k"], time_columns(2), tiered=True
    )
    assert result is not None and result.committed and len(result.inputs) == 4
    assert len(store.batches("loop.trace")) == 1
    assert updates_of(store.read("loop.trace", NESTED)) == before


def test_tiered_choice_merges_like_a_binary_counter() -> None:
    def b(i: int, rows: int) -> BatchRecord:
        return BatchRecord("c", "t", "trace", (0,), f"p{i}", rows=rows, bytes=rows, id=i)

    def ids(bs) -> list[int]:
        return sorted(x.id for x in _tiered_choice(bs))

    big = b(1, 1_000_000)
    assert ids([big, b(2, 100), b(3, 100)]) == [2, 3]
    assert ids([big, b(2, 40), b(3, 38)]) == [2, 3]  # about one size: merged
    assert ids([big, b(2, 300), b(3, 100)]) == []  # nothing to merge yet
    assert ids([big, b(2, 300), b(3, 100), b(4, 100)]) == [3, 4]  # 200: below 300's class
    assert ids([b(1, 300), b(2, 200), b(3, 100), b(4, 100)]) == [1, 2, 3, 4]  # carried
    # A small first epoch rides along with the class above it (it once blocked all merges).
    assert ids([big, b(2, 16), b(3, 41), b(4, 46), b(5, 57)]) == [2, 3, 4, 5]
    assert ids([b(2, 5)]) == [] and ids([]) == []
    # Base 4: a class merges once it holds four, and carries into one that then holds four.
    assert sorted(x.id for x in _tiered_choice([big, b(2, 100), b(3, 100), b(4, 100)], 4)) == []
    four = [b(i, 100) for i in range(2, 6)]
    assert sorted(x.id for x in _tiered_choice([big, *four], 4)) == [2, 3, 4, 5]
    carried = [b(6, 400), b(7, 400), b(8, 450), *four]
    assert sorted(x.id for x in _tiered_choice(carried, 4)) == [2, 3, 4, 5, 6, 7, 8]


@pytest.mark.parametrize("fanout", [2, 4])
def test_tiered_merges_keep_the_live_batches_logarithmic(fanout: int) -> None:
    """A steady stream of epochs of about one size, compacted at each close as the engine
    does (the epoch's own batch is not yet under the frontier): the live batches stay
    logarithmic in the epochs, and each row is rewritten a logarithmic number of times,
    fewer with a larger fanout."""
    import math
    import random

    rng = random.Random(3)
    live: list[BatchRecord] = []
    rewritten = 0
    for epoch in range(2000):
        rows = rng.randrange(35, 46)
        batch = BatchRecord(
            "c", "t", "trace", (epoch,), f"p{epoch}", rows=rows, bytes=rows, id=epoch
        )
        live.append(batch)
        chosen = _tiered_choice(live[:-1], fanout)
        if len(chosen) > 1:
            merged = sum(x.rows for x in chosen)
            rewritten += merged
            live = [x for x in live if x not in chosen]
            merged_batch = BatchRecord(
                "c", "t", "trace", (epoch,), "m", rows=merged, bytes=merged, id=-epoch
            )
            live.insert(0, merged_batch)
        assert len(live) <= 2 * math.log2(epoch + 2) + 3, (epoch, [x.rows for x in live])
    total = sum(x.rows for x in live)
    assert rewritten <= total * 2 * math.log2(2000) / math.log2(fanout)


def test_a_refused_compaction_leaves_no_files(store: TraceStore, monkeypatch) -> None:
    spark = store.spark
    for e in range(2):
        store.append("t", spark.createDataFrame([(1, f"v{e}", 1)], DATA), (e,))
    stale = store.catalog.batches("c", "t", kind="trace")
    assert store.compact("t", Antichain([(1,)]), FLAT, ["k"], time_columns(1))
    before = store.catalog.all_batches("c")
    dirs = sorted(store.warehouse.root.glob("c/t/*/t=*/*"))

    # A compaction planned against batches that another one has just superseded (a
    # race between two workers): its commit is refused and its output deleted at once.
    monkeypatch.setattr(store.catalog, "live_batches", lambda *a, **k: stale)
    with pytest.raises(CatalogError, match="supersedes batches"):
        store.compact("t", Antichain([(2,)]), FLAT, ["k"], time_columns(1))
    assert store.catalog.all_batches("c") == before
    assert sorted(store.warehouse.root.glob("c/t/*/t=*/*")) == dirs


def test_the_compaction_fanout_is_a_setting(monkeypatch) -> None:
    from dbspark.storage.traces import compaction_fanout

    monkeypatch.delenv("DBSPARK_COMPACTION_FANOUT", raising=False)
    assert compaction_fanout() == 4
    monkeypatch.setenv("DBSPARK_COMPACTION_FANOUT", "2")
    assert compaction_fanout() == 2
    for bad in ("1", "four", "-3"):
        monkeypatch.setenv("DBSPARK_COMPACTION_FANOUT", bad)
        with pytest.raises(ValueError, match="DBSPARK_COMPACTION_FANOUT must be an integer >= 2"):
            compaction_fanout()


def test_log_merge_runs_keep_epochs_in_order_and_the_log_logarithmic() -> None:
    """A raw input log's merges take neighbouring epochs only (an upsert replay compares
    each epoch with the winners before it), whatever the batches' sizes; over many
    maintenance passes the live batches stay logarithmic and each row is rewritten a
    logarithmic number of times."""
    import math
    import random

    rng = random.Random(5)
    live: list[BatchRecord] = []
    rewritten = 0
    next_id = 0
    for epoch in range(3000):
        rows = rng.choice([1, 3, 40, 500, 7]) if epoch else 100_000
        live.append(
            BatchRecord("c", "n0.input", "trace", (epoch,), "p", rows=rows, bytes=rows, id=next_id)
        )
        next_id += 1
        if epoch % 10:
            continue
        ordered = sorted(live, key=lambda b: b.time)
        for run in log_merge_runs(live):
            at = [ordered.index(b) for b in run]
            assert at == list(range(at[0], at[0] + len(run))), "a run skips an epoch"
            rows = sum(b.rows for b in run)
            rewritten += rows
            merged = BatchRecord(
                "c", "n0.input", "trace", run[-1].time, "p", rows=rows, bytes=rows, id=next_id
            )
            next_id += 1
            live = [b for b in live if b not in run] + [merged]
    total = sum(b.rows for b in live)
    assert len(live) <= 3 * math.log2(total), len(live)
    assert rewritten <= 3 * total * math.log2(3000)
    # Sizes fall from the oldest run to the newest, so a new small batch never drags an
    # old large one into a rewrite.
    assert (
        log_merge_runs(
            [
                BatchRecord("c", "l", "trace", (0,), "p", rows=1000, bytes=1, id=1),
                BatchRecord("c", "l", "trace", (1,), "p", rows=10, bytes=1, id=2),
            ]
        )
        == []
    )
