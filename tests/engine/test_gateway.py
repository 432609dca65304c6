"""Remembered JVM lookups (engine/spark/gateway.py): building columns makes no reflection
round trips, and the columns built are the same."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from pyspark.sql import functions as F

from dbspark.engine.spark.gateway import remember_jvm_lookups
from dbspark.engine.spark.session import session_conf


@contextmanager
def py4j_commands(spark) -> Iterator[list[str]]:
    """The Py4J commands this process sends while the block runs (their first lines)."""
    client = spark.sparkContext._gateway._gateway_client
    sent: list[str] = []
    original = client.send_command

    def recording(command, *args, **kwargs):
        sent.append(" ".join(command.split("\n")[:3]))
        return original(command, *args, **kwargs)

    client.send_command = recording
    try:
        yield sent
    finally:
        del client.send_command


def test_columns_and_selects_make_no_reflection_calls_once_remembered(spark) -> None:
    remember_jvm_lookups(spark)
    remember_jvm_lookups(spark)  # idempotent
    df = spark.createDataFrame([(1, "a"), (2, "b")], "k BIGINT, v STRING")

    def build():
        return df.select(F.col("k"), (F.col("k") + F.lit(1)).alias("k1"), F.upper("v"))

    build()  # each static method is looked up once, the first time it is called
    with py4j_commands(spark) as sent:
        out = build()
    reflections = [c for c in sent if c.startswith("r ")]
    assert reflections == [], reflections
    # One call builds each column (col, lit, upper), no lookups before them.
    assert sum(1 for c in sent if c.startswith("c ")) >= 3
    assert out.collect() == [(1, 2, "A"), (2, 3, "B")]


def test_without_remembering_pyspark_would_look_classes_up(spark) -> None:
    """The counter above sees reflection calls when they happen: a class not remembered
    (``SerDeUtil``, used for local data) is still looked up."""
    with py4j_commands(spark) as sent:
        assert spark.sparkContext._jvm.SerDeUtil is not None
    assert any(c.startswith("r ") for c in sent)


def test_dbspark_sessions_turn_off_the_dataframe_debugging_context() -> None:
    assert session_conf()["spark.python.sql.dataFrameDebugging.enabled"] == "false"
    # A static setting: a Spark Connect client may not set it (the server refuses).
    remote = session_conf(remote="sc://127.0.0.1:15002")
    assert "spark.python.sql.dataFrameDebugging.enabled" not in remote
