"""``python -m dbspark.sql explain``: the plan of SQL views, as the planner made it, per
view: stages in order, the traces stateful operators keep and their keys (named where
the columns come from), loops, linear work; bad input is one line naming the file."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dbspark.circuit.planner import plan
from dbspark.examples import tpch
from dbspark.sql import compile_circuit
from dbspark.sql.cli import main
from dbspark.sql.explain import explain

TPCH = Path(tpch.__file__).parent
GRAPH = {
    "edges": {"columns": [["src", "BIGINT"], ["dst", "BIGINT"]]},
    "roots": {"columns": [["node", "BIGINT"]]},
}
REACH = """
CREATE VIEW reach AS
  WITH RECURSIVE r(node) AS (
    SELECT node FROM roots UNION SELECT e.dst FROM r JOIN edges e ON e.src = r.node)
  SELECT node FROM r;
CREATE VIEW fan_out AS SELECT src, COUNT(*) AS n FROM edges GROUP BY src;
CREATE VIEW busy AS SELECT src FROM fan_out WHERE n > 2;
"""


def _explain(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(["explain", *map(str, argv)])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def _section(text: str, view: str) -> str:
    """The lines printed under ``view NAME:`` (up to the next blank line)."""
    return text.split(f"\nview {view}: ", 1)[1].split("\n\n", 1)[0]


def test_tpch_q3_shows_the_planners_stages_and_each_traces_keys(capsys) -> None:
    status, out, err = _explain(capsys, TPCH / "q3.sql", "--sources", TPCH / "sources.json")
    assert status == 0 and err == ""
    the_plan = plan(compile_circuit("q3", tpch.sources(), tpch.query_text("q3")))
    printed = re.findall(r"^\s*stage (\d+) (\S+)", out, re.MULTILINE)
    assert printed == [(str(s.id), s.name) for s in the_plan.stages]  # each once, in order
    assert out.startswith("circuit q3: 6 sources, 1 view, 9 stages, 5 traces, 6 upsert states")
    assert "ingest_supplier  (read by no view)" in out
    assert "state  upsert_source state by (l_orderkey, l_linenumber)" in out
    assert "linear filter        (customer.c_mktsegment = 'BUILDING')" in out
    q3 = _section(out, "q3")
    assert q3.startswith("3 stages, 3 keeping state (5 traces), 0 linear")
    assert "join          2 traces: left by (customer.c_custkey), right by (orders.o_custkey)" in q3
    assert (
        "join          2 traces: left by (orders.o_orderkey), right by (lineitem.l_orderkey)" in q3
    )
    # l_orderkey = o_orderkey: the join keeps the left key, and the group says so.
    group = "by group (orders.o_orderkey, orders.o_orderdate, orders.o_shippriority)"
    assert group in " ".join(q3.split())


def test_tpch_q18_shows_the_in_subquery_as_its_own_aggregate_and_distinct(capsys) -> None:
    status, out, _ = _explain(capsys, TPCH / "q18.sql", "--sources", TPCH / "sources.json")
    assert status == 0
    q18 = " ".join(_section(out, "q18").split())
    assert q18.startswith("8 stages, 6 keeping state (9 traces), 2 linear")
    assert "aggregate sum; 1 trace by group (lineitem.l_orderkey) linear filter " in q18
    assert "(sum(lineitem.l_quantity) > 300)" in q18
    assert "distinct 1 trace by all 1 column (lineitem.l_orderkey)" in q18


def test_a_recursive_view_is_a_loop_block_and_later_views_share_stages() -> None:
    text = explain(compile_circuit("graph", GRAPH, REACH))
    the_plan = plan(compile_circuit("graph", GRAPH, REACH))
    (loop,) = the_plan.loops.values()
    reach = _section(text, "reach")
    inside = ", ".join(str(s) for s in loop.stages)
    assert f"loop reach_r: each iteration runs stages {inside} until one changes nothing" in (
        " ".join(reach.split())
    )
    assert "in Airflow, loop_reach_r.iterate runs one iteration per task" in " ".join(reach.split())
    loop_lines = reach.split("\n")
    join_line = next(line for line in loop_lines if " join " in line)
    assert join_line.startswith("      state  join")  # indented inside the loop block
    assert "left by (reach_r.node), right by (edges.src)" in join_line
    leave_line = next(line for line in loop_lines if "leave" in line and "stage" in line)
    assert leave_line.startswith("  stage ")  # the result leaves the loop, outside it
    fan_out = _section(text, "fan_out")
    assert fan_out.startswith("2 stages, 1 keeping state (1 trace), 1 linear")
    assert "count; 1 trace by group (edges.src)" in fan_out
    assert "linear filter        (count(*) > 2)" in fan_out
    # busy's filter and select fuse onto fan_out's last stage: it has none of its own.
    last = the_plan.node_stage[the_plan.circuit.views["busy"]]
    assert last == the_plan.node_stage[the_plan.circuit.views["fan_out"]]
    assert fan_out.endswith("linear select        1 column; published as view busy")
    busy = _section(text, "busy")
    assert busy.startswith("no stage of its own")
    assert re.search(r"also reads stages \d+, \d+ of view fan_out", busy)
    assert f"computed in stage {last}, shown under view fan_out" in busy


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"v.sql": "CREATE VIEW v AS SELECT 1 AS one FROM edges;"}, "s.json: no such file"),
        ({"s.json": json.dumps(GRAPH)}, "v.sql: no such file"),
        ({"s.json": '{"edges": ', "v.sql": ""}, "s.json: line 1, column 11: not valid JSON"),
        (
            {"s.json": '{"edges": {"columns": [["src"]]}}', "v.sql": ""},
            "s.json: source 'edges': \"columns\" must be a list of [name, type] pairs",
        ),
        (
            {"s.json": '{"edges": {"columns": [["src", "BIGNUM"]]}}', "v.sql": ""},
            "s.json: ",
        ),
        (
            {
                "s.json": json.dumps(GRAPH),
                "v.sql": "CREATE VIEW ok AS SELECT src FROM edges;\n"
                "CREATE VIEW ranked AS\n  SELECT src, rank() OVER (ORDER BY dst) FROM edges;",
            },
            "v.sql: view 'ranked', line 3, column 15: window",
        ),
    ],
    ids=["no_sources", "no_sql", "bad_json", "bad_columns", "bad_type", "sql_refused"],
)
def test_bad_input_is_one_line_naming_the_file_and_exit_2(
    capsys, tmp_path: Path, files: dict[str, str], expected: str
) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    status, out, err = _explain(capsys, tmp_path / "v.sql", "--sources", tmp_path / "s.json")
    assert status == 2 and out == ""
    assert err.startswith("python -m dbspark.sql explain: error: ") and err.count("\n") == 1
    assert f"{tmp_path}/{expected}" in err, err


def test_the_module_runs_as_a_command_without_a_traceback(tmp_path: Path) -> None:
    (tmp_path / "s.json").write_text(json.dumps(GRAPH))
    (tmp_path / "v.sql").write_text("CREATE VIEW v AS SELECT src FROM edges ORDER BY src;")
    done = subprocess.run(
        [sys.executable, "-m", "dbspark.sql", "explain", "v.sql", "--sources", "s.json"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().startswith("python -m dbspark.sql explain: error: v.sql: view 'v'")
    assert "ORDER" in done.stderr and "Traceback" not in done.stderr
