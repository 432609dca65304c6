"""The bad-input corpus of issue 18, generated: random valid upsert histories of the
``orders`` example, landed as real files (Parquet, JSON lines, CSV) in a landing
directory, with bad batches at random epochs.

A bad batch is one of the malformed kinds the issue lists: truncated and corrupt Parquet,
wrong delimiters, text that is not UTF-8 (in a text file, or in a Parquet STRING column),
0-byte files, huge strings, NULL keys, two different rows of one key at one watermark
(within the batch, or against the stored version), and schema drift (a column missing,
extra, renamed or of another type). Each is refused with an ``InputError`` whose message
names the source, the file, and the line, row or key where there is one; nothing of it is
committed (the epoch stays uncommitted, the refused ingest registers no batch, no view
changes, no file is left in the warehouse); then the writer replaces the partition's files
with the good batch, the same epoch runs again (as an Airflow user clears the failed
task), and every view equals the reference engine's full refresh of the good history.

What the upsert rule accepts is not bad input and is part of the good histories: a resend
of a row already received (an exact duplicate, in one batch or across epochs), several
rows of one key with different watermarks in one batch (the freshest wins), rows older
than the stored version (ignored), NULL watermarks and NULL non-key columns, tombstones
and keys coming back after one, valid non-ASCII text and long strings. Files are written
here with pyarrow, ``csv`` and ``json`` (good batches through ``LandingDirectory.land``).

Epochs run two ways: ``SparkEngine.run_epoch`` (every batch checked before the epoch
opens) and unit by unit as the DAG's tasks do (open, one ingest per source, the stages,
publish, close), where a refused ingest leaves the epoch open and a re-run skips the
units that committed. Parquet and JSON-lines batches this small run on the local tier
(no JVM); CSV is always Spark's to read, so its test runs fewer examples.
"""

from __future__ import annotations

import csv
import io
import json
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st

from dbspark.core.upsert import BadUpsertRow, UpsertConflict
from dbspark.engine.api import InputError
from dbspark.engine.reference.full_refresh import full_refresh
from dbspark.examples.circuits import orders
from dbspark.orchestration.intervals import Interval
from dbspark.orchestration.sources import LandingDirectory
from dbspark.orchestration.sources.landing import COMPLETION_MARKER

COLUMNS = {
    "customers": ("cust_id", "region", "ts", "deleted"),
    "orders": ("order_id", "cust_id", "amount", "ts", "deleted_at"),
}
TYPES = {
    "customers": {
        "cust_id": pa.int64(),
        "region": pa.string(),
        "ts": pa.int64(),
        "deleted": pa.bool_(),
    },
    "orders": {
        "order_id": pa.int64(),
        "cust_id": pa.int64(),
        "amount": pa.int64(),
        "ts": pa.int64(),
        "deleted_at": pa.int64(),
    },
}
KEY = {"customers": "cust_id", "orders": "order_id"}
SOURCES = tuple(COLUMNS)
HUGE = 200_000  # characters of a huge string in a bad row
START = datetime(2026, 1, 1, tzinfo=UTC)

CORPUS = settings(
    deadline=None,
    # No shrinking: a failure prints its draws, and shrinking examples that each run an
    # engine for several epochs took minutes.
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    derandomize=True,
    database=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.function_scoped_fixture,
        HealthCheck.data_too_large,
    ],
)


def day(epoch: int) -> Interval:
    return Interval(START + timedelta(days=epoch), START + timedelta(days=epoch + 1))


# ==================================================================================== writing
def parquet_bytes(
    source: str, rows: list[tuple], types: dict[str, pa.DataType] | None = None
) -> bytes:
    types = types or TYPES[source]
    names = list(types)
    columns = {n: pa.array([r[i] for r in rows], types[n]) for i, n in enumerate(names)}
    out = io.BytesIO()
    pq.write_table(pa.table(columns), out)
    return out.getvalue()


