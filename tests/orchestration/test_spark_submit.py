"""With a Spark connection of type ``spark``, every Spark task is a ``spark-submit`` of
``dbspark.orchestration.spark_job`` (here to a ``local[1]`` master: a real spark-submit, a new
driver JVM per task), and the epoch comes out as it does in the worker."""

from __future__ import annotations

import json
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from dbspark.core.zset import ZSet
from dbspark.orchestration.intervals import Interval
from dbspark.orchestration.sinks.files import CHANGES, output_dir, read_change_rows
from dbspark.orchestration.sinks.tables import table_path, table_rows
from dbspark.orchestration.sources import LandingDirectory
from dbspark.storage.catalog import Catalog
from tests.moto_s3 import BUCKET

pytestmark = pytest.mark.slow

DAGS = Path(__file__).parent / "dags"
START = datetime(2026, 1, 1, tzinfo=UTC)


def test_an_epoch_through_spark_submit(airflow_db, s3, tmp_path, monkeypatch, capfd):
    """... publishing its tables to S3 (moto's), with the credentials of the connection
    ``[dbspark] table_conn_id`` names: the task has no ``AWS_*`` environment, so the
    driver has them only as the unit's channel hands them over, never in its file."""
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.setenv("AIRFLOW__DBSPARK__WAREHOUSE", str(tmp_path / "warehouse"))
    monkeypatch.setenv("AIRFLOW__DBSPARK__LANDING", str(tmp_path / "landing"))
    monkeypatch.setenv("AIRFLOW__DBSPARK__OUTPUTS", str(tmp_path / "published"))
    monkeypatch.setenv(
        "AIRFLOW_CONN_DBSPARK_SPARK", json.dumps({"conn_type": "spark", "host": "local[1]"})
    )
    location = f"s3://{BUCKET}/published"
    monkeypatch.setenv("AIRFLOW__DBSPARK__TABLE_LOCATION", location)
    monkeypatch.setenv("AIRFLOW__DBSPARK__TABLE_STORAGE_OPTIONS", json.dumps(s3.options()))
    monkeypatch.setenv("AIRFLOW__DBSPARK__TABLE_CONN_ID", "dbspark_tables")
    secret = "dbspark-test-secret-of-the-connection"
    monkeypatch.setenv(
        "AIRFLOW_CONN_DBSPARK_TABLES",
        json.dumps({"conn_type": "aws", "login": "dbspark-test", "password": secret}),
    )
    for variable in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(variable)
    # No instance role to fall back on: without the connection's keys, no request is signed.
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    # Every unit on Spark: a small epoch would otherwise stay on the local tier.
    monkeypatch.setenv("DBSPARK_LOCAL_ROWS", "0")
    day0 = Interval(START, START + timedelta(days=1))
    rows = [("to", 1), ("be", 1), ("or", 1), ("not", 1), ("to", 1), ("be", 1)]
    LandingDirectory(tmp_path / "landing").land("words", day0, rows, ["word", "__w"], "csv")

    dag = DagBag(str(DAGS)).dags["test_word_count"]
    capfd.readouterr()
    run = dag.test(logical_date=day0.end)
    logs = capfd.readouterr().out
    assert str(getattr(run.state, "value", run.state)) == "success", logs[-5000:]
    # The jobs really went through spark-submit, and each reported back.
    assert logs.count("dbspark unit done") >= 4
    assert "spark-submit" in logs

    catalog = Catalog.for_warehouse(tmp_path / "warehouse")
    assert catalog.last_committed_epoch("word_count") == 0
    catalog.close()
    from dbspark.examples.circuits import word_count

    schema = word_count().node(word_count().views["counts"]).schema
    counts = output_dir(tmp_path / "published", "word_count", "counts", CHANGES, 0)
    want = ZSet({("to", 2): 1, ("be", 2): 1, ("or", 1): 1, ("not", 1): 1})
    assert ZSet(read_change_rows(counts, schema)) == want  # epoch 0's change is the view
    # The Delta table the unit committed under spark-submit, on S3, holds the same view;
    # the secret is in no log.
    table = table_path(location, "word_count", "counts")
    options = s3.reader_options()
    assert ZSet(table_rows(table, schema, epoch=0, storage_options=options)) == want
    assert secret not in logs
    # The unit files went through a private directory, and none is left.
    units = tmp_path / "warehouse" / "_units" / "word_count"
    assert stat.S_IMODE(units.stat().st_mode) == 0o700
    assert list(units.iterdir()) == []


def word_count_submitter(tmp_path: Path) -> tuple[Any, Any]:
    """The word count's tasks and a deployment under ``tmp_path`` whose Spark units go
    through spark-submit (the ``dbspark_spark`` connection, set by the test)."""
    from dbspark.examples.circuits import word_count
    from dbspark.orchestration.airflow.deployment import Deployment, DeploymentOptions
    from dbspark.orchestration.airflow.tasks import EpochTasks
    from dbspark.orchestration.units import CircuitRecipe

    tasks = EpochTasks(
        circuit=word_count(),
        sources={},
        options=DeploymentOptions(),
        start_date=START,
        iteration_tasks=1,
        recipe=CircuitRecipe.of_factory(word_count),
    )
    deployment = Deployment(
        warehouse=tmp_path / "warehouse",
        outputs=tmp_path / "published",
        catalog_url=None,
        spark_remote=None,
        spark_submit_conn_id="dbspark_spark",
        serving_url=None,
        serving_table_prefix="dbspark_",
    )
    return tasks, deployment


