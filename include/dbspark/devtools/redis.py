"""A throwaway Redis server on loopback, from the system's ``redis-server`` (Debian
package ``redis-server``): the Celery broker of the multi-machine deployment's local
stand-in (``cluster.py``). No persistence; its log is ``redis.log`` in its folder. As in
``docker-compose.yml`` it requires a password, made afresh for each server and carried in
``url()``, so other users of the machine cannot read or queue tasks through it."""

from __future__ import annotations

import secrets
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
        self.password = secrets.token_hex(16)
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
        return f"redis://:{self.password}@{LOOPBACK}:{self.port}/{db}"

    def start(self) -> LocalRedis:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RedisUnavailable(
                "redis-server is not installed (Debian/Ubuntu: apt-get install redis-server); "
                "the Celery executor of the multi-machine deployment uses it as its broker"
            )
        self.root.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        options = {"port": self.port, "bind": LOOPBACK, "save": '""', "appendonly": "no"}
        options |= {"dir": self.root, "daemonize": "no", "requirepass": self.password}
        # A private file, not the command line, so the password is not in `ps`.
        config = self.root / "redis.conf"
        config.touch(mode=0o600)
        config.write_text("".join(f"{k} {v}\n" for k, v in options.items()), encoding="utf-8")
        command = [binary, str(config)]
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
                conn.sendall(f"AUTH {self.password}\r\nPING\r\n".encode())
                return _replies(conn, 2) == [b"+OK", b"+PONG"]
        except OSError:
            return False

    def refuses_without_password(self) -> bool:
        """Does the server refuse a command from a client that did not authenticate?"""
        assert self.port is not None
        with socket.create_connection((LOOPBACK, self.port), timeout=1.0) as conn:
            conn.sendall(b"PING\r\n")
            return _replies(conn, 1)[0].startswith(b"-NOAUTH")

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        stop_group(proc, timeout=10.0)


def _replies(conn: socket.socket, count: int) -> list[bytes]:
    """The next ``count`` one-line replies on ``conn``."""
    data = b""
    while data.count(b"\r\n") < count:
        chunk = conn.recv(256)
        if not chunk:
            break
        data += chunk
    return data.split(b"\r\n")[:count]
