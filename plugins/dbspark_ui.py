"""The dbspark page in the Airflow UI (nav entry "dbspark"); the code and its tests live
in ``dbspark.orchestration.airflow.ui``."""

from dbspark.orchestration.airflow.ui.plugin import DbsparkPlugin

__all__ = ["DbsparkPlugin"]
