"""A throwaway Redis server on loopback, from the system's ``redis-server`` (Debian
package ``redis-server``): the Celery broker of the multi-machine deployment's local
stand-in (``cluster.py``). No persistence; its log is ``redis.log`` in its folder."""

from __future__ import annotations

import shutil
import socket
import subprocess
from pathlib import Path

from dbspark.devtools.processes import LOOPBACK, free_port, launch, stop_group, tail, wait_until


class RedisUnavailable(RuntimeError):
    """No Redis server could be started here (the message says why)."""


class LocalRedis:
    """A Redis server in ``root`` (see the module docstring)."""

    def __init__(self, root: Path | str, *, startup_timeout: float = 30.0) -> None:
        self.root = Path(root)
        self.startup_timeout = startup_timeout
        self.port: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def log_path(self) -> Path:
        return self.root / "redis.log"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def url(self, db: int = 0) -> str:
        if self.port is None:
            raise RedisUnavailable("the Redis server has not been started")
        return f"redis://{LOOPBACK}:{self.port}/{db}"

    def start(self) -> LocalRedis:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RedisUnavailable(
                "redis-server is not installed (Debian/Ubuntu: apt-get install redis-server); "
                "the Celery executor of the multi-machine deployment uses it as its broker"
            )
        self.root.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        options = {"port": self.port, "bind": LOOPBACK, "save": "", "appendonly": "no"}
        options |= {"dir": self.root, "daemonize": "no"}
        command = [binary, *(part for k, v in options.items() for part in (f"--{k}", str(v)))]
        self._proc = launch(command, log_path=self.log_path, parent_death_signal=None)
        proc = self._proc

        def answers() -> bool:
            if proc.poll() is not None:
                raise RedisUnavailable(f"redis-server exited:\n{tail(self.log_path)}")
            return self._answers()

        try:
            if not wait_until(answers, self.startup_timeout, interval=0.1):
                raise RedisUnavailable(f"redis-server did not start:\n{tail(self.log_path)}")
        except RedisUnavailable:
            self.stop()
            raise
        return self

    def _answers(self) -> bool:
        assert self.port is not None
        try:
            with socket.create_connection((LOOPBACK, self.port), timeout=1.0) as conn:
                conn.sendall(b"PING\r\n")
                return conn.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        stop_group(proc, timeout=10.0)
