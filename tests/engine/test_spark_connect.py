"""The Spark engine over Spark Connect: a real server process, every conformance vector.

The server is a separate JVM started from the pyspark wheel (``LocalConnectServer``),
reached over gRPC on loopback, exactly as a deployment reaches a remote cluster. The
oracles are the vectors' expected outputs, epoch by epoch, and full refresh
(``engine.verify()``) at the end. The classic ``spark`` fixture may live in the same
process: ``connect_session`` puts pyspark back in classic mode when the module ends.

Outside CI a server that cannot start (no Java, say) skips these tests with the reason;
under CI (``CI`` set) it fails them.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from vectors import VECTOR_DIR, VECTORS, replay_vector

from dbspark.conformance.vector import parse_vector
from dbspark.devtools import spark_connect as connect_server_module
from dbspark.devtools.spark_connect import ConnectServerError, LocalConnectServer, free_port
from dbspark.devtools.spark_daemons import BIND_FAILURES
from dbspark.engine.spark.executor import SparkEngine
from dbspark.engine.spark.session import connect_session, is_connect

pytestmark = pytest.mark.slow


def _under_ci() -> bool:
    return os.environ.get("CI", "").lower() not in ("", "0", "false", "no")


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalConnectServer]:
    """A Spark Connect server (local[2]) on loopback for this module; stopped at the end."""
    server = LocalConnectServer(
        master="local[2]",
        log_path=tmp_path_factory.mktemp("connect") / "server.log",
        conf={"spark.sql.shuffle.partitions": 4},
    )
    try:
        server.start()
    except Exception as err:  # ConnectServerError, or no Java at all
        message = f"no Spark Connect server for the tests: {type(err).__name__}: {err}"
        if _under_ci():
            pytest.fail(message)
        pytest.skip(message)
    group = server.pid
    try:
        yield server
    finally:
        server.stop()
    # stop() ends the whole process group (launcher, JVM, Python workers).
    assert group is not None
    with pytest.raises(ProcessLookupError):
        os.killpg(group, 0)


@pytest.fixture(scope="module")
def connect_spark(connect_server: LocalConnectServer) -> Iterator[object]:
    """A Connect session to ``connect_server``; classic mode is restored afterwards."""
    with connect_session(connect_server.url(), app_name="dbspark-connect-tests") as session:
        yield session


# The classic conformance test replays every vector; over Connect the same engine code
# runs. A recursive loop with deletions is replayed here; root joins and upserts with
# tombstones run over Connect in the Airflow scheduler test
# (tests/orchestration/test_scheduler.py), where every task is a Connect client.
OVER_CONNECT = [p for p in VECTORS if p.stem == "reachability_shortcut"]


@pytest.mark.parametrize("path", OVER_CONNECT, ids=[p.stem for p in OVER_CONNECT])
def test_vector_over_connect(connect_spark, warehouse_path: Path, path: Path) -> None:
    assert is_connect(connect_spark)
    engine = replay_vector(connect_spark, warehouse_path, path, local_rows=0)
    differences = engine.verify()
    assert set(differences) == set(engine.circuit.views)
    assert all(not diff for diff in differences.values()), differences


def test_engine_without_a_session_uses_the_active_connect_one(
    connect_spark, warehouse_path: Path
) -> None:
    """A task that builds ``SparkEngine`` without ``spark=`` joins the Connect session."""
    path = VECTOR_DIR / "join_bilinear.json"
    vector = parse_vector(path.read_text(encoding="utf-8"))
    engine = SparkEngine(vector.circuit, warehouse_path, local_rows=0)
    assert engine.spark is connect_spark


def test_a_server_that_cannot_start_says_why(tmp_path: Path) -> None:
    """A bad master makes the JVM exit: the error quotes its log, nothing is left running."""
    server = LocalConnectServer(master="nonsense://nowhere", log_path=tmp_path / "server.log")
    with pytest.raises(ConnectServerError, match=r"exited with status") as caught:
        server.start()
    assert "nonsense://nowhere" in str(caught.value)  # from the log tail
    assert not server.running and server.pid is None  # stop() ran


def test_a_web_ui_port_lost_to_another_process_is_chosen_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The UI port is chosen before the JVM binds it; another process may take it in
    between. The server is launched again with a new UI port, keeping the Connect port
    (already handed to clients after ``start(wait=False)``)."""
    taken = socket.socket()
    taken.bind(("0.0.0.0", 0))
    taken.listen()
    lost = taken.getsockname()[1]
    choices = iter([lost])
    monkeypatch.setattr(
        connect_server_module, "free_port", lambda host: next(choices, None) or free_port(host)
    )
    server = LocalConnectServer(master="local[1]", ui_port=0, log_path=tmp_path / "server.log")
    try:
        server.start(wait=False)
        grpc_port = server.port
        server.wait_until_ready()
        assert server.port == grpc_port
        assert server.ui_port not in (None, lost)
        log_text = (tmp_path / "server.log").read_text()
        assert log_text.count("starting: ") == 2
        assert any(marker in log_text for marker in BIND_FAILURES)
    finally:
        server.stop()
        taken.close()


def test_conformance_command_over_connect(connect_server: LocalConnectServer) -> None:
    """``python -m dbspark.conformance --remote URL --check`` in its own process."""
    vector = VECTOR_DIR / "join_bilinear.json"
    env = {k: v for k, v in os.environ.items() if k != "SPARK_CONNECT_MODE_ENABLED"}
    command = [sys.executable, "-m", "dbspark.conformance", str(vector), "--check"]
    done = subprocess.run(
        [*command, "--remote", connect_server.url()],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["epochs"] == json.loads(vector.read_text())["expected"]


def test_conformance_command_rejects_an_unreachable_server(capsys: pytest.CaptureFixture) -> None:
    from dbspark.conformance.cli import EXIT_BAD_INPUT, main

    port = free_port()  # nothing listens there
    status = main([str(VECTOR_DIR / "join_bilinear.json"), "--remote", f"sc://127.0.0.1:{port}"])
    assert status == EXIT_BAD_INPUT
    assert f"no Spark Connect server answers at 127.0.0.1:{port}" in capsys.readouterr().err
