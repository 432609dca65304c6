"""``python -m dbspark.conformance``: its output format, its options, and bad input exiting
with status 2 and one line on stderr that says what and where.

The command runs as a subprocess, exactly as a user or CI would run it. The public vectors
replay through it in ``test_vectors.py``, beside every other way to an answer.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from vectors import VECTOR_DIR

from dbspark.conformance import (
    VectorError,
    compare,
    engine_names,
    get_engine,
    parse_vector,
    run_epochs,
    zset_to_rows,
)
from dbspark.core.zset import ZSet
from dbspark.engine.reference.engine import ReferenceEngine

ROOT = Path(__file__).resolve().parents[2]


def run_cli(*args: str | Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    include = str(ROOT / "include")
    env["PYTHONPATH"] = include + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run(
        [sys.executable, "-m", "dbspark.conformance", *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=timeout,
        check=False,
    )


def write_vector(tmp_path: Path, vector: Any, name: str = "vector.json") -> Path:
    path = tmp_path / name
    path.write_text(vector if isinstance(vector, str) else json.dumps(vector), encoding="utf-8")
    return path


def assert_bad_input(result: subprocess.CompletedProcess[str], *fragments: str) -> str:
    """Exit 2, nothing on stdout, exactly one line on stderr containing every fragment."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


# --- the public vectors ------------------------------------------------------------------


def test_every_view_appears_in_every_epoch_even_when_empty(tmp_path: Path) -> None:
    vector = {"circuit": "orders", "epochs": [{}, {"customers": []}]}
    result = run_cli(write_vector(tmp_path, vector), "--engine", "reference")
    assert result.returncode == 0, result.stderr
    empty = {"customers_current": [], "orders_current": [], "region_totals": []}
    assert json.loads(result.stdout) == {"epochs": [empty, empty]}


def test_no_epochs_no_output_entries(tmp_path: Path) -> None:
    result = run_cli(
        write_vector(tmp_path, {"circuit": "word_count", "epochs": []}), "--engine", "reference"
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"epochs": []}


def test_rows_sort_by_their_json_text(tmp_path: Path) -> None:
    vector = {"circuit": "geometric", "epochs": [{"numbers": [[[3], 1], [[10], 1]]}]}
    result = run_cli(write_vector(tmp_path, vector), "--engine", "reference")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)["epochs"][0]["series"]
    # "[10]" < "[12]" < ... < "[3]" < ... < "[6]": text order, not numeric order
    assert [row[0] for row, _ in rows] == [10, 12, 20, 24, 3, 40, 48, 6]


def test_booleans_are_booleans_and_null_columns_may_be_missing(tmp_path: Path) -> None:
    vector = {
        "circuit": "orders",
        "epochs": [
            {
                "customers": [{"cust_id": 1, "region": "EU", "ts": 1, "deleted": False}],
                "orders": [{"order_id": 5, "cust_id": 1, "ts": 1}],  # amount NULL
            }
        ],
    }
    result = run_cli(write_vector(tmp_path, vector), "--engine", "reference")
    assert result.returncode == 0, result.stderr
    (epoch,) = json.loads(result.stdout)["epochs"]
    assert epoch["orders_current"] == [[[5, 1, None], 1]]
    # count() counts the order; the SQL sum and max of only NULL are NULL.
    assert epoch["region_totals"] == [[["EU", 1, None, None], 1]]


# --- vectors of our own: cases the public ones do not reach ---------------------------------

# A root reaches c at iteration 2 in epoch 0; epoch 1 adds c -> d. The join must emit d
# at iteration 3 of epoch 1 although nothing changes there in epoch 1 (the first trap in
# ARCHITECTURE.md).
EXTEND_DEEP_REACH = {
    "circuit": "reachability",
    "epochs": [
        {"edges": [[["a", "b"], 1], [["b", "c"], 1]], "roots": [[["a"], 1]]},
        {"edges": [[["c", "d"], 1]]},
    ],
    "expected": [
        {"reach": [[["a"], 1], [["b"], 1], [["c"], 1]]},
        {"reach": [[["a"], 1], [["b"], 1], [["c"], 1], [["d"], 1]]},
    ],
}

