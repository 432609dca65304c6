"""Commit groups (``Catalog.grouped``): an epoch's units in one process commit in one
transaction and one fsync pass, each keeping its own checks, and what committed stays
committed when the block fails."""

from __future__ import annotations

import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dbspark.storage import BatchRecord, Catalog, CatalogError, Warehouse, durability
from dbspark.storage import catalog as catalog_module


def _batch(root: Path, stage: str, t: tuple[int, ...]) -> BatchRecord:
    rel = Warehouse(root).new_path("c", f"{stage}.out", "delta", t)
    (root / rel).mkdir(parents=True)
    pq.write_table(pa.table({"k": [1]}), root / rel / "part-0.parquet")
    return BatchRecord("c", f"{stage}.out", "delta", t, rel, rows=1, bytes=1)


def _seen_elsewhere(cat: Catalog, stage: str) -> bool:
    """Whether a commit is visible to another thread (another connection)."""
    seen: list[bool] = []
    thread = threading.Thread(target=lambda: seen.append(cat.stage_done("c", stage, (0,))))
    thread.start()
    thread.join()
    return seen[0]


def test_grouped_commits_are_read_back_at_once_and_visible_to_others_at_the_end(
    catalog: Catalog,
) -> None:
    catalog.register_circuit("c", "fp")
    with catalog.grouped():
        catalog.open_epoch("c", 0)
        assert catalog.commit("c", "a", (0,))
        assert catalog.stage_done("c", "a", (0,))  # this thread reads what it wrote
        assert not catalog.commit("c", "a", (0,))  # and a repeat is still refused
        assert not _seen_elsewhere(catalog, "a")
        assert catalog.commit("c", "b", (0,))
        assert catalog.commit_epoch("c", 0, stages=["a", "b"])
    assert _seen_elsewhere(catalog, "a") and _seen_elsewhere(catalog, "b")
    assert catalog.epoch_state("c", 0) == "committed"


def test_a_failed_commit_in_a_group_undoes_only_itself(catalog: Catalog) -> None:
    catalog.register_circuit("c", "fp")
    with catalog.grouped():
        assert catalog.commit("c", "a", (0,))
        with pytest.raises(CatalogError, match="supersedes batches"):
            catalog.commit("c", "b", (0,), supersede=[12345])
        assert not catalog.stage_done("c", "b", (0,))
        assert catalog.commit("c", "c", (0,))
    assert [s for s, _ in catalog.stage_runs("c")] == ["a", "c"]


def test_what_committed_in_a_group_stays_committed_when_the_block_fails(
    catalog: Catalog,
) -> None:
    catalog.register_circuit("c", "fp")
    with pytest.raises(RuntimeError, match="a later unit failed"), catalog.grouped():
        assert catalog.commit("c", "a", (0,))
        raise RuntimeError("a later unit failed")
    assert _seen_elsewhere(catalog, "a")


def test_flush_makes_the_group_visible_and_the_group_goes_on(catalog: Catalog) -> None:
    catalog.register_circuit("c", "fp")
    with catalog.grouped():
        assert catalog.commit("c", "a", (0,))
        catalog.flush()
        assert _seen_elsewhere(catalog, "a")
        assert catalog.commit("c", "b", (0,))
        assert not _seen_elsewhere(catalog, "b")
    assert _seen_elsewhere(catalog, "b")
    catalog.flush()  # outside a group: nothing to do


def test_groups_do_not_nest(catalog: Catalog) -> None:
    with catalog.grouped(), pytest.raises(CatalogError, match="do not nest"), catalog.grouped():
        pass


