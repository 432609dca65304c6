"""Build-time check of the Spark image: the pyspark wheel carries the Spark we expect.

Run by deploy/spark/Dockerfile after the install, with the pinned pyspark version:
``python check_pyspark.py 4.2.0``. Fails the build when pyspark (whose Python files the
pyspark-client wheel overwrites) or its bundled jars are of another version, or when
the Spark distribution lacks what the daemons start from.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

#: Where ``SPARK_HOME`` in the Dockerfile points (python:3.11 images, system pip).
EXPECTED_HOME = Path("/usr/local/lib/python3.11/site-packages/pyspark")


def problems(wanted: str) -> list[str]:
    import pyspark

    home = Path(pyspark.__file__).parent
    found = []
    if pyspark.__version__ != wanted:
        found.append(f"pyspark.__version__ is {pyspark.__version__}, not {wanted}")
    if not list((home / "jars").glob(f"spark-core_*-{wanted}.jar")):
        found.append(f"no spark-core jar of version {wanted} in {home / 'jars'}")
    if not list((home / "jars").glob("spark-connect_*.jar")):
        found.append(f"no Spark Connect server jar in {home / 'jars'}")
    for tool in ("spark-class", "spark-submit"):
        if not os.access(home / "bin" / tool, os.X_OK):
            found.append(f"{home / 'bin' / tool} is missing or not executable")
    if home != EXPECTED_HOME:
        found.append(f"pyspark is at {home}, but SPARK_HOME says {EXPECTED_HOME}")
    return found


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: check_pyspark.py PYSPARK_VERSION", file=sys.stderr)
        return 2
    found = problems(argv[0])
    for problem in found:
        print(f"error: {problem}", file=sys.stderr)
    if not found:
        print(f"pyspark {argv[0]} with its Spark distribution: ok")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
