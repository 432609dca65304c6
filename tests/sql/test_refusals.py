"""SQL that dbspark does not compile is refused before anything runs, with an error that
names the view, the construct and where it is in the text."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dbspark.sql import SqlError, compile_circuit

SOURCES = {
    "orders": {
        "columns": [
            ["order_id", "BIGINT"],
            ["cust_id", "BIGINT"],
            ["amount", "BIGINT"],
            ["status", "STRING"],
            ["ts", "BIGINT"],
        ],
        "key": ["order_id"],
        "watermark": ["ts"],
    },
    "customers": {"columns": [["cust_id", "BIGINT"], ["region", "STRING"]]},
}

#: (the view's query, words the error must hold, the line and column it must point at)
REFUSED = {
    "window": ("SELECT order_id, rank() OVER (ORDER BY amount) FROM orders", "window", (2, 18)),
    "order_by": ("SELECT order_id FROM orders ORDER BY amount", "ORDER", (2, 38)),
    "limit": ("SELECT order_id FROM orders LIMIT 3", "LIMIT", (2, 35)),
    "non_equi": (
        "SELECT o.order_id FROM orders o JOIN customers c ON o.cust_id < c.cust_id",
        "non-equi",
        (2, 38),
    ),
    "cross_join": ("SELECT * FROM orders, customers", "cross join", (2, 23)),
    "random": ("SELECT order_id, rand() AS r FROM orders", "non-deterministic", (2, 18)),
    "now": ("SELECT order_id, now() AS r FROM orders", "non-deterministic", (2, 18)),
    "unknown_table": ("SELECT * FROM payments", "unknown table 'payments'", (2, 15)),
    "unknown_column": ("SELECT colour FROM orders", "unknown column colour", (2, 8)),
    "type": ("SELECT status + 1 AS x FROM orders", "cannot apply + to string", (2, 8)),
    "ambiguous": (
        "SELECT cust_id FROM orders o JOIN customers c ON o.cust_id = c.cust_id",
        "ambiguous",
        (2, 8),
    ),
    "not_grouped": (
        "SELECT status, SUM(amount) AS s FROM orders GROUP BY cust_id",
        "must be in GROUP BY",
        (2, 8),
    ),
    "left_condition": (
        "SELECT o.order_id FROM orders o LEFT JOIN customers c "
        "ON o.cust_id = c.cust_id AND o.amount > c.cust_id",
        "may hold only equalities between the sides and conditions on one side",
        (2, 86),
    ),
    "not_in_two_columns": (
        "SELECT cust_id FROM customers WHERE cust_id NOT IN (SELECT cust_id, amount FROM orders)",
        "IN (subquery) needs a subquery of one column",
        (2, 60),
    ),
    "non_equal_correlation": (
        "SELECT c.cust_id FROM customers c WHERE EXISTS "
        "(SELECT 1 FROM orders o WHERE o.cust_id > c.cust_id)",
        "compare outer columns only by equality",
        (2, 80),
    ),
    "except_all_width": (
        "SELECT cust_id FROM customers EXCEPT ALL SELECT cust_id, amount FROM orders",
        "EXCEPT ALL of 1 and 2 columns",
        (2, 49),
    ),
    "sum_distinct_pair": (
        "SELECT SUM(DISTINCT amount, cust_id) AS n FROM orders",
        "SUM(DISTINCT ...) of several columns is not supported",
        (2, 8),
    ),
    "long_escape": (
        "SELECT order_id FROM orders WHERE status LIKE 'a' ESCAPE '!!'",
        "ESCAPE '!!' must be one character",
        (2, 58),
    ),
    "recursive_union_all": (
        "WITH RECURSIVE r(n) AS (SELECT cust_id FROM customers UNION ALL "
        "SELECT n FROM r) SELECT n FROM r",
        "UNION ALL never reaches a fixed point",
        (2, 32),
    ),
}


@pytest.mark.parametrize("case", REFUSED, ids=list(REFUSED))
def test_refused_with_view_construct_and_place(case: str) -> None:
    query, words, (line, column) = REFUSED[case]
    script = f"CREATE VIEW fine AS SELECT order_id FROM orders;\nCREATE VIEW {case} AS {query};"
    # Columns in the table count from the query's first character (1-based).
    offset = len(f"CREATE VIEW {case} AS ")
    with pytest.raises(SqlError) as refused:
        compile_circuit("refusals", SOURCES, script)
    error = refused.value
    assert error.view == case
    assert words in str(error), str(error)
    assert (error.line, error.column - offset) == (line, column), str(error)
    assert str(error).startswith(f"view {case!r}, line {line}, column {error.column}: ")


def test_a_script_that_does_not_parse_is_refused_with_its_place() -> None:
    with pytest.raises(SqlError) as refused:
        compile_circuit("bad", SOURCES, "CREATE VIEW v AS SELECT order_id FROM orders WHERE;")
    assert "cannot parse" in str(refused.value)
    assert refused.value.line == 1


def test_only_create_view_statements_are_accepted() -> None:
    with pytest.raises(SqlError, match="only CREATE VIEW"):
        compile_circuit("bad", SOURCES, "DELETE FROM orders;")
    with pytest.raises(SqlError, match="defines no view"):
        compile_circuit("bad", SOURCES, "  ;")


def test_a_view_name_cannot_be_taken_twice() -> None:
    script = (
        "CREATE VIEW v AS SELECT 1 AS x FROM orders; CREATE VIEW V AS SELECT 2 AS y FROM orders;"
    )
    with pytest.raises(SqlError, match="'V' is already a source or view"):
        compile_circuit("bad", SOURCES, script)
    with pytest.raises(SqlError, match="'orders' is already a source or view"):
        compile_circuit("bad", SOURCES, "CREATE VIEW orders AS SELECT 1 AS x FROM customers;")


def test_duplicate_output_columns_are_refused() -> None:
    script = (
        "CREATE VIEW v AS SELECT o.cust_id, c.cust_id "
        "FROM orders o JOIN customers c ON o.cust_id = c.cust_id;"
    )
    with pytest.raises(SqlError, match="'cust_id' appears twice"):
        compile_circuit("bad", SOURCES, script)


def test_the_conformance_command_exits_2_on_refused_sql(tmp_path: Path) -> None:
    vector = tmp_path / "refused.json"
    sql = "CREATE VIEW ranked AS SELECT order_id, rank() OVER (ORDER BY amount) FROM orders;"
    vector.write_text(
        json.dumps({"circuit": {"sources": SOURCES, "sql": sql}, "epochs": [{}]}),
        encoding="utf-8",
    )
    result = subprocess.run(
        [sys.executable, "-m", "dbspark.conformance", str(vector), "--engine", "reference"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 2
    assert "view 'ranked', line 1, column 40: window function" in result.stderr
    assert result.stdout == ""
