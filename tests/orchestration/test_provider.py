"""dbspark as an Airflow provider: the provider info Airflow reads from the installed
package, the ``dbspark`` connection type and its hook, a DAG run configured by that
connection alone, and a built wheel that carries everything a task and spark-submit use.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from dbspark.orchestration.airflow.deployment import (
    DeploymentOptions,
    dbspark_connection,
    resolve,
)
from dbspark.orchestration.intervals import Interval
from dbspark.orchestration.sources import LandingDirectory

REPO = Path(__file__).resolve().parents[2]
START = datetime(2026, 1, 1, tzinfo=UTC)


def dbspark_conn(**extra: str) -> str:
    return json.dumps({"conn_type": "dbspark", "extra": extra})


def test_airflow_finds_the_provider_its_connection_type_and_its_plugin():
    import jsonschema
    from airflow.providers_manager import ProvidersManager

    from dbspark.orchestration.airflow.provider import get_provider_info

    schema_file = Path(__import__("airflow").__file__).parent / "provider_info.schema.json"
    jsonschema.validate(get_provider_info(), json.loads(schema_file.read_text()))
    manager = ProvidersManager()
    provider = manager.providers["dbspark"]
    assert provider.data["name"] == "dbspark" and provider.version == "0.1.0"
    hook = manager.hooks["dbspark"]
    assert hook is not None
    assert hook.hook_class_name == "dbspark.orchestration.airflow.provider.DbsparkHook"
    assert hook.connection_id_attribute_name == "dbspark_conn_id"
    widgets = manager.connection_form_widgets
    assert {"warehouse", "outputs", "catalog_conn_id"} <= {
        w.field_name for name, w in widgets.items() if name.startswith("extra__dbspark__")
    }
    assert manager.field_behaviours["dbspark"]["hidden_fields"] == [
        "host",
        "schema",
        "login",
        "password",
        "port",
    ]
    # dbspark:// assets: Airflow's URI normalizer, and their OpenLineage datasets.
    assert manager.asset_uri_handlers["dbspark"].__name__ == "sanitize_uri"
    assert manager.asset_to_openlineage_converters["dbspark"].__name__ == "to_openlineage"
    manager.initialize_providers_plugins()
    assert [p.plugin_class for p in manager.plugins if p.name == "dbspark"] == [
        "dbspark.orchestration.airflow.ui.plugin.DbsparkPlugin"
    ]


def test_a_dbspark_connection_places_the_deployment(tmp_path, monkeypatch):
    from dbspark.orchestration.airflow.provider import DbsparkHook

    for key in ("WAREHOUSE", "OUTPUTS", "CATALOG_CONN_ID", "CONN_ID"):
        monkeypatch.delenv(f"AIRFLOW__DBSPARK__{key}", raising=False)
    assert dbspark_connection() == {}  # none: the defaults
    catalog = tmp_path / "catalog.db"
    monkeypatch.setenv("AIRFLOW_CONN_MY_CATALOG", f"sqlite:///{catalog}")
    monkeypatch.setenv(
        "AIRFLOW_CONN_DBSPARK_DEFAULT",
        dbspark_conn(
            warehouse=str(tmp_path / "wh"),
            outputs=str(tmp_path / "out"),
            catalog_conn_id="my_catalog",
        ),
    )
    deployment = resolve(DeploymentOptions())
    assert deployment.warehouse == tmp_path / "wh"
    assert deployment.outputs == tmp_path / "out"
    assert (deployment.catalog_conn_id, deployment.catalog_url) == (
        "my_catalog",
        f"sqlite:///{catalog}",
    )
    # [dbspark] keys and build_dag's arguments come first.
    monkeypatch.setenv("AIRFLOW__DBSPARK__OUTPUTS", str(tmp_path / "elsewhere"))
    assert resolve(DeploymentOptions()).outputs == tmp_path / "elsewhere"
    assert resolve(DeploymentOptions(warehouse=str(tmp_path / "w2"))).warehouse == tmp_path / "w2"
    # Outputs on object storage: the tables go there, the change feed to the default.
    monkeypatch.delenv("AIRFLOW__DBSPARK__TABLE_LOCATION", raising=False)
    on_s3 = resolve(DeploymentOptions(outputs="s3://b/p"))
    assert on_s3.table_settings["table_location"] == "s3://b/p"
    assert on_s3.outputs == tmp_path / "wh" / "published"
    assert "tables at s3://b/p" in on_s3.describe()
    monkeypatch.setenv("AIRFLOW__DBSPARK__TABLE_LOCATION", "s3://b/other")
    with pytest.raises(ValueError, match=r"outputs is 's3://b/p' and table_location 's3://b/o"):
        resolve(DeploymentOptions(outputs="s3://b/p"))

    # The hook reads the same place, and its Test button opens the catalog.
    from dbspark.engine.spark.executor import SparkEngine
    from dbspark.examples.circuits import word_count

    hook = DbsparkHook()
    assert hook.location().warehouse == tmp_path / "wh"
    engine = SparkEngine(word_count(), tmp_path / "wh", catalog_url=f"sqlite:///{catalog}")
    engine.step({"words": [(("a",), 1)]})
    engine.catalog.close()
    assert hook.last_committed_epoch("word_count") == 0
    ok, said = hook.test_connection()
    assert ok and said.endswith(": word_count") and str(tmp_path / "wh") in said

    # A named connection must exist, have the dbspark type and hold only what it takes.
    monkeypatch.setenv("AIRFLOW__DBSPARK__CONN_ID", "nope")
    with pytest.raises(Exception, match="nope"):
        dbspark_connection()
    monkeypatch.setenv("AIRFLOW__DBSPARK__CONN_ID", "my_catalog")
    with pytest.raises(ValueError, match="type 'sqlite', not 'dbspark'"):
        dbspark_connection()
    monkeypatch.delenv("AIRFLOW__DBSPARK__CONN_ID")
    monkeypatch.setenv("AIRFLOW_CONN_DBSPARK_DEFAULT", dbspark_conn(warehous="typo"))
    with pytest.raises(ValueError, match=r"extra keys \['warehous'\]; it takes warehouse"):
        dbspark_connection()
    ok, said = DbsparkHook().test_connection()
    assert not ok and "warehous" in said


@pytest.mark.slow
def test_a_dag_run_placed_by_the_dbspark_connection_alone(test_dags, tmp_path, monkeypatch):
    for key in ("WAREHOUSE", "OUTPUTS", "CATALOG_CONN_ID", "CONN_ID"):
        monkeypatch.delenv(f"AIRFLOW__DBSPARK__{key}", raising=False)
    monkeypatch.setenv("AIRFLOW__DBSPARK__LANDING", str(tmp_path / "landing"))
    monkeypatch.setenv(
        "AIRFLOW_CONN_DBSPARK_DEFAULT",
        dbspark_conn(warehouse=str(tmp_path / "wh"), outputs=str(tmp_path / "out")),
    )
    day0 = Interval(START, START + timedelta(days=1))
    landing = LandingDirectory(tmp_path / "landing")
    landing.land("words", day0, [("a", 1), ("b", 1)], ["word", "__w"], "parquet")
    run = test_dags["test_word_count"].test(logical_date=day0.end)
    assert str(getattr(run.state, "value", run.state)) == "success"
    assert (tmp_path / "wh" / "catalog.db").exists()
    assert (tmp_path / "out" / "word_count" / "counts" / "table").is_dir()


@pytest.mark.slow
def test_a_built_wheel_carries_the_provider_the_plugin_and_the_spark_job(tmp_path):
    """spark-submit runs a file of the installed package, never one of the repository."""
    # Built from a copy: setuptools leaves build/ and an egg-info in the tree it builds.
    source = tmp_path / "source"
    shutil.copytree(
        REPO / "include", source / "include", ignore=shutil.ignore_patterns("*.egg-info")
    )
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    built = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(built), str(source)],
        check=True,
        capture_output=True,
    )
    (wheel,) = built.glob("dbspark-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        declared = archive.read(entry_points).decode()
        archive.extractall(tmp_path / "site")
    assert "dbspark/orchestration/spark_job.py" in names
    assert not [n for n in names if not n.startswith("dbspark")], "files outside the package"
    assert "provider_info = dbspark.orchestration.airflow.provider:get_provider_info" in declared
    assert "dbspark = dbspark.orchestration.airflow.ui.plugin:DbsparkPlugin" in declared
    # Imported from the wheel's files (ahead of this checkout), in another directory:
    # the task's spark-submit application is the wheel's module.
    probe = (
        "import dbspark; from dbspark.orchestration.airflow.tasks import SPARK_JOB; "
        "print(dbspark.__file__); print(SPARK_JOB)"
    )
    shown = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path / "site"), "PATH": "/usr/bin:/bin"},
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    site = str(tmp_path / "site")
    assert shown[0].startswith(site) and shown[1] == f"{site}/dbspark/orchestration/spark_job.py"
    printed = subprocess.run(
        [sys.executable, "-m", "dbspark.orchestration.spark_job", "--path"],
        cwd=tmp_path,
        env={"PYTHONPATH": site, "PATH": "/usr/bin:/bin"},
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    assert printed == shown[1]
