"""Which tier runs a unit, and that the local tier never opens Spark.

An epoch whose input has at most ``local_rows`` rows runs every unit in this process;
the engine's Spark session is opened only when a unit needs it (an Airflow task hands
the engine a function that opens its Spark Connect client or local session).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dbspark.engine.spark.executor import SparkEngine
from dbspark.examples.circuits import NAMED_CIRCUITS


def _opener(spark: Any) -> tuple[list[int], Any]:
    """A Spark opener for an engine, and the list it appends to each time it is called."""
    opened: list[int] = []

    def open_spark() -> Any:
        opened.append(1)
        return spark

    return opened, open_spark


def test_spark_is_opened_only_when_a_unit_needs_it(spark: Any, tmp_path: Path) -> None:
    opened, open_spark = _opener(spark)
    engine = SparkEngine(
        NAMED_CIRCUITS["word_count"](), tmp_path / "wh", spark=open_spark, local_rows=3
    )
    small = engine.step({"words": [(("to",), 1), (("be",), 1)]})
    assert {unit.tier for unit in small.report.units} == {"local"}
    assert all("ran on the local tier" in unit.describe() for unit in small.report.units)
    # Each unit's wall time is reported (the bench breaks an epoch's time down by it).
    assert all(unit.seconds > 0 for unit in small.report.units)
    assert small.report.close_seconds > 0
    assert not opened and not engine.spark_started
    words = [((w,), 1) for w in ("or", "not", "to", "be")]
    large = engine.step({"words": words})
    assert {unit.tier for unit in large.report.units} == {"spark"}
    assert opened == [1] and engine.spark_started
    assert dict(engine.view("counts").items()) == {
        ("to", 2): 1,
        ("be", 2): 1,
        ("or", 1): 1,
        ("not", 1): 1,
    }


def test_either_tier_recognises_the_other_tiers_committed_batch(spark: Any, tmp_path: Path) -> None:
    """An ingest re-run after its epoch committed is checked by fingerprint: the Spark tier
    (a Spark job) and the local tier (NumPy) must fingerprint the same rows alike, NULLs,
    NaN and -0.0 included."""
    import pytest

    from dbspark.circuit.builder import Circuit
    from dbspark.engine.api import InputError

    def circuit() -> Circuit:
        c = Circuit("fingerprints")
        rows = c.zset_source("rows", {"k": "bigint", "x": "double", "s": "string", "b": "boolean"})
        c.view("present", rows.distinct())
        return c

    batch = [
        ((1, 2.5, "a", True), 1),
        ((2, None, None, None), 3),
        ((None, float("nan"), "ß", False), -1),
        ((4, -0.0, "", True), 2),
    ]
    for first, again in ((0, None), (None, 0)):
        warehouse = tmp_path / f"wh{first}"
        SparkEngine(circuit(), warehouse, spark=spark, local_rows=first).step({"rows": batch})
        rerun = SparkEngine(circuit(), warehouse, spark=spark, local_rows=again)
        report = rerun.ingest("rows", 0, batch)
        assert report.skipped and report.note == "same batch as committed"
        with pytest.raises(InputError, match="already ingested a different batch"):
            rerun.ingest("rows", 0, batch[:-1])


def test_a_small_parquet_landing_is_read_without_spark(spark: Any, tmp_path: Path) -> None:
    """A landed Parquet batch under ``local_rows`` is read and checked in this process (what
    lets a small epoch's Airflow ingest task start no JVM); a larger one goes to Spark."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from dbspark.engine.file_batches import FileBatch

    opened, open_spark = _opener(spark)

    def landed(name: str, words: list[str]) -> FileBatch:
        path = tmp_path / f"{name}.parquet"
        pq.write_table(pa.table({"word": pa.array(words, pa.string())}), path)
        return FileBatch(path, "parquet")

    engine = SparkEngine(
        NAMED_CIRCUITS["word_count"](), tmp_path / "wh", spark=open_spark, local_rows=3
    )
    small = engine.step({"words": landed("small", ["to", "be"])})
    assert {unit.tier for unit in small.report.units} == {"local"}
    assert not opened and not engine.spark_started
    large = engine.step({"words": landed("large", ["or", "not", "to", "be"])})
    assert {unit.tier for unit in large.report.units} == {"spark"}
    assert opened == [1]
    assert dict(engine.view("counts").items()) == {
        ("to", 2): 1,
        ("be", 2): 1,
        ("or", 1): 1,
        ("not", 1): 1,
    }


def test_a_warmed_engine_answers_its_first_epoch_from_memory(tmp_path: Path) -> None:
    """``warm()`` loads every live trace (a long-lived worker's start): the next epoch's
    lookups decode no file, and its views are those of an engine that reads its files."""
    from dbspark.engine.reference.engine import ReferenceEngine

    def customer(cust_id: int, region: str, ts: int) -> tuple:
        return (cust_id, region, ts, False)

    def order(order_id: int, cust_id: int, amount: int, ts: int) -> tuple:
        return (order_id, cust_id, amount, ts, None)

    history = [
        {
            "customers": [customer(i, "EU" if i % 2 else "US", 1) for i in range(6000)],
            "orders": [order(i, i % 6000, i % 97, 1) for i in range(9000)],
        },
        {"customers": [customer(3, "APAC", 2)], "orders": [order(5, 4, 1000, 2)]},
        {"orders": [order(7, 3, 1, 3), order(8, 5999, 2, 3)]},
    ]
    reference = ReferenceEngine(NAMED_CIRCUITS["orders"]())
    first = SparkEngine(NAMED_CIRCUITS["orders"](), tmp_path / "wh", resident_bytes=0)
    first.step(history[0])
    reference.step(history[0])
    assert len(first.local.resident) == 0  # keeps nothing across epochs

    worker = SparkEngine(NAMED_CIRCUITS["orders"](), tmp_path / "wh")
    assert worker.warm() > 0
    for epoch, inputs in enumerate(history[1:], start=1):
        loaded = worker.local.resident.loads
        worker.run_epoch(epoch, inputs)
        assert worker.local.resident.loads == loaded  # every lookup answered in memory
        expected = reference.step(inputs).views
        assert worker.views() == expected  # (reading the published views decodes them)
    assert not worker.spark_started


def test_a_small_json_lines_landing_is_read_without_spark(spark: Any, tmp_path: Path) -> None:
    """JSON lines are read on the local tier (``engine/local/jsonl.py``); a compressed
    file, or a source with an array of DATE, TIMESTAMP or DECIMAL, is Spark's."""
    import gzip

    from dbspark.core.types import Schema
    from dbspark.engine.file_batches import FileBatch
    from dbspark.engine.local.files import read_files
    from dbspark.engine.local.jsonl import jsonl_readable

    opened, open_spark = _opener(spark)
    engine = SparkEngine(
        NAMED_CIRCUITS["word_count"](), tmp_path / "wh", spark=open_spark, local_rows=100
    )
    landing = tmp_path / "words.jsonl"
    landing.write_text('{"word": "to"}\r\n\n  \n{"word": "be", "__w": 2}\n{"word": "to"}')
    engine.run_epoch(0, {"words": FileBatch(landing, "jsonl")})
    assert not opened and not engine.spark_started
    assert dict(engine.view("counts").items()) == {("to", 2): 1, ("be", 2): 1}

    schema = Schema((("word", "string"),))
    zipped = tmp_path / "words.jsonl.gz"
    zipped.write_bytes(gzip.compress(b'{"word": "or"}\n'))
    batch = FileBatch(zipped, "jsonl")
    assert read_files("words", schema, batch, weighted=True, upsert=None, max_rows=100) is None
    assert jsonl_readable(Schema((("day", "date"), ("at", "timestamp"), ("p", "decimal(10,2)"))))
    assert not jsonl_readable(Schema((("days", "array<date>"),)))
    assert not jsonl_readable(Schema((("prices", "array<decimal(10,2)>"),)))
    assert jsonl_readable(Schema((("tags", "array<string>"), ("n", "bigint"), ("x", "double"))))


def _typed_circuit() -> Any:
    from dbspark.circuit.builder import Circuit

    c = Circuit("typed_json")
    columns = {
        "id": "bigint",
        "day": "date",
        "at": "timestamp",
        "price": "decimal(10,2)",
        "ts": "bigint",
    }
    items = c.upsert_source("items", columns, key="id", watermark="ts")
    c.view("items_now", items.select("id", "day", "at", "price"))
    return c


#: Lines whose DATE, TIMESTAMP and DECIMAL values only one reading can give: the local
#: tier reads them. ``price`` arrives as a string, an integer and a number with a fraction.
TYPED_LINES = [
    '{"id": 1, "day": "2026-03-08", "at": "2026-03-08T01:30:00-05:00", "price": "12.5", "ts": 1}',
    '{"id": 2, "day": "1999-12-31", "at": "2026-03-08 07:00:00.25Z", "price": 7, "ts": 1}',
    '{"id": 3, "day": null, "at": "1999-12-31T23:00:00+14:00", "price": -0.05, "ts": 1}',
    '{"id": 4, "ts": 1}',
]


def test_json_dates_instants_and_decimals_read_locally_as_spark_reads_them(
    spark: Any, tmp_path: Path
) -> None:
    """A DATE, TIMESTAMP or DECIMAL in JSON lines is read on the local tier when its text
    has one reading, and that reading is Spark's: the same landing on the Spark tier
    gives the same view. A value in any other form (a date without leading zeros, an
    instant without a zone, more decimal places than the scale) hands the batch to
    Spark, which reads it (or refuses it) as before; a JSON type the column never takes
    (a number with an exponent for a DECIMAL) is refused here in Spark's words."""
    from dbspark.engine.file_batches import FileBatch

    def landed(name: str, lines: list[str]) -> FileBatch:
        path = tmp_path / f"{name}.jsonl"
        path.write_text("\n".join(lines) + "\n")
        return FileBatch(path, "jsonl")

    opened, open_spark = _opener(spark)
    local = SparkEngine(_typed_circuit(), tmp_path / "local", spark=open_spark, local_rows=100)
    on_spark = SparkEngine(_typed_circuit(), tmp_path / "spark", spark=spark, local_rows=0)
    local.step({"items": landed("typed", TYPED_LINES)})
    assert not opened and not local.spark_started
    on_spark.step({"items": landed("typed", TYPED_LINES)})
    expected = dict(on_spark.view("items_now").items())
    assert dict(local.view("items_now").items()) == expected
    assert len(expected) == 4

    cases = [  # (a value, whether Spark reads the batch)
        ('"day": "2026-3-8"', True),
        ('"at": "2026-03-08T01:30:00"', True),
        ('"price": "12.345"', True),
        ('"price": 1e2', False),
    ]
    for n, (value, sparks) in enumerate(cases):
        batch = landed(f"other{n}", [f'{{"id": 9, {value}, "ts": 2}}'])
        engines = [
            SparkEngine(_typed_circuit(), tmp_path / f"{tier}{n}", spark=opener, local_rows=rows)
            for tier, opener, rows in (("local", open_spark, 100), ("spark", spark, 0))
        ]
        before = len(opened)
        local_outcome = _outcome(engines[0], batch)
        assert local_outcome == _outcome(engines[1], batch), value
        assert len(opened) == before + sparks, value
    assert local_outcome[0] == "InputError" and "is DECIMAL(10,2), got 100.0" in local_outcome[1]


def _outcome(engine: SparkEngine, batch: Any) -> tuple[str, Any]:
    """The view after an epoch of ``batch``, or the error that refused it."""
    try:
        engine.step({"items": batch})
    except Exception as error:  # the Spark tier's words, whichever tier met the batch
        return type(error).__name__, str(error)
    return "view", dict(engine.view("items_now").items())


def test_a_small_log_is_verified_in_this_process_and_both_tiers_name_the_same_rows(
    spark: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    import pyarrow as pa

    from dbspark.engine.spark import views

    opened, open_spark = _opener(spark)
    circuit = NAMED_CIRCUITS["orders"]()
    engine = SparkEngine(circuit, tmp_path / "wh", spark=open_spark)
    engine.step({"customers": [(7, "EU", 1, False)], "orders": [(1, 7, 50, 1, None)]})
    engine.step({"orders": [(1, 7, 70, 2, None), (2, 7, 20, 1, None)]})
    assert engine.verify_tier() == "local"
    assert engine.verify() == {name: [] for name in circuit.views}
    assert not opened  # the reference engine recomputed the views in this process

    # One bogus committed row in a view's storage: each tier names it, and only it.
    bogus = pa.table({"order_id": [9], "cust_id": [7], "amount": [1], "__epoch": [1], "__w": [1]})
    record = engine.local.write_table(bogus, circuit.name, "view.orders_current", "trace", (1,))
    engine.catalog.commit(circuit.name, "damage", (1,), [record])
    wrong = {name: [] for name in circuit.views} | {"orders_current": [(9, 7, 1, -1)]}
    assert engine.verify() == wrong
    assert engine.verify(tier="spark") == wrong
    assert opened == [1]

    monkeypatch.setattr(views, "REFERENCE_VERIFY_ROWS", 3)  # the log holds 4 rows
    assert engine.verify_tier() == "spark"
    assert SparkEngine(circuit, tmp_path / "wh", spark=spark, local_rows=0).verify_tier() == (
        "spark"
    )


def test_an_epoch_leaves_the_garbage_collector_as_it_found_it(tmp_path: Path) -> None:
    """An epoch freezes the objects older than itself (``_young_objects_only``), and
    unfreezes them when it ends, whether it commits or fails: frozen for good, their
    cyclic garbage would never be collected."""
    import gc

    import pytest

    from dbspark.engine.api import InputError

    engine = SparkEngine(NAMED_CIRCUITS["word_count"](), tmp_path / "wh")
    frozen = []
    original = engine.ingest

    def ingest(*args: Any, **kwargs: Any) -> Any:
        frozen.append(gc.get_freeze_count())
        return original(*args, **kwargs)

    engine.ingest = ingest  # type: ignore[method-assign]
    engine.step({"words": [(("to",), 1)]})
    assert frozen and frozen[0] > 0  # older objects were frozen during the epoch
    assert gc.get_freeze_count() == 0
    with pytest.raises(InputError):
        engine.step({"words": [(("to", "many"), 1)]})
    assert gc.get_freeze_count() == 0
    assert engine.last_committed_epoch() == 0  # the bad epoch committed nothing


def test_with_the_local_tier_off_small_batches_and_merges_stay_on_the_driver(
    spark: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    """``local_rows=0`` runs every unit on Spark; a Z-set batch known to hold at most
    ``driver_rows`` rows is still written from the driver (as an upsert batch is), and a
    compaction merge of at most ``driver_rows`` rows is rewritten in this process: no
    Spark write and no Spark merge. ``driver_rows=0`` sends both to Spark, with the
    same answers."""
    from dbspark.storage import traces, warehouse

    monkeypatch.setenv("DBSPARK_COMPACTION_FANOUT", "2")  # merges within four epochs
    calls: dict[str, int] = {"write": 0, "merge": 0}

    def counting(name: str, original: Any) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return original(*args, **kwargs)

        return counted

    monkeypatch.setattr(
        warehouse, "_write_with_spark", counting("write", warehouse._write_with_spark)
    )
    monkeypatch.setattr(
        traces.TraceStore,
        "_merge_on_spark",
        counting("merge", traces.TraceStore._merge_on_spark),
    )
    epochs = [
        {"words": [(("to",), 1), (("be",), 1)]},
        {"words": [(("or",), 1), (("not",), 1)]},
        {"words": [(("to",), 1), (("be",), -1)]},
        {"words": [(("be",), 1)]},
    ]
    views = {}
    for driver_rows in (20_000, 0):
        calls.update(write=0, merge=0)
        engine = SparkEngine(
            NAMED_CIRCUITS["word_count"](),
            tmp_path / f"driver-{driver_rows}",
            spark=spark,
            local_rows=0,
            driver_rows=driver_rows,
        )
        for inputs in epochs:
            report = engine.step(inputs).report
            assert {unit.tier for unit in report.units} == {"spark"}
        runs = engine.catalog.stage_runs(engine.circuit.name)
        assert any(stage.startswith("compact:") for stage, _ in runs), "nothing merged"
        views[driver_rows] = dict(engine.view("counts").items())
        if driver_rows:
            assert calls == {"write": 0, "merge": 0}
        else:
            assert calls["write"] > 0 and calls["merge"] > 0
    assert views[20_000] == views[0] == {("to", 2): 1, ("or", 1): 1, ("not", 1): 1, ("be", 1): 1}
