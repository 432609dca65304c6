"""The long-lived unit worker (``orchestration/worker.py``): DAG runs hand their units
to a worker process that keeps its engine, and their views equal a full refresh; a
task that finds no worker runs its unit itself; bad input fails at once through it;
and only this user's private socket is trusted."""

from __future__ import annotations

import json
import logging
import socket
from pathlib import Path

import pytest
from test_dag_runs import check_against_full_refresh, day, run

from dbspark.core.zset import ZSet
from dbspark.devtools.unit_worker import LocalUnitWorker
from dbspark.orchestration.airflow.dag import circuit_of
from dbspark.orchestration.worker import WorkerFailed, WorkerUnavailable, _connect
from tests.moto_s3 import BUCKET

pytestmark = pytest.mark.slow


@pytest.fixture
def place(place, spark):
    """The folder's ``place``, with Spark up: these runs compare with full refresh."""
    return place


def test_dag_runs_hand_their_units_to_one_worker_that_keeps_its_engine(
    test_dags, place, tmp_path, monkeypatch, caplog
):
    dag = test_dags["test_word_count"]
    circuit = circuit_of("test_word_count")
    socket_path = tmp_path / "worker" / "units.sock"
    worker_log = tmp_path / "worker.log"
    monkeypatch.setenv("AIRFLOW__DBSPARK__WORKER_SOCKET", str(socket_path))
    worker = LocalUnitWorker(socket_path, worker_log).start()
    columns = ["word", "__w"]
    batches = [
        [("a", 1), ("b", 2)],
        [("a", -1), ("c", 1)],
        [("b", -2), ("d", 3)],
    ]
    history = []
    try:
        for epoch, rows in enumerate(batches):
            place.landing.land("words", day(epoch), rows, columns, "parquet")
            history.append({"words": [((word,), weight) for word, weight in rows]})
            caplog.clear()
            with caplog.at_level(logging.INFO, logger="dbspark"):
                state, tasks = run(dag, epoch)
            assert state == "success", tasks
            logs = caplog.text
            # Every unit ran in the worker, and its log lines reached the task's log.
            for kind in ("ingest", "stage", "publish", "close"):
                assert f"the {kind} unit ran in the dbspark worker at {socket_path}" in logs, kind
            assert f"epoch {epoch}, source words:" in logs
            assert "running the" not in logs  # no task ran its unit itself
            check_against_full_refresh(place, circuit, history, epoch)
        # One engine served every unit of the three epochs.
        assert worker_log.read_text().count("an engine for circuit word_count") == 1
    finally:
        worker.stop()

    # With the worker gone, the tasks run their units themselves, and say so.
    assert not socket_path.exists()
    place.landing.land("words", day(3), [("e", 1)], columns, "parquet")
    history.append({"words": [(("e",), 1)]})
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="dbspark"):
        state, tasks = run(dag, 3)
    assert state == "success", tasks
    logs = caplog.text
    assert (
        f"no dbspark worker socket at {socket_path}: running the ingest unit in this task" in logs
    )
    check_against_full_refresh(place, circuit, history, 3)


def test_bad_input_fails_at_once_through_the_worker(test_dags, place, tmp_path, monkeypatch, capfd):
    dag = test_dags["test_word_count"]
    socket_path = tmp_path / "worker" / "units.sock"
    monkeypatch.setenv("AIRFLOW__DBSPARK__WORKER_SOCKET", str(socket_path))
    worker = LocalUnitWorker(socket_path, tmp_path / "worker.log").start()
    try:
        partition = place.landing.partition("words", day(0))
        partition.mkdir(parents=True)
        (partition / "part-00000.jsonl").write_bytes(b'{"word": "a", "__w": 1}\n{"word": "\xe9"}\n')
        capfd.readouterr()
        state, tasks = run(dag, 0)
        assert state == "failed" and tasks[("ingest.words", -1)] == "failed", tasks
        logs = capfd.readouterr().out
        assert "line 2: byte 11 of the line is not UTF-8" in logs
        assert worker.running  # the worker goes on serving
    finally:
        worker.stop()


