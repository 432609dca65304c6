"""A unit worker (``orchestration/worker.py``) as a child process, for tests and the bench.

It follows the development tools' one life cycle (``processes.py``): started in a
session of its own with its output in one log file, ready once its socket exists,
stopped with SIGTERM (which it takes between units) and SIGKILL after a while.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dbspark.devtools.processes import launch, stop_group, tail, wait_until

#: How long a worker may take to listen (it imports dbspark; it builds no engine yet).
STARTUP_TIMEOUT = 60.0


class LocalUnitWorker:
    """``python -m dbspark.orchestration.worker --socket <socket_path>``, its output
    appended to ``log_path``, with ``env`` added to this process's environment (a
    ``SPARK_REMOTE`` for its Spark, say)."""

    def __init__(
        self, socket_path: Path, log_path: Path, env: Mapping[str, str] | None = None
    ) -> None:
        self.socket_path = Path(socket_path)
        self.log_path = Path(log_path)
        self.env = dict(env or {})
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> LocalUnitWorker:
        """Start it and wait until it listens; an error quoting its log if it does not."""
        command = [sys.executable, "-m", "dbspark.orchestration.worker"]
        self.process = launch(
            [*command, "--socket", str(self.socket_path)],
            log_path=self.log_path,
            env={**os.environ, **self.env, "PYTHONUNBUFFERED": "1"},
        )
        process = self.process

        def listening() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"the unit worker exited:\n{tail(self.log_path)}")
            return self.socket_path.exists()

        if not wait_until(listening, STARTUP_TIMEOUT, interval=0.05):
            self.stop()
            raise RuntimeError(
                f"the unit worker did not listen at {self.socket_path} within "
                f"{STARTUP_TIMEOUT:g} s:\n{tail(self.log_path)}"
            )
        return self

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        """SIGTERM, which it takes between units (it removes its socket), then SIGKILL."""
        stop_group(self.process, timeout=60.0)

    def __enter__(self) -> LocalUnitWorker:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
