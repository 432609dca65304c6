"""Input errors with ``DBSPARK_REDACT_INPUT_VALUES``: the source, the file, the row or
line and the column names stay, the row's values do not (finding 13 of issue 18).

Each case runs once without the setting, to show that the value is in the message
otherwise (so the redacted run proves something), and once with it.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dbspark.core.errors import REDACT_SETTING, REDACTED, InputError
from dbspark.core.types import Schema
from dbspark.engine.batches import upsert_batch
from dbspark.engine.file_batches import FileBatch
from dbspark.engine.local.files import read_files
from dbspark.engine.reference.engine import ReferenceEngine
from dbspark.examples.circuits import orders

SECRET = "alice@example.com"
CUSTOMERS = Schema(
    (("cust_id", "bigint"), ("region", "string"), ("ts", "bigint"), ("deleted", "boolean"))
)


def message_of(action) -> str:
    with pytest.raises(InputError) as error:
        action()
    return str(error.value)


@pytest.mark.parametrize("redact", [False, True])
def test_python_rows_and_upsert_conflicts(redact: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(REDACT_SETTING, "1" if redact else "")
    wrong_type = message_of(
        lambda: upsert_batch("customers", CUSTOMERS, [(1, "north", 1, False), (2, 7, 1, SECRET)])
    )
    engine = ReferenceEngine(orders())
    tie = message_of(
        lambda: engine.step({"customers": [(41, "north", 1, False), (41, SECRET, 1, False)]})
    )
    for message in (wrong_type, tie):
        assert "customers" in message
        assert (SECRET in message) is not redact, message
        assert (REDACTED in message) is redact, message
    assert "row 1" in wrong_type and "column 'region'" in wrong_type
    assert ("cust_id=<redacted>" in tie) is redact and ("cust_id=41" in tie) is not redact


def test_a_huge_value_is_shown_cut_short() -> None:
    """A 200,000-character string in a bad row: the message shows its start and its
    length, not all of it (it goes to the task log of every try)."""
    huge = "x" * 200_000
    message = message_of(
        lambda: upsert_batch("customers", CUSTOMERS, [(1, "a", 1, False), (2, huge, "x", False)])
    )
    assert len(message) < 3_000, len(message)
    assert "row 1" in message and "characters in all)" in message
    tie = message_of(
        lambda: ReferenceEngine(orders()).step(
            {"customers": [(41, huge, 1, False), (41, "south", 1, False)]}
        )
    )
    assert len(tie) < 5_000 and "cust_id=41" in tie, len(tie)
    assert "characters in all)" in tie


@pytest.mark.parametrize("redact", [False, True])
def test_a_null_key_in_a_parquet_file(
    redact: bool, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from dbspark.engine.batches import upsert_spec

    monkeypatch.setenv(REDACT_SETTING, "1" if redact else "")
    circuit = orders()
    spec = upsert_spec(circuit.node(circuit.sources["customers"]))
    path = tmp_path / "customers.parquet"
    rows = [{"cust_id": 1, "region": "n", "ts": 1, "deleted": False}]
    rows.append({"cust_id": None, "region": SECRET, "ts": 1, "deleted": False})
    pq.write_table(pa.Table.from_pylist(rows), path)
    message = message_of(
        lambda: read_files(
            "customers",
            CUSTOMERS,
            FileBatch([path], "parquet"),
            weighted=False,
            upsert=spec,
            max_rows=100,
        )
    )
    assert str(path) in message and "row 1 of the file" in message
    assert (SECRET in message) is not redact, message


@pytest.mark.slow
@pytest.mark.parametrize("redact", [False, True])
def test_bad_csv_and_json_lines_read_by_spark(
    redact: bool, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, spark
) -> None:
    from dbspark.engine.spark.executor import SparkEngine

    monkeypatch.setenv(REDACT_SETTING, "1" if redact else "")
    engine = SparkEngine(orders(), tmp_path / "warehouse", spark=spark)
    csv_file = tmp_path / "c.csv"
    csv_file.write_text(f"cust_id,region,ts,deleted\n1,north,1,false\n2,{SECRET},x{SECRET},false\n")
    json_file = tmp_path / "c.jsonl"
    json_file.write_text(f'{{"cust_id": 1, "region": "n", "ts": "{SECRET}", "deleted": false}}\n')
    for path, fmt, line in ((csv_file, "csv", "line 3"), (json_file, "jsonl", "line 1")):
        message = message_of(
            lambda p=path, f=fmt: engine.check_batch("customers", FileBatch([p], f))
        )
        assert str(path) in message and line in message and "column 'ts'" in message, message
        assert (SECRET in message) is not redact, message


def test_airflow_cfg_turns_redaction_on_for_the_ingest_task(monkeypatch: pytest.MonkeyPatch):
    from dbspark.orchestration.airflow.tasks import apply_redaction_setting

    monkeypatch.setenv(REDACT_SETTING, "")
    monkeypatch.delenv("AIRFLOW__DBSPARK__REDACT_INPUT_VALUES", raising=False)
    apply_redaction_setting()
    assert "row 0 <redacted>" not in message_of(lambda: upsert_batch("c", CUSTOMERS, [(1,)]))
    monkeypatch.setenv("AIRFLOW__DBSPARK__REDACT_INPUT_VALUES", "True")
    apply_redaction_setting()
    assert "row 0 <redacted>" in message_of(lambda: upsert_batch("c", CUSTOMERS, [(1,)]))
