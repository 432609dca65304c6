"""OpenLineage: with the provider installed and a transport configured, ingest and publish
tasks report the sources they read and the views they publish, by their real locations
and with their columns, and never a path inside the warehouse.

The DAG run is real (``dag.test()``: Airflow's task runner, its listeners and the
OpenLineage provider's, the file transport), in a process of its own: Airflow loads its
plugins, and with them the OpenLineage listener, once per process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from dbspark.orchestration.airflow.lineage import location_dataset
from dbspark.orchestration.intervals import Interval
from dbspark.orchestration.sources import LandingDirectory
from dbspark.orchestration.sources.sql import sql_dataset

pytestmark = pytest.mark.slow

DAGS = Path(__file__).parent / "dags"
START = datetime(2026, 1, 1, tzinfo=UTC)

RUN = textwrap.dedent(
    """
    import sys
    from datetime import datetime
    from airflow.dag_processing.dagbag import DagBag

    dag = DagBag(sys.argv[1]).dags["test_word_count"]
    run = dag.test(logical_date=datetime.fromisoformat(sys.argv[2]))
    print("STATE", getattr(run.state, "value", run.state))
    """
)


def events_by_job(path: Path) -> dict[str, list[dict]]:
    """The run events in the file transport's output, by job name (``<dag>.<task>``)."""
    found: dict[str, list[dict]] = {}
    for line in path.read_text().splitlines():
        event = json.loads(line)
        if "job" in event and "eventType" in event:
            found.setdefault(event["job"]["name"], []).append(event)
    return found


def datasets(event: dict, side: str) -> dict[tuple[str, str], list[list[str]]]:
    return {
        (d["namespace"], d["name"]): [
            [f["name"], f["type"]] for f in d.get("facets", {}).get("schema", {}).get("fields", [])
        ]
        for d in event.get(side, [])
    }


def test_ingest_and_publish_report_sources_and_published_tables(airflow_db, tmp_path):
    warehouse, outputs, landing = tmp_path / "wh", tmp_path / "out", tmp_path / "landing"
    lineage = tmp_path / "openlineage.json"
    env = {
        **os.environ,
        "AIRFLOW__DBSPARK__WAREHOUSE": str(warehouse),
        "AIRFLOW__DBSPARK__OUTPUTS": str(outputs),
        "AIRFLOW__DBSPARK__LANDING": str(landing),
        "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps(
            {"type": "file", "log_file_path": str(lineage), "append": True}
        ),
        "AIRFLOW__OPENLINEAGE__NAMESPACE": "dbspark-tests",
    }
    day0 = Interval(START, START + timedelta(days=1))
    LandingDirectory(landing).land("words", day0, [("a", 1), ("b", 1)], ["word", "__w"], "parquet")
    done = subprocess.run(
        [sys.executable, "-c", RUN, str(DAGS), day0.end.isoformat()],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert "STATE success" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]

    jobs = events_by_job(lineage)
    [ingested] = [e for e in jobs["test_word_count.ingest.words"] if e["eventType"] == "COMPLETE"]
    assert datasets(ingested, "inputs") == {("file", str(landing / "words")): [["word", "string"]]}
    assert datasets(ingested, "outputs") == {
        ("dbspark://word_count", "sources.words"): [["word", "string"]]
    }
    [published] = [e for e in jobs["test_word_count.publish"] if e["eventType"] == "COMPLETE"]
    # The circuit's sources in. (dag.test runs every task in one process, whose hook
    # lineage collector also still holds what the ingest read; a deployment runs each task
    # in a process of its own.)
    assert ("dbspark://word_count", "sources.words") in datasets(published, "inputs")
    tables = {k: v for k, v in datasets(published, "outputs").items() if k[0] == "file"}
    assert tables == {
        ("file", str(outputs / "word_count" / "counts" / "table")): [
            ["word", "string"],
            ["n", "bigint"],
        ],
        ("file", str(outputs / "word_count" / "distinct_words" / "table")): [["word", "string"]],
    }
    # Nothing of the warehouse: its batches are the engine's, not anybody's data.
    text = lineage.read_text()
    assert str(warehouse) not in text


def test_datasets_are_named_as_openlineage_names_them():
    import sqlalchemy as sa

    assert location_dataset("/data/out/c/v/table") == ("file", "/data/out/c/v/table")
    assert location_dataset("file:///data/t") == ("file", "/data/t")
    assert location_dataset("s3://bucket/views/c/v/table") == ("s3://bucket", "views/c/v/table")
    url = sa.make_url("postgresql+psycopg://u:p@db.example:5433/shop")
    assert sql_dataset(url, None, "orders") == ("postgres://db.example:5433", "shop.public.orders")
    assert sql_dataset(url, "sales", "orders") == (
        "postgres://db.example:5433",
        "shop.sales.orders",
    )
    assert sql_dataset(sa.make_url("sqlite:////tmp/a.db"), None, "t") == ("sqlite", "/tmp/a.db.t")