# The same at depth 1 (which the engine gets right, because the edge's own enter keeps
# iteration 0 busy).
EXTEND_SHALLOW_REACH = {
    "circuit": "reachability",
    "epochs": [
        {"edges": [[["a", "b"], 1]], "roots": [[["a"], 1]]},
        {"edges": [[["b", "c"], 1]]},
    ],
    "expected": [
        {"reach": [[["a"], 1], [["b"], 1]]},
        {"reach": [[["a"], 1], [["b"], 1], [["c"], 1]]},
    ],
}

# Deleting an edge inside a cycle: c -> d -> e -> c must not keep itself reachable.
CYCLE_DELETION = {
    "circuit": "reachability",
    "epochs": [
        {
            "edges": [[["a", "b"], 1], [["b", "c"], 1], [["c", "d"], 1], [["d", "e"], 1]],
            "roots": [[["a"], 1]],
        },
        {"edges": [[["e", "c"], 1]]},
        {"edges": [[["b", "c"], -1]]},
    ],
    "expected": [
        {"reach": [[[n], 1] for n in "abcde"]},
        {"reach": [[[n], 1] for n in "abcde"]},
        {"reach": [[["a"], 1], [["b"], 1]]},
    ],
}

TRANSITIVE_CLOSURE = {
    "circuit": "transitive_closure",
    "epochs": [
        {"edges": [[[1, 2], 1], [[2, 3], 1], [[2, 3], 1]]},
        {"edges": [[[2, 3], -1]]},  # one copy left: distinct(edges) keeps it
        {"edges": [[[2, 3], -1]]},
    ],
    "expected": [
        {"tc": [[[1, 2], 1], [[1, 3], 1], [[2, 3], 1]]},
        {"tc": [[[1, 2], 1], [[1, 3], 1], [[2, 3], 1]]},
        {"tc": [[[1, 2], 1]]},
    ],
}


@pytest.mark.parametrize(
    "vector",
    [
        pytest.param(EXTEND_DEEP_REACH, id="reach-extends-from-a-deep-node"),
        pytest.param(EXTEND_SHALLOW_REACH, id="reach-extends-from-a-shallow-node"),
        pytest.param(CYCLE_DELETION, id="cycle-deletion"),
        pytest.param(TRANSITIVE_CLOSURE, id="transitive-closure-multiplicities"),
    ],
)
def test_own_vector_replays_to_expected(tmp_path: Path, vector: dict[str, Any]) -> None:
    result = run_cli(write_vector(tmp_path, vector), "--engine", "reference")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"epochs": vector["expected"]}


# --- bad input: exit 2, one line that says what and where ------------------------------------


def test_malformed_json(tmp_path: Path) -> None:
    path = write_vector(tmp_path, '{"circuit": "join", "epochs": [', "broken.json")
    assert_bad_input(run_cli(path, "--engine", "reference"), "broken.json", "not valid JSON")


