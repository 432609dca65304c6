"""The views of the Airflow UI that draw dbspark DAGs, asked of a real api-server.

The repo's ``dags/`` are parsed by a real dag-processor and served by a real
api-server (``devtools/airflow.py``); the test asks for what the Graph and Grid views
load. An ``epoch`` task group holding both ``open`` and ``close`` once made the Graph
view answer HTTP 500 ("A cyclic dependency occurred") for every dbspark DAG.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from dbspark.devtools.airflow import LocalAirflow

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_DAGS = ("dbspark_orders_by_region", "dbspark_reachability", "dbspark_orders_sql")


@pytest.fixture(scope="module")
def airflow(tmp_path_factory):
    root = tmp_path_factory.mktemp("ui")
    env = {
        "AIRFLOW__DBSPARK__WAREHOUSE": str(root / "warehouse"),
        "AIRFLOW__DBSPARK__LANDING": str(root / "landing"),
        "AIRFLOW__DBSPARK__OUTPUTS": str(root / "published"),
        "PYSPARK_PYTHON": sys.executable,
        "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "600",
    }
    deployment = LocalAirflow(root / "airflow", REPO / "dags", env=env, parallelism=1)
    try:
        deployment.start()
        deployment.wait_for_dags(*EXAMPLE_DAGS)
        yield deployment
    finally:
        deployment.stop()


@pytest.mark.parametrize("dag_id", EXAMPLE_DAGS)
def test_the_graph_view_of_every_example_dag_is_served(airflow, dag_id):
    graph = airflow.api.get(f"/ui/structure/structure_data?dag_id={dag_id}")
    ids = [node["id"] for node in graph["nodes"]]
    assert ids[0] == "open_epoch" and ids[-1] == "close_epoch"
    assert "ingest" in ids and "publish" in ids
    edges = {(edge["source_id"], edge["target_id"]) for edge in graph["edges"]}
    assert ("publish", "close_epoch") in edges


def test_the_graph_view_draws_the_loop_as_a_group_of_mapped_iterations(airflow):
    graph = airflow.api.get("/ui/structure/structure_data?dag_id=dbspark_reachability")
    loop = next(node for node in graph["nodes"] if node["id"] == "loop_reach")
    children = {child["id"]: child for child in loop["children"]}
    assert children["loop_reach.iterate"]["is_mapped"] is True
    assert "loop_reach.converged" in children


@pytest.mark.parametrize("dag_id", EXAMPLE_DAGS)
def test_the_grid_view_of_every_example_dag_is_served(airflow, dag_id):
    structure = airflow.api.get(f"/ui/grid/structure/{dag_id}")
    ids = [node["id"] for node in structure]
    assert ids[0] == "open_epoch" and ids[-1] == "close_epoch"
