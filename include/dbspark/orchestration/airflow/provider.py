"""dbspark as an Airflow provider: its provider info, its connection type and its hook.

Installed (``pip install dbspark``), the package declares itself to Airflow through the
``apache_airflow_provider`` entry point (``get_provider_info``): ``airflow providers
list`` shows it, the Connections form offers the ``dbspark`` type, and its plugin (the
dbspark page, ``ui/plugin.py``) is the provider's, also registered under the
``airflow.plugins`` entry point, which Airflow loads without a plugins folder.

A ``dbspark`` connection names where a deployment keeps its state: the warehouse of
traces, the published outputs, and the Airflow connection of the catalog's database (none:
SQLite in the warehouse). The tasks read it (``deployment.py``: ``[dbspark] conn_id``,
by default ``dbspark_default`` when it exists) after ``build_dag``'s arguments and the
``[dbspark]`` keys; :class:`DbsparkHook` reads the same place for code of one's own,
such as a DAG that checks a circuit's last committed epoch.

This module imports Airflow's task SDK at import time (a hook is a class of it): only
Airflow's providers manager and a user's code import it, never a task's hot path.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseHook

from dbspark.orchestration.airflow.deployment import (
    DEFAULT_DBSPARK_CONN_ID,
    CatalogLocation,
    DeploymentOptions,
    resolve_catalog,
)

PACKAGE = "dbspark"
CONNECTION_TYPE = "dbspark"
HOOK_MODULE = "dbspark.orchestration.airflow.provider"
PLUGIN_CLASS = "dbspark.orchestration.airflow.ui.plugin.DbsparkPlugin"
LINEAGE_MODULE = "dbspark.orchestration.airflow.lineage"
#: The connection form's fields a dbspark connection does not use (all it holds is extra).
HIDDEN_FIELDS = ("host", "schema", "login", "password", "port")


def get_provider_info() -> dict[str, Any]:
    """What Airflow's providers manager reads (its ``provider_info.schema.json``)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        versions = [version(PACKAGE)]
    except PackageNotFoundError:  # imported from a source tree, not installed
        versions = []
    return {
        "package-name": PACKAGE,
        "name": "dbspark",
        "description": (
            "Incremental materialized views (DBSP semantics) on Spark: one DAG per circuit, "
            "one epoch per DAG run."
        ),
        "versions": versions,
        "integrations": [{"integration-name": "dbspark", "tags": []}],
        "hooks": [
            {
                "integration-name": "dbspark",
                "python-modules": [HOOK_MODULE],
            }
        ],
        "connection-types": [
            {
                "connection-type": CONNECTION_TYPE,
                "hook-class-name": f"{HOOK_MODULE}.DbsparkHook",
                "hook-name": "dbspark",
                "ui-field-behaviour": {
                    "hidden-fields": list(HIDDEN_FIELDS),
                    "relabeling": {},
                },
                "conn-fields": {
                    "warehouse": {
                        "label": "Warehouse",
                        "description": "The directory of the traces (a shared filesystem).",
                        "schema": {"type": ["string", "null"]},
                    },
                    "outputs": {
                        "label": "Outputs",
                        "description": "Published views (default: <warehouse>/published).",
                        "schema": {"type": ["string", "null"]},
                    },
                    "catalog_conn_id": {
                        "label": "Catalog connection",
                        "description": "An Airflow connection to the catalog's database "
                        "(default: SQLite in the warehouse).",
                        "schema": {"type": ["string", "null"]},
                    },
                },
            }
        ],
        "plugins": [{"name": "dbspark", "plugin-class": PLUGIN_CLASS}],
        # Views' assets and the lineage of ingest and publish (lineage.py).
        "asset-uris": [
            {
                "schemes": ["dbspark"],
                "handler": f"{LINEAGE_MODULE}.sanitize_uri",
                "to_openlineage_converter": f"{LINEAGE_MODULE}.to_openlineage",
            }
        ],
    }


class DbsparkHook(BaseHook):
    """The warehouse and catalog of a ``dbspark`` connection, resolved as the tasks do.

    ``dbspark_conn_id`` names a ``dbspark`` connection; the ``[dbspark]`` keys of
    ``airflow.cfg`` take precedence over it, as they do for the tasks."""

    conn_name_attr = "dbspark_conn_id"
    default_conn_name = DEFAULT_DBSPARK_CONN_ID
    conn_type = CONNECTION_TYPE
    hook_name = "dbspark"

    def __init__(self, dbspark_conn_id: str = DEFAULT_DBSPARK_CONN_ID, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.dbspark_conn_id = dbspark_conn_id

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        return {"hidden_fields": list(HIDDEN_FIELDS), "relabeling": {}}

    def location(self) -> CatalogLocation:
        """Where the warehouse and the catalog are."""
        return resolve_catalog(DeploymentOptions(dbspark_conn_id=self.dbspark_conn_id))

    def get_catalog(self) -> Any:
        """The catalog (``storage.catalog.Catalog``); close it when done."""
        from dbspark.storage.catalog import Catalog

        where = self.location()
        if where.url is None:
            return Catalog.for_warehouse(where.warehouse)
        return Catalog(where.url, warehouse=where.warehouse)

    def last_committed_epoch(self, circuit: str) -> int:
        """The circuit's last committed epoch (-1: none yet)."""
        catalog = self.get_catalog()
        try:
            return catalog.last_committed_epoch(circuit)
        finally:
            catalog.close()

    def test_connection(self) -> tuple[bool, str]:
        """What the Connections page's Test button shows: whether the catalog opens, and
        the circuits it holds."""
        try:
            where = self.location()
            catalog = self.get_catalog()
            try:
                circuits = catalog.circuits()
            finally:
                catalog.close()
        except Exception as err:  # the button shows the reason, whatever it is
            return False, f"{type(err).__name__}: {err}"
        listed = ", ".join(circuits) if circuits else "no circuit yet"
        return True, f"catalog {where.describe()}, warehouse {where.warehouse}: {listed}"
