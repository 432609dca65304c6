"""Source connectors: landed files and table pulls give the batches the engine takes.

Files and tables are written here with pyarrow/csv/json and SQLAlchemy directly where
the point is reading (so a bug in ``land`` cannot hide one in ``batch``), and through
``LandingDirectory.land`` where the point is the round trip. SqlTable runs against real
SQLite files and, when one can be had, a real PostgreSQL server.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa

from dbspark.core.types import Schema
from dbspark.core.zset import ZSet
from dbspark.engine.api import InputError
from dbspark.engine.batches import upsert_batch
from dbspark.engine.file_batches import FileBatch
from dbspark.examples.circuits import orders
from dbspark.orchestration.intervals import Interval
from dbspark.orchestration.sources import (
    LandingDirectory,
    SourceConnector,
    SqlTable,
    source_columns,
)

DAY0 = Interval(datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 2, tzinfo=UTC))
DAY1 = Interval(DAY0.end, DAY0.end + timedelta(days=1))
CUSTOMERS = ("cust_id", "region", "ts", "deleted")
ORDERS = ("order_id", "cust_id", "amount", "ts", "deleted_at")


def write_parquet(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


# ==================================================================================== landing
def test_the_partition_is_per_source_and_interval_start(tmp_path: Path) -> None:
    landing = LandingDirectory(tmp_path)
    assert landing.partition("orders", DAY0) == tmp_path / "orders" / "interval=20260101T000000Z"
    assert ":" not in landing.partition("orders", DAY0).name
    assert str(landing.partition("orders", DAY0)) in landing.describe("orders", DAY0)
    with pytest.raises(ValueError, match="cannot be a directory name"):
        landing.partition("../orders", DAY0)


def test_a_missing_partition_is_an_error_unless_the_source_opts_out(tmp_path: Path) -> None:
    expected = tmp_path / "orders" / "interval=20260101T000000Z"
    with pytest.raises(InputError, match="does not exist") as error:
        LandingDirectory(tmp_path).batch("orders", DAY0)
    assert str(expected) in str(error.value)
    assert "source 'orders'" in str(error.value)
    assert LandingDirectory(tmp_path, require_partition=False).batch("orders", DAY0) is None


def test_markers_and_hidden_files_are_not_data(tmp_path: Path) -> None:
    landing = LandingDirectory(tmp_path, require_partition=True)
    partition = landing.partition("orders", DAY0)
    partition.mkdir(parents=True)
    (partition / "_SUCCESS").write_text("")
    (partition / "_temporary").mkdir()
    assert landing.batch("orders", DAY0) is None  # the writer finished and landed nothing
    write_parquet(partition / "part-00001.parquet", [{"order_id": 2}])
    write_parquet(partition / "part-00000.snappy.parquet", [{"order_id": 1}])
    (partition / ".part-00000.snappy.parquet.crc").write_bytes(b"\0")
    batch = landing.batch("orders", DAY0)
    assert batch == FileBatch(
        [partition / "part-00000.snappy.parquet", partition / "part-00001.parquet"], "parquet"
    )


def test_the_format_comes_from_extensions_or_is_declared(tmp_path: Path) -> None:
    partition = LandingDirectory(tmp_path).partition("words", DAY0)
    partition.mkdir(parents=True)
    (partition / "a.json").write_text('{"word": "x"}\n')
    (partition / "b.jsonl.gz").write_bytes(b"")
    assert LandingDirectory(tmp_path).batch("words", DAY0).format == "jsonl"

    (partition / "c.txt").write_text('{"word": "y"}\n')
    with pytest.raises(InputError, match=r"cannot tell the format of \['c.txt'\]") as error:
        LandingDirectory(tmp_path).batch("words", DAY0)
    assert str(partition) in str(error.value)
    # Declared, a file without a known extension is taken to be of that format.
    assert len(LandingDirectory(tmp_path, "jsonl").batch("words", DAY0).paths) == 3
    with pytest.raises(InputError, match="declared csv, but holds other files"):
        LandingDirectory(tmp_path, "csv").batch("words", DAY0)
    with pytest.raises(ValueError, match="not one of parquet, csv, jsonl"):
        LandingDirectory(tmp_path, "orc")


def test_mixed_formats_in_one_partition_are_refused(tmp_path: Path) -> None:
    landing = LandingDirectory(tmp_path)
    landing.land("orders", DAY0, [(1, 1, 10, 1, None)], ORDERS, "csv")
    landing.land("orders", DAY0, [(2, 1, 10, 1, None)], ORDERS, "parquet")
    with pytest.raises(InputError, match="mixes file formats") as error:
        landing.batch("orders", DAY0)
    message = str(error.value)
    assert str(landing.partition("orders", DAY0)) in message
    assert "part-00000.csv" in message and "part-00001.parquet" in message


def test_landing_writes_whole_files_under_fresh_names(tmp_path: Path) -> None:
    landing = LandingDirectory(tmp_path)
    rows = [(1, "north", 1, False), {"cust_id": 2, "region": "a,b", "ts": 1}]
    first = landing.land("customers", DAY0, rows, CUSTOMERS, "csv")
    second = landing.land("customers", DAY0, rows, CUSTOMERS, "jsonl", name="late")
    assert first.name == "part-00000.csv" and second.name == "late.jsonl"
    assert sorted(p.name for p in first.parent.iterdir()) == ["late.jsonl", "part-00000.csv"]
    assert first.read_text().splitlines() == [
        "cust_id,region,ts,deleted",
        "1,north,1,false",
        '2,"a,b",1,',
    ]
    assert [json.loads(line) for line in second.read_text().splitlines()][1] == {
        "cust_id": 2,
        "region": "a,b",
        "ts": 1,
        "deleted": None,
    }
    with pytest.raises(ValueError, match="has 2 values for the 4 columns"):
        landing.land("customers", DAY0, [(1, "x")], CUSTOMERS)
    with pytest.raises(ValueError, match=r"unknown column\(s\) \['colour'\]"):
        landing.land("customers", DAY0, [{"colour": "red"}], CUSTOMERS)
    with pytest.raises(ValueError, match="CSV cannot hold"):
        landing.land("tags", DAY0, [([1, 2],)], ["tags"], "csv")
    # A failed write leaves no file behind, not even a hidden temporary one.
    assert list(landing.partition("tags", DAY0).iterdir()) == []


def test_a_completion_marker_names_every_file_and_its_rows(tmp_path: Path) -> None:
    landing = LandingDirectory(tmp_path)
    # A writer with nothing to land for an interval marks it complete and empty.
    marker = landing.complete("orders", DAY0)
    assert json.loads(marker.read_text()) == {"files": {}}
    assert landing.batch("orders", DAY0) is None

    landing.land("orders", DAY1, [(1, 1, 10, 1, None), (2, 1, 10, 1, None)], ORDERS, "csv")
    landing.land("orders", DAY1, [(3, 1, 10, 1, None)], ORDERS, "csv")
    (landing.partition("orders", DAY1) / "part-00001.csv").open("a").write("\n\n")
    landing.complete("orders", DAY1)
    marker = landing.partition("orders", DAY1) / "_dbspark_complete.json"
    assert json.loads(marker.read_text()) == {"files": {"part-00000.csv": 2, "part-00001.csv": 1}}
    assert len(landing.batch("orders", DAY1).paths) == 2

    def refused(content: dict, match: str) -> None:
        marker.write_text(json.dumps(content))
        with pytest.raises(InputError, match=match) as error:
            landing.batch("orders", DAY1)
        assert "source 'orders'" in str(error.value)
        assert str(landing.partition("orders", DAY1)) in str(error.value)

    # A file still on its way, a file the writer did not announce, a file cut short.
    refused(
        {"files": {"part-00000.csv": 2, "part-00001.csv": 1, "part-00002.csv": 5}},
        r"\['part-00002.csv'\] named by the marker are not in the partition",
    )
    refused({"files": {"part-00000.csv": 2}}, r"\['part-00001.csv'\] are in the partition but")
    refused(
        {"files": {"part-00000.csv": 3, "part-00001.csv": 1}},
        "part-00000.csv has 2 rows, the marker says 3",
    )
    refused({"files": {"part-00000.csv": -1}}, "whole number of rows")
    refused({"files": ["part-00000.csv"]}, "must be")
    marker.write_text("{")
    with pytest.raises(InputError, match="not JSON"):
        landing.batch("orders", DAY1)

    # Parquet rows come from the footers; JSON lines are counted without blank lines.
    day2 = Interval(DAY1.end, DAY1.end + timedelta(days=1))
    landing.land("customers", day2, [(1, "x", 1, False)] * 3, CUSTOMERS, "parquet")
    landing.complete("customers", day2)
    landing.land("words", day2, [("a",), ("b",)], ["word"], "jsonl")
    landing.complete("words", day2)
    counts = [
        json.loads((landing.partition(s, day2) / "_dbspark_complete.json").read_text())
        for s in ("customers", "words")
    ]
    assert counts == [{"files": {"part-00000.parquet": 3}}, {"files": {"part-00000.jsonl": 2}}]


def test_text_that_is_not_utf8_is_refused_naming_file_and_line(tmp_path: Path) -> None:
    import gzip

    landing = LandingDirectory(tmp_path)
    partition = landing.partition("customers", DAY0)
    partition.mkdir(parents=True)
    latin1 = "cust_id,region,ts,deleted\n1,north,1,false\n2,Zürich,1,false\n".encode("latin-1")
    (partition / "part-00000.csv").write_bytes(latin1)
    with pytest.raises(InputError, match="line 3: byte 4 of the line is not UTF-8") as error:
        landing.batch("customers", DAY0)
    assert "source 'customers'" in str(error.value)
    assert str(partition / "part-00000.csv") in str(error.value)
    assert "Zürich" not in str(error.value)  # the row's value is not copied
    (partition / "part-00000.csv").write_bytes(latin1.decode("latin-1").encode("utf-8"))
    assert landing.batch("customers", DAY0) is not None

    words = landing.partition("words", DAY0)
    words.mkdir(parents=True)
    (words / "a.jsonl.gz").write_bytes(gzip.compress(b'{"word": "ok"}\n{"word": "\xff"}\n'))
    with pytest.raises(InputError, match="line 2: byte 11 of the line is not UTF-8"):
        landing.batch("words", DAY0)
    (words / "a.jsonl.gz").write_bytes(gzip.compress(b'{"word": "ok"}\n')[:-9])  # truncated
    with pytest.raises(InputError, match="cannot be read"):
        landing.batch("words", DAY0)


def test_symbolic_links_are_refused_not_followed(tmp_path: Path) -> None:
    landing = LandingDirectory(tmp_path / "landing")
    elsewhere = write_parquet(tmp_path / "secret.parquet", [{"order_id": 1}])
    partition = landing.partition("orders", DAY0)
    partition.mkdir(parents=True)
    (partition / "part-00000.parquet").symlink_to(elsewhere)
    with pytest.raises(InputError, match=r"'part-00000\.parquet' is a symbolic link") as error:
        landing.batch("orders", DAY0)
    assert str(partition) in str(error.value)
    other = landing.partition("orders", DAY1)
    other.parent.mkdir(parents=True, exist_ok=True)
    other.symlink_to(partition)
    with pytest.raises(InputError, match="partition is a symbolic link"):
        landing.batch("orders", DAY1)


def daily_intervals(count: int) -> list[Interval]:
    """``count`` days from DAY0 on."""
    return [
        Interval(DAY0.start + timedelta(days=n), DAY0.start + timedelta(days=n + 1))
        for n in range(count)
    ]


def test_files_that_arrive_change_or_vanish_after_their_ingest_are_found(tmp_path: Path) -> None:
    from dbspark.orchestration.sources.records import IngestRecords, late_changes

    landing = LandingDirectory(tmp_path / "landing", late_window=2)
    records = IngestRecords(tmp_path / "warehouse", "orders")
    days = daily_intervals(3)
    for day in days:
        landing.land("orders", day, [(1, 1, 10, 1, None)], ORDERS, "parquet", name="a")
        landing.land("orders", day, [(2, 1, 10, 1, None)], ORDERS, "parquet", name="b")
        batch = landing.batch("orders", day)
        records.write("orders", day, landing.record("orders", day, batch))
    assert late_changes(landing, "orders", records, days) == []

    landing.land("orders", days[0], [(3, 1, 10, 1, None)], ORDERS, "parquet", name="late")
    landing.land("orders", days[1], [(9, 1, 10, 1, None)], ORDERS, "parquet", name="a")
    (landing.partition("orders", days[2]) / "b.parquet").unlink()
    found = late_changes(landing, "orders", records, days)
    # The window is the last two intervals: the late file of the first is not looked at.
    assert found == [
        f"{landing.partition('orders', days[1]) / 'a.parquet'} was replaced after "
        f"interval {days[1]} was ingested",
        f"{landing.partition('orders', days[2]) / 'b.parquet'} was removed after "
        f"interval {days[2]} was ingested",
    ]
    wide = LandingDirectory(tmp_path / "landing", late_window=3)
    assert (
        f"{landing.partition('orders', days[0]) / 'late.parquet'} arrived after"
        in (late_changes(wide, "orders", records, days)[0])
    )
    assert (
        late_changes(LandingDirectory(tmp_path / "landing", late_window=0), "orders", records, days)
        == []
    )


def test_records_past_the_late_window_are_removed_and_the_rest_kept(tmp_path: Path) -> None:
    from dbspark.orchestration.sources.records import IngestRecords, late_window

    landing = LandingDirectory(tmp_path / "landing", late_window=2)
    records = IngestRecords(tmp_path / "warehouse", "orders")
    days = daily_intervals(4)
    for day in days:
        records.write("orders", day, {"files": {}})
    folder = records.path("orders", days[0]).parent
    # A write of the oldest record that died before its rename, and one in flight now.
    (folder / f".{records.path('orders', days[0]).name}.tmp-dead").write_text("{")
    (folder / f".{records.path('orders', days[3]).name}.tmp-live").write_text("{")
    committed = days[:3]
    window = late_window(landing, committed)
    assert window == days[1:3]
    assert records.forget("orders", committed[: len(committed) - len(window)]) == 1
    assert records.read("orders", days[0]) is None
    assert all(records.read("orders", day) == {"files": {}} for day in days[1:])
    assert sorted(p.name for p in folder.iterdir() if p.name.startswith(".")) == [
        f".{records.path('orders', days[3]).name}.tmp-live"
    ]
    assert late_window(LandingDirectory(tmp_path / "landing", late_window=0), committed) == []
    assert records.forget("other", days) == 0


def test_the_late_files_policy_is_warn_fail_or_airflow_cfgs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert LandingDirectory(tmp_path, late_files="FAIL").late_files == "fail"
    monkeypatch.delenv("AIRFLOW__DBSPARK__LATE_FILES", raising=False)
    assert LandingDirectory(tmp_path).late_files == "warn"
    monkeypatch.setenv("AIRFLOW__DBSPARK__LATE_FILES", "fail")
    assert LandingDirectory(tmp_path).late_files == "fail"
    with pytest.raises(ValueError, match="'warn' or 'fail'"):
        LandingDirectory(tmp_path, late_files="ignore")


# ==================================================================================== fingerprints
def at(hour: int, minute: int = 0, microsecond: int = 0) -> datetime:
    """A naive UTC time on DAY0's date (DAY0 is midnight to midnight)."""
    return datetime(2026, 1, 1, hour, minute, 0, microsecond)


