"""``python -m dbspark.conformance VECTOR.json [--engine spark|reference] [--warehouse DIR]
[--remote sc://HOST:PORT] [--check]``.

``--remote`` (default: the ``SPARK_REMOTE`` environment variable, which pyspark also
honours) runs the Spark engine through a Spark Connect server instead of a local
in-process Spark. The server must see the warehouse directory at the same path (same
machine or shared file system).

Exit status 0: one JSON object ``{"epochs": [...]}`` on stdout. Exit status 2:
the vector, the circuit, a source or a row is bad input, or the engine cannot
run; one line on stderr says what and where. Exit status 1: ``--check`` found a
difference from the vector's ``expected``, or the engine failed.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path

from dbspark.conformance.engines import EngineUnavailable, engine_names, get_engine
from dbspark.conformance.runner import compare, run_epochs
from dbspark.conformance.vector import VectorError, parse_vector

PROG = "python -m dbspark.conformance"
EXIT_MISMATCH = 1
EXIT_BAD_INPUT = 2

log = logging.getLogger("dbspark.conformance")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Replay a conformance vector through a named circuit and print what each "
        "view holds after each epoch, as JSON on stdout.",
    )
    parser.add_argument("vector", help="the vector file (JSON)")
    parser.add_argument(
        "--engine",
        default="spark",
        choices=engine_names(),
        help="which engine runs the circuit (default: spark)",
    )
    parser.add_argument(
        "--warehouse",
        type=Path,
        help="warehouse directory for engines that store traces (default: a fresh temporary "
        "directory, removed afterwards)",
    )
    parser.add_argument(
        "--remote",
        metavar="sc://HOST:PORT",
        help="run the Spark engine through this Spark Connect server (default: $SPARK_REMOTE; "
        "unset: a local in-process Spark); it must see the warehouse at the same path",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help='also compare with the vector\'s "expected" and exit 1 on a difference',
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="progress on stderr")
    return parser


def _fail(vector: str, message: str, status: int = EXIT_BAD_INPUT) -> int:
    one_line = " ".join(str(message).split())
    print(f"{PROG}: error: {vector}: {one_line}", file=sys.stderr)
    return status


@contextmanager
def _process_stderr_to(path: Path | None) -> Iterator[None]:
    """Point file descriptor 2 at ``path`` while a JVM starts, so it inherits the file.

    The contract of this command is one line on stderr for bad input; Spark's JVM
    writes start-up warnings straight to the inherited descriptor, around Python.
    """
    if path is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "ab") as target:
        os.dup2(target.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


def _unreachable(remote: str, timeout: float = 5.0) -> str | None:
    """Why a Spark Connect address cannot be used, or None when its port answers.

    The Connect client retries a dead address for minutes; a wrong URL should fail
    at once, as bad input.
    """
    import socket

    from dbspark.engine.spark.session import connect_address

    try:
        host, port = connect_address(remote)
    except ValueError as exc:
        return str(exc)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError as exc:
        return f"no Spark Connect server answers at {host}:{port} ({exc})"


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # PySpark warns about the pandas version on import; no pandas path is used here.
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas")
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        stream=sys.stderr,
        format="%(name)s: %(message)s",
    )
    spec = get_engine(args.engine)
    if spec.unavailable is not None:
        return _fail(args.vector, f"--engine {args.engine}: {spec.unavailable}")
    if args.remote is not None and spec.name != "spark":
        return _fail(args.vector, f"--remote: engine {spec.name} does not run on Spark")
    remote = args.remote or os.environ.get("SPARK_REMOTE") or None
    if spec.name != "spark":
        remote = None  # $SPARK_REMOTE only concerns the Spark engine
    if remote is not None:
        problem = _unreachable(remote)
        if problem is not None:
            return _fail(args.vector, f"--remote {remote}: {problem}")

    try:
        text = Path(args.vector).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return _fail(args.vector, f"cannot read the vector: {exc}")
    try:
        vector = parse_vector(text)
    except VectorError as exc:
        return _fail(args.vector, str(exc))
    log.info("circuit %s, %d epochs, engine %s", vector.circuit_name, len(vector.epochs), spec.name)

    with ExitStack() as stack:
        warehouse = args.warehouse
        if spec.uses_warehouse and warehouse is None:
            warehouse = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="dbspark-")))
        elif warehouse is not None and not spec.uses_warehouse:
            log.info("engine %s keeps no warehouse; --warehouse %s unused", spec.name, warehouse)
        try:
            jvm_log = None if args.verbose or warehouse is None else warehouse / "logs" / "jvm.log"
            with _process_stderr_to(jvm_log):
                if remote is not None:
                    # The engine joins the active session (see spark_session).
                    from dbspark.engine.spark.session import connect_session

                    stack.enter_context(connect_session(remote, app_name="dbspark-conformance"))
                engine = spec.create(vector.circuit, warehouse=warehouse)
            outputs = run_epochs(
                engine,
                vector.circuit,
                vector.epochs,
                on_epoch=lambda i, _result: log.info("epoch %d done", i),
            )
        except EngineUnavailable as exc:
            return _fail(args.vector, f"--engine {args.engine}: {exc}")
        except VectorError as exc:
            return _fail(args.vector, str(exc))
        except Exception as exc:  # an engine failure, not bad input: say so on one line
            if args.verbose:
                log.exception("engine %s failed", spec.name)
            return _fail(args.vector, f"engine {spec.name} failed: {type(exc).__name__}: {exc}", 1)

    sys.stdout.write(json.dumps({"epochs": outputs}) + "\n")
    sys.stdout.flush()
    if args.check:
        if not vector.has_expected:
            return _fail(args.vector, '--check: the vector has no "expected"')
        difference = compare(outputs, vector.expected)
        if difference is not None:
            return _fail(args.vector, f"--check: {difference}", EXIT_MISMATCH)
        log.info("matches expected")
    return 0
