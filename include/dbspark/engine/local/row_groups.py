"""The row groups a keyed read needs: those whose key statistics admit a wanted key.

A loop's trace holds each bucket's rows sorted by key, in row groups of
``KEYED_GROUP_ROWS`` rows (``storage/warehouse.py``), so each group covers a narrow
range of the leading key column. A read for a few keys then needs, in each file, only
the groups whose ``[min, max]`` holds one of the keys *of that file's bucket*. Testing
every wanted key against every file would admit almost every group: a bucket's keys
are spread over the whole key range by the hash, so any key, of any bucket, falls
inside some group's range.

The rule only ever leaves out a group that cannot hold a wanted key: a group without
statistics is read, and so is every group when a wanted key is NULL or the column is
not a signed integer (whose statistics compare as the values do). The caller still
matches the rows read against the keys.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


class GroupedFile:
    """One Parquet file read a row group at a time; the groups decoded are kept (a file
    never changes once written), and so are its footer and the key ranges read from it."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._file = pq.ParquetFile(path)
        self.metadata = self._file.metadata
        self._ranges: dict[str, tuple[np.ndarray, np.ndarray] | None] = {}
        self._groups: dict[int, pa.Table] = {}

    @property
    def column_names(self) -> list[str]:
        return self._file.schema_arrow.names

    @property
    def num_groups(self) -> int:
        return self.metadata.num_row_groups

    def needed(self, column: str, wanted: np.ndarray | None) -> list[int]:
        """The groups that may hold a row whose ``column`` is one of ``wanted`` (sorted
        int64 values); every group when ``wanted`` is None or the file has no usable
        statistics for ``column``."""
        everything = list(range(self.num_groups))
        if wanted is None:
            return everything
        ranges = self._key_ranges(column)
        if ranges is None:
            return everything
        lows, highs = ranges
        first = np.searchsorted(wanted, lows, "left")
        past = np.searchsorted(wanted, highs, "right")
        return np.flatnonzero(past > first).tolist()

    def read(self, groups: Sequence[int]) -> tuple[list[pa.Table], list[int]]:
        """The rows of ``groups`` (in order), and which of them were decoded now (the
        others were kept from an earlier read)."""
        new = [g for g in groups if g not in self._groups]
        if new:
            table = self._file.read_row_groups(new)
            offset = 0
            for group in new:
                rows = self.metadata.row_group(group).num_rows
                self._groups[group] = table.slice(offset, rows)
                offset += rows
        return [self._groups[g] for g in groups], new

    def _key_ranges(self, column: str) -> tuple[np.ndarray, np.ndarray] | None:
        """Each group's (min, max) of the integer ``column``; a group without statistics
        gets the widest range, so it is always read. None when the file's ``column`` is
        not an integer."""
        if column in self._ranges:
            return self._ranges[column]
        ranges = None
        schema = self._file.schema_arrow
        index = schema.get_field_index(column)
        if index >= 0 and pa.types.is_signed_integer(schema.field(index).type):
            leaf = [self.metadata.schema.column(i).path for i in range(self.metadata.num_columns)]
            chunk_index = leaf.index(column)
            info = np.iinfo(np.int64)
            lows = np.full(self.num_groups, info.min, np.int64)
            highs = np.full(self.num_groups, info.max, np.int64)
            for group in range(self.num_groups):
                stats = self.metadata.row_group(group).column(chunk_index).statistics
                if stats is not None and stats.has_min_max:
                    lows[group], highs[group] = int(stats.min), int(stats.max)
            ranges = (lows, highs)
        self._ranges[column] = ranges
        return ranges


def wanted_values(column: pa.Array | pa.ChunkedArray) -> np.ndarray | None:
    """A key column's distinct values as sorted int64, for ``GroupedFile.needed``; None
    (read every group) when it is not a signed integer column or holds a NULL, which matches
    NULL keys that statistics do not bound."""
    if not pa.types.is_signed_integer(column.type) or column.null_count:
        return None
    return np.unique(column.to_numpy().astype(np.int64, copy=False))