@pytest.mark.parametrize(
    ("vector", "fragments"),
    [
        ([1, 2], ["must be a JSON object"]),
        ({"epochs": []}, ['no "circuit"']),
        ({"circuit": "join"}, ['no "epochs"']),
        ({"circuit": "join", "epochs": {}}, ['"epochs" must be a list']),
        ({"circuit": "join", "epochs": [[]]}, ["epoch 0", "must be an object"]),
        (
            {"circuit": "join", "epochs": [{}, {"left": {"k": 1}}]},
            ["epoch 1", "'left'", "must be a list"],
        ),
        (
            {"circuit": "join", "epochs": [{"left": [[[1, "x"]]]}]},
            ["epoch 0", "'left'", "entry 0", "[row, weight]"],
        ),
        (
            {"circuit": "join", "epochs": [{"left": [[1, "x", 1]]}]},
            ["epoch 0", "'left'", "[row, weight]"],
        ),
        (
            {"circuit": "join", "epochs": [{"left": [[{"k": 1, "a": "x"}, 1]]}]},
            ["epoch 0", "'left'", "row must be a list"],
        ),
        (
            {"circuit": "join", "epochs": [{"left": [[[1, "x"], 1.5]]}]},
            ["epoch 0", "'left'", "weight must be an integer"],
        ),
        (
            {"circuit": "join", "epochs": [{"left": [[[1, "x"], True]]}]},
            ["epoch 0", "weight must be an integer"],
        ),
        (
            {"circuit": "orders", "epochs": [{"orders": [[1, 2, 3, 4, None]]}]},
            ["epoch 0", "'orders'", "must be an object keyed by column name"],
        ),
        (
            {"circuit": {"sources": {"e": {"columns": "src"}}, "sql": ""}, "epochs": []},
            ["source 'e'", '"columns" must be a list of [name, type] pairs'],
        ),
    ],
    ids=[
        "not-an-object",
        "no-circuit",
        "no-epochs",
        "epochs-not-a-list",
        "epoch-not-an-object",
        "input-not-a-list",
        "entry-without-weight",
        "entry-not-a-pair",
        "row-not-a-list",
        "float-weight",
        "boolean-weight",
        "upsert-row-not-an-object",
        "sql-source-without-columns",
    ],
)
def test_malformed_vector(tmp_path: Path, vector: Any, fragments: list[str]) -> None:
    assert_bad_input(run_cli(write_vector(tmp_path, vector), "--engine", "reference"), *fragments)


def test_nan_is_not_json(tmp_path: Path) -> None:
    path = write_vector(tmp_path, '{"circuit": "join", "epochs": [{"left": [[[NaN, "x"], 1]]}]}')
    assert_bad_input(run_cli(path, "--engine", "reference"), "not valid JSON", "NaN")


def test_unknown_circuit(tmp_path: Path) -> None:
    path = write_vector(tmp_path, {"circuit": "reachabilty", "epochs": []})
    line = assert_bad_input(run_cli(path, "--engine", "reference"), "unknown circuit")
    assert "'reachabilty'" in line and "reachability" in line  # says what exists


def test_unknown_source_names_the_epoch(tmp_path: Path) -> None:
    vector = {"circuit": "reachability", "epochs": [{}, {}, {"egdes": []}]}
    assert_bad_input(
        run_cli(write_vector(tmp_path, vector), "--engine", "reference"),
        "epoch 2",
        "no source 'egdes'",
        "edges",
    )


def test_string_in_a_bigint_column(tmp_path: Path) -> None:
    vector = {
        "circuit": "join",
        "epochs": [{"left": [[[1, "x"], 1]]}, {"right": [[["2", "y"], 1]]}],
    }
    assert_bad_input(
        run_cli(write_vector(tmp_path, vector), "--engine", "reference"),
        "epoch 1",
        "source 'right'",
        '["2", "y"]',
        "column 'k'",
        "BIGINT",
    )


@pytest.mark.parametrize(
    ("value", "shown"), [(1.0, "1.0"), (True, "true")], ids=["float", "boolean"]
)
def test_float_or_boolean_is_not_a_bigint(tmp_path: Path, value: Any, shown: str) -> None:
    vector = {"circuit": "transitive_closure", "epochs": [{"edges": [[[value, 2], 1]]}]}
    assert_bad_input(
        run_cli(write_vector(tmp_path, vector), "--engine", "reference"),
        "epoch 0",
        "source 'edges'",
        "column 'src'",
        "BIGINT",
        shown,
    )


def test_integer_is_not_a_boolean(tmp_path: Path) -> None:
    row = {"cust_id": 1, "region": "EU", "ts": 1, "deleted": 1}
    vector = {"circuit": "orders", "epochs": [{"customers": [row]}]}
    assert_bad_input(
        run_cli(write_vector(tmp_path, vector), "--engine", "reference"),
        "source 'customers'",
        "column 'deleted'",
        "BOOLEAN",
    )