def csv_text(names: list[str], rows: list[tuple], delimiter: str = ",") -> str:
    def field_(value: Any) -> str:
        if isinstance(value, bool):
            return "true" if value else "false"
        return "" if value is None else str(value)

    out = io.StringIO()
    writer = csv.writer(out, delimiter=delimiter, lineterminator="\n")
    writer.writerow(names)
    writer.writerows([field_(v) for v in row] for row in rows)
    return out.getvalue()


def jsonl_lines(names: list[str], rows: list[tuple]) -> list[str]:
    return [json.dumps(dict(zip(names, row, strict=True)), ensure_ascii=False) for row in rows]


def file_bytes(source: str, fmt: str, rows: list[tuple]) -> bytes:
    names = list(COLUMNS[source])
    if fmt == "parquet":
        return parquet_bytes(source, rows)
    if fmt == "csv":
        return csv_text(names, rows).encode()
    return "".join(line + "\n" for line in jsonl_lines(names, rows)).encode()


EXTENSION = {"parquet": ".parquet", "csv": ".csv", "jsonl": ".jsonl"}


# ==================================================================================== histories
def rows_of(source: str) -> Callable[[int, int], st.SearchStrategy[tuple]]:
    if source == "customers":
        regions = st.sampled_from(["north", "south", "zürich", "東京", None]) | st.just(
            "r" * 2_000  # a long, valid string: taken as any other
        )
        return lambda key, ts: st.tuples(
            st.just(key), regions, st.just(ts), st.booleans() | st.none()
        )
    return lambda key, ts: st.tuples(
        st.just(key),
        st.integers(1, 4) | st.none(),
        st.integers(-5, 100),
        st.just(ts),
        st.none() | st.none() | st.integers(0, 9),  # a non-NULL deleted_at is a tombstone
    )


@st.composite
def histories(draw: Any, formats: tuple[str, ...]) -> list[dict[str, Any]]:
    """Epochs of good batches: per source its rows, its format, how many files and
    whether a completion marker is left. Each (key, watermark) has one row, so a row
    drawn again for it is that row (an exact resend, a no-op); watermarks are drawn in
    any order, so some rows are older than the stored version."""
    seen: dict[tuple[str, int, int | None], tuple] = {}
    epochs = []
    for _ in range(draw(st.integers(2, 4))):
        epoch = {}
        for source in SOURCES:
            rows = []
            for _ in range(draw(st.integers(0, 4))):
                key = draw(st.integers(1, 4)) + (10 if source == "orders" else 0)
                ts = draw(st.integers(0, 12) | st.none())
                if (source, key, ts) not in seen:
                    seen[(source, key, ts)] = draw(rows_of(source)(key, ts))
                rows.append(seen[(source, key, ts)])
            epoch[source] = SimpleNamespace(
                rows=rows,
                format=draw(st.sampled_from(formats)),
                files=draw(st.integers(1, 2)),
                marker=draw(st.booleans()),
            )
        epochs.append(epoch)
    return epochs


def land_good(landing: LandingDirectory, source: str, interval: Interval, good: Any) -> None:
    """Land a good batch as its writer would (``land``, atomically), in one or two files,
    with or without a completion marker; an empty batch is a marker and nothing else."""
    if good.rows:
        parts = [good.rows[i :: good.files] for i in range(good.files)]
        for index, part in enumerate(p for p in parts if p):
            name = f"part-{index}"
            landing.land(source, interval, part, COLUMNS[source], good.format, name=name)
    if good.marker or not good.rows:
        landing.complete(source, interval)


def clear(landing: LandingDirectory, source: str, interval: Interval) -> None:
    shutil.rmtree(landing.partition(source, interval), ignore_errors=True)


def winners(history: list[dict[str, Any]], source: str) -> dict[int, tuple]:
    """The stored version of each key after ``history`` (the upsert rule: the greatest
    watermark wins, NULL below every value)."""
    best: dict[int, tuple] = {}
    for epoch in history:
        for row in epoch[source].rows:
            held = best.get(row[0])
            if held is None or (row[-2 if source == "customers" else 3] or -1) > (
                (held[-2 if source == "customers" else 3]) or -1
            ):
                best[row[0]] = row
    return best


