"""Feeding a source from small Parquet and JSON-lines files without Spark.

A landing batch of a few thousand rows is read in this process, so the Airflow task
that ingests it starts no JVM. The rules are the Spark tier's (``engine/spark/files.py``):
the file's own schema is checked against the declared columns (the same messages, from
``engine/file_batches.py``), types may only widen safely, rows are cast to the declared
types, and rows then get the checks Python rows get, naming the files that hold a bad
key. What this tier does not take it leaves to Spark, which reads anything:

* CSV files (Spark's CSV parsing rules are its own, and a second parser would read some
  files differently), and JSON-lines files with DATE, TIMESTAMP or DECIMAL columns
  (strings Spark casts by its rules); other JSON lines map strictly to types, and are
  read here (``jsonl.py``);
* paths that are not local files (``s3a://``, ``hdfs://``);
* batches with more than ``local_rows`` rows, counted from the files' footers.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import reduce

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from dbspark.core.columns import WEIGHT
from dbspark.core.errors import shown
from dbspark.core.types import (
    BIGINT,
    BOOLEAN,
    DATE,
    DOUBLE,
    STRING,
    TIMESTAMP,
    Schema,
    decimal_widens,
    element_type,
    is_array,
    is_decimal,
    is_scalar,
)
from dbspark.core.upsert import BadUpsertRow, UpsertError, UpsertSpec, upserts_to_updates
from dbspark.core.zset import ZSet
from dbspark.engine.api import InputError
from dbspark.engine.batches import CheckedRows, CheckedTable, arrow_rows, upsert_batch, zset_batch
from dbspark.engine.file_batches import (
    FileBatch,
    check_names,
    declared_columns,
    jsonl_row_lines,
    local_path,
    located,
    located_rows,
    tied_rows,
    wrong_type,
)
from dbspark.engine.local.dialect import arrow_type
from dbspark.engine.local.jsonl import (
    SparksToRead,
    count_rows,
    file_lines,
    jsonl_readable,
    read_jsonl,
)

#: Bad rows shown in one error.
_MAX_SHOWN = 5
#: A JSON-lines batch of more than ``local_rows`` times this many bytes goes to Spark
#: without its lines being counted.
_MAX_LINE_BYTES = 1024
#: File name endings Spark (Hadoop's codecs) decompresses on the fly; such files are its.
_COMPRESSED = (".gz", ".bz2", ".deflate", ".lz4", ".snappy", ".zst")


@dataclass(frozen=True)
class CheckedFiles:
    """A file batch read and checked on the local tier: ``batch`` is what ingest takes
    (checked upsert rows, or a Z-set), ``row_files`` names each row's file."""

    batch: CheckedTable | CheckedRows | ZSet
    files: tuple[str, ...]
    row_files: tuple[str, ...]
    format: str = "parquet"

    def file_label(self) -> str:
        return ", ".join(self.files)

    def where_holding(
        self, key_columns: Sequence[str], keys: Sequence[tuple | None], files: Sequence[str]
    ) -> str:
        """Where in ``files`` the rows with one of ``keys`` are (their rows, or a JSON-lines
        file's lines), worded for an error found at ingest; ``""`` if not known."""
        if isinstance(self.batch, ZSet):
            return ""
        rows = self.batch.rows() if isinstance(self.batch, CheckedTable) else self.batch
        index = [list(self.batch.schema.names).index(c) for c in key_columns]
        wanted = {k for k in keys if k is not None}
        found = [i for i, row in enumerate(rows) if tuple(row[j] for j in index) in wanted]
        lead = "the offending keys are on "
        return located_rows(self.format, found, self.row_files, files, lead)

    def files_holding(self, key_columns: Sequence[str], keys: Sequence[tuple | None]) -> list[str]:
        """The files that hold rows with one of ``keys`` (for errors found at ingest)."""
        if isinstance(self.batch, ZSet):
            return list(self.files)
        rows = self.batch.rows() if isinstance(self.batch, CheckedTable) else self.batch
        names = list(self.batch.schema.names)
        index = [names.index(c) for c in key_columns]
        wanted = {k for k in keys if k is not None}
        found = {
            file
            for row, file in zip(rows, self.row_files, strict=True)
            if tuple(row[i] for i in index) in wanted
        }
        return [f for f in self.files if f in found] or list(self.files)