def make_orders_table(url: str | sa.URL, *, table: str = "orders_cdc", aware: bool = False):
    """An operational orders table whose ``changed_at`` is a TIMESTAMP, ``changed_ms``
    the same instant in epoch milliseconds and ``changed_s`` in epoch seconds."""
    engine = sa.create_engine(url)
    meta = sa.MetaData()
    t = sa.Table(
        table,
        meta,
        sa.Column("order_id", sa.BigInteger, primary_key=True),
        sa.Column("cust_id", sa.BigInteger),
        sa.Column("amount", sa.BigInteger),
        sa.Column("ts", sa.BigInteger),
        sa.Column("deleted_at", sa.BigInteger),
        sa.Column("changed_at", sa.DateTime(timezone=aware)),
        sa.Column("changed_ms", sa.BigInteger),
        sa.Column("changed_s", sa.Integer),
        sa.Column("note", sa.String),
    )
    moments = {
        1: at(0) - timedelta(microseconds=1),  # just before the interval
        2: at(0),  # exactly at its start: in
        3: at(12, 30),
        4: DAY0.end.replace(tzinfo=None) - timedelta(microseconds=1),  # last instant in
        5: DAY0.end.replace(tzinfo=None),  # exactly at its end: out
    }
    rows = []
    for order_id, moment in moments.items():
        instant = moment.replace(tzinfo=UTC)
        rows.append(
            {
                "order_id": order_id,
                "cust_id": 7,
                "amount": 10 * order_id,
                "ts": order_id,
                "deleted_at": None,
                "changed_at": instant if aware else moment,
                "changed_ms": int(instant.timestamp() * 1000),
                "changed_s": int(instant.timestamp()),  # floor: 4 lands on 23:59:59
                "note": "n",
            }
        )
    with engine.begin() as conn:
        meta.create_all(conn)
        conn.execute(t.insert(), rows)
    engine.dispose()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'operational.db'}"
    make_orders_table(url)
    return url


