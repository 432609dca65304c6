"""Where a DAG's tasks find the warehouse, the catalog, Spark and the serving database.

Nothing here is decided when the DAG file is parsed: a task resolves its deployment
when it runs, from the ``build_dag`` arguments, then ``airflow.cfg`` (section
``[dbspark]``, or ``AIRFLOW__DBSPARK__*`` environment variables), then Airflow
Connections, so one DAG file serves a laptop and a cluster alike. A connection of type
``dbspark`` (``provider.py``; ``[dbspark] conn_id``, or ``dbspark_default`` when it
exists) may hold the warehouse, the outputs and the catalog's connection id, under the
``[dbspark]`` keys of the same names.

| setting | ``build_dag`` argument | ``[dbspark]`` key | default |
| --- | --- | --- | --- |
| warehouse (traces) | ``warehouse`` | ``warehouse`` | ``$AIRFLOW_HOME/dbspark/warehouse`` |
| published outputs | ``outputs`` | ``outputs`` | ``<warehouse>/published`` |
| (on object storage) | | ``outputs = s3://...`` | the tables there, the feed in the default |
| catalog | ``catalog_conn_id`` | ``catalog_conn_id`` | SQLite in the warehouse |
| the three above, in one | | ``conn_id`` | ``dbspark_default``, if it exists |
| Spark | ``spark_conn_id`` | ``spark_conn_id`` | local Spark in the worker |
| serving tables | ``serving_conn_id`` | ``serving_conn_id`` | none |
| published tables' credentials | | ``table_conn_id`` | the task's ``AWS_*`` |
| published tables | | ``table_retention_hours`` | ``DBSPARK_TABLE_*``, or 168 |
| | | ``table_maintain_every`` | ``DBSPARK_TABLE_*``, or 10 |
| | | ``table_target_file_bytes`` | ``DBSPARK_TABLE_*``, or 32 MiB |
| maintenance (``maintain``) | | ``maintain_every`` | every 10th epoch |
| | | ``gc_min_age_hours`` | 6 |
| | | ``changes_retention_hours`` | 168 |
| | | ``input_log_retention_hours`` | 168 |
| SQLite on NFS, CIFS, FUSE | | ``sqlite_on_shared_filesystem`` | refused (``allow``) |
| making commits durable | | ``sync_method`` | ``DBSPARK_SYNC_METHOD``, or ``auto`` |
| a long-lived unit worker | | ``worker_socket`` | none: each task runs its unit |

The Spark connection decides where Spark work runs: of type ``spark_connect`` (the
Spark provider's), every task is a Spark Connect client of that server; of type
``spark``, every Spark task is a ``spark-submit`` of ``orchestration/spark_job.py`` to that
master; without one, each worker process runs Spark in local mode.

With ``worker_socket`` set (and no ``spark``-type connection), a task hands its unit to
the dbspark worker listening there (``orchestration/worker.py``), which keeps its
engines, decoded traces and Spark session between units; a task that finds none there
runs the unit itself.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dbspark.orchestration.airflow.hook import connection, connection_url, dbspark_setting

log = logging.getLogger("dbspark.airflow")

DEFAULT_SPARK_CONN_ID = "dbspark_spark"
DEFAULT_CATALOG_CONN_ID = "dbspark_catalog"
DEFAULT_DBSPARK_CONN_ID = "dbspark_default"
#: What a ``dbspark`` connection may hold (its extra), as the ``[dbspark]`` keys name it.
DBSPARK_CONNECTION_KEYS = ("warehouse", "outputs", "catalog_conn_id")


@dataclass(frozen=True)
class DeploymentOptions:
    """What ``build_dag`` was told; ``None`` defers to ``airflow.cfg`` and Connections."""

    warehouse: str | None = None
    outputs: str | None = None
    catalog_conn_id: str | None = None
    spark_conn_id: str | None = None
    serving_conn_id: str | None = None
    serving_table_prefix: str = "dbspark_"
    dbspark_conn_id: str | None = None


@dataclass(frozen=True)
class Deployment:
    """The resolved places one task works with."""

    warehouse: Path
    outputs: Path
    catalog_url: str | None
    spark_remote: str | None
    spark_submit_conn_id: str | None
    serving_url: str | None
    serving_table_prefix: str
    #: The Airflow connections the URLs came from (a spark-submit unit file names these).
    catalog_conn_id: str | None = None
    serving_conn_id: str | None = None
    #: The ``[dbspark] table_*`` keys set in airflow.cfg, as text (checked by the publish
    #: unit, ``TableSettings.from_environment``).
    table_settings: dict[str, str] = field(default_factory=dict)
    #: The socket of the long-lived unit worker (``[dbspark] worker_socket``), if any.
    worker_socket: Path | None = None
    #: The object store credentials of the published tables (``[dbspark] table_conn_id``;
    #: :func:`table_credentials`), and that connection's id; empty: the publishing
    #: process's own ``AWS_*`` environment or instance role.
    table_credentials: dict[str, str] = field(default_factory=dict, repr=False)
    table_conn_id: str | None = None

    def describe(self) -> str:
        spark = "local Spark in the worker"
        if self.spark_remote:
            spark = f"Spark Connect at {self.spark_remote}"
        elif self.spark_submit_conn_id:
            spark = f"spark-submit through connection {self.spark_submit_conn_id!r}"
        catalog = _safe_url(self.catalog_url) if self.catalog_url else "SQLite in the warehouse"
        parts = [f"warehouse {self.warehouse}", f"catalog {catalog}", spark]
        parts.append(f"outputs {self.outputs}")
        if self.table_settings.get("table_location"):
            parts.append(f"tables at {self.table_settings['table_location']}")
        if self.serving_url:
            parts.append(f"serving tables in {_safe_url(self.serving_url)}")
        if self.worker_socket and not self.spark_submit_conn_id:
            parts.append(f"units handed to the dbspark worker at {self.worker_socket}")
        return "; ".join(parts)


def _database_url(found: Any | None) -> str | None:
    if found is None:
        return None
    return connection_url(found.conn_id).render_as_string(hide_password=False)


@dataclass(frozen=True)
class CatalogLocation:
    """Where the catalog is: a database URL, or (None) SQLite in the warehouse."""

    warehouse: Path
    url: str | None
    #: The Airflow connection of ``url`` (None with SQLite in the warehouse).
    conn_id: str | None = None

    @property
    def sqlite_file(self) -> Path | None:
        """The default catalog's file (``Catalog.for_warehouse``), when no URL is set."""
        return None if self.url else self.warehouse / "catalog.db"

    def describe(self) -> str:
        return _safe_url(self.url) if self.url else f"SQLite in the warehouse {self.warehouse}"


