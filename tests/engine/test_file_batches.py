"""Feeding sources from files (``FileBatch``): good files give the vectors' answers, bad
files are rejected before the epoch opens, naming the source and the file, and the
same epoch then runs from fixed files.

Files are written here with pyarrow, ``csv`` and ``json`` (not with Spark or dbspark), and
the oracle is each conformance vector's expected output.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from vectors import VECTOR_DIR

from dbspark.conformance.runner import zset_to_rows
from dbspark.conformance.vector import parse_vector
from dbspark.core.upsert import BadUpsertRow, UpsertConflict
from dbspark.engine.api import InputError
from dbspark.engine.file_batches import FileBatch

ORDERS = {"order_id": "bigint", "cust_id": "bigint", "amount": "bigint", "ts": "bigint"}
ORDERS_ALL = [*ORDERS, "deleted_at"]
ARROW = {"bigint": pa.int64(), "string": pa.string(), "boolean": pa.bool_()}


def load(name: str) -> tuple[Any, list]:
    text = (VECTOR_DIR / name).read_text()
    return parse_vector(text), json.loads(text)["expected"]


def views(engine: Any) -> dict:
    return {name: zset_to_rows(z) for name, z in engine.views().items()}


# --- writing files independently of the code under test ------------------------------------
def source_columns(circuit: Any, source: str) -> list[tuple[str, str]]:
    node = circuit.node(circuit.sources[source])
    schema = node.schema if node.op == "zset_source" else node.params["user_schema"]
    return list(schema.fields)


def as_records(circuit: Any, source: str, batch: list) -> list[dict]:
    """Rows of a vector batch as dicts (Z-set entries get ``__w``)."""
    columns = [n for n, _ in source_columns(circuit, source)]
    node = circuit.node(circuit.sources[source])
    if node.op == "zset_source":
        return [{**dict(zip(columns, row, strict=True)), "__w": w} for row, w in batch]
    return [dict(zip(columns, row, strict=True)) for row in batch]


def write(path: Path, fmt: str, records: list[dict], types: dict[str, str]) -> Path:
    """Write ``records`` (all with the keys of ``types``) as parquet, csv or jsonl."""
    if fmt == "parquet":
        arrays = {c: pa.array([r.get(c) for r in records], ARROW[t]) for c, t in types.items()}
        pq.write_table(pa.table(arrays), path)
    elif fmt == "csv":
        with path.open("w", newline="") as out:
            writer = csv.writer(out)
            writer.writerow(list(types))
            for r in records:
                writer.writerow(["" if r.get(c) is None else _csv(r.get(c)) for c in types])
    else:
        with path.open("w") as out:
            for r in records:
                out.write(json.dumps({c: r[c] for c in types if c in r}) + "\n")
    return path


def _csv(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def file_batches(vector: Any, epoch: int, fmt: str, where: Path, split: bool) -> dict:
    """One epoch's inputs as FileBatches (each source split in two files when ``split``)."""
    inputs = {}
    for source, batch in vector.epochs[epoch].items():
        records = as_records(vector.circuit, source, batch)
        types = dict(source_columns(vector.circuit, source))
        if "__w" in (records[0] if records else {}):
            types["__w"] = "bigint"
        halves = [records[::2], records[1::2]] if split and len(records) > 1 else [records]
        paths = [
            write(where / f"{source}-{epoch}-{i}.{fmt}", fmt, part, types)
            for i, part in enumerate(halves)
        ]
        inputs[source] = FileBatch(paths, fmt)
    return inputs


# --- no Spark ------------------------------------------------------------------------------
def test_a_file_batch_is_a_checked_value(tmp_path: Path) -> None:
    one = FileBatch(tmp_path / "a.csv", "CSV")
    assert one == FileBatch([str(tmp_path / "a.csv")], "csv")
    assert one.paths == (str(tmp_path / "a.csv"),)
    assert FileBatch(["x.json"], "json").format == "jsonl"
    with pytest.raises(ValueError, match="not one of parquet, csv, jsonl"):
        FileBatch(["x.orc"], "orc")
    with pytest.raises(ValueError, match="at least one path"):
        FileBatch([], "csv")
    with pytest.raises(ValueError, match="more than once"):
        FileBatch(["a.csv", "b.csv", "a.csv"], "csv")


# --- the engine ----------------------------------------------------------------------------
#: ``local_rows`` per tier: small Parquet and JSON-lines files are read in this process
#: on the local tier; CSV always, and everything with ``local_rows=0``, by Spark.
TIERS = {"local": 200_000, "spark": 0}


