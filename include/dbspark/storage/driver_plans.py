"""Plans whose small result comes to the driver run as one Spark job each.

A unit on the Spark tier whose epoch is small (``driver_rows``) brings its outputs to
the driver and writes them with pyarrow (``Warehouse.write``), and decides its upserts
there. Each such collect is one action, but with adaptive execution Spark submits
every shuffle stage and every broadcast of the plan as a job of its own: a join unit's
output delta took 5 jobs, an aggregate's 4, and a loop iteration about 12. A job costs
0.1-0.3 s here however little it does. For rows few enough to collect, what adaptive
execution decides at run time (coalesced partitions, a switch to a broadcast join)
saves nothing, so these collects are planned statically, with no broadcast and one
shuffle partition: the shuffles become stages of the one job. Measured (ARCHITECTURE.md,
"One job per collect"): jobs per W1 unit 4.1 -> 2.6 and per W2 loop iteration about
12 -> 3, in the same time. Units that write through Spark keep the session's settings.

Reading more than 32 folders (a trace's bucket folders over a few batches), Spark lists
them with a job too (``parallelPartitionDiscovery``). The warehouse is a local or
mounted file system, where the driver lists a few hundred folders in milliseconds, so
its reads list on the driver (``listed_on_driver``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

#: Settings for the planning of a collect of at most a few thousand rows.
ONE_JOB_SETTINGS = {
    "spark.sql.adaptive.enabled": "false",
    "spark.sql.autoBroadcastJoinThreshold": "-1",
    # A few thousand rows: more partitions would only be more tasks.
    "spark.sql.shuffle.partitions": "1",
}


#: Spark's setting for the number of paths from which it lists them with a job.
DISCOVERY_THRESHOLD = "spark.sql.sources.parallelPartitionDiscovery.threshold"
#: Its default: fewer paths are listed on the driver anyway.
DEFAULT_DISCOVERY_THRESHOLD = 32


def one_job(spark: Any) -> AbstractContextManager[None]:
    """Plan the actions run inside the block with ``ONE_JOB_SETTINGS``, then give the
    session back its own values. The settings are read when an action plans its query,
    so the block must hold the action (``toArrow``, ``collect``), not only the building
    of the frame. ``spark`` None (a unit on the local tier): nothing to set."""
    return nullcontext() if spark is None else _settings(spark, ONE_JOB_SETTINGS)


def listed_on_driver(spark: Any, paths: int) -> AbstractContextManager[None]:
    """Have a read of ``paths`` folders, created inside the block, list them on the
    driver (a ``DataFrameReader`` lists when the frame is created)."""
    if paths <= DEFAULT_DISCOVERY_THRESHOLD:
        return nullcontext()
    return _settings(spark, {DISCOVERY_THRESHOLD: str(paths)})


@contextmanager
def _settings(spark: Any, settings: dict[str, str]) -> Iterator[None]:
    conf = spark.conf
    before = {key: conf.get(key, None) for key in settings}
    for key, value in settings.items():
        if before[key] != value:
            conf.set(key, value)
    try:
        yield
    finally:
        for key, value in before.items():
            if value == settings[key]:
                continue
            if value is None:
                conf.unset(key)
            else:
                conf.set(key, value)
