"""A class-data archive for Spark's JVM: a session starts in about two thirds of the time.

A Spark driver loads some 15,000 classes from ``pyspark/jars`` before its first job, and
the JVM parses and verifies each one on every start: measured here, 8 s to a session and
3 s to its first job. The JVM's class-data sharing (CDS) can map them pre-parsed from an
archive instead: 5.8 s and 1.7 s with one. Every process that starts a JVM pays this
(an Airflow task that runs a Spark unit, ``spark-submit``, a Connect server, the
standalone daemons), so the archive is built once, at set-up, and every launch dbspark
makes points at it.

``build()`` starts a local session with ``-XX:ArchiveClassesAtExit``, runs the kinds of
work an epoch does (Arrow in and out, Parquet, joins, aggregates, windows), and keeps
the classes the JVM loaded. The JVM checks an archive on use (its own build, the class
path) and ignores one that does not match, silently with ``java_options()``'s flags: a
stale archive costs the start-up it would have saved, never a failure. The archive is
named by the pyspark version, so an upgrade builds a new one.

``DBSPARK_JVM_ARCHIVE`` names the file (``off`` disables it); by default it lives in
the Python environment, beside the jars it was made from.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ARCHIVE_VARIABLE = "DBSPARK_JVM_ARCHIVE"
#: The JVM says why it ignored an archive at warning level; a stale archive is not the
#: user's concern (it only costs start-up time), so those lines are turned off.
QUIET_CDS = ("-Xshare:auto", "-Xlog:cds=off", "-Xlog:cds+dynamic=off")
BUILD_TIMEOUT_S = 600


def archive_path() -> Path | None:
    """Where the archive is (or would be built), or None when disabled."""
    chosen = os.environ.get(ARCHIVE_VARIABLE, "").strip()
    if chosen.lower() in ("off", "0", "false", "no"):
        return None
    if chosen:
        return Path(chosen)
    import pyspark

    return Path(sys.prefix) / "share" / "dbspark" / f"spark-{pyspark.__version__}.jsa"


def java_options() -> tuple[str, ...]:
    """JVM options that use the archive, or none when it is disabled or not built."""
    path = archive_path()
    if path is None or not path.is_file():
        return ()
    return (f"-XX:SharedArchiveFile={path}", *QUIET_CDS)


def with_archive(options: str) -> str:
    """``options`` (a JVM option string) with the archive's options added, unless it
    already names a class-data archive or sharing setting of its own."""
    if "SharedArchiveFile" in options or "ArchiveClassesAtExit" in options or "-Xshare" in options:
        return options
    return " ".join(part for part in (options.strip(), *java_options()) if part)


def build(path: Path | None = None) -> Path | None:
    """Build the archive at ``path`` (default ``archive_path()``) and return it; None when
    disabled. Written under a temporary name and renamed, so a reader never sees half."""
    target = path or archive_path()
    if target is None:
        return None
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, scratch = tempfile.mkstemp(prefix=".building-", suffix=".jsa", dir=target.parent)
    os.close(handle)
    os.unlink(scratch)  # the JVM creates it
    env = dict(os.environ)
    env[ARCHIVE_VARIABLE] = "off"
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "dbspark.engine.spark.class_archive", "--workload", scratch],
            env=env,
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
        )
        if done.returncode != 0 or not os.path.isfile(scratch):
            raise RuntimeError(
                f"building the JVM class archive {target} failed (exit {done.returncode}):\n"
                + (done.stderr or done.stdout)[-3000:]
            )
        os.replace(scratch, target)
    finally:
        if os.path.exists(scratch):
            os.unlink(scratch)
    return target


def _workload(scratch: str) -> None:
    """What an epoch does, in a session whose JVM writes the classes it loaded at exit."""
    import pyarrow as pa
    from pyspark.sql import SparkSession, Window
    from pyspark.sql import functions as F

    from dbspark.engine.spark.session import session_conf

    builder = SparkSession.builder.master("local[2]").appName("dbspark-class-archive")
    for key, value in session_conf("local[2]").items():
        builder = builder.config(key, value)
    builder = builder.config("spark.driver.extraJavaOptions", f"-XX:ArchiveClassesAtExit={scratch}")
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    with tempfile.TemporaryDirectory() as work:
        table = pa.table({"k": list(range(200)), "v": [float(i) for i in range(200)]})
        left = spark.createDataFrame(table.to_pandas())
        left.write.parquet(f"{work}/left")
        right = (
            spark.read.parquet(f"{work}/left")
            .withColumnRenamed("v", "u")
            .withColumn("w", F.lit(1).cast("bigint"))
        )
        joined = left.join(right, "k").groupBy((F.col("k") % 7).alias("g"))
        totals = joined.agg(F.sum("w").alias("n"), F.max("v").alias("top"), F.count("*"))
        ranked = totals.withColumn("r", F.row_number().over(Window.orderBy(F.desc("n"))))
        ranked.where(F.col("r") < 5).toArrow()
        spark.sql(f"SELECT k, v FROM parquet.`{work}/left` WHERE k IN (1, 2, 3)").collect()
        left.union(right.select("k", "u")).distinct().write.mode("overwrite").parquet(f"{work}/out")
        left.crossJoin(F.broadcast(right.limit(3))).count()
    spark.stop()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--workload"] and len(args) == 2:
        _workload(args[1])
        return 0
    if args not in ([], ["--if-missing"]):
        print("usage: python -m dbspark.engine.spark.class_archive [--if-missing]", file=sys.stderr)
        return 2
    path = archive_path()
    if args and (path is None or path.is_file()):
        return 0
    print(f"building the JVM class archive {path} (once, about a minute)...", flush=True)
    built = build()
    print(f"JVM class archive: {built or f'off ({ARCHIVE_VARIABLE})'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
