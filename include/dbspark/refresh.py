"""``python -m dbspark.refresh``: verify or rebuild views from scratch.

This is the second way to every answer (ARCHITECTURE.md, "Two ways to every answer").

    python -m dbspark.refresh verify CIRCUIT --warehouse DIR
    python -m dbspark.refresh rebuild CIRCUIT --warehouse DIR [--view NAME ...]

``CIRCUIT`` is a named example circuit (``orders``, ``reachability``, ...) or
``package.module:function`` returning a ``Circuit``. ``verify`` recomputes every
view over the warehouse's raw input log and compares it with the incrementally
maintained view: exit 0 when they agree, 1 with the differing rows otherwise.
``rebuild`` replaces the views' contents with the full refresh.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from pathlib import Path

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
    parser = argparse.ArgumentParser(prog="python -m dbspark.refresh", description=__doc__)
    parser.add_argument("action", choices=("verify", "rebuild"))
    parser.add_argument("circuit", help="a named example circuit or module:function")
    parser.add_argument("--warehouse", type=Path, required=True)
    parser.add_argument("--view", action="append", help="rebuild only these views")
    args = parser.parse_args(argv)
    if not (args.warehouse / "catalog.db").exists():
        print(f"no warehouse at {args.warehouse} (no catalog.db)", file=sys.stderr)
        return 2

    from dbspark.engine.spark.executor import SparkEngine

    engine = SparkEngine(load_circuit(args.circuit), args.warehouse)
    epoch = engine.last_committed_epoch()
    if args.action == "verify":
        differences = engine.verify()
        for name, rows in differences.items():
            state = "matches full refresh" if not rows else f"DIFFERS in {len(rows)} rows"
            print(f"view {name} at epoch {epoch}: {state}")
            for row in rows[:20]:
                print(f"  {row[:-1]} weight(full refresh - maintained) = {row[-1]}")
        return 1 if any(differences.values()) else 0
    for name in args.view or list(engine.circuit.views):
        if name not in engine.circuit.views:
            print(f"circuit {engine.circuit.name!r} has no view {name!r}", file=sys.stderr)
            return 2
        rows = engine.rebuild(name)
        print(f"view {name} rebuilt from scratch at epoch {epoch}: {rows} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
