"""Spark's RPC is authenticated in the deployment's topology (issue 18, finding 11).

The standalone master, the workers and the driver (the Spark Connect server) run with
``spark.authenticate`` and one shared secret, as ``docker-compose.yml`` and
``LocalCluster`` start them: a worker without the secret, or with another one, never
joins the cluster, and the secret is never on a command line.
"""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from dbspark.devtools import spark_connect, spark_standalone
from dbspark.devtools.processes import wait_until
from dbspark.devtools.spark_connect import LocalConnectServer
from dbspark.devtools.spark_daemons import AUTH_SECRET_VARIABLE
from dbspark.devtools.spark_standalone import LocalSparkMaster, LocalSparkWorker

SECRET = "4a1c" * 16


def command_line(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


@pytest.mark.slow
def test_only_a_worker_with_the_secret_joins_the_master(tmp_path):
    master = LocalSparkMaster(log_path=tmp_path / "master.log", auth_secret=SECRET)
    workers = {
        name: LocalSparkWorker(
            "",
            master=master,
            log_path=tmp_path / f"{name}.log",
            work_dir=tmp_path / name,
            auth_secret=secret,
        )
        for name, secret in (("same", SECRET), ("other", "0" * 64), ("none", None))
    }
    try:
        master.start()
        for worker in workers.values():
            worker.master_url = master.master_url
            worker.start(wait=False)
        workers["same"].wait_until_ready()

        def refused(name: str) -> bool:
            return "Failed to connect to master" in workers[name].launch_log()

        assert wait_until(lambda: refused("other") and refused("none"), 60), {
            name: worker.log_tail() for name, worker in workers.items()
        }
        registered = master.state()["workers"]
        assert [w["id"] for w in registered] == [workers["same"].state()["id"]]
        master_log = master.launch_log()
        assert "DIGEST-MD5" in master_log  # the wrong secret's handshake failed
        assert "Expected SaslMessage" in master_log  # the secretless worker did not try
        # The secret reached the JVMs through their environment, not their command lines.
        for daemon in (master, workers["same"]):
            assert daemon.pid is not None
            assert SECRET not in command_line(daemon.pid)
            assert "-Dspark.authenticate=true" in command_line(daemon.pid)
    finally:
        for worker in workers.values():
            worker.stop()
        master.stop()


def test_the_driver_reads_its_secret_from_a_private_file(tmp_path):
    server = LocalConnectServer(
        master="spark://127.0.0.1:7077", port=15999, auth_secret=SECRET, log_path=tmp_path / "x"
    )
    command = server.command()
    assert SECRET not in " ".join(command)
    assert "spark.authenticate=true" in command
    properties = Path(command[command.index("--properties-file") + 1])
    assert stat.S_IMODE(properties.stat().st_mode) == 0o600
    assert stat.S_IMODE(properties.parent.stat().st_mode) == 0o700
    assert properties.read_text() == f"spark.authenticate.secret={SECRET}\n"
    server.stop()  # never started: stopping still removes the secret
    assert not properties.parent.exists()
    # Without a secret nothing is written and nothing is switched on.
    plain = LocalConnectServer(master="local[1]", port=15999).command()
    assert "--properties-file" not in plain
    assert not any(c.startswith("spark.authenticate") for c in plain)


@pytest.mark.parametrize(
    ("main", "argv"),
    [
        (spark_standalone.main, ["master"]),
        (spark_standalone.main, ["worker", "--master", "spark://spark-master:7077"]),
        (spark_connect.main, ["--master", "spark://spark-master:7077"]),
    ],
    ids=["master", "worker", "connect server of a cluster"],
)
def test_the_launchers_refuse_to_run_a_cluster_without_a_secret(main, argv, monkeypatch, capsys):
    monkeypatch.delenv(AUTH_SECRET_VARIABLE, raising=False)
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    error = capsys.readouterr().err
    assert f"{AUTH_SECRET_VARIABLE} is not set" in error and "--no-auth" in error
