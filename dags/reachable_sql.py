"""Airflow DAG: graph reachability with the view written in SQL, in a file.

``sql/reachable.sql`` defines the view (a ``WITH RECURSIVE`` query) and
``sql/graph_sources.json`` declares the sources it reads; both files sit next to this
one. Each daily run reads the same landing files as ``dbspark_reachability``
(``<landing>/edges/...`` and ``<landing>/roots/...``; a ``__w`` of -1 deletes an edge).
``python -m dbspark.sql explain sql/reachable.sql --sources sql/graph_sources.json``
prints what each run will do.
"""

from datetime import UTC, datetime

from dbspark.orchestration import sql_dag

dag = sql_dag(
    "sql/reachable.sql",
    sources="sql/graph_sources.json",  # every source from [dbspark] landing
    dag_id="dbspark_reachable_sql",
    schedule="@daily",
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    iteration_tasks=8,
)
