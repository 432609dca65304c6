"""Imports point one way (ARCHITECTURE.md, "Layers"): every ``import dbspark.X`` in the
library, at module level or inside a function, goes to its own layer or one below; no
library module imports the development tools; and the layers under ``orchestration``
never import Airflow."""

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
    "examples": {"core", "circuit", "examples"},
    "engine": {"core", "circuit", "storage", "engine"},
    "orchestration": {"core", "circuit", "storage", "engine", "orchestration"},
    "conformance": {"core", "circuit", "storage", "engine", "examples", "conformance"},
    "refresh": {"core", "circuit", "storage", "engine", "examples"},
    "devtools": {
        "core",
        "circuit",
        "storage",
        "engine",
        "orchestration",
        "examples",
        "conformance",
        "devtools",
    },
}
#: Third-party packages a layer must not import.
FORBIDDEN_THIRD_PARTY = {
    "core": {"airflow", "pyspark", "duckdb", "pyarrow", "sqlalchemy"},
    "circuit": {"airflow", "pyspark", "duckdb"},
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


def test_every_part_is_known() -> None:
    parts = {_part(p) for p in MODULES}
    assert parts <= set(ALLOWED), parts - set(ALLOWED)
    assert {"core", "engine", "devtools"} <= parts
