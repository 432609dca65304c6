"""Spark sessions for dbspark: local classic mode by default, Spark Connect on request.

``spark_session()`` is the one place that decides how dbspark talks to Spark:

* **local** (the default, ``local[2]``): a classic session in this process, bound
  to ``127.0.0.1``, without the web UI (``DBSPARK_SPARK_UI=1`` turns it on), with
  few shuffle partitions (``DBSPARK_SHUFFLE_PARTITIONS``, default 4) because
  dbspark's deltas are small, and the JVM's logging turned down to WARN;
* **Spark Connect** when ``remote="sc://host:port"`` is given, or when neither
  ``master`` nor ``remote`` is given and ``SPARK_REMOTE`` is set (as pyspark itself
  does): the engine uses only the DataFrame API, so it runs unchanged against a
  Connect server (``dbspark.devtools.spark_connect.LocalConnectServer`` starts one locally);
* a ``master`` URL (``spark://...``) for a classic cluster.

pyspark picks the flavour of ``pyspark.sql.functions``, ``Window``, ``Observation`` and
``DataFrame.method(df, ...)`` by a process-wide flag (the ``SPARK_CONNECT_MODE_ENABLED``
environment variable), not by the session a column ends up in. So a process uses one
kind at a time: creating a Connect session sets the flag, and while it is set a classic
session in the same process cannot run dbspark's operators. ``connect_session()`` is a
block that uses Connect and then puts the process back as it was (tests use it next to
the classic session fixture).

Every session gets ``spark.sql.session.timeZone=UTC`` and adaptive execution.
An active session is reused when it is compatible (same kind, same master or
remote); settings that can change at runtime are then applied to it.
"""

from __future__ import annotations

import logging
import os
import tempfile
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, cast

from pyspark.sql import SparkSession

from dbspark.core.settings import int_setting
from dbspark.engine.spark.class_archive import with_archive

log = logging.getLogger(__name__)

DEFAULT_MASTER = "local[2]"
DEFAULT_SHUFFLE_PARTITIONS = 4
LOCAL_HOST = "127.0.0.1"
#: Spark Connect's default port, for ``sc://host`` without one.
DEFAULT_CONNECT_PORT = 15002
#: pyspark's process-wide switch between the classic and the Connect API (see above).
_CONNECT_MODE_FLAG = "SPARK_CONNECT_MODE_ENABLED"

#: Settings every session gets (runtime-settable, so they also apply to a reused one).
RUNTIME_DEFAULTS = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.adaptive.enabled": "true",
    "spark.sql.adaptive.coalescePartitions.enabled": "true",
    # The expression compiler uses try_* functions, so it does not depend on ANSI mode;
    # but only ANSI mode makes BIGINT overflow an error instead of a silent wrap-around.
    "spark.sql.ansi.enabled": "true",
}

#: Settings every classic session dbspark starts gets; static, so they are given when the
#: session is built (a Connect client cannot set them, nor can a reused session take them).
CLASSIC_STATIC_DEFAULTS = {
    # PySpark's DataFrame debugging context costs two JVM calls and a walk of the Python
    # stack around every Column method (a third of a Spark unit's Py4J calls); it points
    # errors at the line of dbspark that built the column, which tells a user nothing.
    "spark.python.sql.dataFrameDebugging.enabled": "false",
}


def shuffle_partitions() -> int:
    """``spark.sql.shuffle.partitions`` for new sessions: ``DBSPARK_SHUFFLE_PARTITIONS`` or 4."""
    return int_setting("DBSPARK_SHUFFLE_PARTITIONS", DEFAULT_SHUFFLE_PARTITIONS, minimum=1)


def _ui_enabled() -> bool:
    return os.environ.get("DBSPARK_SPARK_UI", "").strip().lower() in ("1", "true", "yes")


