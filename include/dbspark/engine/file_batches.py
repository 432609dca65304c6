"""A batch given as files, and the checks of its columns that both tiers make.

A :class:`FileBatch` names files of one format (``parquet``, ``csv`` with a header line,
``jsonl``: one JSON object per line). The Spark tier reads any batch
(``engine/spark/files.py``); the local tier reads a small Parquet batch of local files
in this process (``engine/local/files.py``). Both reject a file whose columns are not
the source's declared ones with the same message, built here, and both say where in its
file an offending row is (:func:`located`: a Parquet file's row, a text file's line).
"""

from __future__ import annotations

import bz2
import codecs
import gzip
import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any

from dbspark.core.columns import WEIGHT
from dbspark.core.errors import REDACTED, redacting, shown_text
from dbspark.core.types import BIGINT, Schema
from dbspark.core.upsert import UpsertSpec
from dbspark.engine.api import InputError

FORMATS = ("parquet", "csv", "jsonl")
#: Which file a row came from (NULL for rows of a DataFrame batch).
FILE = "__file"
#: Where in its file: the 0-based row of a Parquet file; NULL for text files (whose line
#: is found again, on an error's path only: ``engine/spark/files.py``, ``_lines_holding``).
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
        except UnicodeDecodeError:
            raise not_utf8(source, path, number, line) or AssertionError(line) from None
        yield line


def not_utf8(source: str, path: str, number: int, line: bytes) -> InputError | None:
    """The error for line ``number`` of a text file, if its bytes are not UTF-8 (naming
    the byte, never the line's text)."""
    try:
        line.decode("utf-8")
    except UnicodeDecodeError as error:
        return InputError(
            source,
            f"line {number}: byte {error.start + 1} of the line is not UTF-8 "
            f"(0x{line[error.start]:02x}); text files must be UTF-8",
            path,
        )
    return None


def utf8_checked(path: str) -> bool:
    """Whether :func:`check_utf8` reads ``path`` itself: a local file that exists. Spark
    reads any other (``s3a://``) with bytes that are not UTF-8 as U+FFFD, so its reader
    refuses U+FFFD in such a text file instead (``engine/spark/files.py``)."""
    local = local_path(path)
    return local is not None and os.path.isfile(local)


def check_utf8(source: str, batch: FileBatch) -> None:
    """Refuse a batch with a file that is not UTF-8, naming the file and the line:
    Spark's readers would replace the bytes with U+FFFD and load the mangled text. A
    Parquet file's STRING columns are checked too (:func:`check_parquet_text`). Files on
    other file systems (``s3a://``) are not read twice: Spark's reader refuses their text
    files' U+FFFD (see :func:`utf8_checked`)."""
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
        if local is None or not utf8_checked(path):
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


def check_header_fields(
    source: str, fields: Sequence[str | None], path: str, *, case_sensitive: bool
) -> None:
    """Refuse a CSV header line (its fields as read, in order) with a column named twice
    or a field with no name. Spark renames such columns (``id,name,id`` reads as
    ``id0,name,id2``; an empty field as ``_c<index>``), which would be reported as missing
    and unknown columns, so this is asked of the header line itself wherever a column's
    name could be such a rename (:func:`renamed_by_reader`). ``case_sensitive``: Spark's
    ``spark.sql.caseSensitive``; without it ``id`` and ``ID`` are one column named twice."""
    seen: dict[str, list[int]] = {}
    for number, name in enumerate(fields, start=1):
        if name is None or name == "":
            raise InputError(source, f"field {number} of the header has no column name", path)
        seen.setdefault(name if case_sensitive else name.lower(), []).append(number)
    for numbers in seen.values():
        if len(numbers) > 1:
            spelt = sorted({str(fields[n - 1]) for n in numbers})
            name = fields[numbers[0] - 1]
            also = (
                f", as {' and '.join(repr(s) for s in spelt)}: column names ignore case"
                if len(spelt) > 1
                else ""
            )
            at = ", ".join(str(n) for n in numbers)
            raise InputError(
                source,
                f"the column {name!r} is repeated in the header (fields {at}{also}); "
                "a column may appear once",
                path,
            )