def read_files(
    source: str,
    schema: Schema,
    batch: FileBatch,
    *,
    weighted: bool,
    upsert: UpsertSpec | None,
    max_rows: int,
) -> CheckedFiles | None:
    """Read and check ``batch`` here, or None if it is the Spark tier's to read (see the
    module docstring). Raises what the Spark tier raises for a bad file."""
    if batch.format not in ("parquet", "jsonl") or max_rows <= 0:
        return None
    paths = [local_path(p) for p in batch.paths]
    if any(p is None for p in paths):
        return None
    if batch.format == "jsonl":
        tables = _read_jsonl_files(source, schema, paths, batch.paths, weighted, max_rows)  # type: ignore[arg-type]
        if tables is None:
            return None
    else:
        files = [_open(source, path) for path in paths]  # type: ignore[arg-type]
        if sum(f.metadata.num_rows for f in files) > max_rows:
            return None
        tables = [
            _read(source, schema, file, path, weighted)
            for file, path in zip(files, batch.paths, strict=True)
        ]
    row_files = tuple(
        path for table, path in zip(tables, batch.paths, strict=True) for _ in range(table.num_rows)
    )
    if upsert is not None:
        _check_null_keys(source, upsert, tables, batch.paths, batch.format)
    table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
    label = ", ".join(batch.paths)
    if upsert is not None:
        typed = checked_table(schema, table)
        if typed is not None and not _has_ties(upsert, table):
            return CheckedFiles(typed, batch.paths, row_files, batch.format)
    rows = arrow_rows(source, table, schema, weighted=weighted)
    if weighted:
        zset = zset_batch(source, schema, rows, label)
        return CheckedFiles(zset, batch.paths, row_files, batch.format)
    checked = upsert_batch(source, schema, rows, label)
    result = CheckedFiles(checked, batch.paths, row_files, batch.format)
    assert upsert is not None
    try:  # ties within the batch, worded by core's rule, before the epoch opens
        upserts_to_updates(upsert, checked, lambda key: None, label)
    except UpsertError as error:
        holding = result.files_holding(error.key_columns, error.keys)
        rows = tied_rows(upsert, checked, error.keys)
        where = located_rows(batch.format, rows, result.row_files, holding)
        args = (error.source, ", ".join(holding), error.keys, error.detail + where)
        raise type(error)(*args, error.positions, error.key_columns) from None
    return result


def checked_table(schema: Schema, table: pa.Table) -> CheckedTable | None:
    """``table`` as upsert input that ingest takes as it stands: when its columns are
    exactly ``schema``'s and each one's type fits its declared type (the files' rule,
    ``arrow_type_fits``), cast to the declared types. Otherwise None, and the row path
    checks it and words what is wrong."""
    if sorted(table.column_names) != sorted(schema.names):
        return None
    if not all(is_scalar(kind) for kind in schema.types):
        return None
    columns = []
    for name, kind in schema.fields:
        column = table.column(name)
        if not arrow_type_fits(column.type, kind):
            return None
        columns.append(column.cast(arrow_type(kind)))
    return CheckedTable(pa.Table.from_arrays(columns, names=list(schema.names)), schema)


def _has_ties(spec: UpsertSpec, table: pa.Table) -> bool:
    """Whether two different rows share a key and a watermark (then core's rule, on the
    rows, rejects the batch with its message; ingest checks again, set-based)."""
    groups = list(spec.key) + [m for m in spec.watermark if m not in spec.key]
    if table.num_rows == 0:
        return False
    distinct = table.select(list(spec.columns)).group_by(list(spec.columns)).aggregate([])
    counts = distinct.group_by(groups).aggregate([([], "count_all")])
    return bool(pc.any(pc.greater(counts.column("count_all"), 1)).as_py())


