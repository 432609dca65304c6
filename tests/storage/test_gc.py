"""A crash between writing files and committing them leaves only garbage, which GC removes."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa

from dbspark.storage import BatchRecord, Catalog, Warehouse, garbage_collect

DATA = "k long, v string, __epoch long, __w long"


def catalog_rows(cat: Catalog) -> tuple:
    with cat.engine.connect() as conn:
        return tuple(
            sorted(map(tuple, conn.execute(sa.text(f"SELECT * FROM {t}"))), key=repr)
            for t in ("circuits", "epochs", "batches", "stage_runs", "frontiers")
        )


def test_a_crash_before_commit_leaves_garbage_that_gc_removes(
    spark, warehouse: Warehouse, local_catalog: Catalog
) -> None:
    cat = local_catalog
    cat.register_circuit("c", "fp")
    cat.open_epoch("c", 0)
    df = spark.createDataFrame([(1, "a", 0, 1), (2, "b", 0, 1)], DATA)

    kept = warehouse.write(df, "c", "n1.delta", "delta", (0,), bucket_by=["k"], buckets=4)
    assert kept is not None and cat.commit("c", "n1", (0,), [kept])

    # The "crashed" attempt of the next stage: files written, the commit never happens.
    lost = warehouse.write(df, "c", "n2.delta", "delta", (0,))
    assert lost is not None and (warehouse.root / lost.path).is_dir()
    before = catalog_rows(cat)
    assert not cat.stage_done("c", "n2", (0,))

    # A write younger than min_age may be in flight: it is left alone.
    report = garbage_collect(warehouse, cat, min_age_seconds=3600)
    assert report.unregistered_dirs == []
    assert (warehouse.root / lost.path).is_dir()

    report = garbage_collect(warehouse, cat, min_age_seconds=0)
    assert report.unregistered_dirs == [lost.path]
    assert report.bytes_freed >= lost.bytes
    assert not (warehouse.root / lost.path).exists()
    assert not (warehouse.root / "c" / "n2.delta").exists()  # empty folders go too
    assert (warehouse.root / kept.path).is_dir()
    assert (warehouse.root / "catalog.db").is_file()
    assert catalog_rows(cat) == before  # the catalog is untouched

    # The retried stage writes afresh and commits; the committed data reads back.
    again = warehouse.write(df, "c", "n2.delta", "delta", (0,))
    assert again is not None and again.path != lost.path
    assert cat.commit("c", "n2", (0,), [again])
    assert garbage_collect(warehouse, cat, min_age_seconds=0).unregistered_dirs == []
    got = warehouse.read(spark, cat.batches("c", "n2.delta"), df.schema)
    assert sorted(map(tuple, got.collect())) == [(1, "a", 0, 1), (2, "b", 0, 1)]


def test_gc_removes_superseded_batches_files_and_rows(
    spark, warehouse: Warehouse, local_catalog: Catalog
) -> None:
    cat = local_catalog
    cat.register_circuit("c", "fp")
    df = spark.createDataFrame([(1, "a", 0, 1)], DATA)
    old = [warehouse.write(df, "c", "t", "trace", (e,)) for e in range(2)]
    for e, rec in enumerate(old):
        assert rec is not None and cat.commit("c", f"a{e}", (e,), [rec])
    ids = [b.id for b in cat.batches("c", "t")]
    merged = warehouse.write(df, "c", "t", "trace", (1,))
    assert merged is not None
    assert cat.commit("c", "compact:t", (1,), [merged], supersede=ids)

    # Not yet: the compaction is younger than min_age (a reader may still use the old ones).
    assert garbage_collect(warehouse, cat, min_age_seconds=3600).superseded_batches == []
    assert all((warehouse.root / r.path).is_dir() for r in old if r)

    report = garbage_collect(warehouse, cat, min_age_seconds=0)
    assert sorted(report.superseded_batches) == sorted(ids)
    assert not any((warehouse.root / r.path).exists() for r in old if r)
    assert [b.path for b in cat.all_batches("c")] == [merged.path]
    assert (warehouse.root / merged.path).is_dir()


# --- issue 18, finding 4: a safe minimum age on the database's clock, and leases --------


def _batch(root: Path, circuit: str, collection: str, time: tuple[int, ...]) -> BatchRecord:
    """A batch directory holding one small Parquet file, not yet registered."""
    rel = Warehouse(root).new_path(circuit, collection, "trace", time)
    (root / rel).mkdir(parents=True)
    pq.write_table(pa.table({"k": [1, 2]}), root / rel / "part-0.parquet")
    return BatchRecord(circuit, collection, "trace", time, rel, rows=2, bytes=1)


@pytest.fixture
def leased(catalog_url: str, tmp_path: Path) -> Iterator[tuple[Catalog, Path]]:
    root = tmp_path / "wh"
    root.mkdir()
    cat = Catalog(catalog_url, warehouse=root)
    cat.register_circuit("c", "fp")
    yield cat, root
    cat.close()


def test_gc_deletes_nothing_young_by_default(leased: tuple[Catalog, Path]) -> None:
    cat, root = leased
    orphan = _batch(root, "c", "n1.delta", (0,))
    old = _batch(root, "c", "t", (0,))
    assert cat.commit("c", "a", (0,), [old])
    (old_id,) = [b.id for b in cat.batches("c", "t")]
    assert cat.commit("c", "compact:t", (0,), [], supersede=[old_id])
    # min_age_seconds used to default to 0: a running unit's files went at once.
    report = garbage_collect(root, cat)
    assert report.unregistered_dirs == [] and report.superseded_batches == []
    assert report.kept == [orphan.path]
    assert (root / orphan.path).is_dir() and (root / old.path).is_dir()


def test_gc_measures_age_on_the_database_clock_not_mtimes(leased: tuple[Catalog, Path]) -> None:
    cat, root = leased
    ahead = _batch(root, "c", "n1.delta", (0,))  # written by a host whose clock runs ahead
    behind = _batch(root, "c", "n2.delta", (0,))  # ... and one whose clock runs behind
    for path, stamp in ((ahead.path, 4_102_444_800), (behind.path, 0)):  # 2100, 1970
        for p in [root / path, *(root / path).rglob("*")]:
            os.utime(p, (stamp, stamp))
    # First seen now: neither is old yet, whatever its mtime says (the old rule deleted
    # the 1970 one at once and kept the 2100 one until 2100).
    assert garbage_collect(root, cat, min_age_seconds=1).kept == sorted([ahead.path, behind.path])
    time.sleep(1.2)
    report = garbage_collect(root, cat, min_age_seconds=1)
    assert sorted(report.unregistered_dirs) == sorted([ahead.path, behind.path])
    assert not (root / ahead.path).exists() and not (root / behind.path).exists()


def test_a_lease_keeps_a_units_files_and_the_batches_it_may_read(
    leased: tuple[Catalog, Path],
) -> None:
    cat, root = leased
    before = _batch(root, "c", "t", (0,))
    assert cat.commit("c", "a", (0,), [before])
    # Superseded before any lease: no unit at work can have planned against it.
    assert cat.commit(
        "c", "compact:early", (0,), [], supersede=[b.id for b in cat.batches("c", "t")]
    )
    read = _batch(root, "c", "t", (1,))
    assert cat.commit("c", "b", (1,), [read])

    reader = cat.acquire_lease("c", "stage join_6 at epoch 2 (reads t)")
    writer = cat.acquire_lease("c", "ingest orders at epoch 2")
    assert [lease.holder for lease in cat.leases("c")] == [
        "stage join_6 at epoch 2 (reads t)",
        "ingest orders at epoch 2",
    ]
    written = _batch(root, "c", "n1.delta", (2,))  # the writer's, not committed yet
    # A compaction supersedes what the reader planned against.
    (read_id,) = [b.id for b in cat.batches("c", "t")]
    assert cat.commit("c", "compact:t", (1,), [], supersede=[read_id])

    report = garbage_collect(root, cat, min_age_seconds=0)
    assert report.superseded_batches != [] and not (root / before.path).exists()
    assert read_id not in report.superseded_batches and (root / read.path).is_dir()
    assert report.unregistered_dirs == [] and (root / written.path).is_dir()

    cat.release_lease(reader)
    report = garbage_collect(root, cat, min_age_seconds=0)
    # The writer's lease also started before the compaction: it may have read it too.
    assert report.superseded_batches == [] and (root / read.path).is_dir()
    assert (root / written.path).is_dir()  # the writer is still at work

    # The writer commits, then releases: its batch is registered, never garbage.
    assert cat.commit("c", "ingest.orders", (2,), [written])
    cat.release_lease(writer)
    report = garbage_collect(root, cat, min_age_seconds=0)
    assert report.superseded_batches == [read_id] and not (root / read.path).exists()
    assert report.unregistered_dirs == [] and (root / written.path).is_dir()

    # A unit that died: its lease expires (database clock) and its files go.
    cat.acquire_lease("c", "stage that dies", seconds=0.5)
    dead = _batch(root, "c", "n3.delta", (2,))
    assert garbage_collect(root, cat, min_age_seconds=0).kept == [dead.path]
    time.sleep(0.8)
    assert garbage_collect(root, cat, min_age_seconds=0).unregistered_dirs == [dead.path]
    assert cat.leases("c") == []


def test_gc_removes_leftover_unit_files(leased: tuple[Catalog, Path]) -> None:
    cat, root = leased
    units = root / "_units" / "c"
    units.mkdir(parents=True)
    (units / "a.unit.json").write_text("{}")
    (units / "a.result.json").write_text("{}")
    # What an ingest task killed during a large SQL pull leaves: its scratch folder.
    (units / "pull-1").mkdir()
    (units / "pull-1" / "part-00000.parquet").write_bytes(b"half")
    other = root / "_units" / "other"
    other.mkdir()
    (other / "b.unit.json").write_text("{}")  # another circuit's: not this GC's
    assert garbage_collect(root, cat, min_age_seconds=3600).unit_files == []
    report = garbage_collect(root, cat, min_age_seconds=0)
    assert sorted(report.unit_files) == [
        "_units/c/a.result.json",
        "_units/c/a.unit.json",
        "_units/c/pull-1",
    ]
    assert list(units.iterdir()) == [] and (other / "b.unit.json").exists()


def test_a_lease_replaces_the_leases_of_earlier_tries_only(leased: tuple[Catalog, Path]) -> None:
    """A task's try ends the leases its earlier tries could not release (the catalog was
    down when they ended), which kept their garbage for the lease's length; another
    process of the same try (a redelivery) and other tasks keep theirs."""
    cat, root = leased
    task = "task d/manual__2026_01_01/join_6[-1] try"  # '_' is no LIKE wildcard here
    cat.acquire_lease("c", f"{task} 1: stage unit")
    same = cat.acquire_lease("c", f"{task} 2: stage unit (redelivered)")
    other = cat.acquire_lease("c", "task d/manual__2026x01x01/join_6[-1] try 1: stage unit")
    orphan = _batch(root, "c", "n1.delta", (0,))  # written by try 1 after its lease began
    assert garbage_collect(root, cat, min_age_seconds=0).kept == [orphan.path]
    cat.release_lease(other)
    now = cat.acquire_lease("c", f"{task} 2: stage unit", replaces=[f"{task} 1: "])
    assert sorted(lease.id for lease in cat.leases("c")) == sorted([same, now])
    for lease in (same, now):
        cat.release_lease(lease)
    assert garbage_collect(root, cat, min_age_seconds=0).unregistered_dirs == [orphan.path]
