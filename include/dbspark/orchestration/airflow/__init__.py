"""Everything of dbspark's orchestration that knows Airflow: ``dag`` builds a circuit's DAG
(:func:`~dbspark.orchestration.airflow.dag.build_dag`), ``tasks`` holds what each task of
an epoch's DAG run does, ``deployment`` resolves where a task works from ``airflow.cfg``
(``[dbspark]``) and Airflow Connections.

``import airflow`` in these modules is an absolute import: it is Apache Airflow, never
this package.
"""
