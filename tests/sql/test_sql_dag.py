"""A circuit defined in SQL is an ordinary circuit: ``build_dag`` takes it unchanged,
and the Graph view can draw it (loops and the constant of a global aggregate included).
``sql_dag`` builds one from a ``.sql`` file and a JSON source declaration next to the DAG
file, and SQL it refuses is that DAG file's import error in Airflow's own DagBag."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from dbspark.orchestration import LandingDirectory, build_dag
from dbspark.sql import compile_circuit

SQL_VECTORS = Path(__file__).resolve().parents[3] / "shared" / "conformance" / "sql"


def test_build_dag_takes_a_sql_circuit_and_the_graph_view_can_draw_it() -> None:
    from airflow.api_fastapi.core_api.services.ui.task_group import task_group_to_dict
    from airflow.serialization.serialized_objects import DagSerialization

    spec = json.loads((SQL_VECTORS / "sql_reachability.json").read_text())["circuit"]
    script = spec["sql"] + "; CREATE VIEW reached AS SELECT COUNT(*) AS n FROM reach;"
    circuit = compile_circuit("sql_reach", spec["sources"], script)
    landing = LandingDirectory("/tmp/landing")
    dag = build_dag(
        circuit,
        dag_id="dbspark_sql_reach",
        schedule="@daily",
        start_date=datetime(2026, 1, 1, tzinfo=UTC),
        sources={"edges": landing, "roots": landing},
    )
    task_ids = {t.task_id for t in dag.tasks}
    assert {"open_epoch", "ingest.edges", "ingest.roots", "publish", "close_epoch"} <= task_ids
    assert any(t.startswith("loop_reach_r.") for t in task_ids), sorted(task_ids)
    assert any(t.startswith("constant_") for t in task_ids), sorted(task_ids)
    stored = DagSerialization.deserialize_dag(DagSerialization.serialize_dag(dag))
    group_dict: dict = {}
    nodes = [
        task_group_to_dict(child, group_dict=group_dict)
        for child in stored.task_group.topological_sort(group_dict=group_dict)
    ]
    ids = [node["id"] for node in nodes]
    after_close = {"rebuild", "verify", "serve", "maintain"}
    assert ids[0] == "open_epoch" and ids[-5] == "close_epoch", ids
    assert set(ids[-4:]) == after_close, ids


GRAPH = {
    "edges": {"columns": [["src", "STRING"], ["dst", "STRING"]]},
    "roots": {"columns": [["node", "STRING"]]},
}
DAG_FILE = """
\"\"\"Airflow DAG of the views in sql/{script}.\"\"\"
from datetime import UTC, datetime

from dbspark.orchestration import LandingDirectory, sql_dag

dag = sql_dag(
    "sql/{script}",
    sources="sql/graph.json",
    connectors=LandingDirectory("/tmp/landing"),
    dag_id="{dag_id}",
    schedule="@daily",
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
)
"""


def test_sql_dag_files_load_and_a_sql_error_is_that_dag_files_import_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.dag_processing.dagbag import DagBag

    from dbspark.orchestration.airflow.dag import circuit_of

    folder = tmp_path / "dags"
    (folder / "sql").mkdir(parents=True)
    (folder / "sql" / "graph.json").write_text(json.dumps(GRAPH))
    (folder / "sql" / "fan_out.sql").write_text(
        "CREATE VIEW fan_out AS SELECT src, COUNT(*) AS n FROM edges GROUP BY src;"
    )
    (folder / "sql" / "ranked.sql").write_text(
        "CREATE VIEW fine AS SELECT src FROM edges;\n"
        "CREATE VIEW ranked AS\n"
        "  SELECT src, rank() OVER (PARTITION BY src ORDER BY dst) AS r FROM edges;\n"
    )
    for script, dag_id in (("fan_out.sql", "sql_fan_out"), ("ranked.sql", "sql_ranked")):
        dag_file = folder / f"{dag_id}.py"
        dag_file.write_text(DAG_FILE.format(script=script, dag_id=dag_id))
    monkeypatch.chdir(tmp_path)  # the files are found next to the DAG file, not here

    bag = DagBag(str(folder))

    assert set(bag.dags) == {"sql_fan_out"}
    circuit = circuit_of("sql_fan_out")
    assert circuit.name == "fan_out" and list(circuit.views) == ["fan_out"]
    tasks = {t.task_id for t in bag.dags["sql_fan_out"].tasks}
    assert {"ingest.edges", "ingest.roots", "publish"} <= tasks  # one connector for both
    assert "count; 1 trace by group (edges.src)" in bag.dags["sql_fan_out"].doc_md  # explain
    ((path, error),) = bag.import_errors.items()
    assert path.endswith("sql_ranked.py")
    message = error.strip().splitlines()[-1]  # what the UI shows last, under the traceback
    assert message.startswith("dbspark.sql.errors.SqlError: ")
    assert f"{folder / 'sql' / 'ranked.sql'}: view 'ranked', line 3, column 15:" in message
    assert "window function" in message
