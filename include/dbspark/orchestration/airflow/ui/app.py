"""The dbspark page's FastAPI app, which the plugin mounts in Airflow's api-server.

Routes (all ``GET``; the app has no other method):

- ``/``: every circuit of the catalog (HTML); ``/circuits/<name>``: one circuit's epochs,
  loops and traces (HTML, ``?limit=`` epochs, newest first);
- ``/api/circuits`` and ``/api/circuits/<name>``: the same as JSON.

Every route requires Airflow's own authentication and authorization, through the
api-server's dependencies: ``requires_access_dag("GET", RUN)`` (the JWT of the
``Authorization`` header or of the UI's ``_token`` cookie; 401 without one, 403 for a
user who may not read DAG runs), then each circuit is shown only to users who may read
a DAG that ran it. A browser without a login is sent to the auth manager's login page.
FastAPI's own documentation routes are off: they would answer without authentication.

The catalog is found as the DAGs' tasks find it (``deployment.resolve_catalog``:
``[dbspark] warehouse`` / ``catalog_conn_id``, the ``dbspark_catalog`` connection), and
only read. DAGs given their own ``warehouse=`` or ``catalog_conn_id=`` in ``build_dag``
keep another catalog, which this page does not see.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from typing import Annotated, Any

from airflow.api_fastapi.app import API_ROOT_PATH, get_auth_manager
from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails
from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_dag
from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from dbspark.orchestration.airflow.deployment import CatalogLocation, resolve_catalog
from dbspark.orchestration.airflow.ui import render
from dbspark.orchestration.airflow.ui.status import (
    DEFAULT_EPOCHS,
    AirflowLinks,
    CircuitStatus,
    circuit_names,
    circuit_status,
    dag_ids,
    summarize,
)
from dbspark.storage.catalog import Catalog

#: Where the plugin mounts the app in the api-server.
URL_PREFIX = "/dbspark"


class CatalogCache:
    """One open :class:`Catalog` (an engine and its connection pool) per catalog for the
    life of the app: opening one checks its schema in a write transaction, which a page
    view should not take each time. A default SQLite catalog that does not exist yet is
    not created (None), and one replaced by a new file (a fresh warehouse) is reopened."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[str, tuple[int | None, Catalog]] = {}

    def get(self, location: CatalogLocation) -> Catalog | None:
        identity: int | None = None
        if location.sqlite_file is not None:
            try:
                identity = location.sqlite_file.stat().st_ino
            except FileNotFoundError:
                return None
        key = location.url or str(location.sqlite_file)
        with self._lock:
            known = self._open.get(key)
            if known is not None and known[0] == identity:
                return known[1]
            if known is not None:
                known[1].close()
            catalog = (
                Catalog(location.url) if location.url else Catalog.for_warehouse(location.warehouse)
            )
            self._open[key] = (identity, catalog)
            return catalog

    def close(self) -> None:
        with self._lock:
            for _, catalog in self._open.values():
                catalog.close()
            self._open.clear()


def _readable_dags(user: GetUserDep) -> Callable[[Iterable[str]], set[str]]:
    """Which of some DAGs the user may read the runs of (as the api-server decides for
    its own DAG run routes, teams included)."""
    from airflow.models.dag import DagModel

    def readable(dags: Iterable[str]) -> set[str]:
        wanted = sorted(set(dags))
        teams = DagModel.get_dag_id_to_team_name_mapping(wanted) if wanted else {}
        auth = get_auth_manager()
        return {
            dag
            for dag in wanted
            if auth.is_authorized_dag(
                method="GET",
                access_entity=DagAccessEntity.RUN,
                details=DagDetails(id=dag, team_name=teams.get(dag)),
                user=user,
            )
        }

    return readable


ReadableDags = Annotated[Callable[[Iterable[str]], set[str]], Depends(_readable_dags)]


def visible(catalog: Catalog, readable: Callable[[Iterable[str]], set[str]]) -> list[str]:
    """The circuits the user may see: those a readable DAG ran, and those no DAG run
    recorded (run by the engine alone, outside Airflow's permissions)."""
    shown = []
    for name in circuit_names(catalog):
        dags = dag_ids(catalog, name)
        if not dags or readable(dags):
            shown.append(name)
    return shown