# ==================================================================================== bad batches
@dataclass
class Bad:
    """A bad batch as landed: the file the error must name (``named``), patterns the
    message must match, and whether it is refused before the epoch opens."""

    kind: str
    named: Path
    patterns: list[str]
    error: type[InputError] = InputError
    before_open: bool = True
    by_name: bool = False  # the message names the file by name and its directory
    extra: list[Path] = field(default_factory=list)


def write(directory: Path, name: str, data: bytes) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_bytes(data)
    return path.resolve()


def at_least_one(draw: Any, source: str, rows: list[tuple]) -> list[tuple]:
    if rows:
        return list(rows)
    return [draw(rows_of(source)(1 if source == "customers" else 11, 1))]


KINDS = (
    "truncated_parquet",
    "corrupt_parquet",
    "zero_byte",
    "wrong_delimiter",
    "not_utf8",
    "huge_string",
    "null_key",
    "tie_in_batch",
    "tie_with_stored",
    "schema_drift",
)


def make_bad(
    draw: Any,
    directory: Path,
    source: str,
    rows: list[tuple],
    formats: tuple[str, ...],
    stored: dict[int, tuple],
) -> Bad:
    """Write a bad batch of ``source`` (in place of the good ``rows``) into ``directory``."""
    kind = draw(st.sampled_from(KINDS))
    fmt = draw(st.sampled_from(formats))
    names = list(COLUMNS[source])
    key = KEY[source]
    if kind in ("truncated_parquet", "corrupt_parquet"):
        fmt = "parquet"
    ext = EXTENSION[fmt]
    # File-level kinds may sit beside a good file of the same batch.
    extra = []
    file_level = ("truncated_parquet", "corrupt_parquet", "zero_byte", "schema_drift")
    if kind in file_level and rows and draw(st.booleans()):
        extra.append(write(directory, f"a-good{ext}", file_bytes(source, fmt, rows)))

    if kind == "truncated_parquet":
        data = parquet_bytes(source, at_least_one(draw, source, rows))
        cut = draw(st.integers(0, len(data) - 1))
        path = write(directory, "b-bad.parquet", data[:cut])
        return Bad(kind, path, [r"cannot be read: \["], extra=extra)

    if kind == "corrupt_parquet":
        data = parquet_bytes(source, at_least_one(draw, source, rows))
        footer = int.from_bytes(data[-8:-4], "little")
        how = draw(
            st.sampled_from(
                ["magic", "length_zero", "length_past", "footer_ff", "footer_00", "noise"]
            )
        )
        if how == "magic":
            data = data[:-4] + b"PARX"
        elif how == "length_zero":
            data = data[:-8] + (0).to_bytes(4, "little") + b"PAR1"
        elif how == "length_past":
            data = data[:-8] + (len(data) * 2).to_bytes(4, "little") + b"PAR1"
        elif how in ("footer_ff", "footer_00"):
            fill = b"\xff" if how == "footer_ff" else b"\x00"
            data = data[: len(data) - 8 - footer] + fill * footer + data[-8:]
        else:
            data = draw(st.binary(min_size=1, max_size=64)) + b"PAR0"
        path = write(directory, "b-bad.parquet", data)
        return Bad(f"{kind}:{how}", path, [r"cannot be read: "], extra=extra)

    if kind == "zero_byte":
        path = write(directory, f"b-bad{ext}", b"")
        if fmt == "parquet":
            return Bad(kind, path, [r"cannot be read: "], extra=extra)
        if fmt == "csv" and not draw(st.booleans()):
            return Bad(kind, path, [r"the CSV file has no header line"], extra=extra)
        # An empty JSON-lines file has no rows, which is not wrong in itself (nor is a CSV
        # file with no line, as far as the marker's count goes): the writer's completion
        # marker says what should have arrived.
        claimed = draw(st.integers(1, 3))
        counts = {p.name: len(rows) for p in extra}
        counts[path.name] = claimed
        (directory / COMPLETION_MARKER).write_text(json.dumps({"files": counts}))
        return Bad(
            kind,
            path,
            [re.escape(f"{path.name} has 0 rows, the marker says {claimed}")],
            by_name=True,
            extra=extra,
        )

    if kind == "wrong_delimiter":
        body = at_least_one(draw, source, rows)
        if "csv" in formats and draw(st.booleans()):
            delimiter = draw(st.sampled_from([";", "\t", "|"]))
            if draw(st.booleans()):  # everything in another delimiter: one column
                text = csv_text(names, body, delimiter)
                pattern = r"the header has missing column\(s\)"
            else:  # a comma header, lines in another delimiter
                text = csv_text(names, [], ",") + csv_text(names, body, delimiter).split("\n", 1)[1]
                pattern = rf"line 2: 1 fields, the header has {len(names)}"
            path = write(directory, "b-bad.csv", text.encode())
            return Bad(kind, path, [pattern])
        lines = jsonl_lines(names, body)
        joined = draw(st.sampled_from([" ", ", ", "\t"])).join(lines) + (
            "," if len(lines) == 1 else ""
        )
        path = write(directory, "b-bad.jsonl", (joined + "\n").encode())
        return Bad(kind, path, [r"line 1: not valid JSON"])

    if kind == "not_utf8":
        body = at_least_one(draw, source, rows)
        i = draw(st.integers(0, len(body) - 1))
        if source == "customers":  # a Latin-1 "ü" in the region of row i
            body[i] = (body[i][0], "Zürich", *body[i][2:])
        if fmt == "parquet" and source == "customers":
            path = write(directory, "b-bad.parquet", latin1_region_parquet(body, i))
            return Bad(
                kind,
                path,
                [rf"row {i} of the file: column 'region' holds bytes that are not UTF-8"],
            )
        fmt = "jsonl" if fmt == "parquet" else fmt  # the orders have no text: a stray byte
        lines = csv_text(names, body).splitlines() if fmt == "csv" else jsonl_lines(names, body)
        at = i + (1 if fmt == "csv" else 0)
        encoded = [line.encode() for line in lines]
        if source == "customers":
            encoded[at] = lines[at].encode("latin-1")
            byte, value = lines[at].index("ü") + 1, "0xfc"
        else:
            encoded[at] += b"\xa0"
            byte, value = len(lines[at]) + 1, "0xa0"
        path = write(directory, f"b-bad{EXTENSION[fmt]}", b"".join(e + b"\n" for e in encoded))
        return Bad(
            kind, path, [rf"line {at + 1}: byte {byte} of the line is not UTF-8 \({value}\)"]
        )

    if kind == "huge_string":
        body = at_least_one(draw, source, rows)
        i = draw(st.integers(0, len(body) - 1))
        digits = "9" * HUGE
        ts_at = names.index("ts")
        if source == "customers" and draw(st.booleans()):  # a huge text in a row with a NULL key
            body[i] = (None, "x" * HUGE, *body[i][2:])
            return null_key_bad(directory, source, fmt, body, i, kind)
        if fmt == "parquet":
            types = {**TYPES[source], "ts": pa.string()}
            body[i] = tuple(digits if n == ts_at else v for n, v in enumerate(body[i]))
            body = [
                tuple(str(v) if n == ts_at and v is not None else v for n, v in enumerate(r))
                for r in body
            ]
            path = write(directory, "b-bad.parquet", parquet_bytes(source, body, types))
            return Bad(kind, path, [r"the file: column 'ts' is BIGINT, got STRING"])
        body[i] = tuple(digits if n == ts_at else v for n, v in enumerate(body[i]))
        path = write(directory, f"b-bad{ext}", file_bytes(source, fmt, body))
        line = i + (2 if fmt == "csv" else 1)
        return Bad(kind, path, [rf"line {line}: "])

    if kind == "null_key":
        body = at_least_one(draw, source, rows)
        i = draw(st.integers(0, len(body) - 1))
        body[i] = (None, *body[i][1:])
        return null_key_bad(directory, source, fmt, body, i, kind)

    stored = {k: r for k, r in stored.items() if r[names.index("ts")] is not None}
    if kind == "tie_with_stored" and stored:
        k = draw(st.sampled_from(sorted(stored)))
        held = stored[k]
        changed = (
            (k, ("elsewhere" if held[1] != "elsewhere" else "other"), *held[2:])
            if source == "customers"
            else (k, held[1], held[2] + 1, *held[3:])
        )
        body = [r for r in rows if r[0] != k] + [changed]
        body = draw(st.permutations(body))
        path = write(directory, f"b-bad{ext}", file_bytes(source, fmt, list(body)))
        return Bad(
            kind,
            path,
            [r"same watermark as the stored version", rf"offending keys: {key}={k}\b"],
            error=UpsertConflict,
            before_open=False,
        )

    if kind in ("tie_in_batch", "tie_with_stored"):
        ts_at = names.index("ts")
        base = at_least_one(draw, source, rows)
        first = draw(st.sampled_from(base))
        if first[ts_at] is None:  # two rows at a NULL watermark: keep to plain ties
            base.remove(first)
            first = tuple(1 if n == ts_at else v for n, v in enumerate(first))
            base = [r for r in base if r[0] != first[0] or r[ts_at] != 1]
        k = first[0]
        other = (
            (k, f"{first[1]}-2" if first[1] else "other", *first[2:])
            if source == "customers"
            else (k, first[1], first[2] + 1, *first[3:])
        )
        body = [r for r in base if r[0] != k] + [first, other]
        body = list(draw(st.permutations(body)))
        if draw(st.booleans()):  # the two rows in two files: both are named
            one = [r for r in body if r != other]
            a = write(directory, f"a-bad{ext}", file_bytes(source, fmt, one))
            b = write(directory, f"b-bad{ext}", file_bytes(source, fmt, [other]))
            return Bad(
                kind,
                a,
                [rf"offending keys: {key}={k}\b", re.escape(str(b))],
                error=UpsertConflict,
            )
        path = write(directory, f"b-bad{ext}", file_bytes(source, fmt, body))
        return Bad(kind, path, [rf"offending keys: {key}={k}\b"], error=UpsertConflict)

    assert kind == "schema_drift"
    body = at_least_one(draw, source, rows)
    choices = ["extra", "renamed", "retyped"] + (["missing"] if fmt != "jsonl" else [])
    how = draw(st.sampled_from(choices))
    types = dict(TYPES[source])
    column = draw(st.sampled_from([n for n in names if n != key])) if how == "missing" else "ts"
    if how == "extra":
        types["note"] = pa.string()
        body = [(*r, "n") for r in body]
        wanted = r"unknown key\(s\) note" if fmt == "jsonl" else r"unknown column\(s\) \['note'\]"
        line = 1
    elif how == "missing":
        at = names.index(column)
        del types[column]
        body = [r[:at] + r[at + 1 :] for r in body]
        wanted = rf"missing column\(s\) \['{column}'\]"
    elif how == "renamed":
        types = {("TS" if n == "ts" else n): t for n, t in types.items()}
        wanted = (
            r"unknown key\(s\) TS"
            if fmt == "jsonl"
            else r"missing column\(s\) \['ts'\] and unknown column\(s\) \['TS'\]"
        )
        line = 1
    else:
        at = names.index("ts")
        types["ts"] = pa.float64()
        body = [
            tuple((v + 0.5 if isinstance(v, int) else v) if n == at else v for n, v in enumerate(r))
            for r in body
        ]
        line = next((n for n, r in enumerate(body) if r[at] is not None), None)
        if line is None:
            body[0] = tuple(0.5 if n == at else v for n, v in enumerate(body[0]))
            line = 0
        line += 1
        wanted = {
            "parquet": r"the file: column 'ts' is BIGINT, got DOUBLE",
            "jsonl": rf"line {line}: column 'ts' is BIGINT",
            "csv": rf"line {line + 1}: column 'ts' is BIGINT",
        }[fmt]
    drifted = list(types)
    if fmt == "parquet":
        data = parquet_bytes(source, body, types)
    elif fmt == "csv":
        data = csv_text(drifted, body).encode()
    else:
        data = "".join(ln + "\n" for ln in jsonl_lines(drifted, body)).encode()
    if fmt == "jsonl" and how in ("extra", "renamed"):
        wanted = rf"line {line}: {wanted}"
    path = write(directory, f"b-bad{ext}", data)
    return Bad(f"{kind}:{how}", path, [wanted], extra=extra)


