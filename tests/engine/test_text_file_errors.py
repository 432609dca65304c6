"""Bad input in CSV and JSON-lines files is refused naming the file and the line.

Issue 18's hypothesis corpus (``tests/orchestration/test_bad_input_corpus.py``) found three
gaps, closed here: a NULL key (and a tie) in a text file was reported without its line; a
CSV header naming a column twice was reported as missing and unknown columns (Spark renames
the repeats); and a text file Spark reads from another file system (no local UTF-8 check)
loaded bytes that are not UTF-8 as U+FFFD. Spark's text readers give no line numbers, so
the line is found again only when the error is raised.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from vectors import VECTOR_DIR

from dbspark.conformance.vector import parse_vector
from dbspark.core.upsert import BadUpsertRow, UpsertConflict, UpsertSpec
from dbspark.engine import file_batches
from dbspark.engine.api import InputError
from dbspark.engine.file_batches import FileBatch

#: ``local_rows`` per tier: the local tier reads small JSON-lines files in this process
#: (CSV always goes to Spark); ``spark`` reads everything with Spark.
TIERS = {"local": 200_000, "spark": 0}
ORDERS = "order_id,cust_id,amount,ts,deleted_at"


def engine_for(spark: Any, warehouse: Path, vector: str, tier: str = "spark") -> Any:
    from dbspark.engine.spark.executor import SparkEngine

    parsed = parse_vector((VECTOR_DIR / vector).read_text())
    return SparkEngine(parsed.circuit, warehouse, spark=spark, local_rows=TIERS[tier]), parsed


def orders_engine(spark: Any, warehouse: Path, tier: str) -> Any:
    engine, vector = engine_for(spark, warehouse, "watermarks_and_tombstones.json", tier)
    engine.run_epoch(0, vector.epochs[0])
    return engine


def order(order_id: int | None, amount: int, ts: int) -> dict[str, Any]:
    return {"order_id": order_id, "cust_id": 7, "amount": amount, "ts": ts, "deleted_at": None}


def jsonl(path: Path, *lines: dict[str, Any] | str) -> Path:
    """JSON lines: a dict is a row, a string is written as it is (a blank line)."""
    text = "".join((ln if isinstance(ln, str) else json.dumps(ln)) + "\n" for ln in lines)
    path.write_text(text)
    return path


def csv_orders(path: Path, *lines: dict[str, Any] | str) -> Path:
    """Orders as CSV under a header line: a dict is a row, a string a raw line."""

    def row(r: dict[str, Any]) -> str:
        return ",".join("" if r[c] is None else str(r[c]) for c in ORDERS.split(","))

    path.write_text(
        ORDERS + "\n" + "".join((ln if isinstance(ln, str) else row(ln)) + "\n" for ln in lines)
    )
    return path


def refused(
    engine: Any, batch: dict[str, FileBatch], error: type = InputError, at_ingest: bool = False
) -> str:
    """The message of the error ``batch`` is refused with; nothing of it ran (or, for an
    error found at ingest, against the state, the refused ingest did not run)."""
    last = engine.last_committed_epoch()
    epoch = last + 1
    with pytest.raises(error) as caught:
        engine.run_epoch(epoch, batch)
    message = str(caught.value)
    assert "Traceback" not in message and "\tat org.apache" not in message
    runs = engine.catalog.stage_runs(engine.circuit.name, epoch=epoch)
    if at_ingest:
        ingests = {engine.plan.stage_of(engine.circuit.sources[s]).name for s in batch}
        assert not ingests & {stage for stage, _ in runs}, runs
    else:
        assert runs == []
    assert engine.last_committed_epoch() == last
    return message


# --- no Spark ------------------------------------------------------------------------------
def test_where_rows_are_worded() -> None:
    located = file_batches.located
    assert located({"a": [3]}, "line", ["a"]) == " (line 3 of the file)"
    assert located({"a": [5, 2, 2]}, "row", ["a"]) == " (rows 2, 5 of the file)"
    assert located({"a": [2], "b": [4, 9]}, "line", ["a", "b"]) == " (line 2 of a; lines 4, 9 of b)"
    assert located({"a": range(1, 9)}, "line", ["a"]) == " (lines 1, 2, 3, 4, 5, ... of the file)"
    assert located({"a": []}, "line", ["a"]) == ""


def test_a_jsonl_row_is_found_at_its_line(tmp_path: Path) -> None:
    # Rows are the non-blank lines; lines end at \n, \r\n or \r, as Spark splits them.
    path = tmp_path / "x.jsonl"
    path.write_bytes(b'{"a": 1}\r\n  \n{"a": 2}\r{"a": 3}\n\n{"a": 4}\n')
    assert file_batches.jsonl_row_lines(str(path), [0, 1, 2, 3]) == {0: 1, 1: 3, 2: 4, 3: 6}
    assert file_batches.jsonl_row_lines(f"file://{path}", [3]) == {3: 6}
    assert file_batches.jsonl_row_lines(str(path), [9]) == {}


def test_a_tie_is_found_among_rows() -> None:
    spec = UpsertSpec("s", ("k", "v", "ts"), ("bigint",) * 3, key=("k",), watermark=("ts",))
    rows = [(1, 1, 5), (2, 1, 5), (1, 2, 5), (1, 2, 6), (2, 1, 5), (1, 1, 5)]
    # Key 1 at ts 5 has two different rows (three rows in all); key 2's are the same row.
    assert file_batches.tied_rows(spec, rows, [(1,), (2,)]) == [0, 2, 5]
    assert file_batches.tied_rows(spec, rows, [(2,)]) == []


def test_a_repeated_or_nameless_header_field_is_refused() -> None:
    check = file_batches.check_header_fields
    with pytest.raises(
        InputError, match=r"file h\.csv: the column 'id' is repeated in the header \(fields 1, 3\)"
    ):
        check("s", ["id", "name", "id"], "h.csv", case_sensitive=False)
    with pytest.raises(
        InputError,
        match=r"the column 'id' is repeated in the header \(fields 1, 3, as 'ID' and 'id': "
        r"column names ignore case\)",
    ):
        check("s", ["id", "name", "ID"], "h.csv", case_sensitive=False)
    check("s", ["id", "name", "ID"], "h.csv", case_sensitive=True)  # two columns then
    with pytest.raises(InputError, match=r"field 2 of the header has no column name"):
        check("s", ["id", None, "name"], "h.csv", case_sensitive=False)
    check("s", ["id0", "name", "id2"], "h.csv", case_sensitive=False)  # named so: fine
    # Spark renames a repeat as name + its index: only then is the header line read.
    assert file_batches.renamed_by_reader(["id0", "name", "id2"])
    assert file_batches.renamed_by_reader(["id", "_c1"])
    assert file_batches.renamed_by_reader(["ID0", "name", "id2"])
    assert not file_batches.renamed_by_reader(["id", "name1", "ts"])
    assert not file_batches.renamed_by_reader(["id0", "name", "ts"])


# --- the engine ----------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("tier", sorted(TIERS))
def test_a_null_key_in_a_text_file_names_its_line(
    spark, tmp_path: Path, warehouse_path: Path, tier: str
) -> None:
    """Parquet names the row; CSV and JSON lines now name the line (1-based, a CSV file's
    header being line 1; blank lines count), on the tier that reads the file."""
    engine = orders_engine(spark, warehouse_path, tier)
    good = jsonl(tmp_path / "good.jsonl", order(2, 3, 150))
    bad = jsonl(
        tmp_path / "bad.jsonl", order(1, 1, 150), "", "  ", order(None, 6, 300), order(None, 8, 400)
    )
    message = refused(engine, {"orders": FileBatch([good, bad], "jsonl")}, BadUpsertRow)
    assert f"(file '{bad}')" in message, message
    assert "NULL in a key column (line 4 of the file): [None, 7, 6, 300, None]" in message, message
    csv_bad = csv_orders(tmp_path / "bad.csv", order(1, 1, 150), "", order(None, 6, 300))
    message = refused(engine, {"orders": FileBatch(csv_bad, "csv")}, BadUpsertRow)
    assert f"(file '{csv_bad}')" in message, message
    assert "NULL in a key column (line 4 of the file): [None, 7, 6, 300, None]" in message, message
    # Both files hold one: each is named, and the line says which file it is in.
    other = csv_orders(tmp_path / "other.csv", order(None, 9, 100))
    message = refused(engine, {"orders": FileBatch([other, csv_bad], "csv")}, BadUpsertRow)
    assert f"(file '{csv_bad}, {other}')" in message or f"(file '{other}, {csv_bad}')" in message
    assert (
        f"(line 2 of {other}): [None, 7, 9, 100, None]" in message
        or f"(line 4 of {csv_bad}): [None, 7, 6, 300, None]" in message
    ), message


@pytest.mark.slow
@pytest.mark.parametrize("tier", sorted(TIERS))
def test_ties_in_files_name_their_lines_or_rows(
    spark, tmp_path: Path, warehouse_path: Path, tier: str
) -> None:
    engine = orders_engine(spark, warehouse_path, tier)
    one = jsonl(
        tmp_path / "one.jsonl",
        order(3, 6, 300),
        "",
        order(4, 1, 300),
        order(3, 60, 300),
        order(3, 6, 250),
    )
    message = refused(engine, {"orders": FileBatch(one, "jsonl")}, UpsertConflict)
    assert "same watermark in one batch" in message and "order_id=3" in message, message
    assert "(lines 1, 4 of the file)" in message, message
    c = csv_orders(tmp_path / "c.csv", order(1, 1, 150), order(3, 6, 300))
    d = csv_orders(tmp_path / "d.csv", "", order(3, 60, 300))
    e = csv_orders(tmp_path / "e.csv", order(2, 3, 150))
    message = refused(engine, {"orders": FileBatch([c, e, d], "csv")}, UpsertConflict)
    assert f"(file '{c}, {d}')" in message, message
    assert f"(line 3 of {c}; line 3 of {d})" in message, message
    import pyarrow as pa
    import pyarrow.parquet as pq

    p = tmp_path / "p.parquet"
    rows = [order(1, 1, 150), order(3, 6, 300), order(2, 3, 150), order(3, 61, 300)]
    pq.write_table(pa.table({k: pa.array([r[k] for r in rows], pa.int64()) for k in rows[0]}), p)
    message = refused(engine, {"orders": FileBatch(p, "parquet")}, UpsertConflict)
    assert "(rows 1, 3 of the file)" in message, message


@pytest.mark.slow
def test_lines_are_counted_across_a_file_split_in_blocks(
    spark, tmp_path: Path, warehouse_path: Path
) -> None:
    """Spark reads a large text file as several blocks; the line of a row counts the
    lines of the blocks before it."""
    engine = orders_engine(spark, warehouse_path, "spark")
    rows: list[dict[str, Any] | str] = [order(10 + i, i, 150) for i in range(400)]
    rows[301] = order(None, 5, 150)
    rows[17] = ""
    path = csv_orders(tmp_path / "big.csv", *rows)
    before = spark.conf.get("spark.sql.files.maxPartitionBytes")
    spark.conf.set("spark.sql.files.maxPartitionBytes", "1024")  # about 8 blocks
    try:
        assert spark.read.text(str(path)).rdd.getNumPartitions() > 4
        message = refused(engine, {"orders": FileBatch(path, "csv")}, BadUpsertRow)
        rows[250] = "1,2"  # a short line: found by its text, the same way
        short = csv_orders(tmp_path / "short.csv", *rows)
        short_message = refused(engine, {"orders": FileBatch(short, "csv")})
    finally:
        spark.conf.set("spark.sql.files.maxPartitionBytes", before)
    assert "NULL in a key column (line 303 of the file): [None, 7, 5, 150, None]" in message, (
        message
    )
    assert "line 252: 2 fields, the header has 5" in short_message, short_message


@pytest.mark.slow
def test_a_csv_header_that_repeats_a_column_is_refused_as_such(
    spark, tmp_path: Path, warehouse_path: Path
) -> None:
    engine = orders_engine(spark, warehouse_path, "spark")
    cases = {
        "order_id,cust_id,amount,ts,deleted_at,amount\n1,7,1,150,,1\n": (
            r"the column 'amount' is repeated in the header \(fields 3, 6\); "
            r"a column may appear once"
        ),
        "order_id,cust_id,amount,ts,Amount,deleted_at\n1,7,1,150,1,\n": (
            r"the column 'amount' is repeated in the header \(fields 3, 5, as 'Amount' and "
            r"'amount': column names ignore case\)"
        ),
        "order_id,cust_id,amount,ts,,deleted_at\n1,7,1,150,,\n": (
            r"field 5 of the header has no column name"
        ),
    }
    for number, (text, pattern) in enumerate(cases.items()):
        path = tmp_path / f"h{number}.csv"
        path.write_text(text)
        message = refused(engine, {"orders": FileBatch(path, "csv")})
        assert f"source 'orders', file {path}: " in message, message
        assert re.search(pattern, message), message
        assert "missing column" not in message and "unknown column" not in message, message


@pytest.fixture
def elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every path as one on another file system (``s3a://``): no local UTF-8 check, and
    Spark reads the file (the local files are what it finds there)."""
    monkeypatch.setattr(file_batches, "local_path", lambda path: None)