def test_bad_input_in_the_driver_fails_the_task_with_the_drivers_error(tmp_path, monkeypatch):
    """The task sees only spark-submit's exit status; the driver sends an error no retry
    can fix back in its result file, so the task raises that very error (and the retry
    policy fails it at once) instead of a failed submission that would be retried."""
    from dbspark.core.errors import InputError
    from dbspark.orchestration.units import IngestUnit

    monkeypatch.setenv(
        "AIRFLOW_CONN_DBSPARK_SPARK", json.dumps({"conn_type": "spark", "host": "local[1]"})
    )
    tasks, deployment = word_count_submitter(tmp_path)
    with pytest.raises(InputError, match=r"source 'sentences'.*has no such source") as refused:
        tasks._submit(deployment, IngestUnit(0, "sentences", [("to",)]))
    assert refused.value.source == "sentences"
    # Nothing is left of the unit: neither its file nor the result that carried the error.
    assert list((tmp_path / "warehouse" / "_units" / "word_count").iterdir()) == []


def test_a_task_stopped_by_its_timeout_stops_spark_submit_and_its_driver(tmp_path, monkeypatch):
    """Airflow's timeout raises in the task while spark-submit runs: the submission and
    the Python driver it started (client mode) stop with the task, instead of running on
    past its lease."""
    import os
    import sys
    import time

    import psutil
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
    from airflow.sdk.exceptions import AirflowTaskTimeout
    from airflow.sdk.execution_time.timeout import timeout

    from dbspark.orchestration.airflow.tasks import submit_or_kill

    monkeypatch.setenv(
        "AIRFLOW_CONN_DBSPARK_SPARK", json.dumps({"conn_type": "spark", "host": "local[1]"})
    )
    started = tmp_path / "driver.pid"
    application = tmp_path / "sleeps.py"
    application.write_text(
        "import os, pathlib, sys, time\n"
        "pathlib.Path(sys.argv[1]).write_text(str(os.getpid()))\n"
        "time.sleep(300)\n"
    )
    hook = SparkSubmitHook(
        conn_id="dbspark_spark",
        application_args=[str(started)],
        env_vars={
            # spark-submit is the wheel's, beside this interpreter (as the task finds it).
            "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"],
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
        },
    )
    began = time.monotonic()
    with pytest.raises(AirflowTaskTimeout), timeout(30):
        submit_or_kill(hook, str(application))
    assert time.monotonic() - began < 75
    assert started.exists(), "the driver never started: the timeout came too early to tell"
    driver = int(started.read_text())
    submission = hook._submit_sp
    deadline = time.monotonic() + 15
    while psutil.pid_exists(driver) and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = psutil.pid_exists(driver) and psutil.Process(driver).status() != psutil.STATUS_ZOMBIE
    assert not alive, f"the driver {driver} outlived its task"
    assert submission.poll() is not None


def test_a_unit_through_an_authenticated_standalone_cluster(tmp_path, monkeypatch, capfd):
    """A standalone master with ``spark.authenticate`` (as the compose topology runs it):
    the spark connection's password is the cluster's secret, which reaches the driver in
    a private properties file, never on spark-submit's command line. The unit's full
    refresh runs in executors on the cluster's worker."""
    import secrets

    from dbspark.devtools.spark_standalone import LocalSparkCluster
    from dbspark.engine.spark.executor import SparkEngine
    from dbspark.examples.circuits import word_count
    from dbspark.orchestration.units import VerifyUnit

    warehouse = tmp_path / "warehouse"
    engine = SparkEngine(word_count(), warehouse, spark=lambda: None, local_rows=100)
    engine.step({"words": [(("to",), 1), (("be",), 1)]})  # epoch 0, on the local tier
    engine.catalog.close()
    secret = secrets.token_hex(16)
    # Every verification with Spark, so that executors on the cluster do the work.
    monkeypatch.setenv("DBSPARK_LOCAL_ROWS", "0")
    with LocalSparkCluster(tmp_path / "spark", workers=1, auth_secret=secret) as cluster:
        monkeypatch.setenv(
            "AIRFLOW_CONN_DBSPARK_SPARK",
            json.dumps({"conn_type": "spark", "host": cluster.master_url, "password": secret}),
        )
        tasks, deployment = word_count_submitter(tmp_path)
        capfd.readouterr()
        result = tasks._submit(deployment, VerifyUnit(0))
        logs = capfd.readouterr()
        assert result["differing"] == {} and result["epoch"] == 0
        # The driver got executors from the authenticated master: one ran on the worker.
        assert cluster.executor_logs(), "no executor ran on the cluster"
    assert secret not in logs.out + logs.err
    assert "--properties-file" in logs.out + logs.err
    assert list((warehouse / "_units" / "word_count").iterdir()) == []  # file removed
