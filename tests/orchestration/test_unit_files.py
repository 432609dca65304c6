"""Unit files for spark-submit (issue 18, finding 12): JSON in a private directory,
naming connections instead of carrying their passwords, refused when anyone changed
them. (``test_spark_submit.py`` runs a whole epoch through spark-submit with them.)"""

from __future__ import annotations

import json
import stat
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path

import pytest

from dbspark.core.errors import InputError
from dbspark.engine.api import LoopDidNotConverge
from dbspark.engine.file_batches import FileBatch
from dbspark.engine.spark.executor import circuit_fingerprint
from dbspark.examples.circuits import word_count
from dbspark.orchestration.units import (
    TABLE_CREDENTIALS_VARIABLE,
    UNIT_KEY_VARIABLE,
    CircuitRecipe,
    EvolveUnit,
    IngestUnit,
    PublishUnit,
    RebuildUnit,
    ShippedUnit,
    UnitFileError,
    final_error,
    final_error_document,
    read_result_file,
    read_unit_file,
    result_path,
    run_unit_file,
    unit_directory,
    write_unit_file,
)
from dbspark.storage.catalog import CircuitDefinitionChanged, UncommittedUnits, UnsafeCatalog

KEY = bytes(range(32))
PASSWORD = "hunter2-do-not-ship"
ROWS = [
    (
        "a",
        1,
        2.5,
        float("nan"),
        Decimal("12.340"),
        date(2026, 3, 29),
        datetime(2026, 3, 29, 1, 30, tzinfo=UTC),
        datetime(2026, 3, 29, 3, 30, tzinfo=timezone(timedelta(hours=2))),
        None,
        True,
        ("x", None),
        [1, 2],
        b"\x00\xff",
        {"k": Decimal("1.5")},
    ),
]


def shipped(unit, **extra) -> ShippedUnit:
    return ShippedUnit(
        recipe=CircuitRecipe.of_factory(word_count),
        fingerprint=circuit_fingerprint(word_count()),
        unit=unit,
        warehouse="/warehouse",
        **extra,
    )


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_unit_directory_is_private_even_where_the_warehouse_is_shared(tmp_path):
    warehouse = tmp_path / "warehouse"
    (warehouse / "_units").mkdir(parents=True)
    # What docker-compose's init gives the shared volume, and older versions the folder.
    warehouse.chmod(0o2775)
    (warehouse / "_units").chmod(0o2775)
    folder = unit_directory(warehouse, "word_count")
    assert folder == warehouse / "_units" / "word_count"
    assert mode(folder) == 0o700 and mode(folder.parent) == 0o700
    path = write_unit_file(folder, shipped(IngestUnit(0, "words", ROWS)), KEY)
    assert mode(path) == 0o600 and path.parent == folder


def test_no_password_goes_into_the_file_and_every_value_comes_back(tmp_path):
    folder = unit_directory(tmp_path, "word_count")
    publish = PublishUnit(
        3,
        "/outputs",
        serving_url=f"postgresql://u:{PASSWORD}@db/serving",
        tables={"table_maintain_every": "2"},  # [dbspark] keys reach the driver
    )
    path = write_unit_file(
        folder, shipped(publish, catalog_conn_id="dbspark_catalog", serving_conn_id="s"), KEY
    )
    text = path.read_text()
    assert PASSWORD not in text and "postgresql://" not in text
    body = json.loads(text)["body"]
    assert body["connections"]["catalog"] == {
        "conn_id": "dbspark_catalog",
        "url_from": "DBSPARK_UNIT_CATALOG_URL",
    }
    back = read_unit_file(path, KEY)
    assert back.unit == PublishUnit(
        3, "/outputs", serving_url=None, tables={"table_maintain_every": "2"}
    )
    assert (back.catalog_conn_id, back.serving_conn_id) == ("dbspark_catalog", "s")
    # Rows keep their types (JSON has no DECIMAL, DATE, tuple...), NaN included.
    ingest = read_unit_file(
        write_unit_file(folder, shipped(IngestUnit(0, "words", ROWS)), KEY), KEY
    ).unit
    (row,) = ingest.batch
    assert row[3] != row[3] and row[:3] == ROWS[0][:3] and row[4:] == ROWS[0][4:]
    assert [type(v) for v in row] == [type(v) for v in ROWS[0]]
    files = FileBatch(["/landing/a[1].csv", "/landing/b.csv"], "csv")
    weighted = [(("to",), 2), (("be",), -1)]
    for batch in (files, weighted):
        unit = IngestUnit(1, "words", batch)
        assert read_unit_file(write_unit_file(folder, shipped(unit), KEY), KEY).unit == unit
    rebuild = RebuildUnit(2, ("counts", "present"))
    assert read_unit_file(write_unit_file(folder, shipped(rebuild), KEY), KEY).unit == rebuild


