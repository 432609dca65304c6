"""Upsert ingest decided on the driver (small batches), in Spark and on the local tier:
one answer, one error.

``engine/spark/upserts.py`` has two ways to turn a batch of upserts into the state
delta, and the local tier a third (the same set-based kernels on DuckDB for Arrow
batches, core's rule for Python rows). The same history goes through an engine that
keeps everything in Spark (``driver_rows=0``), one that decides small batches on the
driver, and local ones fed Python rows and Arrow tables; after every epoch all must hold
the reference engine's views, and a bad batch must be refused by each with the same
error class, the same kind of problem and the same keys, leaving the epoch uncommitted.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dbspark.circuit.builder import Circuit
from dbspark.core.upsert import BadUpsertRow, UpsertConflict
from dbspark.engine.api import InputError
from dbspark.engine.local.tier import arrow_table
from dbspark.engine.reference.engine import ReferenceEngine
from dbspark.engine.spark.executor import SparkEngine
from dbspark.engine.spark.upserts import DRIVER_ROWS, default_driver_rows


def readings() -> Circuit:
    """A composite key, a nullable composite watermark, a boolean tombstone and doubles."""
    c = Circuit("readings")
    rows = c.upsert_source(
        "readings",
        {
            "site": "string",
            "sensor": "bigint",
            "value": "double",
            "major": "bigint",
            "minor": "bigint",
            "gone": "boolean",
        },
        key=("site", "sensor"),
        watermark=("major", "minor"),
        tombstone="gone",
    )
    c.view("current", rows.select("site", "sensor", "value"))
    return c


NAN = float("nan")
HISTORY: list[list[tuple[Any, ...]]] = [
    [
        ("a", 1, 1.5, 1, 0, False),
        ("a", 2, NAN, 1, 0, False),
        ("b", 1, -0.0, None, 0, None),  # a NULL watermark is the smallest
        ("b", 1, -0.0, None, 0, None),  # an exact duplicate is harmless
    ],
    [
        ("a", 1, 2.5, 2, 0, False),  # newer: replaces
        ("a", 2, NAN, 1, 0, False),  # a resend of the stored version (NaN equals NaN)
        ("b", 1, 9.0, 1, None, False),  # (1, NULL) beats (NULL, 0)
        ("c", 7, 3.0, 1, 0, True),  # a tombstone for a key never seen
    ],
    [
        ("a", 1, 0.5, 1, 9, False),  # stale: (1, 9) < (2, 0)
        ("a", 2, 4.0, 1, 1, True),  # deletes
        ("c", 7, 5.0, 2, 0, False),  # comes back after its tombstone
    ],
]
BAD_BATCHES: list[tuple[list[tuple[Any, ...]], type, str, set[tuple]]] = [
    ([("a", None, 1.0, 5, 0, False), ("z", 1, 1.0, 5, 0, False)], BadUpsertRow, "NULL in", set()),
    (
        [("z", 1, 1.0, 5, 0, False), ("z", 1, 2.0, 5, 0, False)],
        UpsertConflict,
        "same watermark in one batch",
        {("z", 1)},
    ),
    (
        [("z", 2, 1.0, 5, 0, False), ("c", 7, 6.0, 2, 0, False)],
        UpsertConflict,
        "same watermark as the stored version",
        {("c", 7)},
    ),
]


def normal(rows: Any) -> list[tuple]:
    """Rows comparable across engines: every NaN the same string."""
    return sorted(
        (tuple("NaN" if isinstance(v, float) and math.isnan(v) else v for v in row), w)
        for row, w in rows.items()
    )


def every_path(
    circuit: Callable[[], Circuit], source: str, spark: Any, tmp_path: Path
) -> tuple[dict[str, SparkEngine], Callable[[str, list[tuple]], Any]]:
    """An engine for each way an upsert batch is decided, by name, and a function that
    gives a batch of rows in the form each engine is fed."""
    engines = {
        "in-spark": SparkEngine(
            circuit(), tmp_path / "spark", spark=spark, driver_rows=0, local_rows=0
        ),
        "on-driver": SparkEngine(circuit(), tmp_path / "driver", spark=spark, local_rows=0),
        "local-tier": SparkEngine(circuit(), tmp_path / "local", spark=spark),
        # Arrow batches are decided set-based on DuckDB (kernels.upsert_delta), with no
        # trip through Python rows; core's rule words their errors.
        "local-arrow": SparkEngine(circuit(), tmp_path / "arrow", spark=spark),
    }
    fields = circuit().node(circuit().sources[source]).params["user_schema"].fields

    def given(name: str, batch: list[tuple]) -> Any:
        return arrow_table(batch, fields) if name == "local-arrow" else batch

    return engines, given


@pytest.mark.slow
def test_driver_and_spark_decide_every_batch_alike(spark, tmp_path: Path) -> None:
    reference = ReferenceEngine(readings())
    engines, given = every_path(readings, "readings", spark, tmp_path)

    for epoch, batch in enumerate(HISTORY):
        expected = normal(reference.step({"readings": batch}).views["current"])
        for name, engine in engines.items():
            got = normal(engine.step({"readings": given(name, batch)}).views["current"])
            assert got == expected, f"{name} at epoch {epoch}"
    for batch, error, phrase, keys in BAD_BATCHES:
        for name, engine in engines.items():
            with pytest.raises(error, match=phrase) as raised:
                engine.step({"readings": given(name, batch)})
            if keys:
                assert set(raised.value.keys) == keys, name
            assert engine.last_committed_epoch() == len(HISTORY) - 1, name
    # After the refusals both still continue from the same state.
    last = [("a", 2, 7.0, 3, 0, False)]
    expected = normal(reference.step({"readings": last}).views["current"])
    for name, engine in engines.items():
        got = normal(engine.step({"readings": given(name, last)}).views["current"])
        assert got == expected, name
        assert not any(engine.verify().values()), name


def test_the_driver_row_limit_comes_from_the_environment(monkeypatch) -> None:
    monkeypatch.delenv("DBSPARK_DRIVER_ROWS", raising=False)
    assert default_driver_rows() == DRIVER_ROWS
    monkeypatch.setenv("DBSPARK_DRIVER_ROWS", "0")
    assert default_driver_rows() == 0
    monkeypatch.setenv("DBSPARK_DRIVER_ROWS", " 500 ")
    assert default_driver_rows() == 500
    for bad in ("-1", "many", "1.5"):
        monkeypatch.setenv("DBSPARK_DRIVER_ROWS", bad)
        with pytest.raises(
            ValueError, match=f"DBSPARK_DRIVER_ROWS must be an integer >= 0, got '{bad}'"
        ):
            default_driver_rows()


def test_the_local_tier_threshold_comes_from_the_environment(monkeypatch, tmp_path) -> None:
    from dbspark.engine.spark.executor import LOCAL_ROWS, default_local_rows

    monkeypatch.delenv("DBSPARK_LOCAL_ROWS", raising=False)
    assert default_local_rows() == LOCAL_ROWS
    monkeypatch.setenv("DBSPARK_LOCAL_ROWS", "0")
    assert default_local_rows() == 0
    engine = SparkEngine(readings(), tmp_path / "wh")
    assert engine.local_rows == 0
    report = engine.step({"readings": HISTORY[0]}).report
    assert {unit.tier for unit in report.units} == {"spark"}
    monkeypatch.setenv("DBSPARK_LOCAL_ROWS", "many")
    with pytest.raises(ValueError, match="DBSPARK_LOCAL_ROWS must be an integer >= 0"):
        default_local_rows()


def test_arrow_batches_on_either_tier(spark, tmp_path: Path) -> None:
    """An Arrow table is a batch like Python rows: small ones stay local, larger ones
    (past local_rows) go to Spark as a frame; both give the reference's view, and a bad
    Arrow batch (an unknown column) is refused before the epoch opens."""
    import pyarrow as pa

    fields = readings().node(readings().sources["readings"]).params["user_schema"].fields
    reference = ReferenceEngine(readings())
    small = SparkEngine(readings(), tmp_path / "small", spark=spark)
    large = SparkEngine(readings(), tmp_path / "large", spark=spark, local_rows=1)
    tiers = {"small": set(), "large": set()}
    for batch in HISTORY:
        expected = normal(reference.step({"readings": batch}).views["current"])
        for name, engine in (("small", small), ("large", large)):
            result = engine.step({"readings": arrow_table(batch, fields)})
            assert normal(result.views["current"]) == expected, name
            tiers[name] |= {u.tier for u in result.report.units if u.unit.startswith("ingest")}
    assert tiers == {"small": {"local"}, "large": {"spark"}}
    bad = pa.table({"nope": [1]})
    for engine in (small, large):
        with pytest.raises(InputError, match="readings"):
            engine.step({"readings": bad})


def test_a_typed_arrow_batch_is_taken_as_it_stands(tmp_path: Path) -> None:
    """An Arrow batch whose columns fit the declared types skips Python rows (the local
    tier decides it set-based); one that only Python's rules accept (whole numbers in a
    DOUBLE column, as BIGINT) takes the row path and is still accepted."""
    import pyarrow as pa

    from dbspark.engine.batches import CheckedTable

    def no_spark() -> Any:
        raise AssertionError("a small Arrow batch must not need Spark")

    engine = SparkEngine(readings(), tmp_path / "w", spark=no_spark)
    fields = readings().node(readings().sources["readings"]).params["user_schema"].fields
    typed = engine.check_batch("readings", arrow_table(HISTORY[0], fields))
    assert isinstance(typed, CheckedTable) and len(typed) == 4
    loose = pa.table(
        {
            "site": ["a"],
            "sensor": [1],
            "value": [3],  # BIGINT in a DOUBLE column
            "major": [1],
            "minor": [0],
            "gone": [False],
        }
    )
    checked = engine.check_batch("readings", loose)
    assert not isinstance(checked, CheckedTable)
    result = engine.step({"readings": loose})
    assert normal(result.views["current"]) == [(("a", 1, 3.0), 1)]


def events() -> Circuit:
    """A STRING watermark: ISO 8601 text, compared as text."""
    c = Circuit("events")
    rows = c.upsert_source(
        "events", {"id": "bigint", "at": "string", "what": "string"}, key="id", watermark="at"
    )
    c.view("current", rows.select("id", "what"))
    return c


def test_a_string_watermark_with_a_utc_offset_is_refused_on_every_path(
    spark, tmp_path: Path
) -> None:
    """Text orders instants only within one UTC offset, and local time changes offset at
    daylight saving: ``01:30-05:00`` sorts after ``03:30-04:00`` although it is earlier.
    So a STRING watermark that reads as a time with a non-zero offset is bad input on
    every path (core's rule, the set-based kernels on Spark and on the local tier);
    ``Z``, ``+00:00`` and text that is no time are taken."""
    reference = ReferenceEngine(events())
    engines, given = every_path(events, "events", spark, tmp_path)

    good = [
        (1, "2026-03-08T06:30:00Z", "a"),
        (2, "2026-03-08 07:30:00+00:00", "b"),
        (3, "batch-0007", "c"),
        (4, "2026-03-08T06:30:00-00:00", "d"),
    ]
    expected = normal(reference.step({"events": good}).views["current"])
    for name, engine in engines.items():
        assert normal(engine.step({"events": given(name, good)}).views["current"]) == expected
    bad = [(5, "2026-03-08T09:00:00Z", "e"), (6, "2026-03-08T01:30:00-05:00", "f")]
    with pytest.raises(BadUpsertRow, match="UTC offset other than zero"):
        reference.step({"events": bad})
    for name, engine in engines.items():
        with pytest.raises(BadUpsertRow, match="UTC offset other than zero") as raised:
            engine.step({"events": given(name, bad)})
        assert set(raised.value.keys) == {(6,)}, name
        assert engine.last_committed_epoch() == 0, name


@pytest.mark.parametrize("tier", ["local", "spark"])
def test_a_file_batch_is_looked_at_for_ties_once(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tier: str
) -> None:
    """A landed batch's NULL keys and ties are looked for when its files are read (before
    the epoch opens); ingest then looks only for what needs the stored state, the clash
    with a stored version, and the watermarks' forms. A batch handed over as an Arrow
    table is looked at once, at ingest, for everything."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from dbspark.engine import kernels
    from dbspark.engine.file_batches import FileBatch
    from dbspark.examples.circuits import NAMED_CIRCUITS

    asked: list[bool] = []
    original = kernels.upsert_problems

    def spy(*args: Any, within_batch: bool = True, **kwargs: Any) -> Any:
        asked.append(within_batch)
        return original(*args, within_batch=within_batch, **kwargs)

    monkeypatch.setattr(kernels, "upsert_problems", spy)

    def customers(rows: list[tuple]) -> pa.Table:
        names = ["cust_id", "region", "ts", "deleted"]
        types = [pa.int64(), pa.string(), pa.int64(), pa.bool_()]
        columns = zip(*rows, strict=True)
        return pa.table([pa.array(c, t) for c, t in zip(columns, types, strict=True)], names=names)

    def landed(name: str, rows: list[tuple]) -> FileBatch:
        path = tmp_path / f"{name}.parquet"
        pq.write_table(customers(rows), path)
        return FileBatch(path, "parquet")

    local_rows = 100 if tier == "local" else 0
    engine = SparkEngine(
        NAMED_CIRCUITS["orders"](),
        tmp_path / "wh",
        spark=lambda: spark,
        local_rows=local_rows,
        driver_rows=0,  # decided in Spark, where upsert_problems runs
    )
    empty_orders = {"orders": []}
    engine.run_epoch(0, {"customers": landed("e0", [(1, "EU", 1, False)]), **empty_orders})
    assert asked == [False]
    table = customers([(2, "US", 1, False)])
    engine.run_epoch(1, {"customers": table, **empty_orders})
    assert asked == [False, True]
    # The clash with the stored version is still found in a file batch.
    with pytest.raises(UpsertConflict, match="same watermark as the stored version"):
        engine.run_epoch(2, {"customers": landed("e2", [(1, "APAC", 1, False)]), **empty_orders})
    assert engine.last_committed_epoch() == 1


