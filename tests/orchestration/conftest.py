"""Fixtures shared by the DAG-run tests of this folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

#: The test DAG files (``dags/example_dags.py``): small circuits over a landing folder.
DAGS = Path(__file__).parent / "dags"


@pytest.fixture(scope="module")
def test_dags(airflow_db: Path) -> dict[str, Any]:
    """The test DAGs as Airflow's own DagBag loads them (none may fail to import)."""
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(str(DAGS))
    assert bag.import_errors == {}
    return bag.dags