def pulled_ids(connector: SqlTable, interval: Interval = DAY0) -> list[int]:
    return [row[0] for row in connector.batch("orders", interval, columns=ORDERS)]


def test_a_large_pull_is_written_to_files_and_reads_as_the_same_rows(
    sqlite_url: str, tmp_path: Path
) -> None:
    """Past ``spill_rows``, a pull is checked and written as Parquet files a chunk at a
    time (never held whole), and the engine reads those files as the rows they hold; a
    bad row in a later chunk is refused, naming it and where in the pull it is."""
    from dbspark.engine.spark.executor import SparkEngine
    from dbspark.orchestration.sources import source_schema

    circuit = orders()
    schema = source_schema(circuit, "orders")
    kept = SqlTable(sqlite_url, table="orders_cdc", watermark_column="changed_at")
    spilled = SqlTable(
        sqlite_url, table="orders_cdc", watermark_column="changed_at", chunk_rows=1, spill_rows=2
    )
    rows = kept.batch("orders", DAY0, columns=ORDERS, scratch=tmp_path / "a", schema=schema)
    assert isinstance(rows, list) and len(rows) == 3  # under spill_rows: rows, as before
    files = spilled.batch("orders", DAY0, columns=ORDERS, scratch=tmp_path / "b", schema=schema)
    assert isinstance(files, FileBatch) and files.format == "parquet"
    assert [pq.read_metadata(f).num_rows for f in files.paths] == [2, 1]
    assert all(Path(f).parent == tmp_path / "b" for f in files.paths)
    # Without a scratch folder (a caller of its own), the rows come back as ever.
    assert spilled.batch("orders", DAY0, columns=ORDERS) == rows

    views = []
    for name, batch in (("rows", rows), ("files", files)):
        engine = SparkEngine(circuit, tmp_path / f"warehouse-{name}", spark=lambda: None)
        engine.run_epoch(0, {"customers": [(7, "north", 1, False)], "orders": batch})
        views.append(engine.view("region_totals"))
        assert engine.spark_started is False  # both stayed on the local tier
        engine.catalog.close()
    assert views[0] == views[1] and views[0]

    engine = sa.create_engine(sqlite_url)
    with engine.begin() as conn:  # the last row of the pull: the second file's
        conn.exec_driver_sql("UPDATE orders_cdc SET amount = 'lots' WHERE order_id = 4")
    engine.dispose()
    with pytest.raises(InputError, match=r"rows 2 to 2 of the pull.*row 0.*'amount'"):
        spilled.batch("orders", DAY0, columns=ORDERS, scratch=tmp_path / "c", schema=schema)


