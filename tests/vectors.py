"""Where the public conformance vectors live, for every test that replays them.

``$DBSPARK_CONFORMANCE_VECTORS`` wins; otherwise the shared folder beside this checkout
(``<checkout>/../shared/conformance/vectors``), which is where CI puts it. A missing
folder stops the run at collection: tests parametrized over no vectors would pass
vacuously.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

VECTOR_DIR = Path(
    os.environ.get("DBSPARK_CONFORMANCE_VECTORS")
    or Path(__file__).resolve().parents[2] / "shared" / "conformance" / "vectors"
)
if not sorted(VECTOR_DIR.glob("*.json")):
    raise RuntimeError(
        f"no conformance vectors in {VECTOR_DIR}: put the shared folder beside this "
        "checkout or point DBSPARK_CONFORMANCE_VECTORS at the vectors"
    )
VECTORS = sorted(VECTOR_DIR.glob("*.json"))
#: Circuits defined in SQL (the shared README, "Circuits defined in SQL").
SQL_VECTOR_DIR = VECTOR_DIR.parent / "sql"
SQL_VECTORS = sorted(SQL_VECTOR_DIR.glob("*.json"))
if not SQL_VECTORS:
    raise RuntimeError(f"no SQL conformance vectors in {SQL_VECTOR_DIR}")
REPLAYED = VECTORS + SQL_VECTORS


def replay_vector(spark: Any, warehouse: Path, path: Path, local_rows: int | None = None) -> Any:
    """Step a fresh ``SparkEngine`` through the vector at ``path``, asserting every
    epoch's views against the vector's ``expected``; returns the engine. ``local_rows=0``
    keeps every unit on Spark (the default runs small epochs on the local tier)."""
    from dbspark.conformance.runner import zset_to_rows
    from dbspark.conformance.vector import parse_vector
    from dbspark.engine.spark.executor import SparkEngine

    vector = parse_vector(path.read_text(encoding="utf-8"))
    expected = json.loads(path.read_text(encoding="utf-8"))["expected"]
    engine = SparkEngine(vector.circuit, warehouse, spark=spark, local_rows=local_rows)
    for epoch, inputs in enumerate(vector.epochs):
        result = engine.step(inputs)
        assert result.epoch == epoch
        got = {name: zset_to_rows(z) for name, z in result.views.items()}
        assert got == expected[epoch], f"{path.stem}: epoch {epoch}"
    return engine