def test_bigint_out_of_range(tmp_path: Path) -> None:
    vector = {"circuit": "transitive_closure", "epochs": [{"edges": [[[2**63, 2], 1]]}]}
    assert_bad_input(
        run_cli(write_vector(tmp_path, vector), "--engine", "reference"), "out of range"
    )


def test_wrong_arity(tmp_path: Path) -> None:
    vector = {"circuit": "reachability", "epochs": [{"edges": [[["a", "b", "c"], 1]]}]}
    assert_bad_input(
        run_cli(write_vector(tmp_path, vector), "--engine", "reference"),
        "epoch 0",
        "source 'edges'",
        '["a", "b", "c"]',
        "3 values",
        "has 2",
    )


def test_unknown_upsert_column(tmp_path: Path) -> None:
    row = {"id": 1, "status": "open", "wm_major": 1, "wm_minor": 0, "colour": "red"}
    vector = {"circuit": "accounts", "epochs": [{"accounts": [row]}]}
    assert_bad_input(
        run_cli(write_vector(tmp_path, vector), "--engine", "reference"),
        "source 'accounts'",
        "colour",
    )


def test_null_upsert_key(tmp_path: Path) -> None:
    vector = {"circuit": "accounts", "epochs": [{"accounts": [{"status": "open"}]}]}
    assert_bad_input(
        run_cli(write_vector(tmp_path, vector), "--engine", "reference"),
        "source 'accounts'",
        "key column 'id' is NULL",
    )


def _account(balance: int, major: int = 1, minor: int = 0) -> dict[str, Any]:
    return {"id": 42, "status": "open", "balance": balance, "wm_major": major, "wm_minor": minor}


def test_upsert_conflict_in_one_batch(tmp_path: Path) -> None:
    vector = {"circuit": "accounts", "epochs": [{"accounts": [_account(1), _account(2)]}]}
    assert_bad_input(
        run_cli(write_vector(tmp_path, vector), "--engine", "reference"),
        "epoch 0",
        "'accounts'",
        "id=42",
        "equal watermark",
    )


def test_upsert_conflict_with_the_stored_row(tmp_path: Path) -> None:
    vector = {
        "circuit": "accounts",
        "epochs": [
            {"accounts": [_account(1)]},
            {"accounts": [_account(1, major=1, minor=0)]},  # a resend: fine
            {"accounts": [_account(2, major=1, minor=0)]},  # a different row, same watermark
        ],
    }
    assert_bad_input(
        run_cli(write_vector(tmp_path, vector), "--engine", "reference"),
        "epoch 2",
        "'accounts'",
        "id=42",
    )


def test_bad_row_in_a_late_epoch_prints_nothing(tmp_path: Path) -> None:
    vector = {
        "circuit": "word_count",
        "epochs": [{"words": [[["a"], 1]]}, {"words": [[[7], 1]]}],
    }
    assert_bad_input(
        run_cli(write_vector(tmp_path, vector), "--engine", "reference"), "epoch 1", "'words'"
    )


def test_missing_file(tmp_path: Path) -> None:
    assert_bad_input(
        run_cli(tmp_path / "nope.json", "--engine", "reference"), "nope.json", "cannot read"
    )


# --- engines ------------------------------------------------------------------------------


@pytest.mark.slow
def test_spark_is_the_default_engine(tmp_path: Path) -> None:
    vector = json.loads((VECTOR_DIR / "join_bilinear.json").read_text())
    result = run_cli(VECTOR_DIR / "join_bilinear.json", "--warehouse", tmp_path / "wh", timeout=600)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["epochs"] == vector["expected"]
    assert (tmp_path / "wh" / "catalog.db").exists()