def test_a_table_pull_is_the_half_open_interval(sqlite_url: str) -> None:
    connector = SqlTable(sqlite_url, table="orders_cdc", watermark_column="changed_at")
    rows = connector.batch("orders", DAY0, columns=ORDERS)
    assert rows == [(2, 7, 20, 2, None), (3, 7, 30, 3, None), (4, 7, 40, 4, None)]
    # What the engine's check of a Python batch takes, unchanged.
    circuit = orders()
    assert source_columns(circuit, "orders") == ORDERS
    schema = circuit.node(circuit.sources["orders"]).params["user_schema"]
    assert upsert_batch("orders", schema, rows) == rows
    with pytest.raises(InputError, match=r"source 'order': .* has no such source"):
        source_columns(circuit, "order")
    assert pulled_ids(connector, DAY1) == [5]
    assert "orders_cdc" in connector.describe("orders", DAY0)


def test_timestamps_without_a_time_zone_are_pulled_as_utc_instants(sqlite_url: str) -> None:
    """A timestamp column without a time zone is taken to hold UTC, as the watermark
    is: its values arrive as UTC instants, which a TIMESTAMP source takes (it refuses
    a naive datetime)."""
    columns = ["order_id", "changed_at", "ts"]
    connector = SqlTable(sqlite_url, table="orders_cdc", watermark_column="changed_at")
    rows = connector.batch("events", DAY0, columns=columns)
    expected = [at(0), at(12, 30), DAY0.end.replace(tzinfo=None) - timedelta(microseconds=1)]
    assert [row[1] for row in rows] == [moment.replace(tzinfo=UTC) for moment in expected]
    schema = Schema((("order_id", "bigint"), ("changed_at", "timestamp"), ("ts", "bigint")))
    assert upsert_batch("events", schema, rows) == rows
    with pytest.raises(InputError, match="changed_at"):
        upsert_batch("events", schema, [(2, at(0), 2)])  # what the pull used to give


