"""Spark sessions for dbspark: local classic mode by default, Spark Connect on request.

``spark_session()`` is the one place that decides how dbspark talks to Spark:

* **local** (the default, ``local[2]``): a classic session in this process, bound
  to ``127.0.0.1``, without the web UI (``DBSPARK_SPARK_UI=1`` turns it on), with
  few shuffle partitions (``DBSPARK_SHUFFLE_PARTITIONS``, default 4) because
  dbspark's deltas are small, and the JVM's logging turned down to WARN;
* **Spark Connect** when ``remote="sc://host:port"`` is given: the engine uses
  only the DataFrame API, so it runs unchanged against a Connect server;
* a ``master`` URL (``spark://...``) for a classic cluster.

Every session gets ``spark.sql.session.timeZone=UTC`` and adaptive execution.
An active session is reused when it is compatible (same kind, same master or
remote); settings that can change at runtime are then applied to it.
"""

from __future__ import annotations

import logging
import os
import tempfile
import warnings
from collections.abc import Mapping
from typing import Any

from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

DEFAULT_MASTER = "local[2]"
DEFAULT_SHUFFLE_PARTITIONS = 4
LOCAL_HOST = "127.0.0.1"

#: Settings every session gets (runtime-settable, so they also apply to a reused one).
_RUNTIME_DEFAULTS = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.adaptive.enabled": "true",
    "spark.sql.adaptive.coalescePartitions.enabled": "true",
    # The expression compiler uses try_* functions, so it does not depend on ANSI mode;
    # but only ANSI mode makes BIGINT overflow an error instead of a silent wrap-around.
    "spark.sql.ansi.enabled": "true",
}


def shuffle_partitions() -> int:
    """``spark.sql.shuffle.partitions`` for new sessions: ``DBSPARK_SHUFFLE_PARTITIONS`` or 4."""
    raw = os.environ.get("DBSPARK_SHUFFLE_PARTITIONS", "").strip()
    if not raw:
        return DEFAULT_SHUFFLE_PARTITIONS
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(
            f"DBSPARK_SHUFFLE_PARTITIONS must be a positive integer, got {raw!r}"
        ) from None
    if value < 1:
        raise ValueError(f"DBSPARK_SHUFFLE_PARTITIONS must be a positive integer, got {raw!r}")
    return value


def _ui_enabled() -> bool:
    return os.environ.get("DBSPARK_SPARK_UI", "").strip().lower() in ("1", "true", "yes")


def session_conf(
    master: str | None = None, *, remote: str | None = None, conf: Mapping[str, Any] | None = None
) -> dict[str, str]:
    """The configuration ``spark_session`` applies (user ``conf`` overrides the defaults)."""
    settings: dict[str, str] = dict(_RUNTIME_DEFAULTS)
    settings["spark.sql.shuffle.partitions"] = str(shuffle_partitions())
    if remote is None:
        settings["spark.ui.enabled"] = "true" if _ui_enabled() else "false"
        settings["spark.ui.showConsoleProgress"] = "false"
        if _is_local(master or DEFAULT_MASTER):
            settings["spark.driver.host"] = LOCAL_HOST
            settings["spark.driver.bindAddress"] = LOCAL_HOST
    for key, value in (conf or {}).items():
        settings[key] = _conf_value(value)
    return settings


