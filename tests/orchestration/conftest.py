"""Fixtures shared by the DAG-run tests of this folder."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from dbspark.orchestration.sources import LandingDirectory

#: The test DAG files (``dags/example_dags.py``): small circuits over a landing folder.
DAGS = Path(__file__).parent / "dags"


@pytest.fixture(scope="module")
def test_dags(airflow_db: Path) -> dict[str, Any]:
    """The test DAGs as Airflow's own DagBag loads them (none may fail to import)."""
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(str(DAGS))
    assert bag.import_errors == {}
    return bag.dags


@pytest.fixture
def place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """A fresh warehouse, landing directory and outputs, as airflow.cfg would give them."""
    where = SimpleNamespace(
        warehouse=tmp_path / "warehouse",
        landing=LandingDirectory(tmp_path / "landing"),
        outputs=tmp_path / "published",
    )
    monkeypatch.setenv("AIRFLOW__DBSPARK__WAREHOUSE", str(where.warehouse))
    monkeypatch.setenv("AIRFLOW__DBSPARK__LANDING", str(tmp_path / "landing"))
    monkeypatch.setenv("AIRFLOW__DBSPARK__OUTPUTS", str(where.outputs))
    return where
