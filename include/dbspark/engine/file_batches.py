"""A batch given as files, and the checks of its columns that both tiers make.

A :class:`FileBatch` names files of one format (``parquet``, ``csv`` with a header line,
``jsonl``: one JSON object per line). The Spark tier reads any batch
(``engine/spark/files.py``); the local tier reads a small Parquet batch of local files
in this process (``engine/local/files.py``). Both reject a file whose columns are not
the source's declared ones with the same message, built here.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

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
