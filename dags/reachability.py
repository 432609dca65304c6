"""Airflow DAG: which graph nodes are reachable from the roots, kept current as edges
come and go.

Each daily run is one epoch. Edge and root files land in ``<landing>/edges/...`` and
``<landing>/roots/...``; a ``__w`` column of -1 deletes an edge. The recursive part
runs as the mapped task ``loop_reach.iterate`` (one instance per iteration, until the
fixed point) and ``loop_reach.converged`` checks that it got there.
"""

from datetime import UTC, datetime

from dbspark.examples.circuits import reachability
from dbspark.orchestration import LandingDirectory, build_dag

landing = LandingDirectory()  # [dbspark] landing in airflow.cfg

dag = build_dag(
    reachability,
    dag_id="dbspark_reachability",
    schedule="@daily",
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    sources={"edges": landing, "roots": landing},
    iteration_tasks=8,
)