def latin1_region_parquet(body: list[tuple], i: int) -> bytes:
    """Customers as Parquet whose region column, a STRING, holds Latin-1 bytes in row i
    (pyarrow writes what it is given; the reader does not validate it)."""
    raw = [None if r[1] is None else r[1].encode() for r in body]
    raw[i] = "Zürich".encode("latin-1")
    offsets, data = [0], b""
    for value in raw:
        data += value or b""
        offsets.append(len(data))
    validity = pa.array([v is not None for v in raw]).buffers()[1]
    offsets_buffer = pa.array(offsets, pa.int32()).buffers()[1]
    region = pa.Array.from_buffers(
        pa.string(), len(raw), [validity, offsets_buffer, pa.py_buffer(data)]
    )
    table = pa.table(
        {
            "cust_id": pa.array([r[0] for r in body], pa.int64()),
            "region": region,
            "ts": pa.array([r[2] for r in body], pa.int64()),
            "deleted": pa.array([r[3] for r in body], pa.bool_()),
        }
    )
    out = io.BytesIO()
    pq.write_table(table, out)
    return out.getvalue()


def null_key_bad(
    directory: Path, source: str, fmt: str, body: list[tuple], i: int, kind: str
) -> Bad:
    path = write(directory, f"b-bad{EXTENSION[fmt]}", file_bytes(source, fmt, body))
    patterns = [r"NULL in a key column", rf"offending keys: {KEY[source]}=None"]
    if fmt == "parquet":
        patterns.append(rf"\(row {i} of the file\)")
    return Bad(kind, path, patterns, error=BadUpsertRow)


