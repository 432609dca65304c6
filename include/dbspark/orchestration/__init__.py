"""Circuits as Airflow DAGs: one DAG per circuit, one DAG run per epoch.

The top layer (ARCHITECTURE.md, "Layers"): it imports everything below it and nothing
imports it. ``build_dag`` is the entry point; the files in ``dags/`` call it with a
circuit and one connector per source, or ``sql_dag`` with a ``.sql`` file of views and a
JSON file declaring their sources. ``view_asset`` is the Airflow Asset of a published
view, for DAGs scheduled on it.

Laid out by role, as Airflow providers are: ``airflow/`` (the DAG, its task callables,
deployment from ``airflow.cfg`` and Connections), ``sources/`` (where each source's batch
comes from), ``sinks/`` (where the views go: Parquet directories and serving tables);
``epochs``, ``intervals`` and ``units`` (what a task runs, in the worker or through
spark-submit) know nothing of Airflow.
"""

from dbspark.orchestration.airflow.assets import view_asset
from dbspark.orchestration.airflow.dag import build_dag, sql_dag
from dbspark.orchestration.intervals import Interval
from dbspark.orchestration.sources import LandingDirectory, SourceConnector, SqlTable

__all__ = [
    "Interval",
    "LandingDirectory",
    "SourceConnector",
    "SqlTable",
    "build_dag",
    "sql_dag",
    "view_asset",
]