def test_integer_watermarks_in_seconds_and_milliseconds(sqlite_url: str) -> None:
    ms = SqlTable(
        sqlite_url, table="orders_cdc", watermark_column="changed_ms", watermark_unit="ms"
    )
    assert pulled_ids(ms) == [2, 3, 4]
    seconds = SqlTable(
        sqlite_url, table="orders_cdc", watermark_column="changed_s", watermark_unit="s"
    )
    assert pulled_ids(seconds) == [2, 3, 4]
    # A bound inside a second: the second that starts before it is not in the interval.
    late = Interval(DAY0.start + timedelta(microseconds=1), DAY0.end + timedelta(microseconds=1))
    assert pulled_ids(seconds, late) == [3, 4, 5]
    assert pulled_ids(ms, late) == [3, 4, 5]


def test_columns_are_the_sources_in_its_order_and_may_be_renamed(sqlite_url: str) -> None:
    connector = SqlTable(
        sqlite_url,
        table="orders_cdc",
        watermark_column="changed_at",
        columns={"deleted_at": "changed_s"},
    )
    rows = connector.batch("orders", DAY0, columns=["amount", "order_id", "deleted_at"])
    assert rows[0] == (20, 2, int(DAY0.start.timestamp()))
    weighted = SqlTable(
        sqlite_url, table="orders_cdc", watermark_column="changed_at", weight_column="cust_id"
    )
    assert weighted.batch("orders", DAY0, columns=["order_id"]) == [((2,), 7), ((3,), 7), ((4,), 7)]