def _read_jsonl_files(
    source: str,
    schema: Schema,
    paths: Sequence[str],
    names: Sequence[str],
    weighted: bool,
    max_rows: int,
) -> list[pa.Table] | None:
    """The JSON-lines files as tables, or None when they are Spark's to read (an array of
    a type parsed from text, a value in a form only Spark's text rules read, or more than
    ``max_rows`` lines)."""
    if not jsonl_readable(schema) or any(p.endswith(_COMPRESSED) for p in paths):
        return None
    for path, name in zip(paths, names, strict=True):
        if not os.path.isfile(path):
            raise InputError(source, "the file does not exist", name)
    # Counting lines reads the files: a batch far too large is not even counted.
    if sum(os.path.getsize(p) for p in paths) > max_rows * _MAX_LINE_BYTES:
        return None
    lines = [file_lines(p) for p in paths]  # each file read and decoded once
    if sum(count_rows(ls) for ls in lines) > max_rows:
        return None
    try:
        return [
            read_jsonl(source, schema, file, weighted, name)
            for file, name in zip(lines, names, strict=True)
        ]
    except SparksToRead:
        return None


def _check_null_keys(
    source: str,
    spec: UpsertSpec,
    tables: Sequence[pa.Table],
    paths: Sequence[str],
    fmt: str = "parquet",
) -> None:
    """Rows with a NULL in a key column, reported as the Spark tier reports them."""
    keys = list(spec.key)
    found: list[tuple[str, int, pa.Table]] = []
    for table, path in zip(tables, paths, strict=True):
        mask = reduce(pc.or_, [pc.is_null(table.column(k)) for k in keys])
        for position in pc.indices_nonzero(mask).to_pylist()[:_MAX_SHOWN]:
            found.append((path, position, table))
    if not found:
        return
    path, position, table = found[0]
    first = [table.column(c)[position].as_py() for c in spec.columns]
    files = sorted({p for p, _, _ in found})
    where = located({path: [position]}, "row", files)
    if fmt == "jsonl":  # its line (the file read again, on this error's path only)
        where = located({path: list(jsonl_row_lines(path, [position]).values())}, "line", files)
    raise BadUpsertRow(
        source,
        ", ".join(files),
        [tuple(t.column(k)[i].as_py() for k in keys) for _, i, t in found[:_MAX_SHOWN]],
        detail=f"NULL in a key column{where}: {shown(first)}",
        key_columns=keys,
    )


def _open(source: str, path: str) -> pq.ParquetFile:
    if not os.path.isfile(path):
        raise InputError(source, "the file does not exist", path)
    try:
        return pq.ParquetFile(path)
    except (OSError, pa.ArrowException) as error:
        raise InputError(source, f"cannot be read: {_summary(error)}", path) from None


def _read(source: str, schema: Schema, file: pq.ParquetFile, path: str, weighted: bool) -> pa.Table:
    arrow_schema = file.schema_arrow
    check_names(source, schema, arrow_schema.names, weighted, path, "the file")
    declared = declared_columns(schema, weighted)
    for field in arrow_schema:
        if not arrow_type_fits(field.type, declared[field.name]):
            raise wrong_type(
                source,
                "the file",
                field.name,
                declared[field.name],
                spark_sql_name(field.type),
                path,
            )
    try:
        table = file.read()
    except (OSError, pa.ArrowException) as error:
        raise InputError(source, f"cannot be read: {_summary(error)}", path) from None
    columns = [table.column(n).cast(arrow_type(t)) for n, t in schema.fields]
    names = list(schema.names)
    if weighted:
        names.append(WEIGHT)
        if WEIGHT in table.column_names:
            weights = table.column(WEIGHT).cast(pa.int64())
            if weights.null_count:
                first = weights.is_null().to_pylist().index(True)
                raise InputError(source, f"row {first}: the weight {WEIGHT!r} is NULL", path)
            columns.append(weights)
        else:
            columns.append(pa.array([1] * table.num_rows, pa.int64()))
    return pa.Table.from_arrays(columns, names=names)


