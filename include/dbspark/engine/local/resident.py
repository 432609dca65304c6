"""Resident arrangements: trace files kept decoded in memory across epochs, with a key index.

A small epoch's cost on the local tier is mostly finding the stored rows of the keys
its delta touches. Read from Parquet, that means decoding every touched file: at a 0.1%
TPC-H change every bucket of ``lineitem``'s 6M-row state holds some touched key, and
the lookup decodes all of them (about 100 ms, the largest single cost of the epoch). A
process that runs epoch after epoch (the main job, a benchmark, a long-lived worker)
can keep what it decoded, as Differential Dataflow and Feldera keep their arrangements,
and find a key's rows with an index instead of a scan.

Keeping files is sound without any invalidation: a batch file never changes once
written (a new batch gets a new path, and compaction writes a new file and supersedes
the old ones in the catalog). Which files are live is still asked of the catalog on
every read; the store only answers "what does this path hold". Files the catalog has
superseded are simply no longer asked for, and fall out as the least recently used.

The index of a file is on the first key column of a lookup. Batches are written
key-sorted per bucket, so for integer and temporal keys the column is searched as it
stands (``np.searchsorted``); a file that is not sorted is sorted once, by a
permutation kept with it. Other key types (strings, decimals, floats) are matched by
Arrow's hash ``is_in`` over the column. The candidates are exact for a one-column key;
the caller checks the remaining key columns of the (few) candidate rows.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

#: Default byte budget of a process's resident files (``DBSPARK_RESIDENT_BYTES``).
RESIDENT_BYTES = 4 << 30


def default_resident_bytes() -> int:
    """``DBSPARK_RESIDENT_BYTES`` (0: keep nothing across epochs), else ``RESIDENT_BYTES``."""
    text = os.environ.get("DBSPARK_RESIDENT_BYTES", "").strip()
    if not text:
        return RESIDENT_BYTES
    try:
        value = int(text)
    except ValueError:
        raise ValueError(
            f"DBSPARK_RESIDENT_BYTES must be a whole number of bytes, not {text!r}"
        ) from None
    if value < 0:
        raise ValueError(f"DBSPARK_RESIDENT_BYTES must be 0 or more, not {value}")
    return value


class KeyProbe:
    """The wanted values of a lookup's first key column, prepared once per type for
    the many files (one per bucket) a lookup searches."""

    def __init__(self, wanted: pa.Array | pa.ChunkedArray) -> None:
        self.wanted = wanted
        self._as: dict[pa.DataType, tuple[pa.Array | pa.ChunkedArray, np.ndarray, bool]] = {}

    def cast(self, kind: pa.DataType) -> tuple[pa.Array | pa.ChunkedArray, np.ndarray, bool]:
        """The values as ``kind``; for a searchable type also their distinct non-NULL
        values as sorted integers; and whether NULL is wanted."""
        found = self._as.get(kind)
        if found is None:
            values = self.wanted.cast(kind)
            plain = (
                np.unique(_searchable(values.drop_null()))
                if _searchable_type(kind)
                else np.empty(0, np.int64)
            )
            found = self._as[kind] = (values, plain, values.null_count > 0)
        return found


@dataclass
class _SortedColumn:
    """A column's non-NULL values in ascending order, as integers NumPy can search."""

    values: np.ndarray
    positions: np.ndarray | None  # row of each sorted value; None when the file is sorted
    nulls: np.ndarray  # rows whose value is NULL

    @property
    def nbytes(self) -> int:
        extra = 0 if self.positions is None else self.positions.nbytes
        return self.values.nbytes + self.nulls.nbytes + extra

    def rows_of(self, plain: np.ndarray, null_wanted: bool) -> np.ndarray:
        """Rows (ascending) whose value is one of ``plain`` (distinct, sorted), and
        the NULL rows when ``null_wanted``."""
        found = []
        if len(plain):
            lo = np.searchsorted(self.values, plain, side="left")
            hi = np.searchsorted(self.values, plain, side="right")
            hit = hi > lo
            lo, hi = lo[hit], hi[hit]
            if len(lo):
                counts = hi - lo
                # Every index of every [lo, hi) range, without a Python loop.
                starts = np.repeat(lo - np.cumsum(counts) + counts, counts)
                ranks = starts + np.arange(counts.sum())
                found.append(ranks if self.positions is None else self.positions[ranks])
        if null_wanted and len(self.nulls):
            found.append(self.nulls)
        if not found:
            return np.empty(0, np.int64)
        return np.sort(np.concatenate(found))


