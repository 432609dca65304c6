"""Child processes of the development tools: start one, wait until it serves, stop all
that it started.

Every service a tool runs (PostgreSQL, Redis, the Airflow components, Spark's daemons)
follows one life cycle, and this module is it:

- :func:`launch` starts the process in a session (and process group) of its own, with
  stdout and stderr appended to one log file, so a failure can be read afterwards and
  :func:`stop_group` can end the process with everything it started;
- :func:`die_with_parent` asks Linux to signal the child when the thread that started
  it exits, so a killed test run leaves no server behind;
- :func:`wait_until` polls a readiness check (through tenacity) until it passes or time
  runs out; the caller raises its own error quoting :func:`tail` of the log;
- :func:`kill_sessions` finds (with psutil) whatever is still alive in the sessions of
  the processes started, e.g. task processes Airflow moved to groups of their own.

Ports are picked by :func:`free_port` and may still be lost to another process before
the server binds them: callers that pick ports retry a launch that failed to bind.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import psutil
from tenacity import Retrying, retry_if_result, stop_after_delay, wait_fixed

LOOPBACK = "127.0.0.1"
#: How many lines of a log an error message quotes.
LOG_TAIL_LINES = 40
_PR_SET_PDEATHSIG = 1


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port that was free on ``host`` a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_is_free(port: int, host: str = LOOPBACK) -> bool:
    """Whether a server could listen on ``port`` now (with SO_REUSEADDR, as uvicorn
    binds, so connections of a stopped server in TIME_WAIT do not count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def port_open(host: str, port: int) -> bool:
    """Whether something accepts TCP connections on ``host:port``."""
    connect_to = LOOPBACK if host in ("0.0.0.0", "") else host
    try:
        with socket.create_connection((connect_to, port), timeout=1.0):
            return True
    except OSError:
        return False


def tail(path: Path | str | None, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of a text file ('' when it cannot be read)."""
    if path is None:
        return ""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 256 * 1024))
            text = handle.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def die_with_parent(sig: signal.Signals = signal.SIGTERM) -> Callable[[], None] | None:
    """A ``preexec_fn`` that has Linux send ``sig`` to the child when the thread that
    started it exits; None where that does not exist.

    It runs in the child after ``user=``/``group=`` took effect, which matters: dropping
    privileges clears the setting.
    """
    if not sys.platform.startswith("linux"):
        return None
    # Imported here, before the fork: a child that has dropped to an unprivileged user may
    # not read the interpreter's library (under /root), and an import there would fail.
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)

    def arm() -> None:
        with contextlib.suppress(Exception):
            libc.prctl(_PR_SET_PDEATHSIG, sig)

    return arm


def launch(
    command: Sequence[str],
    *,
    log_path: Path | None,
    env: Mapping[str, str] | None = None,
    cwd: Path | str | None = None,
    parent_death_signal: signal.Signals | None = signal.SIGTERM,
    **popen: Any,
) -> subprocess.Popen[bytes]:
    """Start ``command`` in a session of its own, its output appended to ``log_path``
    after a line saying when and what (None: this process's own stdout and stderr).

    ``parent_death_signal`` None lets the child outlive the thread that started it.
    ``popen`` goes to :class:`subprocess.Popen` (``user=``, ``group=``...).
    """
    with contextlib.ExitStack() as stack:
        output: Any = None
        if log_path is not None:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            output = stack.enter_context(open(log_path, "ab"))
            output.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} starting: ".encode())
            output.write(shlex.join(command).encode() + b"\n")
            output.flush()
        else:
            print(f"starting: {shlex.join(command)}", file=sys.stderr, flush=True)
        return subprocess.Popen(
            list(command),
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT if output is not None else None,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=die_with_parent(parent_death_signal) if parent_death_signal else None,
            **popen,
        )


def wait_until(ready: Callable[[], bool], timeout: float, interval: float = 0.25) -> bool:
    """Call ``ready`` every ``interval`` seconds until it answers True (then True) or
    ``timeout`` seconds have passed (then False). An exception from ``ready`` ends the
    wait at once: that is how a check says the process died."""
    retrying = Retrying(
        stop=stop_after_delay(timeout),
        wait=wait_fixed(interval),
        retry=retry_if_result(lambda ok: not ok),
        retry_error_callback=lambda _state: False,
        reraise=True,
    )
    return bool(retrying(ready))


def stop_group(
    proc: subprocess.Popen[bytes] | None,
    timeout: float = 30.0,
    signals: Sequence[signal.Signals] = (signal.SIGTERM,),
) -> None:
    """End ``proc``'s process group: each of ``signals`` in turn, waiting ``timeout``
    after each, then SIGKILL. Safe on None and on a process that already exited."""
    stop_groups([proc] if proc is not None else [], timeout, signals)


def stop_groups(
    procs: Sequence[subprocess.Popen[bytes]],
    timeout: float = 30.0,
    signals: Sequence[signal.Signals] = (signal.SIGTERM,),
) -> None:
    """End the process groups of ``procs`` together: each of ``signals`` to every group
    still running, then one wait of at most ``timeout`` for all of them, and SIGKILL to
    what is left (waited for 10 seconds). Together, so that components that shut down
    slowly (an Airflow scheduler stopping its tasks) do so side by side."""
    running = list(procs)
    for sig in (*signals, signal.SIGKILL):
        for proc in running:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, sig)
        deadline = time.monotonic() + (timeout if sig != signal.SIGKILL else 10.0)
        still = []
        for proc in running:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                still.append(proc)
        running = still
        if not running:
            return


def empty_group(group_id: int, timeout: float = 10.0) -> bool:
    """SIGKILL process group ``group_id`` until it is gone (its leader may have exited
    while others in the group linger: a JVM's Python workers, a worker's executors);
    False if it is still there after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(group_id, signal.SIGKILL)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        time.sleep(0.1)
    return False


def session_members(session_id: int) -> list[int]:
    """The live processes of a session (zombies excluded)."""
    members = []
    for process in psutil.process_iter(["status"]):
        with contextlib.suppress(psutil.Error, ProcessLookupError, PermissionError):
            if process.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if os.getsid(process.pid) == session_id:
                members.append(process.pid)
    return members


def kill_sessions(session_ids: Iterable[int], timeout: float = 10.0) -> list[int]:
    """SIGKILL everything left in the given sessions until they are empty or ``timeout``
    passes; the processes still there then (empty when all went away)."""
    sessions = list(session_ids)
    leftovers: list[int] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        leftovers = [pid for sid in sessions for pid in session_members(sid)]
        if not leftovers:
            return []
        for pid in leftovers:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    return leftovers


def describe(pid: int) -> str:
    """``pid command line`` of a process, for a message about leftovers."""
    try:
        return f"{pid} {' '.join(psutil.Process(pid).cmdline())}"
    except psutil.Error:
        return str(pid)
