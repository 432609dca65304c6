"""Durability of what the catalog registers (issue 18, finding 5).

A catalog commit makes files visible; if the machine loses power after the commit but
before the kernel wrote the files out, the catalog names files that are empty or gone.
So every file and directory a commit registers is fsynced first (:func:`sync_tree`),
then the directories above it up to the warehouse root, whose entries name it; or, on
Linux 5.8 and later, the whole file system is synced with one ``syncfs(2)``, which
costs a tenth as much for an epoch's files while little else is waiting to be written
(``DBSPARK_SYNC_METHOD`` chooses; by default, the dirty page cache decides).

SQLite's locks do not work on network file systems, and a SQLite file on one host's disk
is not shared with the others: a warehouse on NFS, CIFS, a FUSE mount and the like means
several hosts, which need PostgreSQL. :func:`shared_filesystem` tells from the mount
table (``/proc/mounts``) which file system a path is on.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
import re
import sys
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

#: The mount table read by :func:`filesystem_type` (Linux).
MOUNTS = Path("/proc/mounts")

#: File systems shared between hosts, or whose locking SQLite cannot trust. Any
#: ``fuse.*`` type counts too (sshfs, s3fs, gcsfuse, Docker Desktop's grpcfuse), except
#: ``fuseblk`` (a local disk through FUSE, such as ntfs-3g).
SHARED_TYPES = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "ncpfs",
        "9p",
        "afs",
        "ceph",
        "glusterfs",
        "lustre",
        "gpfs",
        "ocfs2",
        "gfs2",
        "beegfs",
        "fuse",
        "virtiofs",
    }
)

#: fsyncs run from this many threads: a journaling file system commits concurrent
#: fsyncs together, so a batch of 16 bucket files costs about one journal commit.
SYNC_THREADS = 8

#: How :func:`sync_trees` makes files durable: ``syncfs`` (one ``syncfs(2)`` of the
#: file system they are on), ``fsync`` (each file and directory), or ``auto`` (the
#: default: ``syncfs`` where Linux reports write-back errors through it, 5.8 and later,
#: and the page cache holds little dirty data, :data:`SYNCFS_DIRTY_LIMIT`).
SYNC_METHOD_SETTING = "DBSPARK_SYNC_METHOD"
SYNC_METHODS = ("auto", "syncfs", "fsync")


@functools.cache
def _libc_syncfs() -> Any:
    """libc's ``syncfs``, when this is Linux 5.8 or later (earlier kernels return 0
    from it even when write-back failed), else None."""
    if not sys.platform.startswith("linux"):
        return None
    release = re.match(r"(\d+)\.(\d+)", platform.release())
    if release is None or (int(release[1]), int(release[2])) < (5, 8):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        function = libc.syncfs
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int]
    function.restype = ctypes.c_int
    return function


#: ``auto`` calls ``syncfs`` only while the system holds at most this much dirty or
#: in-flight page cache: a ``syncfs`` writes out all of it, other processes' writes
#: included (2 GB of them made a 0.13 s epoch take 0.78 s here), while an
#: epoch's own fsyncs cost a few milliseconds more than a ``syncfs`` of its files alone.
SYNCFS_DIRTY_LIMIT = 32 << 20

#: Where Linux reports the page cache's dirty and write-back bytes.
MEMINFO = Path("/proc/meminfo")


def dirty_bytes() -> int | None:
    """The page cache's dirty and write-back bytes, system-wide, or None where
    :data:`MEMINFO` cannot be read."""
    try:
        text = MEMINFO.read_text()
    except OSError:
        return None
    found = re.findall(r"^(?:Dirty|Writeback):\s+(\d+) kB", text, re.MULTILINE)
    return sum(int(kb) << 10 for kb in found) if found else None


def sync_method() -> str:
    """``syncfs`` or ``fsync``: what :data:`SYNC_METHOD_SETTING` asks for, and this
    system supports. ``auto`` picks ``syncfs`` while little else is waiting to be written
    (:data:`SYNCFS_DIRTY_LIMIT`), else ``fsync``."""
    wanted = os.environ.get(SYNC_METHOD_SETTING, "auto").strip().lower() or "auto"
    if wanted not in SYNC_METHODS:
        raise ValueError(
            f"{SYNC_METHOD_SETTING}={wanted!r}: expected one of {', '.join(SYNC_METHODS)}"
        )
    if wanted == "fsync":
        return "fsync"
    if _libc_syncfs() is None:
        if wanted == "syncfs":
            raise ValueError(
                f"{SYNC_METHOD_SETTING}=syncfs: this system has no syncfs that reports "
                "write-back errors (Linux 5.8 or later); use fsync"
            )
        return "fsync"
    if wanted == "auto":
        dirty = dirty_bytes()
        if dirty is None or dirty > SYNCFS_DIRTY_LIMIT:
            return "fsync"
    return "syncfs"


def _syncfs(path: str) -> None:
    """``syncfs(2)`` of the file system holding ``path``: everything written to it so
    far, data and directory entries, is on disk when it returns."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if _libc_syncfs()(fd) != 0:
            code = ctypes.get_errno()
            raise OSError(code, f"syncfs of {path} failed: {os.strerror(code)}")
    finally:
        os.close(fd)


