"""Airflow DAG: the orders example's upserts, with views written in SQL.

The same landing files as ``dbspark_orders_by_region`` (``<landing>/customers/...`` and
``<landing>/orders/...``) feed views defined by ``CREATE VIEW`` statements
(``dbspark.examples.circuits.ORDERS_SQL``): revenue per region with a LEFT JOIN,
customers without orders with NOT EXISTS, and totals with COUNT(DISTINCT). dbspark
compiles them to the same operators a Python circuit uses, so each daily run updates
them incrementally.
"""

from datetime import UTC, datetime

from dbspark.examples.circuits import orders_sql
from dbspark.orchestration import LandingDirectory, build_dag

landing = LandingDirectory()  # [dbspark] landing in airflow.cfg

dag = build_dag(
    orders_sql,
    dag_id="dbspark_orders_sql",
    schedule="@daily",
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    sources={"customers": landing, "orders": landing},
)
