"""The Airflow plugin that puts the dbspark page in the UI, registered by the package's
``airflow.plugins`` entry point (and named in its provider info, ``provider.py``).

Airflow 3 plugins add pages through a FastAPI app (``fastapi_apps``, mounted in the
api-server) and a nav entry (``external_views``; with a ``url_route`` the UI shows the
page inside its own frame at ``/plugin/dbspark``). React apps need a build toolchain and
share the UI's React, which a bundle of plain JavaScript cannot; server-rendered HTML
needs neither.

Every Airflow process loads the plugins, task processes too (for macros), so
the app is built only when ``fastapi_apps`` is read, which the api-server alone does:
building it imports the api-server's security module, half a second no task should pay.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from airflow.plugins_manager import AirflowPlugin

#: The nav entry: the page at ``<base_url>dbspark/``, shown in the UI's frame.
EXTERNAL_VIEW = {
    "name": "dbspark",
    "href": "dbspark/",
    "url_route": "dbspark",
    "destination": "nav",
}


@cache
def _fastapi_app() -> dict[str, Any]:
    from dbspark.orchestration.airflow.ui.app import URL_PREFIX, create_app

    return {"app": create_app(), "url_prefix": URL_PREFIX, "name": "dbspark"}


class DbsparkPlugin(AirflowPlugin):
    """dbspark's page: circuits, epochs, loops and traces, read from the catalog."""

    name = "dbspark"
    external_views = [EXTERNAL_VIEW]  # noqa: RUF012 (Airflow reads a list attribute)

    @property
    def fastapi_apps(self) -> list[dict[str, Any]]:  # type: ignore[override]
        return [_fastapi_app()]
