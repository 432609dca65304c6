"""A moto S3 server on a free loopback port, for the tests of published tables on object
storage (``[dbspark] table_location = s3://...``): a real HTTP server, which delta-rs
talks to as to any S3 endpoint. The ``s3`` fixture (``tests/orchestration/conftest.py``)
starts one per test with the bucket ``BUCKET`` in it."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

BUCKET = "dbspark-outputs"

#: A moto S3 server in a child process, stopped and started on its port by the lines
#: "stop" and "start" on stdin; its buckets live in the child, so they outlast a stop.
#: (In this process, delta-rs calls that hold the GIL while waiting on the network,
#: such as reading a table's history, would starve the server's threads.)
SERVER = r"""
import sys

from moto.server import ThreadedMotoServer

port = 0
server = None
for line in sys.stdin:
    if line.strip() == "start":
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        server.start()
        port = server.get_host_and_port()[1]
    elif line.strip() == "stop":
        server.stop()
    print(port, flush=True)
"""


class S3:
    """The moto S3 server of one test, on one port."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", SERVER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.port = self._say("start")
        self.url = f"http://127.0.0.1:{self.port}"

    def _say(self, command: str) -> int:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        return int(self.process.stdout.readline())

    def start(self) -> None:
        assert self._say("start") == self.port

    def stop(self) -> None:
        self._say("stop")

    def close(self) -> None:
        self.process.kill()
        self.process.wait()

    def client(self) -> Any:
        """A boto3 S3 client of this server."""
        import boto3

        return boto3.client("s3", endpoint_url=self.url, region_name="us-east-1")

    def options(self) -> dict[str, str]:
        """The location's settings: where, and how long to wait (no credentials)."""
        return {
            "AWS_ENDPOINT_URL": self.url,
            "AWS_REGION": "us-east-1",
            "AWS_ALLOW_HTTP": "true",
            "connect_timeout": "1s",
            "timeout": "10s",
            "max_retries": "1",
            "retry_timeout": "2s",
        }

    def reader_options(self) -> dict[str, str]:
        """``options`` with credentials of its own (moto takes any): how a test reads a
        table back, whatever the environment the publisher had."""
        return {**self.options(), "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y"}
