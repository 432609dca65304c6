"""A crash between writing files and committing them leaves only garbage, which GC removes."""

from __future__ import annotations

import sqlalchemy as sa

from dbspark.storage import Catalog, Warehouse, garbage_collect

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

    report = garbage_collect(warehouse, cat)
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
    assert garbage_collect(warehouse, cat).unregistered_dirs == []
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

    report = garbage_collect(warehouse, cat)
    assert sorted(report.superseded_batches) == sorted(ids)
    assert not any((warehouse.root / r.path).exists() for r in old if r)
    assert [b.path for b in cat.all_batches("c")] == [merged.path]
    assert (warehouse.root / merged.path).is_dir()
