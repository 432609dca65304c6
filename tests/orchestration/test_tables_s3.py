"""Published tables on object storage: ``[dbspark] table_location = s3://...``, against
moto's S3 in server mode, started here on a free loopback port (a real HTTP server:
delta-rs talks to it as to any S3 endpoint).

The endpoint, region and timeouts are the location's storage options (settings); the
credentials are the publishing process's ``AWS_*`` environment, which delta-rs reads
itself, as it would an instance role's. The warehouse and the change feed stay on the
local (shared) filesystem.
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from dbspark.core.columns import COPIES, WEIGHT
from dbspark.core.types import Schema
from dbspark.core.zset import ZSet
from dbspark.engine.local.tier import arrow_schema
from dbspark.engine.reference.full_refresh import full_refresh
from dbspark.examples.circuits import orders
from dbspark.orchestration.sinks.files import CHANGES, output_dir
from dbspark.orchestration.sinks.serving import ServingTarget, catch_up
from dbspark.orchestration.sinks.tables import (
    EPOCH_KEY,
    TableError,
    TableSettings,
    publish_table,
    read_table,
    replace_table,
    table_columns,
    table_exists,
    table_path,
    table_versions,
)
from tests.moto_s3 import BUCKET, S3

#: Two epochs of the orders circuit (as in test_publish_kills.py).
BATCHES = [
    {
        "customers": [(1, "EU", 1, False), (2, "US", 1, False), (3, "EU", 1, False)],
        "orders": [(10, 1, 5, 1, None), (11, 2, 7, 1, None), (12, 3, 4, 1, None)],
    },
    {
        "customers": [(1, "US", 2, False)],
        "orders": [(11, 2, 7, 2, 2), (13, 1, 9, 2, None)],
    },
]
SCHEMA = Schema.of({"k": "bigint", "s": "string"}, what="test")


def change(rows: list[tuple[tuple[Any, ...], int]]) -> pa.Table:
    fields = [*SCHEMA.fields, (WEIGHT, "bigint")]
    return pa.table(
        {name: [(*row, w)[i] for row, w in rows] for i, (name, _) in enumerate(fields)},
        schema=arrow_schema(fields),
    )


def publish_rows(
    path: str, settings: TableSettings, epoch: int, rows: list[Any], **kwargs: Any
) -> Any:
    """``publish_table`` of view ``v`` of circuit ``c`` (``SCHEMA``): ``rows`` as the
    epoch's change."""
    arguments = {"whole_view": lambda: change([]), "settings": settings, **kwargs}
    return publish_table(
        path,
        circuit="c",
        view="v",
        schema=SCHEMA,
        epoch=epoch,
        change=change(rows),
        **arguments,
    )


def as_zset(table: pa.Table, schema: Schema) -> ZSet:
    return ZSet(
        (tuple(record[name] for name in schema.names), record[COPIES])
        for record in table.to_pylist()
    )


def epoch_commits(path: str, epoch: int, options: dict[str, str]) -> int:
    history = DeltaTable(path, storage_options=options).history()
    return sum(1 for commit in history if commit.get(EPOCH_KEY) == epoch)


def no_spark() -> None:
    raise RuntimeError("this small epoch should not need Spark")


def run_and_publish(
    engine: Any, epoch: int, batch: dict[str, Any], outputs: Path, configured: dict[str, str]
) -> dict[str, Any]:
    """One epoch of ``engine`` on the local tier, published by ``PublishUnit`` with the
    ``[dbspark]`` table settings ``configured``; each view's publish event."""
    from dbspark.orchestration.units import CloseUnit, PublishUnit

    assert engine.open_epoch(epoch)
    checked = {name: engine.check_batch(name, rows) for name, rows in batch.items()}
    for stage in engine.plan.stages_in_scope(0):
        anchor = engine.circuit.node(stage.anchor)
        if anchor.op in ("zset_source", "upsert_source"):
            engine.ingest(anchor.label, epoch, checked.get(anchor.label))
        else:
            engine.run_stage(stage.id, (epoch,))
    result = PublishUnit(epoch, str(outputs), tables=configured).run(engine)
    CloseUnit(epoch).run(engine)
    return result["views"]


