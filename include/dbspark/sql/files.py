"""A circuit from files: a ``.sql`` script of views and a JSON file declaring its sources.

What a DAG file and ``python -m dbspark.sql explain`` point at. Every error, from a
missing file to a refused construct, is a :class:`SqlError` whose message names the
file (and, for SQL, the view, line and column), because a DAG's import error and a
command's last line are all the user sees.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dbspark.circuit.builder import Circuit, CircuitError
from dbspark.sql.compiler import add_views, declare_sources
from dbspark.sql.errors import SqlError


def read_text(path: str | Path) -> str:
    """The text of ``path``; a missing or unreadable file is a ``SqlError`` naming it."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SqlError("no such file", file=str(path)) from None
    except (OSError, UnicodeDecodeError) as error:
        raise SqlError(f"cannot read: {error}", file=str(path)) from None


def read_sources(path: str | Path) -> dict[str, Any]:
    """The source declarations in ``path``: a JSON object, source name -> declaration
    (the conformance format's ``sources``)."""
    try:
        declared = json.loads(read_text(path))
    except json.JSONDecodeError as error:
        raise SqlError(
            f"not valid JSON: {error.msg}", line=error.lineno, column=error.colno, file=str(path)
        ) from None
    if not isinstance(declared, dict) or not declared:
        raise SqlError(
            'expected a JSON object of source declarations, e.g. {"edges": {"columns": '
            '[["src", "BIGINT"], ["dst", "BIGINT"]]}}',
            file=str(path),
        )
    return declared


def compile_files(sql: str | Path, sources: str | Path, name: str | None = None) -> Circuit:
    """The circuit of the views in the script ``sql`` over the sources declared in the
    JSON file ``sources``, called ``name`` (default: the script's file name without
    ``.sql``). Errors name the file they are in."""
    sql, sources = Path(sql), Path(sources)
    declared = read_sources(sources)
    script = read_text(sql)
    try:
        circuit = Circuit(name or sql.stem)
    except CircuitError as error:
        raise SqlError(f"{error}; pass a circuit name", file=str(sql)) from None
    try:
        declare_sources(circuit, declared)
    except CircuitError as error:
        raise SqlError(str(error), file=str(sources)) from None
    try:
        add_views(circuit, script)
    except SqlError as error:
        raise error.in_file(str(sql)) from None
    except CircuitError as error:
        raise SqlError(str(error), file=str(sql)) from None
    return circuit
