"""``python -m dbspark.refresh``: verify or rebuild views from scratch.

This is the second way to every answer (ARCHITECTURE.md, "Two ways to every answer").

    python -m dbspark.refresh verify CIRCUIT --warehouse DIR [--tier local|spark]
    python -m dbspark.refresh rebuild CIRCUIT --warehouse DIR [--view NAME ...]
                                  [--outputs DIR]
    python -m dbspark.refresh compact-logs CIRCUIT --warehouse DIR [--keep-epochs N]

``CIRCUIT`` is a named example circuit (``orders``, ``reachability``, ...) or
``package.module:function`` returning a ``Circuit``. ``verify`` recomputes every
view over the warehouse's raw input log and compares it with the incrementally
maintained view: exit 0 when they agree, 1 with the differing rows otherwise. A log
of at most ``REFERENCE_VERIFY_ROWS`` rows is recomputed by the reference engine in this
process, a larger one by Spark; ``--tier`` chooses instead.
``rebuild`` replaces the views' contents with the full refresh; with ``--outputs``
(the deployment's ``[dbspark] outputs``), it also corrects the views' change feeds and
Delta tables there (the ``DBSPARK_TABLE_*`` variables locate and keep the tables),
as a DAG run's ``rebuild`` task does. The serving tables take the correction at the
DAG's next ``serve``.
``compact-logs`` merges the raw input logs of all but the last ``N`` committed epochs
(default 0: as far as the circuit's delays allow), as the DAG's ``maintain`` task does
past ``input_log_retention_hours``: ``verify`` and ``rebuild`` then replay as of a later
epoch only.
"""

from __future__ import annotations

import argparse
import importlib
import os
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dbspark.circuit.builder import Circuit
from dbspark.examples.circuits import NAMED_CIRCUITS


def load_circuit(spec: str) -> Circuit:
    """A named example circuit, or ``module:function`` returning one."""
    if spec in NAMED_CIRCUITS:
        return NAMED_CIRCUITS[spec]()
    if ":" not in spec:
        known = ", ".join(sorted(NAMED_CIRCUITS))
        raise SystemExit(f"unknown circuit {spec!r}: give one of {known} or module:function")
    module_name, function_name = spec.split(":", 1)
    factory = getattr(importlib.import_module(module_name), function_name)
    circuit = factory()
    if not isinstance(circuit, Circuit):
        raise SystemExit(f"{spec} returned {type(circuit).__name__}, not a Circuit")
    return circuit


def main(argv: Sequence[str] | None = None) -> int:
    from dbspark.engine.spark.views import VERIFY_TIERS

    parser = argparse.ArgumentParser(prog="python -m dbspark.refresh", description=__doc__)
    parser.add_argument("action", choices=("verify", "rebuild", "compact-logs"))
    parser.add_argument("circuit", help="a named example circuit or module:function")
    parser.add_argument("--warehouse", type=Path, required=True)
    parser.add_argument("--view", action="append", help="rebuild only these views")
    parser.add_argument(
        "--outputs", help="rebuild: also correct the views' change feeds and tables here"
    )
    parser.add_argument(
        "--tier",
        choices=VERIFY_TIERS,
        help="verify: recompute in this process (local) or with Spark (default: by log size)",
    )
    parser.add_argument(
        "--keep-epochs",
        type=int,
        help="compact-logs: leave the raw input logs of this many last epochs as they are",
    )
    args = parser.parse_args(argv)
    if args.keep_epochs is not None and (args.action != "compact-logs" or args.keep_epochs < 0):
        parser.error("--keep-epochs applies to compact-logs only, and is 0 or more")
    if args.tier is not None and args.action != "verify":
        parser.error("--tier applies to verify only")
    if args.outputs is not None and args.action != "rebuild":
        parser.error("--outputs applies to rebuild only")
    if not (args.warehouse / "catalog.db").exists():
        print(f"no warehouse at {args.warehouse} (no catalog.db)", file=sys.stderr)
        return 2

    from dbspark.engine.spark.executor import SparkEngine

    engine = SparkEngine(load_circuit(args.circuit), args.warehouse)
    # Garbage collection keeps what this run reads and writes while it holds the lease.
    holder = f"python -m dbspark.refresh {args.action} ({socket.gethostname()}, pid {os.getpid()})"
    lease = engine.catalog.acquire_lease(engine.circuit.name, holder)
    try:
        return _run(engine, args)
    finally:
        engine.catalog.release_lease(lease)


def _run(engine: Any, args: argparse.Namespace) -> int:
    epoch = engine.last_committed_epoch()
    if args.action == "compact-logs":
        from dbspark.orchestration.units import CompactLogsUnit

        # The maintain task's unit, with the horizon given in epochs.
        done = CompactLogsUnit(epoch, epoch - (args.keep_epochs or 0)).run(engine)
        print(
            f"raw input logs of {engine.circuit.name!r} up to epoch {done['through_epoch']}: "
            f"{done['merges']} merges replaced {done['batches_replaced']} batches; full "
            f"refresh replays from epoch {done['replayable_from']}"
        )
        return 0
    if args.action == "verify":
        tier = args.tier or engine.verify_tier()
        where = "in this process" if tier == "local" else "with Spark"
        print(f"full refresh of {engine.circuit.name!r} at epoch {epoch} {where}")
        differences = engine.verify(tier=tier)
        for name, rows in differences.items():
            state = "matches full refresh" if not rows else f"DIFFERS in {len(rows)} rows"
            print(f"view {name} at epoch {epoch}: {state}")
            for row in rows[:20]:
                print(f"  {row[:-1]} weight(full refresh - maintained) = {row[-1]}")
        return 1 if any(differences.values()) else 0
    views = args.view or list(engine.circuit.views)
    for name in views:
        if name not in engine.circuit.views:
            print(f"circuit {engine.circuit.name!r} has no view {name!r}", file=sys.stderr)
            return 2
    if args.outputs is None:
        for name in views:
            rows = engine.rebuild(name)
            print(f"view {name} rebuilt from scratch at epoch {epoch}: {rows} rows")
        return 0
    from dbspark.orchestration.sinks.export import rebuild_views
    from dbspark.orchestration.sinks.files import ExportError
    from dbspark.orchestration.sinks.tables import TableError, TableSettings

    try:
        tables = TableSettings.from_environment()
        rebuilt, corrected = rebuild_views(engine, views, root=args.outputs, tables=tables)
    except (ExportError, TableError, ValueError) as err:
        print(f"rebuilding {', '.join(views)} with their outputs failed: {err}", file=sys.stderr)
        return 2
    for name, rows in rebuilt.items():
        print(f"view {name} rebuilt from scratch at epoch {epoch}: {rows} rows")
    for item in corrected.values():
        print(f"outputs of view {item.describe()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