# ==================================================================================== running
def run_units(engine: Any, epoch: int, landing: LandingDirectory) -> None:
    """One epoch as the DAG's tasks run it, each unit on its own: a re-run after a failed
    ingest skips the units that committed (a committed ingest given its batch again)."""
    interval = day(epoch)
    engine.open_epoch(epoch, interval.slug)
    for stage in engine.plan.stages_in_scope(0):
        anchor = engine.circuit.node(stage.anchor)
        if anchor.op in ("zset_source", "upsert_source"):
            engine.ingest(anchor.label, epoch, landing.batch(anchor.label, interval))
        else:
            engine.run_stage(stage.id, (epoch,))
    engine.publish(epoch)
    engine.close_epoch(epoch)


def run_whole(engine: Any, epoch: int, landing: LandingDirectory) -> None:
    """One epoch by ``run_epoch``, given what the connector returns (None: empty)."""
    interval = day(epoch)
    engine.run_epoch(epoch, {s: landing.batch(s, interval) for s in SOURCES})


def warehouse_files(root: Path) -> set[Path]:
    return {p for p in root.rglob("*.parquet") if p.is_file()}


def state_of(engine: Any, epoch: int) -> SimpleNamespace:
    catalog, name = engine.catalog, engine.circuit.name
    return SimpleNamespace(
        last=catalog.last_committed_epoch(name),
        state=catalog.epoch_state(name, epoch),
        runs=catalog.stage_runs(name),
        batches={b.id: b for b in catalog.all_batches(name)},
        counted=sum(o.batches for o in catalog.stage_outputs(name)),
        views=engine.views(),
        files=warehouse_files(engine.root),
    )


