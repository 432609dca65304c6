"""spark-submit entry point: run one unit of an epoch (an ingest, a stage, a loop
iteration, the publish step or the close) of a dbspark circuit.

    spark-submit --master spark://HOST:7077 "$(python -m dbspark.orchestration.spark_job
        --path)" --unit-file PATH

It ships inside the package: spark-submit runs this module's file wherever dbspark is
installed (a wheel, an editable checkout), and nothing looks for the repository on disk.
``--path`` prints that file's path.

The Airflow task that submits it (``dbspark.orchestration.airflow.tasks``, when the Spark
connection has type ``spark``) writes the unit file: JSON, private (0600 in a 0700
directory), with the circuit's recipe, the unit, and the catalog's connection id, and an
HMAC under a key it passes in ``DBSPARK_UNIT_KEY`` with the databases' URLs
(``DBSPARK_UNIT_CATALOG_URL``, ``DBSPARK_UNIT_SERVING_URL``) in this process's
environment. The job refuses a file that is not private or does not match its HMAC,
builds the circuit from the recipe, opens the engine on the same warehouse and catalog,
runs the unit through ``dbspark.orchestration.units.execute_unit`` (the code a local task
runs), and writes the result beside the unit file. It imports no Airflow.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

#: What spark-submit runs: this module's file, in the installed package.
SPARK_JOB = Path(__file__).resolve()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dbspark.orchestration.spark_job")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--unit-file", type=Path, help="run the unit in this unit file")
    what.add_argument("--path", action="store_true", help="print the file spark-submit runs")
    args = parser.parse_args(argv)
    if args.path:
        print(SPARK_JOB)
        return 0
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    from pyspark.sql import SparkSession

    from dbspark.engine.spark.session import CLASSIC_STATIC_DEFAULTS, RUNTIME_DEFAULTS
    from dbspark.orchestration.units import run_unit_file

    # spark-submit chose the master; dbspark's semantics (UTC, ANSI overflow) are set here.
    builder = SparkSession.builder.appName(f"dbspark-unit-{args.unit_file.stem}")
    for key, value in CLASSIC_STATIC_DEFAULTS.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    for key, value in RUNTIME_DEFAULTS.items():
        spark.conf.set(key, value)
    spark.sparkContext.setLogLevel("WARN")
    try:
        result = run_unit_file(args.unit_file, spark)
    finally:
        spark.stop()
    print(f"dbspark unit done: {result}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
