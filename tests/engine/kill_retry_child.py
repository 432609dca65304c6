"""Run a vector's epochs with SparkEngine and die for real at a chosen catalog commit.

Used by ``test_kill_retry.py`` as a subprocess (never imported by library code). The
harness, not the library, wraps ``Catalog.commit`` in this process only: the K-th call
whose stage name starts with PREFIX calls ``os._exit(137)`` just BEFORE the real
commit, just AFTER it (flushed: ``run_epoch`` groups its units' commits, and this one is
durable), or after it but before the group's flush (GROUPED: the commit, and the group's
earlier ones, never reached the disk). The stage and time of the fatal call are written
to ``WAREHOUSE/killed.json`` first, so the test knows which unit died.

    python kill_retry_child.py VECTOR.json WAREHOUSE PREFIX K before|after|grouped EPOCHS \
        [AT_EPOCH]

Only the first EPOCHS epochs run; with AT_EPOCH only commits at that epoch count.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main() -> None:
    vector_path, warehouse, prefix, k, when, epochs = sys.argv[1:7]
    at_epoch = int(sys.argv[7]) if len(sys.argv) > 7 else None
    target, moment = int(k), when
    assert moment in ("before", "after", "grouped"), moment

    from pyspark.sql import SparkSession

    from dbspark.conformance.vector import parse_vector
    from dbspark.devtools.spark_daemons import DEFAULT_JAVA_OPTIONS
    from dbspark.engine.spark.executor import SparkEngine
    from dbspark.storage.catalog import Catalog

    seen = 0
    real_commit = Catalog.commit

    def commit(self: Catalog, circuit: str, stage: str, time, *args, **kwargs):  # type: ignore[no-untyped-def]
        nonlocal seen
        if not stage.startswith(prefix) or at_epoch not in (None, int(time[0])):
            return real_commit(self, circuit, stage, time, *args, **kwargs)
        seen += 1
        if seen != target:
            return real_commit(self, circuit, stage, time, *args, **kwargs)
        note = {"stage": stage, "time": list(time), "when": moment}
        (Path(warehouse) / "killed.json").write_text(json.dumps(note))
        if moment == "before":
            os._exit(137)
        result = real_commit(self, circuit, stage, time, *args, **kwargs)
        if moment == "after":
            self.flush()
        os._exit(137)
        return result  # pragma: no cover

    Catalog.commit = commit  # type: ignore[method-assign]

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("dbspark-kill-child")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.ansi.enabled", "true")
        .config("spark.driver.extraJavaOptions", " ".join(DEFAULT_JAVA_OPTIONS))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    vector = parse_vector(Path(vector_path).read_text())
    engine = SparkEngine(vector.circuit, warehouse, spark=spark)
    for epoch, inputs in enumerate(vector.epochs[: int(epochs)]):
        engine.run_epoch(epoch, inputs)
    sys.exit(0)  # the kill point was never reached


if __name__ == "__main__":
    main()