def check_refusal(
    engine: Any, epoch: int, source: str, bad: Bad, error: BaseException, before: Any, whole: bool
) -> None:
    message = str(error)
    where = f"{bad.kind} of {source!r} at epoch {epoch}: {message[:600]}"
    assert isinstance(error, bad.error), where
    assert f"source {source!r}" in message, where
    if bad.by_name:
        assert bad.named.name in message and str(bad.named.parent) in message, where
    else:
        assert str(bad.named) in message, where
    for pattern in bad.patterns:
        assert re.search(pattern, message), f"{pattern!r} not in {where}"
    for path in bad.extra:  # a good file beside the bad one is not blamed
        assert str(path) not in message, where
    assert "Traceback" not in message and "\tat " not in message, where
    # Nothing of it committed.
    after = state_of(engine, epoch)
    catalog, name = engine.catalog, engine.circuit.name
    assert after.last == before.last == epoch - 1, where
    assert catalog.epoch_state(name, epoch) != "committed", where
    ingest = engine.plan.stage_of(engine.circuit.sources[source]).name
    new_runs = after.runs[len(before.runs) :]
    assert after.runs[: len(before.runs)] == before.runs, where
    assert (ingest, (epoch,)) not in after.runs, where
    new = [b for i, b in after.batches.items() if i not in before.batches]
    assert after.counted - before.counted == len(new), where  # each one a committed unit's
    if bad.before_open or not whole:
        # Refused before anything ran (run_epoch checks every batch first; a unit run
        # stands alone): not one stage run or batch more, the epoch not even opened.
        assert new_runs == [] and new == [], where
        if whole:
            assert after.state == before.state, where
    assert after.views == before.views, where
    registered = [engine.root / b.path for b in after.batches.values()]
    left = [f for f in after.files - before.files if not any(r in f.parents for r in registered)]
    assert left == [], where


