"""P: what publishing an epoch costs, against the view's size and the delta's.

The publish task commits each view's change to its Delta table (``sinks/tables.py``:
one ``MERGE`` per epoch) instead of rewriting the whole view as a Parquet snapshot, as
it did before (``export_epoch(snapshots=True)`` still can). This measures both on the
same view, ``(k BIGINT, g STRING, v BIGINT)`` with ``n`` distinct rows, for each
``n`` and each data-file size the table is kept at:

- ``snapshot_write``: the whole view written as Parquet with pyarrow, the snapshot's
  write (the lower bound of what it cost: the view read from the warehouse is not
  counted);
- ``table_load``: the table's first version, written whole;
- ``table_commit``: one epoch's commit through ``publish_table``, for a small delta
  (0.1% of the rows updated: each a -old +new pair) on one contiguous key range, spread
  at random over the keys, on a range again, and a large one (10%, spread). Each
  records the merge's time reading the table (delta-rs's ``scan_time_ms``; the table
  is written in key order and the merge bounded by the change's range of each column,
  so it skips the files outside it), the files whose range of ``k`` meets the
  change's (``files_read``: what that filter reads) and the rows and files it rewrote:
  delta-rs deletes copy-on-write, so a file that holds one changed row is rewritten
  whole;
- ``table_housekeeping``: after the spread changes, ``maintain_table`` (what the publish
  task runs every ``maintain_every`` epochs), which rewrites the table sorted by ``k``
  when the merges have scattered its files' ranges: its seconds, whether it sorted and
  the files' overlap before and after; the clustered change after it is timed again.

After each commit the table is read back and its row count and sum of ``v`` compared
with the view's (``ok``).
"""

from __future__ import annotations

import shutil
import statistics
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from benchmarks.harness import Bench, Measurement
from dbspark.core.types import Schema
from dbspark.orchestration.sinks.tables import (
    TableSettings,
    maintain_table,
    publish_table,
    read_table,
)

WORKLOAD = "P"
SCHEMA = Schema.of({"k": "bigint", "g": "string", "v": "bigint"}, what="benchmark view")
#: The changes of each table, in order: (label, fraction of the rows, spread at random).
#: A clustered change sits on one contiguous key range (the view's middle, then its
#: first quarter): first on the table as loaded (in key order), then again after a
#: spread change has rewritten every file, which a merge writes in no key order, and
#: once more after the housekeeping that sorts the table again.
AFTER_HOUSEKEEPING = "small, clustered, after housekeeping"
CHANGES = (
    ("small, clustered", 0.001, False),
    ("small, spread", 0.001, True),
    ("small, clustered, after a spread one", 0.001, False),
    ("large, spread", 0.1, True),
    (AFTER_HOUSEKEEPING, 0.001, False),
)
SNAPSHOT_REPEATS = 3


def run(bench: Bench, *, sizes: list[int], file_bytes: list[int]) -> None:
    root = bench.work / WORKLOAD
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    for size in sizes:
        view = _view(size)
        bench.results.add(_snapshot_write(view, root / f"snapshot-{size}"))
        for target in file_bytes:
            if not bench.budget.allows(60):
                bench.results.skip(f"P: view of {size} rows, files of {target} bytes (time budget)")
                continue
            _commits(bench, view, root / f"table-{size}-{target}", target)


def _view(size: int) -> pa.Table:
    """The view as the change of its first epoch: every row once (``__w`` = 1)."""
    keys = np.arange(size, dtype=np.int64)
    return pa.table(
        {
            "k": keys,
            "g": pa.array((keys % 1000).astype(str)),
            "v": keys * 7 % 1000,
            "__w": np.ones(size, dtype=np.int64),
        }
    )


def _snapshot_write(view: pa.Table, folder: Path) -> Measurement:
    runs = []
    for attempt in range(SNAPSHOT_REPEATS):
        target = folder / f"epoch={attempt}"
        target.mkdir(parents=True)
        start = time.perf_counter()
        pq.write_table(view, target / "part-00000.parquet")
        runs.append(time.perf_counter() - start)
    shutil.rmtree(folder, ignore_errors=True)
    return Measurement(
        WORKLOAD, "snapshot_write", statistics.median(runs), size=len(view), params={"runs": runs}
    )


def _commits(bench: Bench, view: pa.Table, path: Path, target: int) -> None:
    size = len(view)
    settings = TableSettings(maintain_every=0, target_file_bytes=target)

    def publish(epoch: int, change: pa.Table):
        return publish_table(
            path,
            circuit="benchmark",
            view="v",
            schema=SCHEMA,
            epoch=epoch,
            change=change,
            whole_view=lambda: view,
            settings=settings,
        )

    start = time.perf_counter()
    loaded = publish(0, view)
    bench.results.add(
        Measurement(
            WORKLOAD,
            "table_load",
            time.perf_counter() - start,
            size=size,
            epoch=0,
            params={"file_bytes": target, "files": loaded.files_added},
        )
    )
    values = view.column("v").to_numpy().copy()
    random = np.random.default_rng(size)
    for epoch, (label, fraction, spread) in enumerate(CHANGES, start=1):
        count = max(1, int(size * fraction))
        if spread:
            keys = np.sort(random.choice(size, count, replace=False))
        else:
            first = size // 2 if epoch == 1 else size // 4
            keys = np.arange(first, first + count, dtype=np.int64)
        old = values[keys]
        new = old + 1000
        change = pa.table(
            {
                "k": np.concatenate([keys, keys]),
                "g": pa.array(np.concatenate([(keys % 1000).astype(str)] * 2)),
                "v": np.concatenate([old, new]),
                "__w": np.concatenate([np.full(count, -1), np.full(count, 1)]).astype(np.int64),
            }
        )
        values[keys] = new
        if label == AFTER_HOUSEKEEPING:
            bench.results.add(_housekeeping(path, settings, size, epoch))
        files_read = len(_files_meeting(path, int(keys.min()), int(keys.max())))
        start = time.perf_counter()
        commit = publish(epoch, change)
        seconds = time.perf_counter() - start
        table = read_table(path)
        ok = len(table) == size and pc.sum(table.column("v")).as_py() == int(values.sum())
        bench.results.add(
            Measurement(
                WORKLOAD,
                "table_commit",
                seconds,
                size=size,
                delta=count,
                epoch=epoch,
                ok=ok,
                params={
                    "change": label,
                    "fraction": fraction,
                    "file_bytes": target,
                    "rows_rewritten": commit.rows_copied,
                    "files_rewritten": commit.files_removed,
                    "files_read": files_read,
                    "scan_ms": commit.scan_ms,
                    "files_in_table": len(table_files(path)),
                },
            )
        )


def _housekeeping(path: Path, settings: TableSettings, size: int, epoch: int) -> Measurement:
    start = time.perf_counter()
    done = maintain_table(path, settings)
    return Measurement(
        WORKLOAD,
        "table_housekeeping",
        time.perf_counter() - start,
        size=size,
        epoch=epoch,
        params={"file_bytes": settings.target_file_bytes, **done},
    )


def _files_meeting(path: Path, low: int, high: int) -> list[str]:
    """The data files whose statistics on ``k`` meet ``[low, high]``: what a merge of a
    change on those keys reads (its bounds on ``g`` and ``v`` span every file here)."""
    from deltalake import DeltaTable

    actions = pa.table(DeltaTable(str(path)).get_add_actions(flatten=True)).to_pylist()
    return [a["path"] for a in actions if a["min.k"] <= high and a["max.k"] >= low]


def table_files(path: Path) -> list[str]:
    from deltalake import DeltaTable

    return DeltaTable(str(path)).file_uris()