def test_a_pull_with_lag_reads_rows_committed_late_and_rereads_nothing_twice(
    sqlite_url: str,
) -> None:
    """Order 6 commits after day 0 was pulled, stamped inside day 0 (a long transaction):
    day 1's pull reaches back an hour and finds it. Order 4, stamped in day 0's last
    hour, is read again, as the same version of the same key: no change."""
    from dbspark.engine.reference.engine import ReferenceEngine

    circuit = orders()
    table = SqlTable(
        sqlite_url, table="orders_cdc", watermark_column="changed_at", lag=timedelta(hours=1)
    )
    assert "reaching back 1:00:00" in table.describe("orders", DAY1)
    engine = ReferenceEngine(circuit)
    customers = [(7, "north", 1, False)]
    first = engine.step(
        {"customers": customers, "orders": table.batch("orders", DAY0, columns=ORDERS)}
    )
    assert sorted(r[0] for r, _ in first.views["orders_current"].items()) == [1, 2, 3, 4]

    db = sa.create_engine(sqlite_url)
    with db.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO orders_cdc (order_id, cust_id, amount, ts, changed_at) "
            "VALUES (6, 7, 60, 6, '2026-01-01 23:30:00.000000')"
        )
    db.dispose()
    pulled = table.batch("orders", DAY1, columns=ORDERS)
    assert sorted(r[0] for r in pulled) == [4, 5, 6]
    second = engine.step({"orders": pulled})
    assert second.view_deltas["orders_current"] == ZSet({(5, 7, 50): 1, (6, 7, 60): 1})

    # Read a row at a time, the pull is the same.
    chunked = SqlTable(
        sqlite_url,
        table="orders_cdc",
        watermark_column="changed_at",
        lag=timedelta(hours=1),
        chunk_rows=1,
    )
    assert chunked.batch("orders", DAY1, columns=ORDERS) == pulled
    with pytest.raises(ValueError, match="lag needs an upsert source"):
        SqlTable(sqlite_url, table="t", watermark_column="w", weight_column="n", lag=timedelta(1))
    with pytest.raises(ValueError, match="negative"):
        SqlTable(sqlite_url, table="t", watermark_column="w", lag=timedelta(hours=-1))