def _summary(error: BaseException) -> str:
    first = next((line.strip() for line in str(error).splitlines() if line.strip()), "")
    return f"[{type(error).__name__}] {first}"[:400]


# ==================================================================================== types
_SIGNED_NARROW = (pa.int8(), pa.int16(), pa.int32())
_UNSIGNED_NARROW = (pa.uint8(), pa.uint16())


def arrow_type_fits(dtype: pa.DataType, type_name: str) -> bool:
    """Can a Parquet column read as Arrow ``dtype`` be read as ``type_name`` without
    losing data? The Spark tier's rule (``spark_type_fits``) on the types Spark reads
    the same column as: unsigned 8/16-bit as SMALLINT/INT, unsigned 32-bit as BIGINT,
    unsigned 64-bit as DECIMAL(20,0)."""
    if pa.types.is_null(dtype):
        return True
    if type_name == BIGINT:
        return dtype in (*_SIGNED_NARROW, pa.int64(), *_UNSIGNED_NARROW, pa.uint32())
    if type_name == DOUBLE:
        return dtype in (pa.float32(), pa.float64(), *_SIGNED_NARROW, *_UNSIGNED_NARROW)
    if type_name == STRING:
        return pa.types.is_string(dtype) or pa.types.is_large_string(dtype)
    if type_name == BOOLEAN:
        return pa.types.is_boolean(dtype)
    if type_name == DATE:
        return pa.types.is_date32(dtype)
    if type_name == TIMESTAMP:  # an instant (Spark reads a timestamp without zone as NTZ)
        return pa.types.is_timestamp(dtype) and dtype.tz is not None and dtype.unit != "ns"
    if is_decimal(type_name):
        return decimal_widens(_exact_digits(dtype), type_name)
    if is_array(type_name):
        return (pa.types.is_list(dtype) or pa.types.is_large_list(dtype)) and arrow_type_fits(
            dtype.value_type, element_type(type_name)
        )
    return False


def _exact_digits(dtype: pa.DataType) -> tuple[int, int] | None:
    """``(precision, scale)`` of an exact numeric type, as Spark widens integers."""
    if pa.types.is_decimal(dtype):
        return dtype.precision, dtype.scale
    digits = {pa.int8(): 3, pa.int16(): 5, pa.int32(): 10, pa.int64(): 20}
    digits.update({pa.uint8(): 5, pa.uint16(): 10, pa.uint32(): 20})
    return (digits[dtype], 0) if dtype in digits else None


_SPARK_NAMES = {
    pa.int8(): "TINYINT",
    pa.int16(): "SMALLINT",
    pa.int32(): "INT",
    pa.int64(): "BIGINT",
    pa.uint8(): "SMALLINT",
    pa.uint16(): "INT",
    pa.uint32(): "BIGINT",
    pa.uint64(): "DECIMAL(20,0)",
    pa.float32(): "FLOAT",
    pa.float64(): "DOUBLE",
    pa.string(): "STRING",
    pa.large_string(): "STRING",
    pa.bool_(): "BOOLEAN",
    pa.binary(): "BINARY",
    pa.date32(): "DATE",
}


def spark_sql_name(dtype: pa.DataType) -> str:
    """The name Spark gives the type it reads an Arrow type as (for error messages)."""
    if dtype in _SPARK_NAMES:
        return _SPARK_NAMES[dtype]
    if pa.types.is_list(dtype) or pa.types.is_large_list(dtype):
        return f"ARRAY<{spark_sql_name(dtype.value_type)}>"
    if pa.types.is_decimal(dtype):
        return f"DECIMAL({dtype.precision},{dtype.scale})"
    if pa.types.is_timestamp(dtype):
        return "TIMESTAMP" if dtype.tz else "TIMESTAMP_NTZ"
    return str(dtype).upper()
