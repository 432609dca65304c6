"""A long-lived process that runs the units Airflow tasks hand it, keeping its engines.

Each task is a process of its own: run in it, a unit opens the catalog, builds an
engine and reads every trace slice it needs from Parquet, and whatever it decoded is
gone when the task ends. A worker (``python -m dbspark.orchestration.worker --socket
PATH``) keeps one engine per circuit, warehouse and catalog, so the decoded traces and
their key indexes (``engine/local/resident.py``) and a started Spark session serve
every later unit: an Airflow epoch then costs what the engine's own epochs cost.

A task hands a unit over when ``[dbspark] worker_socket`` names the worker's socket.
It writes the unit file it would give ``spark-submit`` (``units.write_unit_file``:
private, under a key made for that unit) and sends the worker the file's path, the key
and the databases' URLs over a Unix socket; the worker runs it with
``units.run_unit_file``, as a driver would, and writes the result beside it. The
worker's log lines for the unit come back with its answer and go into the task's log.

Only this user reaches the worker: its socket is 0600 in a 0700 directory this user
owns, and each side checks the other's user. Units run one at a time, in the order
they arrive. A task that finds no worker at the socket runs the unit itself, saying
so; a worker whose engine failed a unit drops that engine, and the next unit builds it
again from the catalog.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import secrets
import signal
import socket
import stat
import struct
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from dbspark.orchestration.units import (
    CATALOG_URL_VARIABLE,
    SERVING_URL_VARIABLE,
    TABLE_CREDENTIALS_VARIABLE,
    UNIT_KEY_VARIABLE,
    ShippedUnit,
    read_result_file,
    result_path,
    run_unit_file,
    write_unit_file,
)

log = logging.getLogger("dbspark.worker")

#: What a request and an answer declare themselves as.
WORKER_FORMAT = "dbspark-worker/1"
#: A request is a unit file's path, a key and two URLs; an answer, a unit's log lines.
MAX_MESSAGE_BYTES = 64 << 20
#: Engines kept, by circuit, warehouse and catalog (the least recently used goes first).
ENGINES_KEPT = 8


class WorkerUnavailable(RuntimeError):
    """No worker answers at the socket: the task runs the unit itself."""


class WorkerFailed(RuntimeError):
    """The worker took the unit and it failed there (the task's retry may run it again:
    a unit that committed is skipped)."""


# ----------------------------------------------------------------------------- the worker
class ResidentEngines:
    """The worker's engines, one per circuit fingerprint, warehouse and catalog, sharing
    one Spark session started when a unit first needs it. ``resident_bytes`` bounds the
    traces they keep decoded, all engines together: past it, the engines used least
    recently are dropped (the one that just ran is kept, within its own budget)."""

    def __init__(self, resident_bytes: int | None = None) -> None:
        from dbspark.engine.local.resident import default_resident_bytes

        self._spark: Any = None
        self.resident_bytes = default_resident_bytes() if resident_bytes is None else resident_bytes
        self._engines: dict[tuple[str, str, str | None], Any] = {}
        self.built = 0  # engines built so far (a unit that found its engine built none)

    def spark(self) -> Any:
        if self._spark is None:
            from dbspark.engine.spark.session import spark_session

            self._spark = spark_session(app_name="dbspark-worker")
        return self._spark

    @contextlib.contextmanager
    def __call__(
        self, shipped: ShippedUnit, circuit: Any, catalog_url: str | None
    ) -> Iterator[Any]:
        from dbspark.engine.spark.executor import SparkEngine

        key = (shipped.fingerprint, str(Path(shipped.warehouse).resolve()), catalog_url)
        engine = self._engines.pop(key, None)
        if engine is None:
            engine = SparkEngine(
                circuit,
                shipped.warehouse,
                spark=self.spark,
                catalog_url=catalog_url,
                resident_bytes=self.resident_bytes,
                # A close returns once its epoch committed; the compaction after it runs
                # on in this process, the next close waiting for it.
                background_compaction=True,
                evolve=getattr(shipped.unit, "evolves", False),
            )
            self.built += 1
            # Its traces into memory now, as the engine's own long-lived use does: the
            # first unit pays for the reads once, and every later one finds its slices.
            try:
                resident = engine.warm()
            except BaseException:
                _retire(engine)
                raise
            log.info(
                "an engine for circuit %s on %s, with %.1f MB of traces resident: kept "
                "for the units after this one",
                circuit.name,
                engine.location,
                resident / 1e6,
            )
        try:
            yield engine
        except BaseException:
            # What a failed unit leaves in the engine's memory is not worth trusting.
            _retire(engine)
            raise
        self._engines[key] = engine  # the most recently used last
        while len(self._engines) > 1 and (
            len(self._engines) > ENGINES_KEPT or self.resident() > self.resident_bytes
        ):
            oldest = next(iter(self._engines))
            _retire(self._engines.pop(oldest))

    def resident(self) -> int:
        """The bytes of decoded traces the kept engines hold."""
        return sum(engine.resident_nbytes for engine in self._engines.values())

    def close(self) -> None:
        for engine in self._engines.values():
            _retire(engine)
        self._engines.clear()


def _retire(engine: Any) -> None:
    """Close an engine this worker no longer keeps, once its compaction in the background
    has finished (a new engine for the circuit would otherwise compact beside it)."""
    try:
        engine.wait_for_compaction()
    except Exception:  # already logged where it failed; the next close compacts again
        log.warning("circuit %s: its last compaction failed", engine.circuit.name)
    finally:
        engine.catalog.close()


def serve(socket_path: str | os.PathLike[str], engines: ResidentEngines) -> None:
    """Serve units at ``socket_path`` until stopped (SIGTERM, between units)."""
    path = Path(socket_path)
    listener = _listen(path)
    try:
        log.info("dbspark worker serving units at %s", path)
        while not _stopping.requested:
            _stopping.idle = True
            connection, _ = listener.accept()
            _stopping.idle = False
            with connection:
                _answer(connection, engines)
    finally:
        listener.close()
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        engines.close()


class _Stopping:
    """SIGTERM's effect: at once while the worker waits for a unit, else after the unit
    it runs (a unit cut short would only be run again by the task's retry)."""

    requested = False
    idle = False

    def __call__(self, signum: int, frame: Any) -> None:
        self.requested = True
        if self.idle:
            raise SystemExit(0)


_stopping = _Stopping()


def _listen(path: Path) -> socket.socket:
    _private_directory(path.parent)
    if path.exists() or path.is_symlink():
        if not stat.S_ISSOCK(path.lstat().st_mode):
            raise FileExistsError(f"{path} exists and is not a socket: not replacing it")
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                probe.connect(str(path))
        except OSError:
            path.unlink()  # left by a worker that died
        else:
            raise FileExistsError(f"a dbspark worker already serves at {path}")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    os.chmod(path, 0o600)
    listener.listen(64)
    return listener


def _answer(connection: socket.socket, engines: ResidentEngines) -> None:
    """Read one request, run its unit, send the answer (the unit's log lines, and its
    error when it failed without a result file)."""
    lines: list[tuple[int, str, str]] = []
    try:
        _require_same_user(connection)
        request = json.loads(_read_line(connection))
        if request.get("format") != WORKER_FORMAT:
            raise ValueError(f"a request in format {request.get('format')!r}, not {WORKER_FORMAT}")
        environ = {UNIT_KEY_VARIABLE: str(request["key"])}
        passed = {
            CATALOG_URL_VARIABLE: "catalog_url",
            SERVING_URL_VARIABLE: "serving_url",
            TABLE_CREDENTIALS_VARIABLE: "table_credentials",
        }
        environ.update(
            {var: str(request[name]) for var, name in passed.items() if request.get(name)}
        )
        with _captured_logs(lines):
            run_unit_file(Path(request["unit_file"]), engines.spark, environ, engines=engines)
        answer: dict[str, Any] = {"format": WORKER_FORMAT, "log": lines}
    except Exception as err:  # the task gets it; the worker goes on
        log.warning("a unit failed in the worker: %s: %s", type(err).__name__, err)
        answer = {"format": WORKER_FORMAT, "log": lines, "error": f"{type(err).__name__}: {err}"}
    with contextlib.suppress(OSError):  # the task may have gone (killed, timed out)
        connection.sendall(json.dumps(answer, default=str).encode() + b"\n")


@contextlib.contextmanager
def _captured_logs(lines: list[tuple[int, str, str]]) -> Iterator[None]:
    """The ``dbspark`` loggers' records at INFO and above, kept as (level, logger,
    message) for the task's log."""

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append((record.levelno, record.name, record.getMessage()))

    handler = Keep(logging.INFO)
    root = logging.getLogger("dbspark")
    level = root.level
    root.addHandler(handler)
    if root.getEffectiveLevel() > logging.INFO:
        root.setLevel(logging.INFO)
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


# ----------------------------------------------------------------------------- the task
def run_in_worker(
    socket_path: str | os.PathLike[str],
    shipped: ShippedUnit,
    directory: Path,
    *,
    catalog_url: str | None = None,
    serving_url: str | None = None,
    table_credentials: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Hand ``shipped`` to the worker at ``socket_path`` and return the unit's result,
    its log lines re-logged here. Raises :class:`WorkerUnavailable` when no worker
    answers there (nothing was run), a final error of the unit as the task would
    (``units.read_result_file``), or :class:`WorkerFailed`."""
    path = Path(socket_path)
    client = _connect(path)
    key = secrets.token_bytes(32)
    unit_file = write_unit_file(directory, shipped, key)
    try:
        with client:
            request = {
                "format": WORKER_FORMAT,
                "unit_file": str(unit_file),
                "key": key.hex(),
                "catalog_url": catalog_url,
                "serving_url": serving_url,
                "table_credentials": json.dumps(dict(table_credentials))
                if table_credentials
                else None,
            }
            client.sendall(json.dumps(request).encode() + b"\n")
            try:
                answer = json.loads(_read_line(client))
            except (OSError, ValueError) as err:
                raise WorkerFailed(
                    f"the dbspark worker at {path} stopped answering while it ran the unit "
                    f"({err}); a retry runs it again unless it committed"
                ) from None
        for level, name, message in answer.get("log", []):
            logging.getLogger(name).log(int(level), "%s", message)
        if result_path(unit_file).exists():
            return read_result_file(unit_file, key)  # a final error is raised from here
        raise WorkerFailed(
            f"the unit failed in the dbspark worker at {path}: {answer.get('error', 'no result')}"
        )
    finally:
        for leftover in (unit_file, result_path(unit_file)):
            leftover.unlink(missing_ok=True)


def _connect(path: Path) -> socket.socket:
    """A connection to the worker at ``path``, after checking that this user owns the
    socket in a private directory (another user's socket would receive the unit's key
    and could answer for it)."""
    try:
        info = path.lstat()
    except FileNotFoundError:
        raise WorkerUnavailable(f"no dbspark worker socket at {path}") from None
    if not stat.S_ISSOCK(info.st_mode):
        raise WorkerUnavailable(f"{path} is not a socket")
    if info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) & 0o077:
        raise WorkerFailed(
            f"refused the worker socket {path}: owned by uid {info.st_uid} with mode "
            f"{stat.S_IMODE(info.st_mode):04o}; it must be this user's (uid {os.getuid()}) "
            "and private"
        )
    _private_directory(path.parent, create=False)
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        client.connect(str(path))
    except OSError as err:
        client.close()
        raise WorkerUnavailable(f"no dbspark worker answers at {path} ({err})") from None
    return client


def _private_directory(path: Path, *, create: bool = True) -> None:
    if create:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
    info = path.lstat()
    mode = stat.S_IMODE(info.st_mode)
    if stat.S_ISLNK(info.st_mode) or info.st_uid != os.getuid() or mode & 0o077:
        raise WorkerFailed(
            f"refused the worker's directory {path}: it must be a directory of this user "
            f"(uid {os.getuid()}) that nobody else may enter (mode 0700), not uid "
            f"{info.st_uid} with mode {mode:04o}"
        )


def _require_same_user(connection: socket.socket) -> None:
    """Refuse a peer of another user (Linux tells who is at the other end)."""
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None:
        return  # the socket's mode and directory keep others out
    credentials = connection.getsockopt(socket.SOL_SOCKET, option, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", credentials)
    if uid != os.getuid():
        raise PermissionError(f"a request from uid {uid}, not this worker's user")


def _read_line(connection: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = connection.recv(65536)
        if not chunk:
            raise ValueError("the connection closed before a whole message arrived")
        data += chunk
        if len(data) > MAX_MESSAGE_BYTES:
            raise ValueError("a message larger than any dbspark worker message")
    return data


# ----------------------------------------------------------------------------- the command
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dbspark.orchestration.worker",
        description="Run the units that dbspark's Airflow tasks hand over, keeping the "
        "engines (their decoded traces and Spark session) between them.",
    )
    parser.add_argument(
        "--socket", type=Path, required=True, help="the Unix socket ([dbspark] worker_socket)"
    )
    parser.add_argument(
        "--resident-bytes",
        type=int,
        default=None,
        help="decoded traces kept in memory, all circuits together (default "
        "DBSPARK_RESIDENT_BYTES, or 4 GiB)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    signal.signal(signal.SIGTERM, _stopping)
    try:
        serve(args.socket, ResidentEngines(resident_bytes=args.resident_bytes))
    except KeyboardInterrupt:
        return 0
    except (FileExistsError, WorkerFailed) as err:
        print(f"dbspark worker: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