def session_conf(
    master: str | None = None, *, remote: str | None = None, conf: Mapping[str, Any] | None = None
) -> dict[str, str]:
    """The configuration ``spark_session`` applies (user ``conf`` overrides the defaults)."""
    settings: dict[str, str] = dict(RUNTIME_DEFAULTS)
    settings["spark.sql.shuffle.partitions"] = str(shuffle_partitions())
    if remote is None:
        settings.update(CLASSIC_STATIC_DEFAULTS)
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
    creator's settings are otherwise left alone); with neither ``master`` nor
    ``remote``, any active session is, and without one ``SPARK_REMOTE`` (if set) is
    the remote.
    """
    if master is not None and remote is not None:
        raise ValueError("give either master (classic Spark) or remote (Spark Connect), not both")
    no_choice = master is None and remote is None
    if no_choice and os.environ.get("SPARK_REMOTE") and SparkSession.getActiveSession() is None:
        remote = os.environ["SPARK_REMOTE"]
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
        return _connect(remote, app_name, settings)

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


def _connect(remote: str, app_name: str, settings: Mapping[str, str]) -> SparkSession:
    """A new Spark Connect session.

    pyspark's generic builder refuses while a classic context lives in this process,
    and the Connect builder's ``getOrCreate`` would return any active Connect session,
    whatever its server; so ``sc://`` addresses get the Connect builder's ``create``
    (the new session becomes the active one only if none is).
    """
    runtime = {k: v for k, v in settings.items() if not _static(k)}
    if remote.startswith("local"):
        # pyspark starts an in-process server for local[N]; only its generic builder does.
        builder = SparkSession.builder.remote(remote).appName(app_name)
        for key, value in runtime.items():
            builder = builder.config(key, value)
        return builder.getOrCreate()
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    os.environ[_CONNECT_MODE_FLAG] = "1"
    connect_builder = ConnectSession.builder.remote(remote).appName(app_name)
    for key, value in runtime.items():
        connect_builder = connect_builder.config(key, value)
    # The Connect session class mirrors pyspark.sql.SparkSession without subclassing it.
    return cast(SparkSession, connect_builder.create())


@contextmanager
def connect_session(
    remote: str, *, app_name: str = "dbspark", conf: Mapping[str, Any] | None = None
) -> Iterator[SparkSession]:
    """A Spark Connect session for the length of a block, which then stops it and
    restores the process's API flag, so a classic session created before (or after)
    works again (see the module docstring)."""
    before = os.environ.get(_CONNECT_MODE_FLAG)
    active = SparkSession.getActiveSession() if before is not None else None
    session = spark_session(remote=remote, app_name=app_name, conf=conf)
    try:
        yield session
    finally:
        try:
            if session is not active:  # a session someone else opened stays open
                session.stop()
        finally:
            if before is None:
                os.environ.pop(_CONNECT_MODE_FLAG, None)
            else:
                os.environ[_CONNECT_MODE_FLAG] = before


def connect_address(remote: str) -> tuple[str, int]:
    """``(host, port)`` of a ``sc://host[:port][/;params]`` URL (default port 15002)."""
    if not remote.startswith("sc://"):
        raise ValueError(f"a Spark Connect address looks like sc://host:port, got {remote!r}")
    target = remote[len("sc://") :].split("/", 1)[0].split(";", 1)[0]
    host, sep, port = target.rpartition(":")
    if not sep or "]" in port:  # no port (an IPv6 literal's colons are inside [])
        host, port = target, str(DEFAULT_CONNECT_PORT)
    host = host.strip("[]")
    if not host or not port.isdigit():
        raise ValueError(f"a Spark Connect address looks like sc://host:port, got {remote!r}")
    return host, int(port)


def _compatible(session: SparkSession, master: str | None, remote: str | None) -> bool:
    connect = is_connect(session)
    if remote is not None:
        return connect and _same_remote(session, remote)
    if master is None:
        return True  # whatever session is running (tests, spark-submit, a Connect client)
    if connect:
        return False
    try:
        return session.sparkContext.master == master
    except Exception:  # pragma: no cover - a stopped context
        return False


def is_connect(session: SparkSession) -> bool:
    """Is this a Spark Connect session (rather than a classic, in-process one)?"""
    return type(session).__module__.startswith("pyspark.sql.connect")


def _same_remote(session: SparkSession, remote: str) -> bool:
    # pyspark keeps the address on the client's channel builder (no public accessor).
    builder = getattr(getattr(session, "client", None), "_builder", None)
    endpoint = getattr(builder, "endpoint", None)
    if endpoint is None or not remote.startswith("sc://"):
        return False
    try:
        return connect_address(f"sc://{endpoint}") == connect_address(remote)
    except ValueError:
        return False


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
    return key in CLASSIC_STATIC_DEFAULTS or key.startswith(
        ("spark.ui.", "spark.driver.", "spark.executor.", "spark.master")
    )


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
    # The class-data archive (class_archive) goes with it: a third off the JVM's start.
    log4j = f"-Dlog4j.configurationFile=file:{path}"
    settings["spark.driver.extraJavaOptions"] = with_archive(log4j)