def run_corpus(
    data: Any, tmp: Path, history: list[dict[str, Any]], formats: tuple[str, ...], spark: Any
) -> None:
    from dbspark.engine.spark.executor import SparkEngine

    circuit = orders()
    landing = LandingDirectory(tmp / "landing")
    engine = SparkEngine(circuit, tmp / "warehouse", spark=spark)
    whole = data.draw(st.booleans(), label="run_epoch (else unit by unit)")
    run = run_whole if whole else run_units
    good: list[dict[str, Any]] = []
    bad_epochs = data.draw(
        st.sets(st.integers(0, len(history) - 1), min_size=1, max_size=len(history)),
        label="epochs with a bad batch",
    )
    refusals = 0
    try:
        for epoch, inputs in enumerate(history):
            interval = day(epoch)
            expected = full_refresh(
                circuit, [{s: e[s].rows for s in SOURCES} for e in [*good, inputs]]
            )
            bad_source = data.draw(st.sampled_from(SOURCES)) if epoch in bad_epochs else None
            for source in SOURCES:
                if source != bad_source:
                    land_good(landing, source, interval, inputs[source])
            while bad_source is not None:
                stored = winners(good, bad_source)
                directory = landing.partition(bad_source, interval)
                bad = make_bad(
                    data.draw, directory, bad_source, inputs[bad_source].rows, formats, stored
                )
                before = state_of(engine, epoch)
                if not whole:  # the ingests before the refused one commit, as their tasks do
                    before = None
                with pytest.raises(InputError) as caught:
                    if whole:
                        run(engine, epoch, landing)
                    else:
                        interval_ = day(epoch)
                        engine.open_epoch(epoch, interval_.slug)
                        for source in SOURCES:
                            if source != bad_source:
                                engine.ingest(source, epoch, landing.batch(source, interval_))
                        before = state_of(engine, epoch)
                        engine.ingest(bad_source, epoch, landing.batch(bad_source, interval_))
                assert before is not None, caught.value
                event(f"{bad.kind} ({'run_epoch' if whole else 'units'})")
                check_refusal(engine, epoch, bad_source, bad, caught.value, before, whole)
                refusals += 1
                # The writer replaces the partition's files with the good batch.
                clear(landing, bad_source, interval)
                if not data.draw(st.booleans(), label="another bad batch first"):
                    land_good(landing, bad_source, interval, inputs[bad_source])
                    bad_source = None
            run(engine, epoch, landing)
            good.append(inputs)
            assert engine.last_committed_epoch() == epoch
            assert engine.views() == expected, f"epoch {epoch}"
    finally:
        engine.catalog.close()
    assert refusals >= 1


FAST_FORMATS = ("parquet", "jsonl")


