"""A batch given as files, and the checks of its columns that both tiers make.

A :class:`FileBatch` names files of one format (``parquet``, ``csv`` with a header line,
``jsonl``: one JSON object per line). The Spark tier reads any batch
(``engine/spark/files.py``); the local tier reads a small Parquet batch of local files
in this process (``engine/local/files.py``). Both reject a file whose columns are not
the source's declared ones with the same message, built here.
"""

from __future__ import annotations

import bz2
import codecs
import gzip
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import IO, Any

from dbspark.core.columns import WEIGHT
from dbspark.core.errors import REDACTED, redacting, shown_text
from dbspark.core.types import BIGINT, Schema
from dbspark.engine.api import InputError

FORMATS = ("parquet", "csv", "jsonl")
#: Which file a row came from (NULL for rows of a DataFrame batch).
FILE = "__file"
#: Where in its file: the 0-based row of a Parquet file; NULL for text files.
POSITION = "__pos"


@dataclass(frozen=True)
class FileBatch:
    """One batch for one source, as files of one format (read when the epoch is checked).

    ``paths`` are local paths or any URI Spark can read (``s3a://...``); a single path may
    be given as a string. The batch is a value: two equal FileBatches read the same files.
    """

    paths: tuple[str, ...]
    format: str

    def __init__(self, paths: str | os.PathLike[str] | Iterable[Any], format: str) -> None:
        if isinstance(paths, (str, os.PathLike)):
            paths = [paths]
        normal = tuple(os.fspath(p) for p in paths)
        fmt = str(format).strip().lower()
        if fmt == "json":
            fmt = "jsonl"
        if fmt not in FORMATS:
            raise ValueError(f"file format {format!r} is not one of {', '.join(FORMATS)}")
        if not normal:
            raise ValueError("a FileBatch needs at least one path")
        twice = sorted({p for p in normal if normal.count(p) > 1})
        if twice:  # its rows would count twice
            raise ValueError(f"a FileBatch lists {twice} more than once")
        object.__setattr__(self, "paths", normal)
        object.__setattr__(self, "format", fmt)


#: The formats whose files are text, which must be UTF-8.
TEXT_FORMATS = ("csv", "jsonl")
#: How much of a text file :func:`check_utf8` decodes at a time.
_UTF8_CHUNK = 1 << 20


def local_path(path: str) -> str | None:
    """``path`` as a local file path, or None if it names another file system."""
    if path.startswith("file://"):
        return path[len("file://") :]
    if "://" in path:
        return None
    return path


def open_binary(path: str | os.PathLike[str]) -> IO[bytes]:
    """A data file's bytes, decompressed when its name ends in ``.gz`` or ``.bz2`` (as
    Spark's readers decompress them)."""
    suffix = os.path.splitext(os.fspath(path))[1].lower()
    if suffix == ".gz":
        return gzip.open(path, "rb")  # type: ignore[return-value]
    if suffix == ".bz2":
        return bz2.open(path, "rb")  # type: ignore[return-value]
    return open(path, "rb")


def utf8_lines(source: str, path: str, handle: IO[bytes]) -> Iterator[bytes]:
    """The lines of a text file, each checked to be UTF-8; the first that is not is
    refused, naming the file, the line and the byte, never the line's text."""
    for number, line in enumerate(handle, start=1):
        try:
            line.decode("utf-8")
        except UnicodeDecodeError as error:
            raise InputError(
                source,
                f"line {number}: byte {error.start + 1} of the line is not UTF-8 "
                f"(0x{line[error.start]:02x}); text files must be UTF-8",
                path,
            ) from None
        yield line


def check_utf8(source: str, batch: FileBatch) -> None:
    """Refuse a batch with a file that is not UTF-8, naming the file and the line:
    Spark's readers would replace the bytes with U+FFFD and load the mangled text. A
    Parquet file's STRING columns are checked too (:func:`check_parquet_text`). Files on
    other file systems (``s3a://``) are read as Spark finds them."""
    if batch.format == "parquet":
        for path in batch.paths:
            local = local_path(path)
            if local is not None and os.path.isfile(local):
                check_parquet_text(source, local, path)
        return
    if batch.format not in TEXT_FORMATS:
        return
    for path in batch.paths:
        local = local_path(path)
        if local is None or not os.path.isfile(local):
            continue  # the reader says what is wrong with a missing path, in its words
        try:
            with open_binary(local) as handle:
                if _is_utf8(handle):
                    continue
            with open_binary(local) as handle:  # again, line by line, to say where
                for _ in utf8_lines(source, path, handle):
                    pass
        except (OSError, EOFError) as error:  # a truncated or corrupt .gz / .bz2
            raise InputError(source, f"cannot be read: {error}", path) from None


