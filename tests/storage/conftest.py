"""Fixtures of the storage tests: a catalog URL on each backend, a fresh one per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from scratch_databases import scratch_database

from dbspark.storage import Catalog, TraceStore, Warehouse


@pytest.fixture(params=["sqlite", "postgresql"])
def catalog_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A URL of an empty catalog database: a SQLite file, or a new PostgreSQL database."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'catalog.db'}"
        return
    with scratch_database(request.getfixturevalue("postgres_url"), "catalog") as url:
        yield url


@pytest.fixture
def catalog(catalog_url: str) -> Iterator[Catalog]:
    cat = Catalog(catalog_url)
    yield cat
    cat.close()


@pytest.fixture
def warehouse(warehouse_path: Path) -> Warehouse:
    return Warehouse(warehouse_path)


@pytest.fixture
def local_catalog(warehouse_path: Path) -> Iterator[Catalog]:
    """The default catalog of the test's warehouse (SQLite in the warehouse)."""
    cat = Catalog.for_warehouse(warehouse_path)
    yield cat
    cat.close()


@pytest.fixture
def store(spark, warehouse: Warehouse, local_catalog: Catalog) -> TraceStore:
    local_catalog.register_circuit("c", "fp")
    return TraceStore(spark, warehouse, local_catalog, "c", buckets=4)