def test_the_orders_circuit_publishes_its_tables_to_s3(s3: S3, spark: Any, tmp_path: Path) -> None:
    """Two epochs of the orders circuit on the local tier, published by ``PublishUnit``
    with ``[dbspark] table_location`` and ``table_storage_options`` set: each view's
    table is in the bucket and reads as the full refresh as of each epoch; the change
    feed is in the local outputs, and no table is there."""
    from dbspark.engine.spark.executor import SparkEngine

    circuit = orders()
    outputs = tmp_path / "out"
    location = f"s3://{BUCKET}/published"
    configured = {
        "table_location": location,
        "table_storage_options": json.dumps(s3.options()),
    }
    engine = SparkEngine(circuit, tmp_path / "wh", spark=no_spark)
    for epoch, batch in enumerate(BATCHES):
        published = run_and_publish(engine, epoch, batch, outputs, configured)
        for view, event in published.items():
            assert event["table"] == f"{location}/orders/{view}/table"
            assert event["table_version"] == epoch

    expected = [full_refresh(circuit, BATCHES[: epoch + 1], epoch) for epoch in (0, 1)]
    options = s3.options()
    for view in circuit.views:
        schema = circuit.node(circuit.views[view]).schema
        path = table_path(location, "orders", view)
        assert path == f"{location}/orders/{view}/table"
        for epoch in (0, 1):
            table = read_table(path, epoch, storage_options=options)
            assert as_zset(table, schema) == expected[epoch][view], (view, epoch)
            assert epoch_commits(path, epoch, options) == 1
        assert (output_dir(outputs, "orders", view, CHANGES, 1) / "_dbspark.json").exists()
        assert not (outputs / "orders" / view / "table").exists()

    # Spark reads a table in the bucket too (through the driver: no S3 connector).
    from dbspark.orchestration.sinks.tables import spark_table

    frame = spark_table(
        spark, table_path(location, "orders", "region_totals"), 0, storage_options=options
    )
    schema = circuit.node(circuit.views["region_totals"]).schema
    assert as_zset(frame.toArrow(), schema) == expected[0]["region_totals"]

    # A fresh serving table is loaded from the view's table in the bucket (the serve
    # task's catch-up, with the same settings).
    serving = ServingTarget(f"sqlite:///{tmp_path / 'serving.db'}")
    schemas = {view: circuit.node(node).schema for view, node in circuit.views.items()}
    tables = TableSettings.from_environment(configured)
    results = catch_up(serving, "orders", schemas, outputs, 1, tables=tables, max_replay=0)
    for view, schema in schemas.items():
        assert results[view].epoch == 1
        assert ZSet(serving.contents("orders", view, schema)) == expected[1][view], view


