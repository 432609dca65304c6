"""The dbspark page's app behind Airflow's own authentication, over the catalog of real
DAG runs (``dag.test()``: Airflow's task runner and metadata database, in this process).

The app is mounted as the api-server mounts a plugin's app (``init_plugins``), next to
the real auth manager (SimpleAuthManager) and its login routes; tokens are the JWTs
that auth manager signs. ``test_airflow_ui.py`` asks a real api-server for the page.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import quote

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from dbspark.orchestration.intervals import Interval
from dbspark.orchestration.sources import LandingDirectory

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
DAGS = Path(__file__).parent / "dags"
DAG_ID = "test_reachability"
START = datetime(2026, 1, 1, tzinfo=UTC)


def day(n: int) -> Interval:
    return Interval(START + timedelta(days=n), START + timedelta(days=n + 1))


@pytest.fixture(scope="module")
def runs(airflow_db, tmp_path_factory):
    """Two epochs of the reachability DAG, each one DAG run; returns each run's id and
    the task ids of its task instances."""
    from airflow.dag_processing.dagbag import DagBag

    root = tmp_path_factory.mktemp("page")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("AIRFLOW__DBSPARK__WAREHOUSE", str(root / "warehouse"))
        env.setenv("AIRFLOW__DBSPARK__LANDING", str(root / "landing"))
        env.setenv("AIRFLOW__DBSPARK__OUTPUTS", str(root / "published"))
        landing = LandingDirectory(root / "landing")
        dag = DagBag(str(DAGS)).dags[DAG_ID]
        batches = [
            {"edges": [("a", "b", 1), ("b", "c", 1)], "roots": [("a", 1)]},
            {"edges": [("a", "b", -1)]},
        ]
        done = []
        for epoch, batch in enumerate(batches):
            for source, rows in batch.items():
                columns = ["src", "dst", "__w"] if source == "edges" else ["node", "__w"]
                landing.land(source, day(epoch), rows, columns, "parquet")
            for source in ("edges", "roots"):  # complete, even where nothing arrived
                landing.complete(source, day(epoch))
            run = dag.test(logical_date=day(epoch).end)
            assert str(getattr(run.state, "value", run.state)) == "success"
            done.append((run.run_id, {ti.task_id for ti in run.get_task_instances()}))
        yield done


@pytest.fixture(scope="module")
def page(runs):
    """The plugin's app mounted as the api-server mounts it, beside the auth manager."""
    from airflow.api_fastapi.app import init_auth_manager

    from dbspark.orchestration.airflow.ui.plugin import DbsparkPlugin

    (mounted,) = DbsparkPlugin().fastapi_apps
    server = FastAPI()
    init_auth_manager(server)
    server.mount(mounted["url_prefix"], mounted["app"])
    with TestClient(server) as client:
        yield client, mounted["app"]


def token(role: str | None) -> str:
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    user = SimpleAuthManagerUser(username=f"user-{role}", role=role)
    return get_auth_manager().generate_jwt(user)


def as_(role: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token(role)}"}


def test_no_route_answers_without_a_login(page):
    client, _ = page
    for path in ("/dbspark/", "/dbspark/circuits/reachability", "/dbspark/api/circuits"):
        assert client.get(path).status_code == 401, path
    forged = {"Authorization": "Bearer not-a-jwt"}
    assert client.get("/dbspark/api/circuits", headers=forged).status_code == 403
    # A browser is sent to the login page, and back to the page after it.
    answer = client.get("/dbspark/", headers={"Accept": "text/html"}, follow_redirects=False)
    assert answer.status_code == 303
    assert answer.headers["location"].startswith("/auth/login?next=")
    assert quote("/dbspark/", safe="") in answer.headers["location"]
    # FastAPI's own documentation routes would answer anyone: they are off.
    for path in ("/dbspark/openapi.json", "/dbspark/docs", "/dbspark/redoc"):
        assert client.get(path, headers=as_("admin")).status_code == 404, path


def test_a_user_who_may_not_read_dag_runs_is_refused(page):
    client, _ = page
    assert client.get("/dbspark/api/circuits", headers=as_(None)).status_code == 403
    assert client.get("/dbspark/api/circuits", headers=as_("viewer")).status_code == 200


def test_the_routes_are_read_only(page):
    client, _ = page
    for method in ("POST", "PUT", "PATCH", "DELETE"):
        for path in ("/dbspark/", "/dbspark/api/circuits", "/dbspark/api/circuits/reachability"):
            answer = client.request(method, path, headers=as_("admin"))
            assert answer.status_code == 405, (method, path)


