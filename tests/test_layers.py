"""Imports point one way (ARCHITECTURE.md, "Layers"): every ``import dbspark.X`` in the
library, at module level or inside a function, goes to its own layer or one below; no
library module imports the development tools; the layers under ``orchestration`` never
import Airflow; and within ``orchestration`` only ``orchestration/airflow/`` does, besides
the source connectors, which look up a Connection or ``[dbspark] landing`` through its
hook when a batch is pulled."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "include" / "dbspark"

#: What each top-level part of ``dbspark`` may import from ``dbspark``.
ALLOWED: dict[str, set[str]] = {
    "core": {"core"},
    "circuit": {"core", "circuit"},
    "storage": {"core", "storage"},
    "examples": {"core", "circuit", "sql", "examples"},
    "engine": {"core", "circuit", "storage", "engine"},
    "orchestration": {"core", "circuit", "storage", "engine", "sql", "orchestration"},
    "sql": {"core", "circuit", "sql"},
    "conformance": {"core", "circuit", "storage", "engine", "examples", "sql", "conformance"},
    # On top: its rebuild corrects the published outputs (orchestration's sinks).
    "refresh": {"core", "circuit", "storage", "engine", "examples", "orchestration"},
    "devtools": {
        "core",
        "circuit",
        "storage",
        "engine",
        "orchestration",
        "examples",
        "conformance",
        "sql",
        "devtools",
    },
}
#: Third-party packages a layer must not import.
FORBIDDEN_THIRD_PARTY = {
    "core": {"airflow", "pyspark", "duckdb", "pyarrow", "sqlalchemy"},
    "circuit": {"airflow", "pyspark", "duckdb"},
    "sql": {"airflow", "pyspark", "duckdb", "pyarrow", "sqlalchemy"},
    "storage": {"airflow"},
    "engine": {"airflow"},
}


def _part(path: Path) -> str:
    relative = path.relative_to(PACKAGE)
    return relative.parts[0].removesuffix(".py") if len(relative.parts) > 1 else relative.stem


def _imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
    return found


MODULES = sorted(p for p in PACKAGE.rglob("*.py") if p.name != "__init__.py" or p.parent != PACKAGE)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_point_down(path: Path) -> None:
    part = _part(path)
    assert part in ALLOWED, f"{path}: a part of dbspark this test does not know: {part}"
    wrong = []
    for line, module in _imports(path):
        top, *rest = module.split(".")
        if top == "dbspark" and rest and rest[0] not in ALLOWED[part]:
            wrong.append(f"line {line}: {module}")
        if top in FORBIDDEN_THIRD_PARTY.get(part, ()):
            wrong.append(f"line {line}: {module}")
    assert not wrong, f"{path.relative_to(PACKAGE)} ({part}) imports upward: {wrong}"


#: The orchestration modules outside ``orchestration/airflow/`` that may import its hook
#: (``orchestration/airflow/hook.py``), inside a function only: they resolve an Airflow
#: Connection (``SqlTable(conn_id=...)``) or ``[dbspark] landing`` when a batch is
#: pulled, never when a DAG file is parsed. Airflow itself only ``orchestration/airflow/``
#: imports.
HOOK_AT_PULL_TIME = {"orchestration/sources/landing.py", "orchestration/sources/sql.py"}
ORCHESTRATION = sorted(p for p in MODULES if _part(p) == "orchestration")


def _module_level_imports(path: Path) -> set[int]:
    """Lines of the imports that run when the module is imported (not inside a function)."""
    found: set[int] = set()
    pending = list(ast.parse(path.read_text(), filename=str(path)).body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.add(node.lineno)
        pending.extend(ast.iter_child_nodes(node))
    return found


@pytest.mark.parametrize("path", ORCHESTRATION, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_only_orchestration_airflow_imports_airflow(path: Path) -> None:
    relative = path.relative_to(PACKAGE).as_posix()
    if relative.startswith("orchestration/airflow/"):
        return
    imports = _imports(path)
    airflow = [(line, m) for line, m in imports if m.split(".")[0] == "airflow"]
    assert not airflow, f"{relative} imports Airflow outside orchestration/airflow/: {airflow}"
    # The package's front door re-exports build_dag; the modules under it do not reach up.
    front_door = relative == "orchestration/__init__.py"
    into_airflow = [
        (line, m)
        for line, m in imports
        if m.startswith("dbspark.orchestration.airflow") and not front_door
    ]
    if relative in HOOK_AT_PULL_TIME:
        top_level = _module_level_imports(path)
        hook = "dbspark.orchestration.airflow.hook"
        into_airflow = [(line, m) for line, m in into_airflow if line in top_level or m != hook]
    assert not into_airflow, f"{relative} imports orchestration/airflow/: {into_airflow}"


def test_every_part_is_known() -> None:
    parts = {_part(p) for p in MODULES}
    assert parts <= set(ALLOWED), parts - set(ALLOWED)
    assert {"core", "engine", "devtools"} <= parts
