"""The example Airflow DAGs of ``dags/`` for ``test_cluster.py``, bounded to the test's days.

Same circuits, ids, sources and loop settings as ``dags/orders_by_region.py`` and
``dags/reachability.py``. What differs, for the test only: ``catchup=False`` with an
``end_date`` a few days after the start, so unpausing them schedules no run of the
scheduler's own (the originals would catch up one run per day since 2026-01-01) and
every run comes from the REST API; and one quick retry.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from dbspark.examples.circuits import orders, reachability
from dbspark.orchestration import LandingDirectory, build_dag

START = datetime(2026, 1, 1, tzinfo=UTC)
DAYS = 3

landing = LandingDirectory()  # [dbspark] landing, from the deployment's environment
bounded = {
    "schedule": "@daily",
    "start_date": START,
    "end_date": START + timedelta(days=DAYS),
    "catchup": False,
    "retries": 1,
    "retry_delay": timedelta(seconds=2),
}

orders_dag = build_dag(
    orders,
    dag_id="dbspark_orders_by_region",
    sources={"customers": landing, "orders": landing},
    **bounded,
)
reachability_dag = build_dag(
    reachability,
    dag_id="dbspark_reachability",
    sources={"edges": landing, "roots": landing},
    iteration_tasks=8,
    **bounded,
)