def test_epochs_loops_traces_and_links_of_real_dag_runs(page, runs):
    client, _ = page
    answer = client.get("/dbspark/api/circuits/reachability", headers=as_("viewer"))
    assert answer.status_code == 200
    circuit = answer.json()["circuit"]
    assert circuit["summary"]["dags"] == [{"label": DAG_ID, "url": f"/dags/{DAG_ID}"}]
    epochs = {e["epoch"]: e for e in circuit["epochs"]}
    assert sorted(epochs) == [0, 1]
    assert epochs[0]["label"] == day(0).label and epochs[1]["state"] == "committed"
    assert epochs[0]["rows_in"] == {"edges": 2, "roots": 1}
    assert epochs[1]["rows_in"] == {"edges": 1, "roots": 0}
    assert epochs[0]["rows_changed"] == {"reach": 3}  # a, b, c
    assert epochs[1]["rows_changed"] == {"reach": 2}  # b and c unreachable
    assert all(e["duration_seconds"] > 0 for e in epochs.values())
    for epoch, (run_id, task_ids) in enumerate(runs):
        run_url = f"/dags/{DAG_ID}/runs/{quote(run_id, safe='')}"
        assert epochs[epoch]["runs"] == [{"label": run_id, "url": run_url}]
        logs = {link["label"]: link["url"] for link in epochs[epoch]["task_logs"]}
        assert set(logs) <= task_ids, set(logs) - task_ids
        assert {"open_epoch", "ingest.edges", "loop_reach.iterate", "close_epoch"} <= set(logs)
        assert logs["publish"] == f"{run_url}/tasks/publish"
    (loop,) = circuit["loops"]
    assert [run["prefix"] for run in loop["runs"]] == [[0], [1]]
    for run in loop["runs"]:
        assert run["iterations"][-1]["converged"] and run["iterations"][-1]["delta_rows"] == 0
    sizes = {c["collection"]: c for c in circuit["collections"]}
    assert sizes["view.reach"]["live_rows"] >= 1 and sizes["view.reach"]["live_bytes"] > 0

    html = client.get("/dbspark/circuits/reachability", headers=as_("viewer")).text
    assert f'href="/dags/{DAG_ID}/runs/{quote(runs[1][0], safe="")}"' in html
    assert html.count("<polyline") == 2 and "rows changed: reach" in html
    index = client.get("/dbspark/", headers=as_("viewer")).text
    assert 'href="/dbspark/circuits/reachability"' in index


def test_the_ui_session_cookie_is_a_login_too(page):
    client, _ = page
    client.cookies.set("_token", token("viewer"))
    try:
        assert client.get("/dbspark/api/circuits").status_code == 200
    finally:
        client.cookies.clear()


def test_a_circuit_is_shown_only_to_readers_of_its_dag(page):
    """SimpleAuthManager grants by role, never by DAG, so the per-DAG decision is supplied
    here in place of the auth manager's; the page must hide what it refuses."""
    from dbspark.orchestration.airflow.ui.app import _readable_dags

    client, app = page
    app.dependency_overrides[_readable_dags] = lambda: lambda dags: set()
    try:
        listed = client.get("/dbspark/api/circuits", headers=as_("admin")).json()
        assert listed["circuits"] == []
        one = client.get("/dbspark/api/circuits/reachability", headers=as_("admin"))
        assert one.status_code == 404
    finally:
        app.dependency_overrides.clear()
    listed = client.get("/dbspark/api/circuits", headers=as_("admin")).json()
    assert [c["name"] for c in listed["circuits"]] == ["reachability"]


def test_the_installed_package_registers_the_page_and_its_nav_entry():
    """As Airflow loads plugins without a plugins folder: the ``airflow.plugins`` entry
    point of the installed dbspark package (the repo's plugins/ holds none of its own, so
    no second copy is refused as already registered)."""
    from airflow._shared.plugins_manager import (
        _load_entrypoint_plugins,
        _load_plugins_from_plugin_directory,
    )
    from airflow.api_fastapi.app import RESERVED_URL_PREFIXES
    from airflow.api_fastapi.core_api.datamodels.plugins import ExternalViewResponse

    plugins, errors = _load_entrypoint_plugins()
    assert errors == {}
    (plugin,) = [p for p in plugins if p.name == "dbspark"]
    in_folder, errors = _load_plugins_from_plugin_directory(str(REPO / "plugins"))
    assert errors == {} and not [p for p in in_folder if p.name == "dbspark"]
    (app,) = plugin.fastapi_apps
    assert isinstance(app["app"], FastAPI)
    assert not any(app["url_prefix"].startswith(p) for p in RESERVED_URL_PREFIXES)
    (view,) = plugin.external_views
    shown = ExternalViewResponse.model_validate(view)
    assert (shown.destination, shown.url_route) == ("nav", "dbspark")
    assert shown.href.rstrip("/") == app["url_prefix"].strip("/")