def test_utf8_is_checked_across_chunks_and_the_bad_line_found(tmp_path: Path) -> None:
    from dbspark.engine import file_batches

    line = b"x" * 99 + b"\n"
    lines = file_batches._UTF8_CHUNK // len(line)
    # A two-byte character split by the first chunk's end is UTF-8 all the same.
    good = tmp_path / "good.jsonl"
    good.write_bytes(b"x" * (file_batches._UTF8_CHUNK - 1) + "é\n".encode() + line)
    file_batches.check_utf8("s", FileBatch(good, "jsonl"))
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(line * (2 * lines) + b"ok\n" + b"ab\xff\n")
    with pytest.raises(InputError, match=rf"line {2 * lines + 2}: byte 3 of the line"):
        file_batches.check_utf8("s", FileBatch(bad, "jsonl"))
    file_batches.check_utf8("s", FileBatch(bad, "parquet"))  # not text: not looked at
    file_batches.check_utf8("s", FileBatch("s3a://bucket/x.jsonl", "jsonl"))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "tier"),
    [
        ("watermarks_and_tombstones.json", "local"),
        ("join_bilinear.json", "local"),
        ("watermarks_and_tombstones.json", "spark"),
    ],
)
def test_good_files_give_the_vectors_answers(spark, tmp_path: Path, name: str, tier: str) -> None:
    """Every format in turn (one per epoch, so one run covers all three), split over two
    files in every other epoch; views equal the vector's expected output after each."""
    from dbspark.engine.spark.executor import SparkEngine

    vector, expected = load(name)
    engine = SparkEngine(
        vector.circuit, tmp_path / "warehouse", spark=spark, local_rows=TIERS[tier]
    )
    formats = ["parquet", "csv", "jsonl"]
    for epoch in range(len(vector.epochs)):
        fmt = formats[epoch % 3]
        inputs = file_batches(vector, epoch, fmt, tmp_path, split=epoch % 2 == 0)
        engine.run_epoch(epoch, inputs)
        assert views(engine) == expected[epoch], (name, epoch, fmt)
    assert all(not diff for diff in engine.verify().values())


@pytest.mark.slow
def test_z_set_files_without_a_weight_column_count_each_line_once(
    spark, tmp_path: Path, warehouse_path: Path
) -> None:
    from dbspark.engine.spark.executor import SparkEngine

    vector, expected = load("join_bilinear.json")
    engine = SparkEngine(vector.circuit, warehouse_path, spark=spark)
    # Epoch 0 of the vector: left (1,'x') once and (2,'y') twice; right (1,'p').
    left = write(
        tmp_path / "left.jsonl",
        "jsonl",
        [{"k": 1, "a": "x"}, {"k": 2, "a": "y"}, {"k": 2, "a": "y"}],
        {"k": "bigint", "a": "string"},
    )
    right = write(
        tmp_path / "right.csv", "csv", [{"k": 1, "b": "p"}], {"k": "bigint", "b": "string"}
    )
    engine.run_epoch(0, {"left": FileBatch(left, "jsonl"), "right": FileBatch(right, "csv")})
    assert views(engine) == expected[0]


def orders_engine(spark: Any, warehouse: Path, tier: str = "local") -> tuple[Any, Any, list]:
    from dbspark.engine.spark.executor import SparkEngine

    vector, expected = load("watermarks_and_tombstones.json")
    engine = SparkEngine(vector.circuit, warehouse, spark=spark, local_rows=TIERS[tier])
    engine.run_epoch(0, vector.epochs[0])
    return engine, vector, expected


GOOD_ORDERS = [
    {"order_id": 1, "cust_id": 7, "amount": 1, "ts": 150, "deleted_at": None},
    {"order_id": 2, "cust_id": 7, "amount": 3, "ts": 150, "deleted_at": None},
    {"order_id": 3, "cust_id": 7, "amount": 6, "ts": 300, "deleted_at": None},
]  # epoch 1 of the vector
ORDER_TYPES = {**ORDERS, "deleted_at": "bigint"}