def test_a_missing_table_or_column_is_named(sqlite_url: str) -> None:
    def pull(**options: object) -> None:
        settings = {"table": "orders_cdc", "watermark_column": "changed_at", **options}
        SqlTable(sqlite_url, **settings).batch("orders", DAY0, columns=ORDERS)

    with pytest.raises(InputError, match="table 'no_such_table' does not exist") as error:
        pull(table="no_such_table")
    assert "operational.db" in str(error.value)
    with pytest.raises(InputError, match="the watermark column 'changed' is not in table"):
        pull(watermark_column="changed")
    with pytest.raises(InputError, match="the source column 'total' is not in table 'orders_cdc'"):
        pull(columns={"amount": "total"})
    with pytest.raises(InputError, match=r"is BIGINT, not a TIMESTAMP \(give watermark_unit"):
        pull(watermark_column="changed_ms")
    with pytest.raises(InputError, match="is DATETIME, not an integer of epoch s"):
        pull(watermark_unit="s")
    with pytest.raises(ValueError, match="exactly one of url and conn_id"):
        SqlTable(sqlite_url, conn_id="x", table="t", watermark_column="w")
    with pytest.raises(ValueError, match="watermark_unit 'us'"):
        SqlTable(sqlite_url, table="t", watermark_column="w", watermark_unit="us")


def test_a_connection_is_resolved_when_pulling(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conn_id = f"dbspark_test_{uuid.uuid4().hex[:8]}"
    # Built before the connection exists: DAG parsing must not need it.
    connector = SqlTable(conn_id=conn_id, table="orders_cdc", watermark_column="changed_at")
    assert conn_id in connector.describe("orders", DAY0)
    with pytest.raises(LookupError, match=f"AIRFLOW_CONN_{conn_id.upper()}"):
        connector.batch("orders", DAY0, columns=ORDERS)

    assert sqlite_url.startswith("sqlite:////")  # the URI form of an absolute path
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", sqlite_url)
    assert pulled_ids(connector) == [2, 3, 4]
    # The JSON form, with the file in ``host`` as Airflow's SQLite hook has it.
    other = tmp_path / "other.db"
    make_orders_table(f"sqlite:///{other}")
    monkeypatch.setenv(
        f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "sqlite", "host": str(other)})
    )
    assert pulled_ids(connector, DAY1) == [5]


@pytest.fixture
def postgres_table(postgres_url: str) -> Iterator[str]:
    table = f"orders_cdc_{uuid.uuid4().hex[:8]}"
    make_orders_table(postgres_url, table=table)
    make_orders_table(postgres_url, table=f"{table}_tz", aware=True)
    yield table
    engine = sa.create_engine(postgres_url)
    with engine.begin() as conn:
        conn.exec_driver_sql(f'DROP TABLE "{table}"')
        conn.exec_driver_sql(f'DROP TABLE "{table}_tz"')
    engine.dispose()