def test_an_unreachable_s3_location_fails_the_publish_clearly_and_a_retry_completes(
    s3: S3, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the server stopped, a merge and a first load each fail within the
    timeouts, saying which view, epoch and location, and that nothing was committed;
    started again, the retry commits the epoch once."""
    monkeypatch.setenv("DBSPARK_TABLE_LOCATION", f"s3://{BUCKET}/views")
    monkeypatch.setenv("DBSPARK_TABLE_STORAGE_OPTIONS", json.dumps(s3.options()))
    settings = TableSettings.from_environment()
    assert settings.location == f"s3://{BUCKET}/views"
    assert settings.location is not None
    path = table_path(settings.location, "c", "v")
    options = settings.storage_options

    def publish(epoch: int, rows: Any, **kwargs: Any) -> Any:
        return publish_rows(path, settings, epoch, rows, **kwargs)

    epochs = [[((1, "a"), 1), ((2, "b"), 2)], [((1, "a"), -1), ((3, None), 1)]]
    for epoch, rows in enumerate(epochs):
        publish(epoch, rows)
    third = [((2, "b"), -1), ((4, "d"), 1)]

    s3.stop()
    start = time.monotonic()
    with pytest.raises(TableError) as failed:
        publish(2, third)
    message = str(failed.value)
    assert message.startswith(
        f"could not read the table of view 'v' at {path} to publish epoch 2 (nothing was "
        f"committed; a retry publishes it): "
    ), message
    assert f"127.0.0.1:{s3.port}" in message and "\x1b[" not in message
    assert time.monotonic() - start < 30

    s3.start()
    assert publish(2, third).version == 2
    assert publish(2, third).skipped  # a second retry finds it committed
    assert table_versions(path, storage_options=options) == {0: 0, 1: 1, 2: 2}
    assert epoch_commits(str(path), 2, options) == 1
    want = ZSet(epochs[0]) + ZSet(epochs[1]) + ZSet(third)
    assert as_zset(read_table(path, storage_options=options), SCHEMA) == want

    # Three publishers of epoch 3 at once end as one commit on S3 too (delta-rs's
    # commit there is a put that fails when the log entry exists).
    fourth = [((4, "d"), 1), ((5, "e"), 1)]
    start = threading.Barrier(3)

    def racer(_: int) -> Any:
        start.wait()
        return publish(3, fourth)

    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(racer, range(3)))
    assert sorted(r.skipped for r in results) == [False, True, True]
    assert epoch_commits(str(path), 3, options) == 1
    want = want + ZSet(fourth)
    assert as_zset(read_table(path, storage_options=options), SCHEMA) == want

    # A table first published at a later epoch: the server goes away between the
    # check and the load (while the whole view is read), so the commit itself fails.
    other = table_path(settings.location, "c", "w")

    def whole_view_while_the_store_goes_away() -> pa.Table:
        s3.stop()
        return change([((9, "z"), 1)])

    with pytest.raises(TableError) as failed:
        publish_table(
            other,
            circuit="c",
            view="w",
            schema=SCHEMA,
            epoch=5,
            change=change([]),
            whole_view=whole_view_while_the_store_goes_away,
            settings=settings,
        )
    message = str(failed.value)
    assert message.startswith(
        f"could not commit epoch 5 of view 'w' to its table at {other}, nor check whether "
        f"the attempt landed (the store did not answer); a retry publishes the epoch once, "
        f"or finds it published: "
    ), message
    s3.start()
    loaded = publish_table(
        other,
        circuit="c",
        view="w",
        schema=SCHEMA,
        epoch=5,
        change=change([]),
        whole_view=lambda: change([((9, "z"), 1)]),
        settings=settings,
    )
    assert loaded.loaded and table_versions(other, storage_options=options) == {5: 0}


def test_a_view_given_other_columns_replaces_its_s3_table_in_one_commit(s3: S3) -> None:
    """A view an evolution gave another column (``evolve_outputs``): its table on S3
    is overwritten by one commit in the new columns that still holds the epoch, so the
    next epoch follows it; the epoch before reads in the old columns (time travel), and
    a retry changes nothing."""
    settings = TableSettings(location=f"s3://{BUCKET}/evolved", storage_options=s3.options())
    path = table_path(settings.location, "c", "v")
    for epoch, rows in enumerate([[((1, "x"), 1)], [((2, "y"), 2)]]):
        publish_rows(path, settings, epoch, rows)
    wider = Schema.of({"k": "bigint", "s": "string", "n": "bigint"}, what="test")
    rows = pa.table(
        {"k": [1, 2], "s": ["x", "y"], "n": [10, 20], WEIGHT: [1, 2]},
        schema=arrow_schema([*wider.fields, (WEIGHT, "bigint")]),
    )

    def replace() -> Any:
        return replace_table(
            path, circuit="c", view="v", schema=wider, epoch=1, rows=rows, settings=settings
        )

    assert replace().loaded
    options = settings.options
    assert table_columns(path, storage_options=options) == ["k", "s", "n", COPIES]
    assert as_zset(read_table(path, storage_options=options), wider) == ZSet(
        [((1, "x", 10), 1), ((2, "y", 20), 2)]
    )
    assert as_zset(read_table(path, 0, storage_options=options), SCHEMA) == ZSet([((1, "x"), 1)])
    assert replace().skipped
    publish_table(
        path,
        circuit="c",
        view="v",
        schema=wider,
        epoch=2,
        change=pa.table(
            {"k": [3], "s": ["z"], "n": [30], WEIGHT: [1]},
            schema=arrow_schema([*wider.fields, (WEIGHT, "bigint")]),
        ),
        whole_view=lambda: rows,
        settings=settings,
    )
    assert sorted(table_versions(path, storage_options=options)) == [0, 1, 2]
    assert len(read_table(path, 1, storage_options=options)) == 2


def test_credentials_are_refused_as_table_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DBSPARK_TABLE_STORAGE_OPTIONS", json.dumps({"AWS_SECRET_ACCESS_KEY": "x"}))
    with pytest.raises(
        ValueError, match=r"'AWS_SECRET_ACCESS_KEY' is a credential: .* environment"
    ):
        TableSettings.from_environment()
    with pytest.raises(
        ValueError, match=r"\[dbspark\] table_storage_options must be a JSON object"
    ):
        TableSettings.from_environment({"table_storage_options": "region=eu"})
    monkeypatch.delenv("DBSPARK_TABLE_STORAGE_OPTIONS")
    assert TableSettings.from_environment(
        {"table_storage_options": '{"timeout": 30, "AWS_ALLOW_HTTP": true}'}
    ).storage_options == {"timeout": "30", "AWS_ALLOW_HTTP": "true"}


def test_a_removed_view_retires_its_s3_table_and_a_view_added_again_starts_anew(
    s3: S3, spark: Any, tmp_path: Path
) -> None:
    """An evolution that removes ``region_totals`` moves its table on S3 under
    ``_retired/`` (where it still reads as of the epochs it held) as it moves the local
    outputs; a move cut short is completed by a retry. Added back later, the view
    starts a table of its own at its old place, loaded at the epoch it came back."""
    from dbspark.engine.spark.executor import SparkEngine
    from dbspark.orchestration.sinks.tables import retire_table
    from dbspark.orchestration.units import EvolveUnit, execute_unit

    location = f"s3://{BUCKET}/evolving"
    configured = {"table_location": location, "table_storage_options": json.dumps(s3.options())}
    options = s3.options()
    root, outputs = tmp_path / "wh", tmp_path / "out"
    engine = SparkEngine(orders(), root, spark=no_spark)
    for epoch, batch in enumerate(BATCHES):
        run_and_publish(engine, epoch, batch, outputs, configured)
    engine.catalog.close()
    before = full_refresh(orders(), BATCHES, 1)["region_totals"]
    totals = orders().node(orders().views["region_totals"]).schema

    # A move cut short: one log entry went, the rest did not.
    place = table_path(location, "orders", "region_totals")
    retired = f"{location}/orders/_retired/region_totals@epoch=1/table"
    client = s3.client()
    logged = client.list_objects_v2(
        Bucket=BUCKET, Prefix="evolving/orders/region_totals/table/_delta_log/"
    )["Contents"]
    assert len(logged) == 2
    key = logged[0]["Key"]
    client.copy_object(
        Bucket=BUCKET,
        Key=key.replace("orders/region_totals/", "orders/_retired/region_totals@epoch=1/"),
        CopySource={"Bucket": BUCKET, "Key": key},
    )
    client.delete_object(Bucket=BUCKET, Key=key)

    without = SparkEngine(orders(totals=False), root, spark=no_spark, evolve=True)
    unit = EvolveUnit(-1, outputs=str(outputs), tables=configured)
    said = execute_unit(without, unit)["outputs"]
    assert said == {
        "region_totals": "removed: outputs moved to "
        f"{outputs / 'orders' / '_retired' / 'region_totals@epoch=1'} and "
        f"{location}/orders/_retired/region_totals@epoch=1"
    }
    assert not table_exists(place, storage_options=options)
    assert as_zset(read_table(retired, 1, storage_options=options), totals) == before
    assert retire_table(location, "orders", "region_totals", 1, storage_options=options) is None
    run_and_publish(without, 2, {}, outputs, configured)
    without.catalog.close()

    # Added back, the view is rebuilt from the raw input log (on Spark).
    again = SparkEngine(orders(), root, spark=lambda: spark, evolve=True)
    said = execute_unit(again, EvolveUnit(-1, outputs=str(outputs), tables=configured))
    assert said["outputs"]["region_totals"].startswith("added:")
    assert table_versions(place, storage_options=options) == {2: 0}
    later = {"customers": [(4, "EU", 3, False)], "orders": [(14, 4, 6, 3, None)]}
    run_and_publish(again, 3, later, outputs, configured)
    expected = full_refresh(orders(), [*BATCHES, {}, later], 3)["region_totals"]
    assert as_zset(read_table(place, 3, storage_options=options), totals) == expected
    again.catalog.close()