def _fsync(path: str, directory: bool) -> None:
    fd = os.open(path, (os.O_RDONLY | os.O_DIRECTORY) if directory else os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_tree(path: str | os.PathLike[str], *, up_to: str | os.PathLike[str]) -> None:
    """fsync every file and directory under ``path`` and ``path``'s parents up to and
    including ``up_to``, so a crash after this leaves the tree as it is now. A missing
    ``path`` is an error: the caller is about to register it."""
    sync_trees([path], up_to=up_to)


def sync_trees(paths: Iterable[str | os.PathLike[str]], *, up_to: str | os.PathLike[str]) -> None:
    """:func:`sync_tree` for several trees under one ``up_to``, each directory once."""
    root = Path(up_to)
    files: list[str] = []
    directories: list[str] = []
    parents: dict[str, None] = {}
    tops: list[Path] = []
    for path in paths:
        top = Path(path)
        tops.append(top)
        if not top.exists():
            raise FileNotFoundError(f"cannot make {top} durable: it does not exist")
        if top.is_file():
            files.append(str(top))
        else:
            for dirpath, _dirs, names in os.walk(top):
                files.extend(os.path.join(dirpath, n) for n in names)
                directories.append(dirpath)
        parent = top.parent
        while True:
            parents[str(parent)] = None
            if parent == root or parent == parent.parent or root not in parent.parents:
                break
            parent = parent.parent
    # All at once: what makes the tree durable is that every fsync has returned before
    # the catalog commit, not their order; one at a time, the parents' fsyncs cost a
    # journal commit each (about 3 ms here), which made up most of a small epoch's.
    jobs = [(f, False) for f in files] + [(d, True) for d in (*directories, *parents)]
    if len(jobs) > 2 and sync_method() == "syncfs" and _one_filesystem(root, tops):
        # One call for the lot: an epoch's 50 files took 11-25 ms of concurrent fsyncs
        # here, a syncfs 2 ms. It also writes out other dirty data on that file system,
        # which a journal commit in ordered mode (ext4's default) does as well.
        _syncfs(str(root))
        return
    if len(jobs) > 2 and not sys.is_finalizing():
        try:
            with ThreadPoolExecutor(min(SYNC_THREADS, len(jobs))) as pool:
                list(pool.map(lambda job: _fsync(*job), jobs))
            return
        except RuntimeError:
            # The interpreter is exiting (a compaction thread finishing its commit):
            # no new threads, so one fsync at a time. An fsync fails with OSError.
            pass
    for job in jobs:
        _fsync(*job)


def _one_filesystem(root: Path, paths: Iterable[Path]) -> bool:
    """Whether ``root`` and every one of ``paths`` are on one file system (a mount
    inside the warehouse would need a syncfs of its own)."""
    device = os.stat(root).st_dev
    return all(os.stat(p).st_dev == device for p in paths)


def _unescape(field: str) -> str:
    """A /proc/mounts field: spaces, tabs, newlines and backslashes are octal escapes."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def filesystem_type(path: str | os.PathLike[str], mounts: Path | None = None) -> str | None:
    """The type of the file system ``path`` is on (the mount with the longest mount
    point above it, of its nearest existing ancestor resolved), or None without a
    readable mount table."""
    table = MOUNTS if mounts is None else mounts
    try:
        lines = table.read_text().splitlines()
    except OSError:
        return None
    target = Path(os.path.abspath(path))
    while not target.exists() and target != target.parent:
        target = target.parent
    target = target.resolve()
    best: tuple[int, str] | None = None
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = Path(_unescape(fields[1]))
        if point == target or point in target.parents:
            depth = len(point.parts)
            if best is None or depth >= best[0]:
                best = (depth, fields[2])
    return None if best is None else best[1]


def shared_filesystem(path: str | os.PathLike[str], mounts: Path | None = None) -> str | None:
    """The file system type of ``path`` when it is shared between hosts (NFS, CIFS,
    FUSE, ...: :data:`SHARED_TYPES`), else None."""
    kind = filesystem_type(path, mounts)
    if kind is None:
        return None
    base = kind.split(".", 1)[0]
    if kind in SHARED_TYPES or (base == "fuse" and kind not in ("fuseblk", "fusectl")):
        return kind
    return None


def sync_directories(path: str | os.PathLike[str], *, up_to: str | os.PathLike[str]) -> None:
    """fsync the directory ``path`` and its parents up to and including ``up_to`` (their
    entries only, not what lies below them): after a rename into ``path``."""
    root, folder = Path(up_to), Path(path)
    while True:
        _fsync(str(folder), True)
        if folder == root or folder == folder.parent or root not in folder.parents:
            return
        folder = folder.parent