def check_parquet_text(source: str, local: str, path: str) -> None:
    """Refuse a Parquet file whose string columns hold bytes that are not UTF-8, naming
    the file, the row (0-based, as Parquet rows are named) and the column, never the
    value. Neither tier's reader checks: the bytes were committed as they were, and every
    later read of the view that holds them failed in Python's decoder (the local tier) or
    carried invalid text on (Spark). Only the string columns are read, a row group at a
    time; a file that cannot be read is left to the reader to word."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        file = pq.ParquetFile(local)
        names = file.schema_arrow.names
        texts = [f.name for f in file.schema_arrow if _holds_text(f.type)]
        if not texts or len(set(names)) != len(names):  # duplicates: the reader refuses
            return
        row = 0
        for part in file.iter_batches(columns=texts):
            for name in texts:
                column = part.column(name)
                try:
                    column.validate(full=True)
                except pa.ArrowInvalid:
                    at = row + _first_invalid(column)
                    raise InputError(
                        source,
                        f"row {at} of the file: column {name!r} holds bytes that are not "
                        "UTF-8; Parquet STRING values must be UTF-8",
                        path,
                    ) from None
            row += part.num_rows
    except (OSError, pa.ArrowException):
        return  # truncated, corrupt: the reader says so, in its words


def _holds_text(dtype: Any) -> bool:
    import pyarrow as pa

    if pa.types.is_string(dtype) or pa.types.is_large_string(dtype):
        return True
    if pa.types.is_list(dtype) or pa.types.is_large_list(dtype):
        return _holds_text(dtype.value_type)
    return False


def _first_invalid(column: Any) -> int:
    """The index of the first value of ``column`` that fails full validation."""
    import pyarrow as pa

    for index in range(len(column)):
        try:
            column.slice(index, 1).validate(full=True)
        except pa.ArrowInvalid:
            return index
    return 0


def _is_utf8(handle: IO[bytes]) -> bool:
    """Whether all of ``handle`` decodes as UTF-8, decoded a chunk at a time (a
    character may span two chunks)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    try:
        while chunk := handle.read(_UTF8_CHUNK):
            decoder.decode(chunk)
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        return False
    return True


def declared_columns(schema: Schema, weighted: bool) -> dict[str, str]:
    """The columns a file may hold, by name: the schema's, and ``__w`` if ``weighted``."""
    columns = dict(schema.fields)
    if weighted:
        columns[WEIGHT] = BIGINT
    return columns


def check_names(
    source: str, schema: Schema, names: Sequence[str], weighted: bool, file: str | None, what: str
) -> None:
    """Reject ``names`` unless they are the declared columns (``__w`` optional)."""
    allowed = declared_columns(schema, weighted)
    duplicates = sorted({n for n in names if list(names).count(n) > 1})
    if duplicates:
        raise InputError(source, f"{what} has the column(s) {duplicates} more than once", file)
    missing = [n for n in schema.names if n not in names]
    extra = [n for n in names if n not in allowed]
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing column(s) {missing}")
        if extra:
            parts.append(f"unknown column(s) {extra}")
        weight = f" (and optionally {WEIGHT!r})" if weighted else ""
        raise InputError(
            source,
            f"{what} has {' and '.join(parts)}; the source declares {schema}{weight}",
            file,
        )


def json_line_error(
    source: str, where: str, message: str, line: str, file: str | None
) -> InputError:
    """The error for a JSON line that does not read as a row, as both tiers word it:
    ``message`` ends with the offending value after ``, got``, which is redacted (with the
    line itself) when error messages must not copy data."""
    if redacting():
        message = re.sub(r"(, got ).*$", r"\1" + REDACTED, message)
    return InputError(source, f"{where}: {message}: {shown_text(line)}", file)


def wrong_type(
    source: str, what: str, column: str, declared: str, got: str, file: str | None
) -> InputError:
    """The error for a column whose stored type cannot be read as the declared one
    (``got`` in Spark SQL's spelling, e.g. ``INT``)."""
    return InputError(source, f"{what}: column {column!r} is {declared.upper()}, got {got}", file)
