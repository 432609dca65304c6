"""A circuit defined in SQL is an ordinary circuit: ``build_dag`` takes it unchanged,
and the Graph view can draw it (loops and the constant of a global aggregate included)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

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
    assert nodes[0]["id"] == "open_epoch" and nodes[-1]["id"] == "close_epoch"