def test_a_spark_batch_past_the_driver_limit_records_the_whole_batchs_fingerprint(
    spark, tmp_path: Path
) -> None:
    """An upsert batch handed over as a Spark frame is first collected from the driver
    (at most ``driver_rows + 1`` rows); past the limit Spark writes it after all. The
    fingerprint the ingest records must be the whole batch's, or the same batch re-run
    (a retried task) is refused as a different one."""
    from dbspark.engine.spark.ingest import frame_fingerprint

    def circuit() -> Circuit:
        c = Circuit("past_the_limit")
        items = c.upsert_source(
            "items", {"k": "bigint", "v": "bigint", "ts": "bigint"}, key="k", watermark="ts"
        )
        c.view("items", items)
        return c

    rows = [(k, k * 3, 1) for k in range(50)]
    batch = spark.createDataFrame(rows, "k bigint, v bigint, ts bigint").repartition(4)
    warehouse = tmp_path / "wh"
    engine = SparkEngine(circuit(), warehouse, spark=spark, local_rows=0, driver_rows=10)
    engine.run_epoch(0, {"items": batch})
    unit = engine.plan.stage_of(engine.circuit.sources["items"]).name
    assert engine.catalog.input_fingerprint("past_the_limit", unit, (0,)) == frame_fingerprint(
        batch
    )
    again = SparkEngine(circuit(), warehouse, spark=spark, local_rows=0, driver_rows=10)
    report = again.ingest("items", 0, batch)
    assert report.skipped and report.note == "same batch as committed"
    assert dict(again.view("items").items()) == {row: 1 for row in rows}