async def login_first(request: Request, exc: HTTPException) -> Response:
    """A browser without a login goes to the login page and comes back; API clients get
    the 401 itself."""
    wants_html = "text/html" in request.headers.get("accept", "")
    if exc.status_code == 401 and wants_html and "/api/" not in request.url.path:
        login = get_auth_manager().get_url_login(next_url=str(request.url))
        return RedirectResponse(login, status_code=303)
    return await http_exception_handler(request, exc)


def open_catalog(
    locate: Callable[[], CatalogLocation], catalogs: CatalogCache
) -> tuple[Catalog | None, CatalogLocation]:
    """The catalog ``locate`` finds now (None when it does not exist yet) and where it
    is; a 503 when its location cannot be found."""
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        location = locate()
    except (AirflowNotFoundException, LookupError) as err:
        raise HTTPException(503, f"the dbspark catalog cannot be found: {err}") from err
    return catalogs.get(location), location


def create_app(locate: Callable[[], CatalogLocation] = resolve_catalog) -> FastAPI:
    """The app; ``locate`` finds the catalog at each request (from Airflow's configuration
    and Connections by default, so a changed setting needs no restart)."""
    catalogs = CatalogCache()
    links = AirflowLinks(API_ROOT_PATH)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        catalogs.close()

    app = FastAPI(
        title="dbspark",
        lifespan=lifespan,
        dependencies=[Depends(requires_access_dag("GET", DagAccessEntity.RUN))],
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )

    def catalog_and_location() -> tuple[Catalog | None, CatalogLocation]:
        return open_catalog(locate, catalogs)

    def one_circuit(
        name: str, readable: Callable[[Iterable[str]], set[str]], limit: int
    ) -> tuple[CircuitStatus, CatalogLocation]:
        catalog, location = catalog_and_location()
        if catalog is None or name not in visible(catalog, readable):
            raise HTTPException(404, f"no circuit {name!r} in the dbspark catalog")
        return circuit_status(catalog, name, links, limit=limit), location

    app.add_exception_handler(HTTPException, login_first)

    @app.get("/", response_class=HTMLResponse, name="dbspark_index")
    def index(request: Request, readable: ReadableDags) -> str:
        catalog, location = catalog_and_location()
        summaries = (
            [summarize(catalog, name, links) for name in visible(catalog, readable)]
            if catalog is not None
            else []
        )
        return render.index_page(
            summaries,
            location.describe(),
            lambda name: request.url_for("dbspark_circuit", name=name).path,
            missing=catalog is None,
        )

    @app.get("/circuits/{name}", response_class=HTMLResponse, name="dbspark_circuit")
    def circuit_page(
        request: Request,
        name: str,
        readable: ReadableDags,
        limit: Annotated[int, Query(ge=1, le=10_000)] = DEFAULT_EPOCHS,
    ) -> str:
        status, location = one_circuit(name, readable, limit)
        return render.circuit_page(
            status,
            location.describe(),
            index_url=request.url_for("dbspark_index").path,
            json_url=request.url_for("dbspark_circuit_json", name=name).path,
        )

    @app.get("/api/circuits", name="dbspark_circuits_json")
    def circuits_json(readable: ReadableDags) -> Any:
        catalog, location = catalog_and_location()
        names = visible(catalog, readable) if catalog is not None else []
        summaries = [summarize(catalog, name, links) for name in names] if catalog else []
        return jsonable_encoder({"catalog": location.describe(), "circuits": summaries})

    @app.get("/api/circuits/{name}", name="dbspark_circuit_json")
    def circuit_json(
        name: str,
        readable: ReadableDags,
        limit: Annotated[int, Query(ge=1, le=10_000)] = DEFAULT_EPOCHS,
    ) -> Any:
        status, location = one_circuit(name, readable, limit)
        return jsonable_encoder({"catalog": location.describe(), "circuit": status})

    return app
