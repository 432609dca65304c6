"""Input batches: checking what a user hands to a source before anything runs.

Every engine accepts the same input for one epoch: for a Z-set source, rows
with integer weights; for an upsert source, upsert rows (tuples in schema
order, or mappings by column name where a missing column is NULL). Bad input
is rejected here with an error that names the source, the file (when known)
and the offending row, before any state changes.

The Spark engine also takes a ``DataFrame`` or a ``FileBatch`` (parquet, csv, jsonl
files) per source; ``engine/spark/files.py`` (and, for small local Parquet files,
``engine/local/files.py``) checks those (schema, every row read from
the files) and raises the same ``InputError``, naming the file and the line or row.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa

from dbspark.circuit.builder import Node
from dbspark.core.columns import WEIGHT
from dbspark.core.errors import InputError, shown
from dbspark.core.types import Schema, python_value_fits
from dbspark.core.upsert import UpsertSpec
from dbspark.core.zset import ZSet


def check_row(
    source: str, schema: Schema, row: Any, position: int, file: str | None = None
) -> tuple:
    """Return ``row`` as a tuple if it fits ``schema``; otherwise raise ``InputError``."""
    if isinstance(row, Mapping):
        unknown = set(row) - set(schema.names)
        if unknown:
            raise InputError(source, f"row {position} has unknown columns {sorted(unknown)}", file)
        row = tuple(row.get(name) for name in schema.names)
    elif isinstance(row, (list, tuple)):
        row = tuple(row)
    else:
        raise InputError(
            source, f"row {position} must be a list or an object, got {shown(row)}", file
        )
    if len(row) != len(schema):
        raise InputError(
            source,
            f"row {position} {shown(list(row))} has {len(row)} values, "
            f"schema {schema} has {len(schema)}",
            file,
        )
    for (name, type_name), value in zip(schema.fields, row, strict=True):
        if not python_value_fits(value, type_name):
            raise InputError(
                source,
                f"row {position} {shown(list(row))}: column {name!r} is "
                f"{type_name.upper()}, got {shown(value)}",
                file,
            )
    return row


def zset_batch(
    source: str, schema: Schema, batch: ZSet | Iterable[Any] | None, file: str | None = None
) -> ZSet:
    """Check a Z-set batch: a ZSet, or ``[row, weight]`` pairs (None: empty)."""
    if batch is None:  # an empty batch, as a connector returns one (ingest takes it so)
        return ZSet()
    if isinstance(batch, ZSet):
        pairs: Iterable[Any] = batch.items()
    else:
        pairs = batch
    checked = []
    for position, item in enumerate(pairs):
        if not isinstance(item, (list, tuple)) or len(item) != 2:
            raise InputError(
                source, f"entry {position} must be [row, weight], got {shown(item)}", file
            )
        row, weight = item
        if not isinstance(weight, int) or isinstance(weight, bool):
            raise InputError(
                source, f"entry {position}: weight must be an integer, got {shown(weight)}", file
            )
        checked.append((check_row(source, schema, row, position, file), weight))
    return ZSet(checked)


class CheckedRows(list):
    """Upsert rows that ``upsert_batch`` already checked against ``schema`` (as tuples):
    an engine that checks a whole epoch before it opens does not check them again."""

    def __init__(self, rows: Iterable[tuple], schema: Schema) -> None:
        super().__init__(rows)
        self.schema = schema


class CheckedTable:
    """An upsert batch as Arrow, with exactly the source's columns cast to their declared
    types (``engine/local/files.py``: ``checked_table``). The local tier ingests it as it
    stands, set-based, with no trip through Python rows; NULL keys and ties are judged
    there (``kernels.upsert_problems``), and core's rule words the error."""

    def __init__(self, table: pa.Table, schema: Schema) -> None:
        self.table = table
        self.schema = schema

    def __len__(self) -> int:
        return self.table.num_rows

    def rows(self) -> CheckedRows:
        """The rows as tuples (for core's rule, and for a Spark unit)."""
        columns = [self.table.column(n).to_pylist() for n in self.schema.names]
        return CheckedRows(zip(*columns, strict=True), self.schema)


def upsert_batch(
    source: str, schema: Schema, batch: Iterable[Any] | None, file: str | None = None
) -> list[tuple]:
    """Check an upsert batch: rows as tuples or mappings (missing columns are NULL; None
    is an empty batch)."""
    if batch is None:  # an empty batch, as a connector returns one (ingest takes it so)
        return CheckedRows((), schema)
    if isinstance(batch, CheckedRows) and batch.schema == schema:
        return batch
    if isinstance(batch, CheckedTable) and batch.schema == schema:
        return batch.rows()
    if isinstance(batch, (str, bytes, Mapping)):
        raise InputError(source, "an upsert batch must be a list of rows", file)
    return CheckedRows(
        (check_row(source, schema, row, position, file) for position, row in enumerate(batch)),
        schema,
    )


def arrow_rows(source: str, table: pa.Table, schema: Schema, *, weighted: bool) -> Any:
    """An Arrow batch as the rows (or, with ``__w``, the Z-set pairs) Python batches are,
    so it is checked by the same code; columns match by name."""
    names = list(schema.names)
    missing = [n for n in names if n not in table.column_names]
    extra = [n for n in table.column_names if n not in names and n != WEIGHT]
    if missing or extra:
        raise InputError(
            source,
            f"the Arrow batch has columns {table.column_names}; expected {names}"
            + (" (and optionally __w)" if weighted else ""),
        )
    columns = [table.column(n).to_pylist() for n in names]
    rows = list(zip(*columns, strict=True)) if names else []
    if not weighted:
        return rows
    if WEIGHT in table.column_names:
        return [
            (row, int(w)) for row, w in zip(rows, table.column(WEIGHT).to_pylist(), strict=True)
        ]
    return [(row, 1) for row in rows]


def fingerprint_text(columns: Iterable[str], rows: int, row_hash_sum: int) -> str:
    """A batch's fingerprint: its columns, its row count and the sum of its rows' hashes
    (Spark's ``xxhash64`` of every column, sorted by name, and of the row's NULL
    pattern). Both tiers compute the sum their own way and format it here, so a
    committed batch is recognised whichever tier ingested it."""
    text = f"{','.join(sorted(columns))}|{rows}|{row_hash_sum}"
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def upsert_spec(node: Node) -> UpsertSpec:
    """The upsert semantics an ``upsert_source`` node declares (shared by every engine)."""
    user: Schema = node.params["user_schema"]
    return UpsertSpec(
        source=node.label,
        columns=user.names,
        types=user.types,
        key=node.params["key"],
        watermark=node.params["watermark"],
        tombstone=node.params["tombstone"],
        tombstone_value=node.params["tombstone_value"],
    )