def _searchable_type(kind: pa.DataType) -> bool:
    return (
        pa.types.is_integer(kind)
        or pa.types.is_date(kind)
        or pa.types.is_timestamp(kind)
        or pa.types.is_time(kind)
    )


def _searchable(array: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A NULL-free integer or temporal array as int64 (dates as days, times as ticks)."""
    kind = array.type
    if pa.types.is_date32(kind) or pa.types.is_time32(kind):
        array = array.cast(pa.int32())
    elif not pa.types.is_integer(kind):
        array = array.cast(pa.int64())
    return np.asarray(array.to_numpy(zero_copy_only=False), dtype=np.int64)


class ResidentFile:
    """One decoded batch file and its key indexes, built when first asked for."""

    def __init__(self, table: pa.Table) -> None:
        # One chunk per column: Arrow's take over a chunked column concatenates the
        # chunks first, which would make each lookup cost the whole file again.
        self.table = table.combine_chunks()
        self.nbytes = self.table.nbytes
        self._sorted: dict[str, _SortedColumn] = {}

    def index(self, column: str) -> None:
        """Build the index of ``column`` now, if its type has one."""
        values = self.table.column(column)
        if _searchable_type(values.type) and column not in self._sorted:
            self._sorted[column] = index = _sort(values)
            self.nbytes += index.nbytes

    def rows_with(self, column: str, probe: KeyProbe) -> pa.Table:
        """The rows whose ``column`` equals a value of the probe (NULL matches NULL), in
        file order."""
        values = self.table.column(column)
        wanted, plain, null_wanted = probe.cast(values.type)
        if not _searchable_type(values.type):
            return self.table.filter(pc.is_in(values, value_set=wanted, skip_nulls=False))
        self.index(column)
        return self.table.take(pa.array(self._sorted[column].rows_of(plain, null_wanted)))


def _sort(values: pa.ChunkedArray) -> _SortedColumn:
    valid = pc.is_valid(values).to_numpy(zero_copy_only=False)
    nulls = np.flatnonzero(~valid)
    plain = _searchable(values.drop_null())
    if len(plain) < 2 or bool(np.all(plain[1:] >= plain[:-1])):
        positions = None if not len(nulls) else np.flatnonzero(valid)
        return _SortedColumn(plain, positions, nulls)
    order = np.argsort(plain, kind="stable")
    rows = np.flatnonzero(valid)[order]
    return _SortedColumn(plain[order], rows, nulls)


class ResidentFiles:
    """Decoded files by path, the least recently used dropped beyond ``budget`` bytes."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self._files: OrderedDict[str, ResidentFile] = OrderedDict()
        self._bytes = 0
        self.loads = 0  # files decoded from disk (reads the store could not answer)

    @property
    def enabled(self) -> bool:
        return self.budget > 0

    @property
    def nbytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._files)

    def __contains__(self, path: str) -> bool:
        return path in self._files

    def get(self, path: str) -> ResidentFile | None:
        found = self._files.get(path)
        if found is not None:
            self._files.move_to_end(path)
        return found

    def load(self, path: str) -> ResidentFile | None:
        """The file at ``path``, decoded now unless it is kept; None if it alone is larger
        than the budget."""
        found = self.get(path)
        if found is not None:
            return found
        table = pq.read_table(path)
        self.loads += 1
        return self.keep(path, table)

    def keep(self, path: str, table: pa.Table) -> ResidentFile | None:
        """Keep ``table`` as the contents of ``path`` (a file this process just wrote)."""
        if not self.enabled or table.nbytes > self.budget:
            return None
        resident = ResidentFile(table)
        previous = self._files.pop(path, None)
        if previous is not None:
            self._bytes -= previous.nbytes
        self._files[path] = resident
        self._bytes += resident.nbytes
        self._shrink()
        return resident

    def settle(self) -> None:
        """Account for indexes built since the last call, dropping files over budget."""
        self._bytes = sum(f.nbytes for f in self._files.values())
        self._shrink()

    def _shrink(self) -> None:
        while self._bytes > self.budget and len(self._files) > 1:
            _, dropped = self._files.popitem(last=False)
            self._bytes -= dropped.nbytes

    def clear(self) -> None:
        self._files.clear()
        self._bytes = 0