def spark_session(
    master: str | None = None,
    *,
    app_name: str = "dbspark",
    remote: str | None = None,
    conf: Mapping[str, Any] | None = None,
) -> SparkSession:
    """A Spark session for dbspark (see the module docstring).

    ``master`` and ``remote`` are exclusive. When a compatible session is already
    active it is returned, with the caller's explicit ``conf`` applied to it (its
    creator's settings are otherwise left alone).
    """
    if master is not None and remote is not None:
        raise ValueError("give either master (classic Spark) or remote (Spark Connect), not both")
    if remote is not None and not remote.startswith(("sc://", "local")):
        raise ValueError(
            f"a Spark Connect address looks like sc://host:port (or local[N] for an "
            f"in-process server), got {remote!r}"
        )
    # pyspark's own notice about pandas 3; not actionable for dbspark users.
    warnings.filterwarnings(
        "ignore", message="PySpark does not yet fully support pandas", category=FutureWarning
    )
    settings = session_conf(master, remote=remote, conf=conf)

    active = SparkSession.getActiveSession()
    if active is not None and _compatible(active, master, remote):
        # Only what the caller asked for: the defaults were applied when it was created
        # (or its creator chose otherwise on purpose).
        _apply_runtime(active, {k: _conf_value(v) for k, v in (conf or {}).items()})
        return active

    if remote is not None:
        builder = SparkSession.builder.remote(remote).appName(app_name)
        runtime = {k: v for k, v in settings.items() if not _static(k)}
        for key, value in runtime.items():
            builder = builder.config(key, value)
        return builder.getOrCreate()

    chosen = master or DEFAULT_MASTER
    if _is_local(chosen):
        _quiet_jvm_startup(settings)
    builder = SparkSession.builder.master(chosen).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    _apply_runtime(session, settings)
    # Classic local only: the log level of the JVM lives on the SparkContext.
    session.sparkContext.setLogLevel("WARN")
    return session


def _compatible(session: SparkSession, master: str | None, remote: str | None) -> bool:
    connect = is_connect(session)
    if remote is not None:
        return connect and _same_remote(session, remote)
    if connect:
        return False
    if master is None:
        return True  # whatever classic session is running (tests, spark-submit)
    try:
        return session.sparkContext.master == master
    except Exception:  # pragma: no cover - a stopped context
        return False


def is_connect(session: SparkSession) -> bool:
    """Is this a Spark Connect session (rather than a classic, in-process one)?"""
    return type(session).__module__.startswith("pyspark.sql.connect")


def _same_remote(session: SparkSession, remote: str) -> bool:
    client = getattr(session, "client", None)
    host = getattr(client, "host", None)
    port = getattr(client, "port", None)
    if host is None:
        return False
    target = remote[len("sc://") :].split("/", 1)[0].split(";", 1)[0]
    return target in (f"{host}:{port}", str(host))


def _apply_runtime(session: SparkSession, settings: Mapping[str, str]) -> None:
    for key, value in settings.items():
        if _static(key):
            continue
        try:
            if session.conf.get(key, None) != value:
                session.conf.set(key, value)
        except Exception as exc:  # a server may forbid changing some settings
            log.debug("could not set %s=%s on the active session: %s", key, value, exc)


def _static(key: str) -> bool:
    """Settings that only take effect when the JVM/context starts."""
    return key.startswith(("spark.ui.", "spark.driver.", "spark.executor.", "spark.master"))


def _is_local(master: str) -> bool:
    return master == "local" or master.startswith("local[")


def _conf_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


_LOG4J2 = """\
# dbspark: Spark's JVM at WARN, without the startup chatter.
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
logger.hadoop.name = org.apache.hadoop.util.NativeCodeLoader
logger.hadoop.level = error
logger.utils.name = org.apache.spark.util.Utils
logger.utils.level = error
logger.blockmanager.name = org.apache.spark.storage.BlockManager
logger.blockmanager.level = error
"""


def _quiet_jvm_startup(settings: dict[str, str]) -> None:
    """Keep the JVM's startup chatter (log4j banner, native-hadoop and hostname warnings) quiet.

    ``setLogLevel`` only applies once the context exists; until then Spark's default
    log4j2 profile prints. Unless the user configured the driver's Java options or a
    Spark conf directory, point log4j2 at a quiet configuration written to the temp dir.
    """
    os.environ.setdefault("SPARK_LOCAL_IP", LOCAL_HOST)
    if "SPARK_CONF_DIR" in os.environ or "spark.driver.extraJavaOptions" in settings:
        return
    path = os.path.join(tempfile.gettempdir(), f"dbspark-log4j2-{os.getuid()}.properties")
    try:
        with open(path, encoding="utf-8") as handle:
            current = handle.read()
    except OSError:
        current = None
    if current != _LOG4J2:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(_LOG4J2)
    settings["spark.driver.extraJavaOptions"] = f"-Dlog4j.configurationFile=file:{path}"