def resolve_catalog(
    options: DeploymentOptions | None = None,
    held: Callable[[], dict[str, str]] | None = None,
) -> CatalogLocation:
    """The warehouse and catalog alone, resolved as :func:`resolve` does (for readers of
    the catalog, such as the Airflow UI page, that need no Spark or serving database).
    ``held`` gives what the ``dbspark`` connection holds (:func:`_dbspark_connection_once`)."""
    options = options or DeploymentOptions()
    held = held or _dbspark_connection_once(options)
    home = Path(os.environ.get("AIRFLOW_HOME", Path.home() / "airflow"))
    warehouse = Path(
        options.warehouse
        or dbspark_setting("warehouse")
        or held().get("warehouse")
        or home / "dbspark" / "warehouse"
    ).resolve()
    # An explicitly named connection must exist; the default name is optional.
    catalog_id = (
        options.catalog_conn_id
        or dbspark_setting("catalog_conn_id")
        or held().get("catalog_conn_id")
    )
    catalog = connection(catalog_id or DEFAULT_CATALOG_CONN_ID, required=bool(catalog_id))
    return CatalogLocation(
        warehouse, _database_url(catalog), catalog.conn_id if catalog is not None else None
    )


def resolve(options: DeploymentOptions) -> Deployment:
    """Resolve a task's deployment (see the module docstring for the order)."""
    held = _dbspark_connection_once(options)
    catalog = resolve_catalog(options, held)
    warehouse = catalog.warehouse
    from dbspark.orchestration.sinks.tables import is_uri

    outputs_setting = options.outputs or dbspark_setting("outputs") or held().get("outputs")
    tables = table_settings()
    if outputs_setting and is_uri(outputs_setting):
        # Outputs on object storage: the tables go there; the change feed, published by
        # an atomic rename that object stores lack, stays on the shared filesystem.
        location = tables.setdefault("table_location", str(outputs_setting))
        if location.rstrip("/") != str(outputs_setting).rstrip("/"):
            raise ValueError(
                f"[dbspark] outputs is {outputs_setting!r} and table_location {location!r}: "
                "outputs on object storage is where the tables go, so name one place (set "
                "outputs to a shared directory for the change feed, and table_location for "
                "the tables)"
            )
        outputs_setting = None
    outputs = Path(outputs_setting or warehouse / "published").resolve()

    spark_id = options.spark_conn_id or dbspark_setting("spark_conn_id")
    spark = connection(spark_id or DEFAULT_SPARK_CONN_ID, required=bool(spark_id))
    serving_id = options.serving_conn_id or dbspark_setting("serving_conn_id")
    serving = connection(serving_id, required=True)
    tables_id = dbspark_setting("table_conn_id")

    remote = submit = None
    if spark is not None and spark.conn_type == "spark_connect":
        from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

        remote = SparkConnectHook(conn_id=spark.conn_id).get_connection_url()
    elif spark is not None and spark.conn_type == "spark":
        submit = spark.conn_id
    elif spark is not None:
        raise ValueError(
            f"Airflow connection {spark.conn_id!r} has type {spark.conn_type!r}; dbspark tasks "
            "use a 'spark_connect' connection (Spark Connect), a 'spark' one (spark-submit) "
            "or none (local Spark in the worker)"
        )
    return Deployment(
        warehouse=warehouse,
        outputs=outputs,
        catalog_url=catalog.url,
        spark_remote=remote,
        spark_submit_conn_id=submit,
        serving_url=_database_url(serving),
        serving_table_prefix=options.serving_table_prefix,
        catalog_conn_id=catalog.conn_id,
        serving_conn_id=serving.conn_id if serving is not None else None,
        table_settings=tables,
        worker_socket=_worker_socket(),
        table_credentials=table_credentials(tables_id),
        table_conn_id=tables_id,
    )


