"""Resident arrangements: trace batches kept decoded in memory across epochs, with a key index.

A small epoch's cost on the local tier is mostly finding the stored rows of the keys
its delta touches. Read from Parquet, that means decoding every touched file: at a 0.1%
TPC-H change every bucket of ``lineitem``'s 6M-row state holds some touched key, and
the lookup decodes all of them (about 100 ms, the largest single cost of the epoch). A
process that runs epoch after epoch (the main job, a benchmark, a long-lived worker)
can keep what it decoded, as Differential Dataflow and Feldera keep their arrangements,
and find a key's rows with an index instead of a scan.

Keeping them is sound without any invalidation: a batch never changes once written
(a new batch gets a new path, and compaction writes a new batch and supersedes the old
ones in the catalog). Which batches are live is still asked of the catalog on every
read; the store only answers "what does this path hold". Batches the catalog has
superseded are simply no longer asked for, and fall out as the least recently used.
An entry is a whole batch, all its bucket files together (the local tier decides that),
so a lookup costs one probe per batch, not one per bucket.

The index of a file is on the key columns of a lookup, all of them together: each
column's values become small integers (an integer or temporal value minus the file's
minimum; a string, decimal or boolean its position among the file's distinct values),
combined in mixed radix into one int64 per row and sorted, so a lookup is
``np.searchsorted`` of the probe keys' codes. Indexing the first key column alone is not
enough: a key such as ``(origin, time_hour)`` or ``(carrier, month)`` leads with a column
of a handful of values, whose rows are a third of the file. Codes are exact (NULL a
value of its own), so the rows found match every covered key column and need no second
check; float columns (NaN, -0.0) and radixes whose product would overflow end the
covered prefix, and the caller checks the columns left over. A first column with no
code falls back to Arrow's hash ``is_in`` over the column.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
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
    """The wanted keys of a lookup, one array per key column, cast once per type for the
    many files (one per bucket) a lookup searches. ``distinct``: no key occurs twice (a
    gathered key set), so a file whose index covers every column can sort the probe's
    codes instead of deduplicating them (``np.unique`` hashes, then sorts: four times a
    sort's cost at a 1% W1 change, once per batch searched)."""

    def __init__(self, *columns: pa.Array | pa.ChunkedArray, distinct: bool = False) -> None:
        self.columns = columns
        self.distinct = distinct
        self._as: dict[tuple[int, pa.DataType], pa.Array | pa.ChunkedArray] = {}

    @property
    def num_rows(self) -> int:
        return len(self.columns[0])

    def cast(self, position: int, kind: pa.DataType) -> pa.Array | pa.ChunkedArray:
        found = self._as.get((position, kind))
        if found is None:
            found = self._as[(position, kind)] = self.columns[position].cast(kind)
        return found


#: The largest product of radixes a key code may reach (it stays an exact int64).
_CODE_LIMIT = 1 << 62


class _ColumnCodes:
    """A key column's values as small integers, the same for a file's rows and a probe:
    an integer or temporal value minus the file's minimum (NULL one past the maximum),
    any other hashable value its position among the file's distinct values (NULL
    included). ``radix`` is how many codes there are; a probe value the file does not
    hold gets -1."""

    def __init__(self, values: pa.ChunkedArray) -> None:
        self.kind = values.type
        self.dictionary: pa.Array | None = None
        self.low = 0
        if _searchable_type(self.kind) and values.null_count < len(values):
            present = _searchable(values.drop_null())
            low, high = int(present.min()), int(present.max())
            if high - low + 2 <= _CODE_LIMIT:
                self.low, self.radix = low, high - low + 2
                self.rows = self._integer_codes(values)
                return
        self.dictionary = pc.unique(values)
        self.radix = max(len(self.dictionary), 1)
        self.rows = self._dictionary_codes(values)

    def _integer_codes(self, values: pa.Array | pa.ChunkedArray) -> np.ndarray:
        valid = pc.is_valid(values).to_numpy(zero_copy_only=False)
        codes = np.full(len(values), self.radix - 1, dtype=np.int64)  # NULL's code
        present = _searchable(values.drop_null())
        # Outside the file's range (tested before subtracting, which could wrap): -1.
        outside = (present < self.low) | (present > self.low + self.radix - 2)
        codes[valid] = np.where(outside, -1, present - self.low)
        return codes

    def _dictionary_codes(self, values: pa.Array | pa.ChunkedArray) -> np.ndarray:
        found = pc.index_in(values, value_set=self.dictionary, skip_nulls=False)
        return np.asarray(found.fill_null(-1).to_numpy(zero_copy_only=False), dtype=np.int64)

    def probe(self, values: pa.Array | pa.ChunkedArray) -> np.ndarray:
        if self.dictionary is not None:
            return self._dictionary_codes(values)
        return self._integer_codes(values)


def _encodable(kind: pa.DataType) -> bool:
    """Whether values of ``kind`` are equal exactly when their codes are: floats are not
    (NaN and -0.0), and are matched by Arrow's ``is_in`` on the first key column."""
    return not pa.types.is_floating(kind) and not pa.types.is_nested(kind)


@dataclass
class _KeyIndex:
    """Each row's key as one int64, its columns' codes combined in mixed radix, sorted.
    ``covered`` key columns are matched exactly (the leading ones whose radixes fit)."""

    covered: tuple[str, ...]
    encoders: list[_ColumnCodes]
    strides: list[int]
    sorted_codes: np.ndarray
    positions: np.ndarray | None  # the row of each sorted code; None when rows are sorted
    unique: bool = False  # no code twice (a key's one row): one search per probe, not two

    @classmethod
    def build(cls, table: pa.Table, columns: tuple[str, ...]) -> _KeyIndex | None:
        encoders: list[_ColumnCodes] = []
        product = 1
        for name in columns:
            values = table.column(name)
            if not _encodable(values.type):
                break
            codes = _ColumnCodes(values)
            if product * codes.radix > _CODE_LIMIT:
                break
            encoders.append(codes)
            product *= codes.radix
        if not encoders:
            return None
        strides = [
            int(np.prod([e.radix for e in encoders[i + 1 :]], dtype=object))
            for i in range(len(encoders))
        ]
        combined = _combine([e.rows for e in encoders], strides)
        if len(combined) < 2 or bool(np.all(combined[1:] >= combined[:-1])):
            positions = None
        else:
            positions = np.argsort(combined, kind="stable")
            combined = combined[positions]
        covered = tuple(columns[: len(encoders)])
        unique = len(combined) < 2 or bool(np.all(combined[1:] != combined[:-1]))
        return cls(covered, encoders, strides, combined, positions, unique)

    @property
    def nbytes(self) -> int:
        extra = 0 if self.positions is None else self.positions.nbytes
        return self.sorted_codes.nbytes + extra

    def rows_of(self, probe: KeyProbe) -> np.ndarray:
        """Rows (ascending) whose covered key columns equal a probe key's (NULL = NULL)."""
        codes = [e.probe(probe.cast(i, e.kind)) for i, e in enumerate(self.encoders)]
        held = np.logical_and.reduce([c >= 0 for c in codes])
        combined = _combine([c[held] for c in codes], self.strides)
        # Codes are exact: distinct keys over every column give distinct codes. Sorted,
        # the probes also search the sorted codes several times faster.
        exact = probe.distinct and len(self.encoders) == len(probe.columns)
        wanted = np.sort(combined) if exact else np.unique(combined)
        if not len(wanted) or not len(self.sorted_codes):
            return np.empty(0, np.int64)
        lo = np.searchsorted(self.sorted_codes, wanted, side="left")
        if self.unique:
            found = np.minimum(lo, len(self.sorted_codes) - 1)
            ranks = lo[self.sorted_codes[found] == wanted]
            return ranks if self.positions is None else np.sort(self.positions[ranks])
        hi = np.searchsorted(self.sorted_codes, wanted, side="right")
        hit = hi > lo
        lo, hi = lo[hit], hi[hit]
        if not len(lo):
            return np.empty(0, np.int64)
        counts = hi - lo
        # Every index of every [lo, hi) range, without a Python loop.
        ranks = np.repeat(lo - np.cumsum(counts) + counts, counts) + np.arange(counts.sum())
        return ranks if self.positions is None else np.sort(self.positions[ranks])


def _combine(codes: list[np.ndarray], strides: list[int]) -> np.ndarray:
    combined = np.zeros(len(codes[0]), dtype=np.int64)
    for column, stride in zip(codes, strides, strict=True):
        combined += column * np.int64(stride)
    return combined


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
    """One decoded batch (or file) and its key indexes, built when first asked for."""

    def __init__(self, table: pa.Table) -> None:
        # One chunk per column: Arrow's take over a chunked column concatenates the
        # chunks first, which would make each lookup cost the whole file again.
        self.table = table.combine_chunks()
        self.nbytes = self.table.nbytes
        self._indexes: dict[tuple[str, ...], _KeyIndex | None] = {}
        self._building = threading.Lock()  # an index is built once, by one thread

    def index(self, columns: str | Sequence[str]) -> _KeyIndex | None:
        """The index of the key ``columns`` (built now if it was not), or None when the
        first column's type has none."""
        key = (columns,) if isinstance(columns, str) else tuple(columns)
        if key not in self._indexes:
            with self._building:
                if key not in self._indexes:
                    index = _KeyIndex.build(self.table, key)
                    if index is not None:
                        self.nbytes += index.nbytes
                    self._indexes[key] = index
        return self._indexes[key]

    def covers(self, columns: str | Sequence[str]) -> bool:
        """Whether ``rows_with(columns, ...)`` matches every one of ``columns`` exactly
        (else only the leading ones, or the first: the caller checks the rest)."""
        key = (columns,) if isinstance(columns, str) else tuple(columns)
        index = self.index(key)
        return index is not None and index.covered == key

    def rows_with(
        self, columns: str | Sequence[str], probe: KeyProbe, select: Sequence[str] | None = None
    ) -> pa.Table:
        """The rows whose key equals a key of the probe (NULL matches NULL), in file
        order: on every key column the index covers (``covers``), at least the first.
        With ``select``, only those columns (the others are not copied)."""
        table = self.table if select is None else self.table.select(list(select))
        index = self.index(columns)
        if index is None:
            first = (columns,) if isinstance(columns, str) else tuple(columns)
            values = self.table.column(first[0])
            wanted = probe.cast(0, values.type)
            return table.filter(pc.is_in(values, value_set=wanted, skip_nulls=False))
        rows = index.rows_of(probe)
        if not len(rows):  # most small files of a trace hold none of a delta's keys
            return table.slice(0, 0)
        return table.take(pa.array(rows))


class ResidentFiles:
    """Decoded batches (or files) by path, the least recently used dropped beyond
    ``budget`` bytes. Safe to share between threads (the epoch's units and a compaction
    in the background): the order and the byte count change under a lock; a file is
    decoded outside it, so two threads that miss one path at once may both decode it."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self._files: OrderedDict[str, ResidentFile] = OrderedDict()
        self._bytes = 0
        self._lock = threading.RLock()
        self.loads = 0  # entries decoded from disk (reads the store could not answer)

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
        with self._lock:
            found = self._files.get(path)
            if found is not None:
                self._files.move_to_end(path)
            return found

    def load(
        self, path: str, read: Callable[[], pa.Table | None] | None = None
    ) -> ResidentFile | None:
        """What ``path`` holds, decoded now unless it is kept: by ``read`` (a batch's
        files together, say), by default the Parquet file at ``path``. None if it alone
        is larger than the budget, or ``read`` found nothing to keep."""
        found = self.get(path)
        if found is not None:
            return found
        table = pq.read_table(path) if read is None else read()
        if table is None:
            return None
        self.loads += 1
        return self.keep(path, table)

    def keep(self, path: str, table: pa.Table) -> ResidentFile | None:
        """Keep ``table`` as the contents of ``path`` (a file this process just wrote)."""
        if not self.enabled or table.nbytes > self.budget:
            return None
        resident = ResidentFile(table)
        with self._lock:
            previous = self._files.pop(path, None)
            if previous is not None:
                self._bytes -= previous.nbytes
            self._files[path] = resident
            self._bytes += resident.nbytes
            self._shrink()
        return resident

    def settle(self) -> None:
        """Account for indexes built since the last call, dropping files over budget."""
        with self._lock:
            self._bytes = sum(f.nbytes for f in list(self._files.values()))
            self._shrink()

    def _shrink(self) -> None:
        while self._bytes > self.budget and len(self._files) > 1:
            _, dropped = self._files.popitem(last=False)
            self._bytes -= dropped.nbytes

    def clear(self) -> None:
        with self._lock:
            self._files.clear()
            self._bytes = 0
