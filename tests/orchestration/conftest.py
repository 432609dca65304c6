"""Fixtures shared by the DAG-run tests of this folder."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from dbspark.orchestration.sources import LandingDirectory
from tests.moto_s3 import BUCKET, S3

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


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[S3]:
    """A moto S3 server of the test's own, holding the bucket ``BUCKET``."""
    # The publishing process's credentials (moto takes any).
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "dbspark-test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "dbspark-test-secret")
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    server = S3()
    server.client().create_bucket(Bucket=BUCKET)
    try:
        yield server
    finally:
        server.close()
