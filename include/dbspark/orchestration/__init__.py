"""Circuits as Airflow DAGs: one DAG per circuit, one DAG run per epoch.

The top layer (ARCHITECTURE.md, "Layers"): it imports everything below it and nothing
imports it. ``build_dag`` is the entry point; the files in ``dags/`` call it with a
circuit and one connector per source.
"""

from dbspark.orchestration.connectors import LandingDirectory, SourceConnector, SqlTable
from dbspark.orchestration.dag import build_dag
from dbspark.orchestration.intervals import Interval

__all__ = ["Interval", "LandingDirectory", "SourceConnector", "SqlTable", "build_dag"]