def latin1(path: Path, text: str) -> Path:
    path.write_bytes(text.encode("latin-1"))
    return path


@pytest.mark.slow
def test_text_spark_reads_unchecked_is_refused_where_not_utf8(
    spark, tmp_path: Path, warehouse_path: Path, elsewhere: None
) -> None:
    """Spark reads bytes that are not UTF-8 without a word (its CSV reader as U+FFFD, its
    text reader as they are); in a file it reads unchecked they are refused by the check
    of every row that already runs, and the file read again to name the line and the
    byte, as the local check words it."""
    engine, _ = engine_for(spark, warehouse_path, "join_bilinear.json")
    right = latin1(tmp_path / "right.csv", "k,b\n1,p\n")
    cases = {
        "bad_string.csv": (
            "k,a\n1,x\n\n2,Z\xfcrich\n",
            r"line 4: byte 4 of the line is not UTF-8 \(0xfc\)",
        ),
        "bad_number.csv": ("k,a\n1\xe9,x\n", r"line 2: byte 2 of the line is not UTF-8 \(0xe9\)"),
        "bad_header.csv": ("k,\xe0\n1,x\n", r"line 1: byte 3 of the line is not UTF-8 \(0xe0\)"),
        "bad.jsonl": (
            '{"k": 1, "a": "x"}\n{"k": 2, "a": "Z\xfcrich"}\n',
            r"line 2: byte 17 of the line is not UTF-8 \(0xfc\); text files must be UTF-8$",
        ),
    }
    for name, (text, pattern) in cases.items():
        path = latin1(tmp_path / name, text)
        fmt = "csv" if name.endswith(".csv") else "jsonl"
        message = refused(engine, {"left": FileBatch(path, fmt), "right": FileBatch(right, "csv")})
        assert f"source 'left', file {path}: " in message, message
        assert re.search(pattern, message), message
    # UTF-8 that holds U+FFFD itself: the CSV reader's text cannot tell it from bytes it
    # replaced, so it is refused there; JSON lines are read as bytes, and it is text.
    literal = tmp_path / "literal.csv"
    literal.write_text("k,a\n1,x\n2,\ufffd\n", encoding="utf-8")
    message = refused(engine, {"left": FileBatch(literal, "csv"), "right": FileBatch(right, "csv")})
    assert "line 3: the line holds U+FFFD, which Spark's CSV reader also makes of" in message
    left = tmp_path / "left.jsonl"
    left.write_text('{"k": 1, "a": "x\ufffd"}\n', encoding="utf-8")
    engine.run_epoch(0, {"left": FileBatch(left, "jsonl"), "right": FileBatch(right, "csv")})
    assert engine.last_committed_epoch() == 0
    assert dict(engine.views()["joined"].items()) == {(1, "x\ufffd", "p"): 1}
    good = latin1(tmp_path / "good.csv", "k,a\n1,y\n")
    engine.run_epoch(1, {"left": FileBatch(good, "csv"), "right": FileBatch(right, "csv")})
    assert engine.last_committed_epoch() == 1