def test_a_value_json_cannot_hold_is_refused_not_pickled(tmp_path):
    folder = unit_directory(tmp_path, "word_count")
    with pytest.raises(UnitFileError, match="a object cannot go into a unit file"):
        write_unit_file(folder, shipped(IngestUnit(0, "words", [(object(),)])), KEY)


def test_a_changed_unit_file_is_refused(tmp_path):
    folder = unit_directory(tmp_path, "word_count")
    path = write_unit_file(folder, shipped(IngestUnit(0, "words", [("to",)])), KEY)
    document = json.loads(path.read_text())
    document["body"]["unit"]["fields"]["epoch"] = 7
    path.write_text(json.dumps(document))
    with pytest.raises(UnitFileError, match="its HMAC does not match, so it was changed"):
        read_unit_file(path, KEY)
    # Nor does a file written under another key pass, nor one that is no unit file at all.
    other = write_unit_file(folder, shipped(IngestUnit(0, "words", [("to",)])), KEY)
    with pytest.raises(UnitFileError, match="HMAC does not match"):
        read_unit_file(other, bytes(32))
    other.write_bytes(b"\x80\x04\x95pickle")
    with pytest.raises(UnitFileError, match="not a dbspark unit file"):
        read_unit_file(other, KEY)


def test_a_unit_file_others_may_write_is_refused(tmp_path):
    folder = unit_directory(tmp_path, "word_count")
    path = write_unit_file(folder, shipped(IngestUnit(0, "words", [("to",)])), KEY)
    path.chmod(0o660)
    with pytest.raises(UnitFileError, match="mode 0660; unit files must be"):
        read_unit_file(path, KEY)
    path.chmod(0o600)
    folder.chmod(0o770)
    with pytest.raises(UnitFileError, match="refused the unit directory"):
        read_unit_file(path, KEY)


def test_the_driver_runs_nothing_without_the_key(tmp_path):
    folder = unit_directory(tmp_path, "word_count")
    path = write_unit_file(folder, shipped(IngestUnit(0, "words", [("to",)])), KEY)
    with pytest.raises(UnitFileError, match=f"{UNIT_KEY_VARIABLE} does not hold"):
        run_unit_file(path, spark=None, environ={})


def test_table_credentials_stay_out_of_the_file_and_the_driver_needs_them(tmp_path):
    """The tables' credentials (``[dbspark] table_conn_id``) are left out of the unit file,
    which names their connection; a driver not handed them refuses before running."""
    folder = unit_directory(tmp_path, "word_count")
    keys = {"AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": PASSWORD}
    for unit in (
        PublishUnit(3, "/outputs", table_credentials=keys),
        RebuildUnit(3, ("counts",), outputs="/outputs", table_credentials=keys),
        EvolveUnit(3, outputs="/outputs", table_credentials=keys),
    ):
        path = write_unit_file(folder, shipped(unit, table_conn_id="dbspark_tables"), KEY)
        assert PASSWORD not in path.read_text() and "AKIDEXAMPLE" not in path.read_text()
        assert PASSWORD not in repr(unit)
        back = read_unit_file(path, KEY)
        assert back.unit.table_credentials is None and back.table_conn_id == "dbspark_tables"
        environ = {UNIT_KEY_VARIABLE: KEY.hex()}
        with pytest.raises(UnitFileError, match=f"{TABLE_CREDENTIALS_VARIABLE}; it is not set"):
            run_unit_file(path, spark=None, environ=environ)


def test_the_tables_credentials_come_from_the_connection_table_conn_id_names(monkeypatch):
    from dbspark.orchestration.airflow.deployment import table_credentials

    assert table_credentials(None) == {}
    monkeypatch.setenv(
        "AIRFLOW_CONN_TABLES",
        json.dumps(
            {
                "conn_type": "aws",
                "login": "AKIDEXAMPLE",
                "password": PASSWORD,
                "extra": {"aws_session_token": "session"},
            }
        ),
    )
    assert table_credentials("tables") == {
        "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE",
        "AWS_SECRET_ACCESS_KEY": PASSWORD,
        "AWS_SESSION_TOKEN": "session",
    }
    monkeypatch.setenv(
        "AIRFLOW_CONN_NO_KEYS", json.dumps({"conn_type": "aws", "extra": {"region": "x"}})
    )
    with pytest.raises(
        ValueError, match=r"'no_keys' .* access key id as its login .* \['region'\]"
    ):
        table_credentials("no_keys")


def test_recipes_rebuild_the_circuit_or_say_there_is_none(tmp_path):
    recipe = CircuitRecipe.of_factory(word_count)
    assert recipe == CircuitRecipe(factory="dbspark.examples.circuits:word_count")
    assert circuit_fingerprint(recipe.build()) == circuit_fingerprint(word_count())
    assert CircuitRecipe.of_factory(lambda: word_count()) is None
    sql = tmp_path / "totals.sql"
    sql.write_text("CREATE VIEW totals AS SELECT word, COUNT(*) AS n FROM words GROUP BY word;")
    sources = tmp_path / "sources.json"
    sources.write_text(json.dumps({"words": {"columns": [["word", "string"]]}}))
    built = CircuitRecipe(sql=str(sql), sources=str(sources)).build()
    assert built.name == "totals" and set(built.views) == {"totals"}


