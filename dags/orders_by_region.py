"""Airflow DAG: orders and customers arrive as upserts; totals per region stay current.

Each daily run is one epoch. It ingests that day's upsert files (Parquet, CSV or JSON
lines) from the landing directory, ``<landing>/customers/interval=20260101T000000Z/``
and ``<landing>/orders/interval=.../``, updates the views incrementally on Spark and
publishes them: ``customers_current``, ``orders_current`` and ``region_totals``.
A row with a newer ``ts`` replaces its key's row; ``deleted`` / ``deleted_at`` delete it.
"""

from datetime import UTC, datetime

from dbspark.examples.circuits import orders
from dbspark.orchestration import LandingDirectory, build_dag

landing = LandingDirectory()  # [dbspark] landing in airflow.cfg

dag = build_dag(
    orders,
    dag_id="dbspark_orders_by_region",
    schedule="@daily",
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    sources={"customers": landing, "orders": landing},
)