def _truncated(path: Path) -> Path:
    write(path, "parquet", GOOD_ORDERS, ORDER_TYPES)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def _text(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _latin1(path: Path, text: str) -> Path:
    """``text`` encoded as Latin-1 (gzipped for a ``.gz`` name): not UTF-8 where it
    has a letter past ASCII. Spark's readers would load U+FFFD in its place."""
    import gzip

    data = text.encode("latin-1")
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return path


BAD_FILES = {
    # name: (make the bad file in a dir -> FileBatch, message pattern)
    "missing": (lambda d: FileBatch(d / "nope.parquet", "parquet"), r"does not exist"),
    "truncated_parquet": (
        lambda d: FileBatch(_truncated(d / "orders.parquet"), "parquet"),
        r"cannot be read: \[",
    ),
    "parquet_missing_column": (
        lambda d: FileBatch(write(d / "o.parquet", "parquet", GOOD_ORDERS, ORDERS), "parquet"),
        r"missing column\(s\) \['deleted_at'\]",
    ),
    "parquet_extra_column": (
        lambda d: FileBatch(
            write(
                d / "o.parquet",
                "parquet",
                [{**r, "note": "x"} for r in GOOD_ORDERS],
                {**ORDER_TYPES, "note": "string"},
            ),
            "parquet",
        ),
        r"unknown column\(s\) \['note'\]",
    ),
    "parquet_wrong_type": (
        lambda d: FileBatch(
            write(
                d / "o.parquet",
                "parquet",
                [{**r, "amount": str(r["amount"])} for r in GOOD_ORDERS],
                {**ORDER_TYPES, "amount": "string"},
            ),
            "parquet",
        ),
        r"column 'amount' is BIGINT, got STRING",
    ),
    "jsonl_malformed_line": (
        lambda d: FileBatch(
            _text(
                d / "o.jsonl",
                '{"order_id": 1, "cust_id": 7, "amount": 1, "ts": 150}\n{"order_id": 2, "cust\n',
            ),
            "jsonl",
        ),
        r"line 2: not valid JSON",
    ),
    "jsonl_wrong_type": (
        lambda d: FileBatch(
            _text(
                d / "o.jsonl",
                '{"order_id": 1, "cust_id": 7, "amount": 1, "ts": 150}\n\n'
                '{"order_id": 2, "cust_id": 7, "amount": "3", "ts": 150}\n',
            ),
            "jsonl",
        ),
        r"line 3: column 'amount' is BIGINT, got \"3\"",
    ),
    "jsonl_unknown_key": (
        lambda d: FileBatch(
            _text(d / "o.jsonl", '{"order_id": 1, "cust_id": 7, "amout": 1, "ts": 150}\n'),
            "jsonl",
        ),
        r"line 1: unknown key\(s\) amout",
    ),
    # JSON lines are read by the local tier too: the same words on both (issue 20).
    "jsonl_not_an_object": (
        lambda d: FileBatch(_text(d / "o.jsonl", "[1, 2]\n"), "jsonl"),
        r"line 1: not a JSON object: \[1, 2\]",
    ),
    "jsonl_key_twice": (
        lambda d: FileBatch(
            _text(d / "o.jsonl", '{"order_id": 1, "cust_id": 7, "amount": 1, "amount": 2}\n'),
            "jsonl",
        ),
        r"line 1: not valid JSON \(or a key appears twice\)",
    ),
    "jsonl_nan": (
        lambda d: FileBatch(
            _text(d / "o.jsonl", '\r\n{"order_id": 1, "cust_id": 7, "amount": NaN}\r\n'),
            "jsonl",
        ),
        r"line 2: not valid JSON",
    ),
    "jsonl_fraction_for_bigint": (
        lambda d: FileBatch(
            _text(d / "o.jsonl", '{"order_id": 1, "cust_id": 7, "amount": 1.0, "ts": 1}\n'),
            "jsonl",
        ),
        r"line 1: column 'amount' is BIGINT, got 1: ",  # Spark shows 1.0 as DECIMAL 1
    ),
    "jsonl_past_bigint": (
        lambda d: FileBatch(
            _text(d / "o.jsonl", '{"order_id": 9223372036854775808, "ts": 1}\n'),
            "jsonl",
        ),
        r"line 1: column 'order_id' is BIGINT, got 9223372036854775808:",
    ),
    "csv_not_a_number": (
        lambda d: FileBatch(
            _text(
                d / "o.csv",
                "order_id,cust_id,amount,ts,deleted_at\n1,7,1,150,\n2,7,three,150,\n",
            ),
            "csv",
        ),
        r"line 3: column 'amount' is BIGINT, got 'three'",
    ),
    "csv_short_line": (
        lambda d: FileBatch(
            _text(d / "o.csv", "order_id,cust_id,amount,ts,deleted_at\n1,7,1,150,\n2,7,3\n"),
            "csv",
        ),
        r"line 3: 3 fields, the header has 5",
    ),
    # Given directly, not through a landing directory, which checks its own (issue 18).
    "csv_not_utf8": (
        lambda d: FileBatch(
            _latin1(
                d / "o.csv", "order_id,cust_id,amount,ts,deleted_at\n1,7,1,150,\n2,7,3,150,\xe9\n"
            ),
            "csv",
        ),
        r"line 3: byte 11 of the line is not UTF-8 \(0xe9\)",
    ),
    "csv_gz_not_utf8": (
        lambda d: FileBatch(
            _latin1(d / "o.csv.gz", "order_id,cust_id,amount,ts,deleted_at\n\xe91,7,1,150,\n"),
            "csv",
        ),
        r"line 2: byte 1 of the line is not UTF-8 \(0xe9\)",
    ),
    "jsonl_not_utf8": (
        lambda d: FileBatch(
            _latin1(
                d / "o.jsonl",
                '{"order_id": 1, "cust_id": 7, "amount": 1, "ts": 150}\n{"\xfc": 1}\n',
            ),
            "jsonl",
        ),
        r"line 2: byte 3 of the line is not UTF-8 \(0xfc\)",
    ),
    "csv_missing_column": (
        lambda d: FileBatch(
            _text(d / "o.csv", "order_id,cust_id,ts,deleted_at\n1,7,150,\n"), "csv"
        ),
        r"missing column\(s\) \['amount'\]",
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("tier", sorted(TIERS))
def test_bad_files_commit_nothing_and_fixed_files_run(
    spark, tmp_path: Path, warehouse_path: Path, tier: str
) -> None:
    """Each kind of bad file in turn against one engine (a rejected batch changes nothing,
    which is what lets the cases share it), then the fixed file runs the same epoch."""
    engine, _, expected = orders_engine(spark, warehouse_path, tier)
    for case, (make, pattern) in sorted(BAD_FILES.items()):
        bad_dir = tmp_path / case
        bad_dir.mkdir()
        batch = make(bad_dir)
        with pytest.raises(InputError, match=pattern) as caught:
            engine.run_epoch(1, {"orders": batch})
        message = str(caught.value)
        assert "source 'orders'" in message and batch.paths[0] in message, case
        assert "\tat org.apache" not in message and "Traceback" not in message, case
        assert engine.catalog.stage_runs(engine.circuit.name, epoch=1) == [], case
        assert engine.catalog.epoch_state(engine.circuit.name, 1) is None, case  # not opened
        assert engine.last_committed_epoch() == 0, case
    good = write(tmp_path / "fixed.parquet", "parquet", GOOD_ORDERS, ORDER_TYPES)
    engine.run_epoch(1, {"orders": FileBatch(good, "parquet")})
    assert engine.last_committed_epoch() == 1
    assert views(engine) == expected[1]


@pytest.mark.slow
@pytest.mark.parametrize("tier", sorted(TIERS))
def test_upsert_problems_in_files_name_the_files(
    spark, tmp_path: Path, warehouse_path: Path, tier: str
) -> None:
    engine, _, expected = orders_engine(spark, warehouse_path, tier)
    # Parquet files with a NULL key, and with a tie, name their files on either tier.
    p_null = write(
        tmp_path / "null.parquet", "parquet", [{**GOOD_ORDERS[0], "order_id": None}], ORDER_TYPES
    )
    with pytest.raises(BadUpsertRow, match="NULL in a key column") as caught:
        engine.run_epoch(1, {"orders": FileBatch(p_null, "parquet")})
    assert str(p_null) in str(caught.value)
    p_tie = write(
        tmp_path / "tie.parquet", "parquet", [{**GOOD_ORDERS[2], "amount": 61}], ORDER_TYPES
    )
    p_fine = write(tmp_path / "fine.parquet", "parquet", GOOD_ORDERS, ORDER_TYPES)
    p_other = write(tmp_path / "other.parquet", "parquet", [GOOD_ORDERS[0]], ORDER_TYPES)
    with pytest.raises(UpsertConflict, match="same watermark in one batch") as caught:
        engine.run_epoch(1, {"orders": FileBatch([p_tie, p_other, p_fine], "parquet")})
    assert f"{p_tie}, {p_fine}" in str(caught.value) and str(p_other) not in str(caught.value)
    a = write(tmp_path / "a.parquet", "parquet", GOOD_ORDERS[:2], ORDER_TYPES)
    null_key = write(
        tmp_path / "b.jsonl", "jsonl", [{"cust_id": 7, "amount": 6, "ts": 300}], ORDER_TYPES
    )
    with pytest.raises(BadUpsertRow, match="NULL in a key column") as caught:
        engine.run_epoch(1, {"orders": FileBatch(null_key, "jsonl")})
    assert str(null_key) in str(caught.value)
    assert "(line 1 of the file)" in str(caught.value)  # on either tier (issue 18)
    # Two files with different rows for order 3 at one watermark: both files are named.
    c = write(tmp_path / "c.csv", "csv", [GOOD_ORDERS[2]], ORDER_TYPES)
    d = write(tmp_path / "d.csv", "csv", [{**GOOD_ORDERS[2], "amount": 60}], ORDER_TYPES)
    e = write(tmp_path / "e.csv", "csv", [GOOD_ORDERS[0]], ORDER_TYPES)
    with pytest.raises(UpsertConflict, match="same watermark in one batch") as caught:
        engine.run_epoch(1, {"orders": FileBatch([c, e, d], "csv")})
    assert f"{c}, {d}" in str(caught.value) and str(e) not in str(caught.value)
    assert f"(line 2 of {c}; line 2 of {d})" in str(caught.value)
    assert engine.catalog.stage_runs(engine.circuit.name, epoch=1) == []
    # A conflict with the stored version (order 1 stored at ts 200 with amount 9) is found
    # at ingest and names the file that holds it.
    fine = write(tmp_path / "c.jsonl", "jsonl", [GOOD_ORDERS[2]], ORDER_TYPES)
    clash = write(
        tmp_path / "f.jsonl",
        "jsonl",
        [{"order_id": 1, "cust_id": 7, "amount": 8, "ts": 200}],
        ORDER_TYPES,
    )
    with pytest.raises(UpsertConflict, match="order_id=1") as caught:
        engine.run_epoch(1, {"orders": FileBatch([fine, clash], "jsonl")})
    assert engine.last_committed_epoch() == 0
    orders_ingest = engine.plan.stage_of(engine.circuit.sources["orders"]).name
    assert orders_ingest not in [
        s for s, _ in engine.catalog.stage_runs(engine.circuit.name, epoch=1)
    ]
    assert str(clash) in str(caught.value) and str(fine) not in str(caught.value)
    fixed = write(tmp_path / "g.parquet", "parquet", GOOD_ORDERS[2:], ORDER_TYPES)
    engine.run_epoch(1, {"orders": FileBatch([a, fixed], "parquet")})
    assert engine.last_committed_epoch() == 1
    assert views(engine) == expected[1]


@pytest.mark.slow
def test_dataframe_batches_get_the_schema_check(spark, warehouse_path: Path) -> None:
    from dbspark.engine.spark.executor import SparkEngine

    vector, expected = load("join_bilinear.json")
    engine = SparkEngine(vector.circuit, warehouse_path, spark=spark)
    right = spark.createDataFrame([(1, "p")], "k int, b string")  # INT widens to BIGINT
    with pytest.raises(InputError, match=r"source 'left'.*unknown column\(s\) \['extra'\]"):
        engine.run_epoch(
            0, {"left": spark.createDataFrame([(1, "x", 1)], "k long, a string, extra int")}
        )
    with pytest.raises(InputError, match=r"source 'left'.*missing column\(s\) \['a'\]"):
        engine.run_epoch(0, {"left": spark.createDataFrame([(1,)], "k long")})
    with pytest.raises(InputError, match=r"source 'left'.*column 'k' is BIGINT, got STRING"):
        engine.run_epoch(0, {"left": spark.createDataFrame([("1", "x")], "k string, a string")})
    with pytest.raises(InputError, match=r"column '__w' is BIGINT, got DOUBLE"):
        engine.run_epoch(
            0, {"left": spark.createDataFrame([(1, "x", 1.0)], "k long, a string, __w double")}
        )
    assert engine.catalog.stage_runs(engine.circuit.name) == []
    # Columns in another order, a weight column, INT keys: accepted.
    left = spark.createDataFrame([("x", 1, 1), ("y", 2, 2)], "a string, k int, __w long")
    engine.run_epoch(0, {"left": left, "right": right})
    assert views(engine) == expected[0]