def test_spark_submit_refuses_a_circuit_the_driver_cannot_rebuild(tmp_path):
    from airflow.sdk.exceptions import AirflowFailException

    from dbspark.orchestration.airflow.deployment import Deployment, DeploymentOptions
    from dbspark.orchestration.airflow.tasks import EpochTasks
    from dbspark.orchestration.units import CloseUnit

    tasks = EpochTasks(
        circuit=word_count(),  # an object: no recipe
        sources={},
        options=DeploymentOptions(),
        start_date=datetime(2026, 1, 1, tzinfo=UTC),
        iteration_tasks=1,
    )
    deployment = Deployment(
        warehouse=tmp_path,
        outputs=tmp_path,
        catalog_url=None,
        spark_remote=None,
        spark_submit_conn_id="dbspark_spark",
        serving_url=None,
        serving_table_prefix="dbspark_",
    )
    with pytest.raises(AirflowFailException, match="module-level function that returns"):
        tasks._submit(deployment, CloseUnit(0))
    assert not (tmp_path / "_units").exists()  # refused before anything was written


def test_a_failure_no_retry_can_fix_comes_back_in_the_result_file(tmp_path):
    """The driver's bad input reaches the task as the same error (the task sees only the
    spark-submit exit status otherwise), so the retry policy fails the task at once."""
    warehouse = tmp_path / "warehouse"
    unit = ShippedUnit(
        recipe=CircuitRecipe.of_factory(word_count),
        fingerprint=circuit_fingerprint(word_count()),
        unit=IngestUnit(0, "no_such_source", [("to",)]),
        warehouse=str(warehouse),
    )
    path = write_unit_file(unit_directory(warehouse, "word_count"), unit, KEY)
    environ = {UNIT_KEY_VARIABLE: KEY.hex()}
    with pytest.raises(InputError, match="no_such_source") as in_driver:
        run_unit_file(path, spark=None, environ=environ)
    assert mode(result_path(path)) == 0o600
    with pytest.raises(InputError) as in_task:
        read_result_file(path, KEY)
    assert str(in_task.value) == str(in_driver.value)
    assert in_task.value.source == "no_such_source"


@pytest.mark.parametrize(
    "error",
    [
        InputError("edges", "column 'src' is NULL in row 3", "part-0.parquet"),
        UncommittedUnits("units it needs never committed", ["ingest_edges", "loop:reach"]),
        LoopDidNotConverge("loop 'reach' reached its bound of 5 iterations"),
        CircuitDefinitionChanged("the definition of circuit 'r' changed"),
        UnsafeCatalog("refusing a SQLite catalog: the warehouse /w is on nfs4"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_each_final_error_crosses_as_its_own_kind_and_fails_at_once(error):
    from airflow.sdk.definitions.retry_policy import RetryAction

    from dbspark.orchestration.airflow.policy import retry_policy

    document = json.loads(json.dumps(final_error_document(error)))
    again = final_error(document)
    assert type(again) is type(error) and str(again) == str(error)
    assert getattr(again, "missing", None) == getattr(error, "missing", None)
    assert retry_policy().evaluate(again, 1, 4).action == RetryAction.FAIL


def test_a_result_file_with_an_unknown_error_kind_is_refused():
    refused = final_error({"kind": "SomethingElse", "message": "boom"})
    assert isinstance(refused, UnitFileError) and "SomethingElse" in str(refused)


def test_a_unit_holds_a_lease_where_it_runs(tmp_path, monkeypatch):
    """A driver or the unit worker holds its own lease while the unit runs, so garbage
    collection keeps the unit's files even after the task that handed it over stopped
    (and released the task's lease); the lease ends with the unit."""
    from dbspark.orchestration import units
    from dbspark.orchestration.units import CloseUnit
    from dbspark.storage.catalog import Catalog

    warehouse = tmp_path / "warehouse"
    seen = []

    def execute(engine, unit):  # what the unit saw: the circuit's live leases
        seen.extend(lease.holder for lease in engine.catalog.leases("word_count"))
        return {"ran": unit.kind}

    monkeypatch.setattr(units, "execute_unit", execute)
    unit = ShippedUnit(
        recipe=CircuitRecipe.of_factory(word_count),
        fingerprint=circuit_fingerprint(word_count()),
        unit=CloseUnit(0),
        warehouse=str(warehouse),
    )
    path = write_unit_file(unit_directory(warehouse, "word_count"), unit, KEY)
    assert run_unit_file(path, spark=None, environ={UNIT_KEY_VARIABLE: KEY.hex()}) == {
        "ran": "close"
    }
    [holder] = seen
    assert holder.startswith("close unit of epoch 0 of word_count (")
    catalog = Catalog.for_warehouse(warehouse)
    assert catalog.leases("word_count") == []
    catalog.close()