@pytest.mark.slow
def test_u_fffd_in_a_local_utf8_file_is_text(spark, tmp_path: Path, warehouse_path: Path) -> None:
    """A local file is checked byte by byte before Spark reads it: U+FFFD written as
    UTF-8 is a character like any other there."""
    engine, _ = engine_for(spark, warehouse_path, "join_bilinear.json")
    left = tmp_path / "left.csv"
    left.write_text("k,a\n1,\ufffd\n", encoding="utf-8")
    right = tmp_path / "right.csv"
    right.write_text("k,b\n1,p\n")
    engine.run_epoch(0, {"left": FileBatch(left, "csv"), "right": FileBatch(right, "csv")})
    assert engine.last_committed_epoch() == 0


@pytest.mark.slow
def test_a_null_weight_in_a_csv_file_names_its_line(
    spark, tmp_path: Path, warehouse_path: Path
) -> None:
    engine, _ = engine_for(spark, warehouse_path, "join_bilinear.json")
    left = tmp_path / "left.csv"
    left.write_text("k,a,__w\n1,x,1\n\n2,y,\n")
    right = tmp_path / "right.csv"
    right.write_text("k,b\n1,p\n")
    message = refused(engine, {"left": FileBatch(left, "csv"), "right": FileBatch(right, "csv")})
    assert f"source 'left', file {left}: line 4: the weight '__w' is NULL" in message, message