def _dbspark_connection_once(options: DeploymentOptions) -> Callable[[], dict[str, str]]:
    """:func:`dbspark_connection` of ``options``, looked up on first use and only then:
    every task resolves its deployment, and ``[dbspark]`` keys that say it all need no
    connection lookup (a request to Airflow's API in a task)."""
    found: list[dict[str, str]] = []

    def held() -> dict[str, str]:
        if not found:
            found.append(dbspark_connection(options.dbspark_conn_id))
        return found[0]

    return held


def dbspark_connection(conn_id: str | None = None) -> dict[str, str]:
    """What the ``dbspark`` connection holds (``DBSPARK_CONNECTION_KEYS``): the one named
    ``conn_id`` or ``[dbspark] conn_id``, which must exist, else ``dbspark_default``
    when it exists; empty without one."""
    named = conn_id or dbspark_setting("conn_id")
    found = connection(named or DEFAULT_DBSPARK_CONN_ID, required=bool(named))
    if found is None:
        return {}
    if found.conn_type != "dbspark":
        raise ValueError(
            f"Airflow connection {found.conn_id!r} has type {found.conn_type!r}, not "
            "'dbspark' (the warehouse, outputs and catalog of a dbspark deployment)"
        )
    extra = found.extra_dejson
    held = {}
    for key in DBSPARK_CONNECTION_KEYS:
        # The Connections form saves a provider's field under its plain name, an older
        # one as extra__<type>__<name>.
        value = extra.get(key) or extra.get(f"extra__dbspark__{key}")
        if value:
            held[key] = str(value)
    unknown = sorted(
        set(extra)
        - {*DBSPARK_CONNECTION_KEYS}
        - {f"extra__dbspark__{k}" for k in DBSPARK_CONNECTION_KEYS}
    )
    if unknown:
        raise ValueError(
            f"Airflow connection {found.conn_id!r} (type 'dbspark') has extra keys "
            f"{unknown}; it takes {', '.join(DBSPARK_CONNECTION_KEYS)}"
        )
    return held


def _worker_socket() -> Path | None:
    """``[dbspark] worker_socket``, the long-lived unit worker's socket, if set."""
    found = dbspark_setting("worker_socket")
    return Path(found).expanduser() if found else None


def table_settings() -> dict[str, str]:
    """The published tables' settings that ``[dbspark]`` in airflow.cfg sets (keys
    ``table_retention_hours``, ``table_maintain_every``, ``table_target_file_bytes``:
    ``tables.SETTING_KEYS``)."""
    found = {
        "table_retention_hours": dbspark_setting("table_retention_hours"),
        "table_maintain_every": dbspark_setting("table_maintain_every"),
        "table_target_file_bytes": dbspark_setting("table_target_file_bytes"),
        # Where the tables are (a path or s3://...) and delta-rs's options for it.
        "table_location": dbspark_setting("table_location"),
        "table_storage_options": dbspark_setting("table_storage_options"),
    }
    return {key: value for key, value in found.items() if value is not None}