def renamed_by_reader(names: Sequence[str]) -> bool:
    """Whether the column names Spark's CSV reader gave may hold its renames of a
    repeated header field (every occurrence becomes the name and its 0-based index:
    two or more names that are one base and their indices) or of an empty one
    (``_c<index>``). Almost no header that is fine looks so, and only one that does has
    its header line read again."""
    bases: dict[str, int] = {}
    for index, name in enumerate(names):
        suffix = str(index)
        if name == f"_c{index}":
            return True
        if name.endswith(suffix) and len(name) > len(suffix):
            base = name[: -len(suffix)].lower()
            bases[base] = bases.get(base, 0) + 1
    return any(count > 1 for count in bases.values())


def jsonl_row_lines(path: str, rows: Iterable[int]) -> dict[int, int]:
    """The 1-based lines of a local JSON-lines file that hold its rows ``rows`` (0-based,
    in file order: each non-blank line is a row, as both tiers read them). The file is
    read again: call it only to word an error."""
    from dbspark.engine.local.jsonl import file_lines

    wanted = set(rows)
    local = local_path(path)
    if not wanted or local is None:
        return {}
    found: dict[int, int] = {}
    row = 0
    for number, line in enumerate(file_lines(local), start=1):
        if not line.strip(" "):
            continue
        if row in wanted:
            found[row] = number
            if len(found) == len(wanted):
                break
        row += 1
    return found


#: Lines (or rows) of one file an error lists.
_MAX_LOCATED = 5


def located(
    found: Mapping[str, Iterable[int]], unit: str, named: Sequence[str], lead: str = ""
) -> str:
    """Where in their files an error's rows are, as `` (lines 2, 5 of the file)`` (or
    ``; `` between files, each named unless the error names one file only; ``lead``
    after the parenthesis), or ``""``. ``unit`` is ``line`` (1-based, a text file's) or
    ``row`` (0-based, a Parquet file's)."""
    parts = []
    for file, numbers in found.items():
        every = sorted(set(numbers))
        if not every:
            continue
        listed = ", ".join(str(n) for n in every[:_MAX_LOCATED])
        if len(every) > _MAX_LOCATED:
            listed += ", ..."
        of = "the file" if len(named) <= 1 else file
        parts.append(f"{unit}{'s' if len(every) > 1 else ''} {listed} of {of}")
    return f" ({lead}{'; '.join(parts)})" if parts else ""


def located_rows(
    fmt: str, rows: Iterable[int], row_files: Sequence[str], named: Sequence[str], lead: str = ""
) -> str:
    """:func:`located` for rows of a batch read on the local tier (``rows`` index the
    batch, ``row_files`` names each row's file): a Parquet file's rows, a JSON-lines
    file's lines (the file read again: an error's path only)."""
    start: dict[str, int] = {}
    for index, file in enumerate(row_files):
        start.setdefault(file, index)
    found: dict[str, list[int]] = {}
    for index in rows:
        file = row_files[index]
        found.setdefault(file, []).append(index - start[file])
    if fmt != "jsonl":
        return located(found, "row", named, lead)
    for file, positions in found.items():
        lines = jsonl_row_lines(file, positions)
        found[file] = [lines[p] for p in positions if p in lines]
    return located(found, "line", named, lead)


def tied_rows(spec: UpsertSpec, rows: Sequence[Sequence[Any]], keys: Iterable[Any]) -> list[int]:
    """The indices of ``rows`` (upsert rows, as tuples) that share one of ``keys`` and a
    watermark with a different row: a tie's rows."""
    names = list(spec.columns)
    key = [names.index(c) for c in spec.key]
    watermark = [names.index(c) for c in spec.watermark]
    wanted = {k for k in keys if k is not None}
    groups: dict[tuple, list[int]] = {}
    for index, row in enumerate(rows):
        k = tuple(row[i] for i in key)
        if k in wanted:
            groups.setdefault((k, tuple(row[i] for i in watermark)), []).append(index)
    found = []
    for members in groups.values():
        if len({tuple(rows[i]) for i in members}) > 1:
            found.extend(members)
    return sorted(found)


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
