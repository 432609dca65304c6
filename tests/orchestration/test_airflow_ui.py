"""The views of the Airflow UI that draw dbspark DAGs, asked of a real api-server.

The repo's ``dags/`` are parsed by a real dag-processor and served by a real
api-server (``devtools/airflow.py``); the test asks for what the Graph and Grid views
load. An ``epoch`` task group holding both ``open`` and ``close`` once made the Graph
view answer HTTP 500 ("A cyclic dependency occurred") for every dbspark DAG. The
installed package adds the dbspark page, which must answer only a logged-in user, as
Airflow's own REST API must.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from dbspark.devtools.airflow import LocalAirflow

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_DAGS = (
    "dbspark_orders_by_region",
    "dbspark_reachability",
    "dbspark_orders_sql",
    "dbspark_reachable_sql",
)
#: Every DAG in dags/: the dbspark ones and the example consumer of a view's asset.
ALL_DAGS = (*EXAMPLE_DAGS, "region_totals_report")


@pytest.fixture(scope="module")
def airflow(tmp_path_factory):
    root = tmp_path_factory.mktemp("ui")
    env = {
        "AIRFLOW__DBSPARK__WAREHOUSE": str(root / "warehouse"),
        "AIRFLOW__DBSPARK__LANDING": str(root / "landing"),
        "AIRFLOW__DBSPARK__OUTPUTS": str(root / "published"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
        "PYSPARK_PYTHON": sys.executable,
        "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "600",
    }
    deployment = LocalAirflow(root / "airflow", REPO / "dags", env=env, parallelism=1)
    try:
        deployment.start()
        deployment.wait_for_dags(*ALL_DAGS)
        yield deployment
    finally:
        deployment.stop()


@pytest.mark.parametrize("dag_id", EXAMPLE_DAGS)
def test_the_graph_view_of_every_example_dag_is_served(airflow, dag_id):
    graph = airflow.api.get(f"/ui/structure/structure_data?dag_id={dag_id}")
    ids = [node["id"] for node in graph["nodes"]]
    assert ids[0] == "open_epoch" and ids[-5] == "close_epoch"
    assert set(ids[-4:]) == {"rebuild", "verify", "serve", "maintain"}
    assert "ingest" in ids and "publish" in ids
    edges = {(edge["source_id"], edge["target_id"]) for edge in graph["edges"]}
    assert {("publish", "close_epoch"), ("close_epoch", "rebuild"), ("rebuild", "verify")} <= edges
    assert {("close_epoch", "serve"), ("close_epoch", "maintain"), ("rebuild", "serve")} <= edges


def test_every_dag_file_is_served_and_none_failed_to_import(airflow):
    files = sorted(p.stem for p in (REPO / "dags").glob("*.py"))
    assert len(files) == len(ALL_DAGS), files  # a new DAG file joins ALL_DAGS
    assert airflow.api.get("/api/v2/importErrors")["import_errors"] == []
    graph = airflow.api.get("/ui/structure/structure_data?dag_id=region_totals_report")
    assert [node["id"] for node in graph["nodes"]] == ["report"]


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
    assert ids[0] == "open_epoch" and ids[-5] == "close_epoch"
    assert set(ids[-4:]) == {"rebuild", "verify", "serve", "maintain"}


def test_the_dbspark_page_answers_a_logged_in_user_only(airflow):
    from dbspark.engine.spark.executor import SparkEngine
    from dbspark.examples.circuits import reachability

    # One epoch in the deployment's catalog ([dbspark] warehouse), by the engine alone.
    engine = SparkEngine(reachability(), airflow.extra_env["AIRFLOW__DBSPARK__WAREHOUSE"])
    engine.step({"edges": [(("a", "b"), 1)], "roots": [(("a",), 1)]})
    engine.catalog.close()

    plugins = airflow.api.get("/api/v2/plugins")["plugins"]
    (view,) = [v for p in plugins if p["name"] == "dbspark" for v in p["external_views"]]
    assert (view["url_route"], view["destination"]) == ("dbspark", "nav")
    listed = airflow.api.get("/dbspark/api/circuits")["circuits"]
    assert [c["name"] for c in listed] == ["reachability"]
    login = {"Authorization": f"Bearer {airflow.api.token()}"}
    page = httpx.get(f"{airflow.url}/{view['href']}", headers=login)
    assert page.status_code == 200 and "/dbspark/circuits/reachability" in page.text
    # The UI's own session cookie logs in as well (the page is shown in the UI's frame).
    shown = httpx.get(f"{airflow.url}/dbspark/", cookies={"_token": airflow.api.token()})
    assert shown.status_code == 200

    assert httpx.get(f"{airflow.url}/dbspark/api/circuits").status_code == 401
    anonymous = httpx.get(f"{airflow.url}/dbspark/", headers={"Accept": "text/html"})
    assert anonymous.status_code == 303
    assert anonymous.headers["location"].startswith("/auth/login?next=")
    assert httpx.post(f"{airflow.url}/dbspark/api/circuits", headers=login).status_code == 405


def test_airflows_own_rest_api_answers_a_logged_in_user_only(airflow):
    """Airflow's REST API (``/api/v2``) refuses requests without a valid token (none, or
    one signed with another secret) and does nothing for them; the same requests with the
    user's token work, so the refusals are not those of a wrong path or body."""
    import jwt

    dag = "region_totals_report"  # asset-scheduled and paused: a run of it stays queued
    runs = f"/api/v2/dags/{dag}/dagRuns"
    token = airflow.api.token()
    claims = jwt.decode(token, options={"verify_signature": False})
    forged = jwt.encode(claims, "not-the-deployment-secret-" * 2, algorithm="HS512")
    assert jwt.get_unverified_header(token)["alg"] == "HS512", "forge it like the real one"

    def send(method: str, path: str, body: Any = None, bearer: str | None = None):
        headers = {"Accept": "application/json"}
        if bearer is not None:
            headers["Authorization"] = f"Bearer {bearer}"
        return httpx.request(method, airflow.url + path, json=body, headers=headers, timeout=30)

    def refused(method: str, path: str, body: Any = None) -> None:
        for bearer in (None, forged):
            status = send(method, path, body, bearer).status_code
            assert status in (401, 403), (method, path, bearer is not None, status)

    def works(method: str, path: str, body: Any = None) -> Any:
        answer = send(method, path, body, token)
        assert answer.status_code == 200, (method, path, answer.text)
        return answer.json()

    trigger = {"conf": {}, "logical_date": None, "note": "by the REST API test"}
    reads = ("/api/v2/dags", runs, "/api/v2/connections", "/api/v2/variables")
    for path in reads:
        refused("GET", path)
    refused("POST", runs, trigger)
    refused("PATCH", f"/api/v2/dags/{dag}", {"is_paused": True})
    assert works("GET", runs)["dag_runs"] == [], "a refused trigger created a run"
    for path in reads:
        works("GET", path)
    assert dag in [d["dag_id"] for d in works("GET", "/api/v2/dags?limit=100")["dags"]]
    assert works("PATCH", f"/api/v2/dags/{dag}", {"is_paused": True})["is_paused"] is True

    run_id = works("POST", runs, trigger)["dag_run_id"]
    task = f"{runs}/{quote(run_id, safe='')}/taskInstances/report"
    mark = {"new_state": "success", "include_upstream": False, "include_downstream": False}
    refused("PATCH", task, mark)
    assert works("GET", task)["state"] is None, "a refused PATCH changed the task's state"
    (marked,) = works("PATCH", task, mark)["task_instances"]
    assert marked["state"] == "success"
    assert works("GET", task)["state"] == "success"