def test_a_group_syncs_all_its_files_once_before_its_database_commit(
    warehouse_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = warehouse_path.resolve()
    cat = Catalog.for_warehouse(root)
    cat.register_circuit("c", "fp")
    calls: list[tuple[list[Path], bool]] = []
    real = catalog_module.sync_trees

    def sync_trees(paths: list[Path], *, up_to: Path) -> None:
        calls.append((list(paths), _seen_elsewhere(cat, "a")))
        real(paths, up_to=up_to)

    monkeypatch.setattr(catalog_module, "sync_trees", sync_trees)
    first, second = _batch(root, "a", (0,)), _batch(root, "b", (0,))
    with cat.grouped():
        assert cat.commit("c", "a", (0,), [first])
        assert cat.commit("c", "b", (0,), [second])
        assert calls == []
    assert calls == [([root / first.path, root / second.path], False)]
    assert _seen_elsewhere(cat, "b")
    cat.close()


def test_a_group_whose_files_vanished_commits_nothing(warehouse_path: Path) -> None:
    root = warehouse_path.resolve()
    cat = Catalog.for_warehouse(root)
    cat.register_circuit("c", "fp")
    record = _batch(root, "a", (0,))
    with pytest.raises(FileNotFoundError), cat.grouped():
        assert cat.commit("c", "a", (0,), [record])
        durability_path = root / record.path
        for child in durability_path.iterdir():
            child.unlink()
        durability_path.rmdir()
    assert not cat.stage_done("c", "a", (0,)) and cat.all_batches("c") == []
    cat.close()


def test_the_sync_method_setting_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(durability.SYNC_METHOD_SETTING, "fsync")
    assert durability.sync_method() == "fsync"
    monkeypatch.setenv(durability.SYNC_METHOD_SETTING, "sometimes")
    with pytest.raises(ValueError, match="DBSPARK_SYNC_METHOD='sometimes'"):
        durability.sync_method()


@pytest.mark.skipif(durability._libc_syncfs() is None, reason="needs Linux 5.8 or later")
def test_auto_syncs_the_file_system_only_while_little_else_is_dirty(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A syncfs writes out every process's dirty pages: past the limit, each file's own
    # fsync costs less. An explicit setting is followed whatever is dirty.
    meminfo = tmp_path / "meminfo"
    monkeypatch.setattr(durability, "MEMINFO", meminfo)
    monkeypatch.delenv(durability.SYNC_METHOD_SETTING, raising=False)
    limit_kb = durability.SYNCFS_DIRTY_LIMIT >> 10
    meminfo.write_text(f"MemTotal: 100 kB\nDirty: {limit_kb // 2} kB\nWriteback: 0 kB\n")
    assert durability.sync_method() == "syncfs"
    meminfo.write_text(f"Dirty: {limit_kb // 2} kB\nWriteback: {limit_kb} kB\n")
    assert durability.sync_method() == "fsync"
    monkeypatch.setenv(durability.SYNC_METHOD_SETTING, "syncfs")
    assert durability.sync_method() == "syncfs"
    monkeypatch.setenv(durability.SYNC_METHOD_SETTING, "auto")
    meminfo.unlink()
    assert durability.sync_method() == "fsync"


def test_a_group_keeps_its_operator_batches_up_to_date_without_reading_them_again(
    tmp_path: Path,
) -> None:
    """An epoch's units each ask for the circuit's operator batches: inside a group the
    list is read once, then each stage commit adds its own batches (with their ids);
    a commit that supersedes batches, or the end of the group, makes it read again."""
    import sqlalchemy as sa

    cat = Catalog.for_warehouse(tmp_path)
    cat.register_circuit("c", "fp")
    reads: list[str] = []

    def count(conn, cursor, statement, *args) -> None:
        whole = "created_by = " not in statement  # not a commit's own new batches
        if statement.lstrip().startswith("SELECT batches.id") and whole:
            reads.append(statement)

    sa.event.listen(cat.engine, "before_cursor_execute", count)

    def fresh() -> list[tuple]:
        seen: list[list[BatchRecord]] = []
        thread = threading.Thread(target=lambda: seen.append(cat.operator_batches("c")))
        thread.start()
        thread.join()
        return [(b.id, b.path) for b in seen[0]]

    with cat.grouped():
        cat.open_epoch("c", 0)
        assert cat.commit("c", "a", (0,), [_batch(tmp_path, "a", (0,))])
        first = cat.operator_batches("c")
        assert len(first) == 1 and first[0].id is not None
        before = len(reads)
        assert cat.commit("c", "b", (0,), [_batch(tmp_path, "b", (0,))])
        kept = cat.operator_batches("c")
        assert [b.collection for b in kept] == ["a.out", "b.out"]
        assert all(b.id is not None for b in kept)
        # The new batch's id came with the commit: the list itself was not read again.
        assert len(reads) == before
        cat.flush()
        assert [(b.id, b.path) for b in kept] == fresh()
        cat.open_epoch("c", 1)
        assert cat.commit("c", "c", (1,), [_batch(tmp_path, "c", (1,))])
        cat.operator_batches("c")
        replaced = cat.operator_batches("c")[0]
        assert cat.commit("c", "d", (1,), [_batch(tmp_path, "d", (1,))], supersede=[replaced.id])
        after = cat.operator_batches("c")
        assert replaced.id not in {b.id for b in after}
        cat.flush()
        assert [(b.id, b.path) for b in after] == fresh()
    cat.close()
