"""The one place dbspark reads Airflow: ``[dbspark]`` settings and Connections.

As a provider's hook stands between its operators and Airflow's connections, every read
of ``airflow.cfg`` (section ``[dbspark]``, or ``AIRFLOW__DBSPARK__*`` environment
variables) and every Connection lookup goes through here: the deployment a task resolves
(``deployment.py``), the task policies (``policy.py``, ``tasks.py``), and the source
connectors that resolve a Connection or ``[dbspark] landing`` when they pull a batch
(``sources/sql.py``, ``sources/landing.py``; they import this module inside a function
and never Airflow itself). Nothing is read when a DAG file is parsed, and the task SDK
is imported inside each function: it costs seconds to import.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from dbspark.orchestration.sources.sql import sqlalchemy_url


def dbspark_setting(key: str) -> str | None:
    """``[dbspark] <key>`` from ``airflow.cfg`` (or ``AIRFLOW__DBSPARK__<KEY>``); None
    when unset or empty."""
    from airflow.sdk.configuration import conf

    return conf.get("dbspark", key, fallback=None) or None


def dbspark_flag(key: str) -> bool:
    """``[dbspark] <key>`` as a boolean (Airflow's spellings: true/false, 1/0, ...);
    False when unset."""
    from airflow.sdk.configuration import conf

    return conf.getboolean("dbspark", key, fallback=False)


def connection(conn_id: str | None, *, required: bool) -> Any | None:
    """The Airflow Connection ``conn_id``; None without an id, or when it is not defined
    and not ``required`` (a missing required one is Airflow's not-found error)."""
    if not conn_id:
        return None
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        return BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        if required:
            raise
        return None


def connection_url(conn_id: str) -> sa.URL:
    """The SQLAlchemy URL of the Airflow connection ``conn_id`` (resolved now).

    Works inside a task and outside one (connections given as ``AIRFLOW_CONN_<ID>``
    environment variables, a URI or JSON). A SQLite connection may hold its file path in
    ``host`` (Airflow's SQLite hook convention, and the JSON form) or in ``schema`` (the
    URI form ``sqlite:////abs/path.db``); ``get_uri`` renders the first one wrongly, so
    SQLite URLs are built from the fields.
    """
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        conn = connection(conn_id, required=True)
    except AirflowNotFoundException:
        raise LookupError(
            f"Airflow connection {conn_id!r} is not defined (add it in Airflow, or set "
            f"AIRFLOW_CONN_{conn_id.upper()})"
        ) from None
    if conn.conn_type == "sqlite":
        path = conn.host or conn.schema
        if not path:
            raise ValueError(f"Airflow connection {conn_id!r} (sqlite) names no database file")
        return sa.URL.create("sqlite", database=path)
    return sqlalchemy_url(conn.get_uri())