@pytest.mark.slow
@pytest.mark.parametrize("tier", sorted(TIERS))
def test_a_tie_with_the_stored_version_names_where_its_key_is(
    spark, tmp_path: Path, warehouse_path: Path, tier: str
) -> None:
    """Found at ingest, against the state (order 1 is stored at ts 200 with amount 9)."""
    engine = orders_engine(spark, warehouse_path, tier)
    clash = order(1, 8, 200)
    cases = {
        "clash.jsonl": (jsonl(tmp_path / "clash.jsonl", order(3, 6, 300), "", clash), "line 3"),
        "clash.csv": (csv_orders(tmp_path / "clash.csv", order(3, 6, 300), clash), "line 3"),
    }
    for name, (path, where) in cases.items():
        fmt = name.rsplit(".", 1)[1]
        message = refused(engine, {"orders": FileBatch(path, fmt)}, UpsertConflict, True)
        assert "same watermark as the stored version" in message, message
        assert f"(the offending keys are on {where} of the file)" in message, message
        assert f"(file '{path}')" in message, message
    fine = jsonl(tmp_path / "fine.jsonl", order(3, 6, 300))
    other = jsonl(tmp_path / "other.jsonl", order(4, 1, 300), clash)
    message = refused(engine, {"orders": FileBatch([fine, other], "jsonl")}, UpsertConflict, True)
    assert f"(file '{other}')" in message and "on line 2 of the file)" in message, message