def test_a_postgres_connection_pulls_the_interval(
    postgres_url: str, postgres_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through an Airflow ``postgres://`` URI (mapped to psycopg 3), with a session time
    zone far from UTC: naive and aware timestamps both keep their UTC bounds."""
    url = sa.make_url(postgres_url)
    airflow_uri = url.set(drivername="postgres").render_as_string(hide_password=False)
    conn_id = f"dbspark_pg_{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", airflow_uri)
    monkeypatch.setenv("PGTZ", "America/New_York")  # libpq sets the session's TimeZone
    for table in (postgres_table, f"{postgres_table}_tz"):
        connector = SqlTable(conn_id=conn_id, table=table, watermark_column="changed_at")
        assert pulled_ids(connector) == [2, 3, 4], table
        assert pulled_ids(connector, DAY1) == [5], table
        # Naive and aware columns alike give the rows' UTC instants.
        moments = [row[1] for row in connector.batch("e", DAY0, columns=["order_id", "changed_at"])]
        assert moments == [
            at(0, 0).replace(tzinfo=UTC),
            at(12, 30).replace(tzinfo=UTC),
            DAY0.end - timedelta(microseconds=1),
        ], table
    millis = SqlTable(
        postgres_url, table=postgres_table, watermark_column="changed_ms", watermark_unit="ms"
    )
    assert millis.batch("orders", DAY0, columns=ORDERS)[0] == (2, 7, 20, 2, None)
    with pytest.raises(InputError, match="column 'nope' is not in table"):
        SqlTable(postgres_url, table=postgres_table, watermark_column="nope").batch(
            "orders", DAY0, columns=ORDERS
        )


# ==================================================================================== end to end
@pytest.mark.slow
def test_file_names_with_glob_characters_are_read_literally(spark, tmp_path: Path) -> None:
    """``a[1].csv`` is that file: as a glob it would match ``a1.csv`` and read its rows
    twice, and none of its own."""
    from dbspark.engine.spark.executor import SparkEngine

    landing = LandingDirectory(tmp_path / "landing")
    landing.land("customers", DAY0, [(1, "north", 1, False)], CUSTOMERS, "csv", name="a[1]")
    landing.land("customers", DAY0, [(2, "south", 1, False)], CUSTOMERS, "csv", name="a1")
    batch = landing.batch("customers", DAY0)
    assert [Path(p).name for p in batch.paths] == ["a1.csv", "a[1].csv"]
    engine = SparkEngine(orders(), tmp_path / "warehouse", spark=spark)
    checked = engine.check_batch("customers", batch)
    assert sorted(tuple(r) for r in checked.rows().collect()) == [
        (1, "north", 1, False),
        (2, "south", 1, False),
    ]


@pytest.mark.slow
def test_connectors_feed_epochs_of_the_orders_circuit(
    spark, tmp_path: Path, sqlite_url: str
) -> None:
    """Day 0: customers as parquet, orders as CSV (with a _SUCCESS marker). Day 1:
    customers as JSON lines, orders pulled from a table. Each batch goes to the engine as
    the connector returned it."""
    from dbspark.engine.spark.executor import SparkEngine

    circuit = orders()
    landing = LandingDirectory(tmp_path / "landing")
    landing.land(
        "customers", DAY0, [(1, "north", 1, False), (2, "south", 1, False)], CUSTOMERS, "parquet"
    )
    landing.land("orders", DAY0, [(10, 1, 100, 1, None), (11, 2, 50, 1, None)], ORDERS, "csv")
    (landing.partition("orders", DAY0) / "_SUCCESS").write_text("")
    landing.land(
        "customers", DAY1, [(2, "north", 2, False), (3, "west", 2, False)], CUSTOMERS, "jsonl"
    )
    # Of the table's rows only order 5 (stamped at DAY0.end) is in day 1: make it customer
    # 3's order, and add a day-1 update of order 10 (landed as CSV on day 0).
    table = SqlTable(sqlite_url, table="orders_cdc", watermark_column="changed_at")
    engine = sa.create_engine(sqlite_url)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "UPDATE orders_cdc SET cust_id = 3, amount = 5, ts = 2 WHERE order_id = 5"
        )
        conn.exec_driver_sql(
            "INSERT INTO orders_cdc (order_id, cust_id, amount, ts, changed_at) "
            "VALUES (10, 1, 70, 2, '2026-01-02 08:00:00.000000')"
        )
    engine.dispose()

    connectors: list[dict[str, SourceConnector]] = [
        {"customers": landing, "orders": landing},
        {"customers": landing, "orders": table},
    ]
    spark_engine = SparkEngine(circuit, tmp_path / "warehouse", spark=spark)
    for epoch, interval in enumerate([DAY0, DAY1]):
        batches = {
            source: connector.batch(
                source, interval, columns=source_columns(circuit, source), spark=spark
            )
            for source, connector in connectors[epoch].items()
        }
        assert all(b is not None for b in batches.values())
        spark_engine.run_epoch(epoch, batches)

    totals = {row: w for row, w in spark_engine.view("region_totals").items()}
    assert totals == {("north", 2, 120, 70): 1, ("west", 1, 5, 5): 1}