#: What a ``table_conn_id`` connection's extra may hold besides its login and password.
TABLE_CONNECTION_EXTRA = ("aws_session_token",)


def table_credentials(conn_id: str | None) -> dict[str, str]:
    """The credentials of the published tables' object store, from the Airflow connection
    ``conn_id`` (``[dbspark] table_conn_id``), which must exist: its login is the access
    key id, its password the secret access key, and its extra may hold
    ``aws_session_token``. As ``AWS_*`` names, which delta-rs takes as storage options.
    Empty without a connection: then the publishing process's ``AWS_*`` environment or
    instance role is used, which a spark-submit driver in cluster mode does not have.

    The credentials never go into a unit file or a log: they reach a spark-submit driver
    or the unit worker as the catalog's URL does (``units.TABLE_CREDENTIALS_VARIABLE``)."""
    found = connection(conn_id, required=True)
    if found is None:
        return {}
    extra = found.extra_dejson
    unknown = sorted(set(extra) - set(TABLE_CONNECTION_EXTRA))
    if not found.login or not found.password or unknown:
        raise ValueError(
            f"Airflow connection {found.conn_id!r} ([dbspark] table_conn_id) must hold the "
            "published tables' access key id as its login and secret access key as its "
            "password, and may hold aws_session_token in its extra"
            + (f"; its extra has {unknown}" if unknown else "")
        )
    held = {"AWS_ACCESS_KEY_ID": found.login, "AWS_SECRET_ACCESS_KEY": found.password}
    if extra.get("aws_session_token"):
        held["AWS_SESSION_TOKEN"] = str(extra["aws_session_token"])
    return held


@dataclass(frozen=True)
class MaintenanceSettings:
    """How the ``maintain`` task keeps storage bounded (issue 18, finding 14): it runs
    after every ``every``-th epoch's close; garbage collection deletes nothing younger
    than ``gc_min_age_hours``; change and snapshot directories of epochs committed more
    than ``changes_retention_hours`` ago are removed (the last epoch's always stays); the
    raw input logs of epochs committed more than ``input_log_retention_hours`` ago are
    merged (``SparkEngine.compact_input_logs``), so full refresh, ``verify`` and
    ``rebuild`` still replay them, but only as of a later epoch. Ages are on the catalog
    database's clock."""

    every: int = 10
    gc_min_age_hours: float = 6.0
    changes_retention_hours: float = 168.0
    input_log_retention_hours: float = 168.0


def maintenance_settings() -> MaintenanceSettings:
    """The ``[dbspark]`` keys ``maintain_every``, ``gc_min_age_hours``,
    ``changes_retention_hours`` and ``input_log_retention_hours``, checked; a bad value
    is an error naming its key."""
    defaults = MaintenanceSettings()
    values: dict[str, Any] = {}
    for key, raw, field_name, kind, minimum in (
        ("maintain_every", dbspark_setting("maintain_every"), "every", int, 1),
        ("gc_min_age_hours", dbspark_setting("gc_min_age_hours"), "gc_min_age_hours", float, 0),
        (
            "changes_retention_hours",
            dbspark_setting("changes_retention_hours"),
            "changes_retention_hours",
            float,
            0,
        ),
        (
            "input_log_retention_hours",
            dbspark_setting("input_log_retention_hours"),
            "input_log_retention_hours",
            float,
            0,
        ),
    ):
        if raw is None:
            continue
        try:
            value = kind(raw.strip())
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise ValueError(
                f"[dbspark] {key} = {raw!r}: a {'whole ' if kind is int else ''}number "
                f">= {minimum} is needed (default {getattr(defaults, field_name)})"
            )
        values[field_name] = value
    return MaintenanceSettings(**values)


@contextmanager
def spark_for(deployment: Deployment) -> Iterator[Any]:
    """The task's Spark session: a Connect client for the length of the task, or the
    worker's local session (reused by every task ``dag.test()`` runs in one process)."""
    from dbspark.engine.spark.session import connect_session, spark_session

    if deployment.spark_remote:
        with connect_session(deployment.spark_remote, app_name="dbspark-airflow") as spark:
            yield spark
    else:
        yield spark_session(app_name="dbspark-airflow")


def _safe_url(url: str) -> str:
    """A URL without its password, for logs."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # not a SQLAlchemy URL: say nothing of it rather than leak it
        return "<url>"