@settings(CORPUS, max_examples=30)
@given(data=st.data(), history=histories(FAST_FORMATS))
def test_bad_parquet_and_json_lines_batches_are_refused_and_the_pipeline_continues(
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
    data: Any,
    history: Any,
) -> None:
    run_corpus(
        data,
        tmp_path_factory.mktemp("corpus"),
        history,
        FAST_FORMATS,
        lambda: request.getfixturevalue("spark"),
    )


ALL_FORMATS = ("parquet", "jsonl", "csv")


@pytest.mark.slow
@settings(CORPUS, max_examples=3)
@given(data=st.data(), history=histories(("csv",)))
def test_bad_csv_batches_are_refused_and_the_pipeline_continues(
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
    data: Any,
    history: Any,
) -> None:
    run_corpus(
        data,
        tmp_path_factory.mktemp("corpus"),
        history,
        ALL_FORMATS,
        lambda: request.getfixturevalue("spark"),
    )


# ==================================================================================== regressions
def test_a_parquet_string_that_is_not_utf8_is_refused_naming_the_row(tmp_path: Path) -> None:
    """Found by the corpus: pyarrow writes a STRING column with Latin-1 bytes as given, and
    neither tier's reader checked them. The batch was committed, and every later read of
    the views that hold it failed in Python's UTF-8 decoder (the local tier). The check
    runs before either tier reads the batch (``check_utf8``)."""
    from dbspark.engine.file_batches import FileBatch, check_utf8
    from dbspark.engine.spark.executor import SparkEngine

    rows = [(1, "north", 1, False), (2, "south", 1, None), (3, None, 1, False)]
    bad = tmp_path / "customers.parquet"
    bad.write_bytes(latin1_region_parquet(rows, 1))
    with pytest.raises(InputError, match=r"row 1 of the file: column 'region' holds bytes"):
        check_utf8("customers", FileBatch(bad, "parquet"))
    good = tmp_path / "good.parquet"
    good.write_bytes(parquet_bytes("customers", [(*rows[0][:1], "Zürich", *rows[0][2:])]))
    check_utf8("customers", FileBatch(good, "parquet"))  # valid UTF-8 passes
    check_utf8("customers", FileBatch(tmp_path / "missing.parquet", "parquet"))  # the reader's

    def no_spark() -> Any:
        raise AssertionError("a small Parquet batch needs no Spark")

    engine = SparkEngine(orders(), tmp_path / "warehouse", spark=no_spark)
    engine.run_epoch(0, {"customers": [(9, "west", 0, False)]})
    with pytest.raises(InputError) as caught:
        engine.run_epoch(1, {"customers": FileBatch([good, bad], "parquet")})
    message = str(caught.value)
    assert "source 'customers'" in message and str(bad) in message and str(good) not in message
    assert engine.last_committed_epoch() == 0
    assert engine.catalog.epoch_state("orders", 1) is None
    assert (
        engine.views()["customers_current"]
        == full_refresh(orders(), [{"customers": [(9, "west", 0, False)]}])["customers_current"]
    )
    engine.catalog.close()


def test_run_epoch_takes_an_empty_partition_as_the_connector_returns_it(tmp_path: Path) -> None:
    """Found by the corpus: ``LandingDirectory.batch`` returns None for a partition with no
    data file (a completion marker only), which ``ingest`` takes as an empty batch, but
    ``run_epoch`` failed on it with a bare ``TypeError`` ('NoneType' object is not
    iterable) before the epoch opened."""
    from dbspark.engine.spark.executor import SparkEngine

    landing = LandingDirectory(tmp_path / "landing")
    landing.land("customers", day(0), [(1, "north", 1, False)], COLUMNS["customers"])
    landing.complete("orders", day(0))  # nothing arrived for the orders
    batches = {s: landing.batch(s, day(0)) for s in SOURCES}
    assert batches["orders"] is None
    engine = SparkEngine(orders(), tmp_path / "warehouse", spark=lambda: None)
    engine.run_epoch(0, batches)
    assert engine.last_committed_epoch() == 0
    assert engine.views() == full_refresh(orders(), [{"customers": [(1, "north", 1, False)]}])
    engine.catalog.close()