@pytest.mark.slow
def test_spark_engine_rejects_an_upsert_conflict(tmp_path: Path) -> None:
    conflict = {
        "circuit": "accounts",
        "epochs": [
            {"accounts": [{"id": 1, "status": "open", "balance": 1, "wm_major": 1, "wm_minor": 0}]},
            {"accounts": [{"id": 1, "status": "open", "balance": 2, "wm_major": 1, "wm_minor": 0}]},
        ],
    }
    path = write_vector(tmp_path, conflict)
    assert_bad_input(run_cli(path, "--engine", "spark", timeout=600), "accounts", "id=1")


def test_unknown_engine_is_a_usage_error(tmp_path: Path) -> None:
    path = write_vector(tmp_path, {"circuit": "join", "epochs": []})
    result = run_cli(path, "--engine", "flink")
    assert result.returncode == 2
    assert "flink" in result.stderr


def test_warehouse_is_accepted_by_the_reference_engine(tmp_path: Path) -> None:
    path = write_vector(tmp_path, {"circuit": "join", "epochs": [{}]})
    result = run_cli(path, "--engine", "reference", "--warehouse", tmp_path / "wh")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"epochs": [{"joined": []}]}


def test_registry_knows_both_engines() -> None:
    assert {"reference", "spark"} <= set(engine_names())
    assert get_engine("reference").unavailable is None
    spark = get_engine("spark")
    assert spark.uses_warehouse
    assert spark.unavailable is None
    with pytest.raises(KeyError, match="unknown engine"):
        get_engine("flink")


# --- --check --------------------------------------------------------------------------------


def test_check_reports_a_difference_with_status_1(tmp_path: Path) -> None:
    vector = {
        "circuit": "word_count",
        "epochs": [{"words": [[["a"], 2]]}],
        "expected": [{"counts": [[["a", 3], 1]], "distinct_words": [[["a"], 1]]}],
    }
    result = run_cli(write_vector(tmp_path, vector), "--engine", "reference", "--check")
    assert result.returncode == 1
    assert json.loads(result.stdout)["epochs"][0]["counts"] == [[["a", 2], 1]]
    (line,) = result.stderr.strip().splitlines()
    assert "epoch 0" in line and "'counts'" in line


def test_expected_is_not_input(tmp_path: Path) -> None:
    vector = {"circuit": "join", "epochs": [{}], "expected": "anything at all"}
    result = run_cli(write_vector(tmp_path, vector), "--engine", "reference")
    assert result.returncode == 0, result.stderr


# --- the shared runner, in process ------------------------------------------------------------


def test_run_epochs_with_the_reference_engine() -> None:
    vector = parse_vector(json.dumps(EXTEND_SHALLOW_REACH))
    outputs = run_epochs(ReferenceEngine(vector.circuit), vector.circuit, vector.epochs)
    assert outputs == EXTEND_SHALLOW_REACH["expected"]
    assert compare(outputs, vector.expected) is None
    assert "epoch 1" in (compare(outputs, [outputs[0], outputs[0]]) or "")


def test_run_epochs_names_the_epoch_of_an_upsert_conflict() -> None:
    vector = parse_vector(
        json.dumps(
            {"circuit": "accounts", "epochs": [{}, {"accounts": [_account(1), _account(2)]}]}
        )
    )
    with pytest.raises(VectorError, match="epoch 1"):
        run_epochs(ReferenceEngine(vector.circuit), vector.circuit, vector.epochs)


def test_parse_vector_maps_rows_to_schema_order() -> None:
    vector = parse_vector(
        json.dumps(
            {
                "circuit": "accounts",
                "epochs": [{"accounts": [{"wm_minor": 0, "wm_major": 1, "id": 3}]}],
            }
        )
    )
    assert vector.epochs == [{"accounts": [(3, None, None, 1, 0)]}]
    assert vector.expected is None


def test_zset_to_rows() -> None:
    zset = ZSet([(("b", 2), 1), (("a", 10), -1), (("a", 9), 3), (("a", 9), -3)])
    assert zset_to_rows(zset) == [[["a", 10], -1], [["b", 2], 1]]
