"""Durability (issue 18, finding 5): what a commit registers is on disk first, SQLite
commits with synchronous=FULL, and a SQLite catalog is refused on a shared file system."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dbspark.storage import BatchRecord, Catalog, CatalogError, Warehouse, durability
from dbspark.storage.catalog import SHARED_SQLITE_SETTING
from dbspark.storage.durability import filesystem_type, shared_filesystem
from tests.fsync_recording import recorded_fsyncs


def _catalog_and_bucketed_batch(root: Path) -> tuple[Catalog, BatchRecord]:
    """A catalog in ``root`` with circuit ``c``, and a batch of two bucket files written
    but not registered."""
    cat = Catalog.for_warehouse(root)
    cat.register_circuit("c", "fp")
    rel = Warehouse(root).new_path("c", "n1.in0", "trace", (0, 1))
    for bucket in (3, 7):
        folder = root / rel / f"__bucket={bucket}"
        folder.mkdir(parents=True)
        pq.write_table(pa.table({"k": [bucket]}), folder / "part-0.parquet")
    return cat, BatchRecord("c", "n1.in0", "trace", (0, 1), rel, rows=2, bytes=1, buckets=16)


def test_a_commit_fsyncs_its_files_and_directories_before_the_catalog_names_them(
    warehouse_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(durability.SYNC_METHOD_SETTING, "fsync")
    root = warehouse_path.resolve()
    cat, record = _catalog_and_bucketed_batch(root)
    rel = record.path

    synced: list[str] = []
    committed_first: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        if cat.stage_done("c", "n1", (0, 1)):
            committed_first.append(path)
        synced.append(path)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    assert cat.commit("c", "n1", (0, 1), [record])
    monkeypatch.undo()

    batch = root / rel
    wanted = {str(p) for p in [batch, *batch.rglob("*")]}  # files and folders
    wanted |= {str(batch.parents[i]) for i in range(4)}  # t=0_1, trace, n1.in0, c
    wanted.add(str(root))
    assert wanted <= set(synced), sorted(wanted - set(synced))
    assert committed_first == []
    cat.close()


def test_a_commit_while_the_interpreter_exits_still_fsyncs_everything(
    warehouse_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A background compaction finishing its commit after the main thread has ended can
    start no thread: the fsyncs run one at a time instead of failing the commit."""
    import concurrent.futures.thread as futures_thread

    root = warehouse_path.resolve()
    cat, record = _catalog_and_bucketed_batch(root)
    synced = recorded_fsyncs(monkeypatch)
    # What threading's exit hook sets: every executor then refuses new work.
    monkeypatch.setattr(futures_thread, "_shutdown", True)
    assert cat.commit("c", "n1", (0, 1), [record])
    monkeypatch.undo()
    batch = root / record.path
    assert {str(p) for p in batch.rglob("*")} <= set(synced)
    assert cat.stage_done("c", "n1", (0, 1))
    cat.close()


@pytest.mark.skipif(durability._libc_syncfs() is None, reason="needs Linux 5.8 or later")
def test_with_syncfs_a_commit_syncs_the_file_system_before_the_catalog_names_its_files(
    warehouse_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(durability.SYNC_METHOD_SETTING, "syncfs")
    root = warehouse_path.resolve()
    cat, record = _catalog_and_bucketed_batch(root)
    synced: list[tuple[str, bool]] = []
    real = durability._syncfs

    def syncfs(path: str) -> None:
        synced.append((path, cat.stage_done("c", "n1", (0, 1))))
        real(path)

    monkeypatch.setattr(durability, "_syncfs", syncfs)
    assert cat.commit("c", "n1", (0, 1), [record])
    assert synced == [(str(root), False)]
    cat.close()


def test_a_commit_of_a_missing_batch_fails_before_registering_it(warehouse_path: Path) -> None:
    cat = Catalog.for_warehouse(warehouse_path)
    cat.register_circuit("c", "fp")
    record = BatchRecord("c", "t", "trace", (0,), "c/t/trace/t=0/gone", rows=1, bytes=1)
    with pytest.raises(FileNotFoundError, match="c/t/trace/t=0/gone"):
        cat.commit("c", "a", (0,), [record])
    assert not cat.stage_done("c", "a", (0,)) and cat.all_batches("c") == []
    cat.close()


def test_sqlite_commits_with_synchronous_full(warehouse_path: Path) -> None:
    cat = Catalog.for_warehouse(warehouse_path)
    with cat.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 2  # FULL
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    cat.close()


@pytest.fixture
def mounts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A mount table (as /proc/mounts words it) where ``tmp_path/nfs`` is NFS, ``sshfs``
    a FUSE mount and ``usb`` a local disk through FUSE; the catalog reads it."""
    for name in ("nfs", "sshfs", "usb", "with space"):
        (tmp_path / name).mkdir()
    base = tmp_path.resolve()
    table = tmp_path / "mounts"
    table.write_text(
        "/dev/sda1 / ext4 rw,relatime 0 0\n"
        f"filer:/export {base}/nfs nfs4 rw,vers=4.2 0 0\n"
        f"me@host:/data {base}/sshfs fuse.sshfs rw 0 0\n"
        f"/dev/sdb1 {base}/usb fuseblk rw 0 0\n"
        f"//nas/share {base}/with\\040space cifs rw 0 0\n"
    )
    monkeypatch.setattr(durability, "MOUNTS", table)
    monkeypatch.delenv(SHARED_SQLITE_SETTING, raising=False)
    return base


def test_the_mount_table_tells_shared_file_systems(mounts: Path) -> None:
    assert filesystem_type(mounts / "nfs" / "wh" / "not-yet") == "nfs4"
    assert shared_filesystem(mounts / "nfs") == "nfs4"
    assert shared_filesystem(mounts / "sshfs" / "x") == "fuse.sshfs"
    assert shared_filesystem(mounts / "with space" / "wh") == "cifs"
    assert shared_filesystem(mounts / "usb") is None  # fuseblk: a local disk
    assert shared_filesystem(mounts) is None and filesystem_type(mounts) == "ext4"


def test_the_real_mount_table_is_read(tmp_path: Path) -> None:
    kind = filesystem_type(tmp_path)
    assert kind is not None and kind in Path("/proc/mounts").read_text().split()
    assert shared_filesystem(tmp_path) is None  # the tests' temporary folder is local


def test_sqlite_is_refused_on_a_shared_file_system(mounts: Path, monkeypatch) -> None:
    with pytest.raises(CatalogError, match=r"nfs4\).*Use PostgreSQL") as refused:
        Catalog.for_warehouse(mounts / "nfs" / "wh")
    assert str(mounts / "nfs" / "wh") in str(refused.value)
    assert SHARED_SQLITE_SETTING in str(refused.value)
    # The warehouse on NFS with the SQLite file on a local disk: still one host's file.
    with pytest.raises(CatalogError, match=r"the warehouse .* \(fuse.sshfs\)"):
        Catalog(f"sqlite:///{mounts / 'local.db'}", warehouse=mounts / "sshfs" / "wh")
    with pytest.raises(CatalogError, match="the catalog file"):
        Catalog(f"sqlite:///{mounts / 'nfs' / 'catalog.db'}")
    # Local places, or an explicit override, open.
    Catalog.for_warehouse(mounts / "usb" / "wh").close()
    Catalog(f"sqlite:///{mounts / 'nfs' / 'c.db'}", allow_shared_sqlite=True).close()
    monkeypatch.setenv(SHARED_SQLITE_SETTING, "allow")
    Catalog.for_warehouse(mounts / "nfs" / "wh").close()