def test_outputs_on_s3_take_the_tables_with_the_credentials_of_table_conn_id(
    test_dags, place, s3, tmp_path, monkeypatch
):
    """Outputs on S3 (moto's): the tables go there, the change feed to the warehouse's
    default folder. The worker, started without ``AWS_*`` in its environment, is handed
    the credentials of ``[dbspark] table_conn_id`` with the unit."""
    from dbspark.engine.reference.full_refresh import full_refresh
    from dbspark.orchestration.sinks.files import CHANGES, output_dir
    from dbspark.orchestration.sinks.tables import table_path, table_rows

    location = f"s3://{BUCKET}/published"
    monkeypatch.setenv("AIRFLOW__DBSPARK__OUTPUTS", location)
    monkeypatch.setenv("AIRFLOW__DBSPARK__TABLE_STORAGE_OPTIONS", json.dumps(s3.options()))
    monkeypatch.setenv("AIRFLOW__DBSPARK__TABLE_CONN_ID", "dbspark_tables")
    keys = {"conn_type": "aws", "login": "dbspark-test", "password": "dbspark-test-secret"}
    monkeypatch.setenv("AIRFLOW_CONN_DBSPARK_TABLES", json.dumps(keys))
    for variable in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(variable)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # and no instance role
    socket_path = tmp_path / "worker" / "units.sock"
    monkeypatch.setenv("AIRFLOW__DBSPARK__WORKER_SOCKET", str(socket_path))
    worker = LocalUnitWorker(socket_path, tmp_path / "worker.log").start()
    try:
        place.landing.land("words", day(0), [("a", 1), ("b", 2)], ["word", "__w"], "parquet")
        state, tasks = run(test_dags["test_word_count"], 0)
        assert state == "success", tasks
    finally:
        worker.stop()
    circuit = circuit_of("test_word_count")
    expected = full_refresh(circuit, [{"words": [(("a",), 1), (("b",), 2)]}], 0)
    options = s3.reader_options()
    for view, node in circuit.views.items():
        path = table_path(location, circuit.name, view)
        schema = circuit.node(node).schema
        assert ZSet(table_rows(path, schema, 0, storage_options=options)) == expected[view]
        feed = output_dir(place.warehouse / "published", circuit.name, view, CHANGES, 0)
        assert (feed / "_dbspark.json").is_file()


def test_only_a_private_socket_of_this_user_is_trusted(tmp_path: Path) -> None:
    with pytest.raises(WorkerUnavailable, match="no dbspark worker socket"):
        _connect(tmp_path / "none.sock")
    open_dir = tmp_path / "open"
    open_dir.mkdir(mode=0o777)
    open_dir.chmod(0o777)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(open_dir / "units.sock"))
    (open_dir / "units.sock").chmod(0o600)
    try:
        with pytest.raises(WorkerFailed, match="nobody else may enter"):
            _connect(open_dir / "units.sock")
        (open_dir / "units.sock").chmod(0o666)
        with pytest.raises(WorkerFailed, match="must be this user's"):
            _connect(open_dir / "units.sock")
    finally:
        listener.close()


def test_the_engines_share_one_budget_of_resident_traces(tmp_path: Path) -> None:
    """Past the worker's budget, the engine used least recently goes (its circuit's next
    unit builds it again); the one that just ran stays."""
    from dbspark.engine.spark.executor import circuit_fingerprint
    from dbspark.examples.circuits import word_count
    from dbspark.orchestration.units import CircuitRecipe, ShippedUnit, StageUnit
    from dbspark.orchestration.worker import ResidentEngines

    circuit = word_count()

    def shipped(warehouse: Path) -> ShippedUnit:
        return ShippedUnit(
            recipe=CircuitRecipe.of_factory(word_count),
            fingerprint=circuit_fingerprint(circuit),
            unit=StageUnit(0, 0),
            warehouse=str(warehouse),
        )

    def epoch_in(engines: ResidentEngines, warehouse: Path, epoch: int) -> None:
        with engines(shipped(warehouse), circuit, None) as engine:
            engine.run_epoch(epoch, {"words": [(("w",), 1)]})

    roomy = ResidentEngines(resident_bytes=1 << 30)
    epoch_in(roomy, tmp_path / "a", 0)
    one = roomy.resident()  # what one such engine keeps
    epoch_in(roomy, tmp_path / "b", 0)
    epoch_in(roomy, tmp_path / "a", 1)
    assert one > 0 and roomy.built == 2  # both kept: a's second epoch found its engine
    roomy.close()

    tight = ResidentEngines(resident_bytes=one * 3 // 2)  # room for one engine, not two
    epoch_in(tight, tmp_path / "c", 0)
    epoch_in(tight, tmp_path / "d", 0)  # c's engine goes, d's stays
    assert tight.built == 2 and 0 < tight.resident() <= one * 3 // 2
    epoch_in(tight, tmp_path / "c", 1)  # built again
    assert tight.built == 3
    tight.close()
