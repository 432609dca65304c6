"""The engine, on each tier, against the reference engine on random update streams.

Every property runs three ways (the ``tier`` parameter): ``spark`` keeps every unit on
Spark (``local_rows=0``), ``local`` runs every unit in this process with DuckDB (the
default for small epochs), and ``crossing`` sets the threshold so low that epochs and
sources switch between the tiers in both directions within one history, each tier
continuing from the other's files.

Each epoch, every view of the incremental Spark engine (traces in a warehouse, a
SQLite catalog) must equal the reference engine's; where the reference rejects a
batch (an upsert conflict), Spark must reject the same epoch and source. Graph
streams build a graph with cycles and self-loops and then insert and delete edges
(the deletions inside cycles are the hard case); upsert streams carry late rows,
tombstones and NULL watermarks. Few examples, fixed seed: every Spark job costs
real time, and the reference-engine suite runs the same strategies hundreds of times.

Every operator kind runs here on the incremental Spark path: the general linear
operator (explode: weight from data; temporal filters: epoch from data, output
scheduled for later epochs), ``flat_map``, ``delay`` at the root and inside a loop,
every built-in aggregate with NULLs and retractions (grouped and global), the
recursive named circuits with deletions, and a loop nested in a loop. After the last
epoch, ``SparkEngine.verify()`` (a full refresh over the raw input log) must find no
difference either.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from typing import Any

import pytest
from circuits_for_tests import builtin_aggregates_circuit
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from test_reference_properties import (
    EVENTS,
    ITEMS,
    NESTED_BUG_HISTORY,
    NUMBERS,
    POSITIVE,
    any_changes,
    customer_rows,
    graph_history,
    histories,
    int_graph_history,
    loops_with_time_circuit,
    nested_circuit,
    order_rows,
    temporal_circuit,
    two_graph_history,
)

from dbspark.circuit.builder import Circuit
from dbspark.core.upsert import UpsertConflict
from dbspark.engine.local import tier as local_tier
from dbspark.engine.reference.engine import ReferenceEngine
from dbspark.engine.spark.executor import SparkEngine
from dbspark.engine.spark.upserts import DRIVER_ROWS
from dbspark.examples.circuits import NAMED_CIRCUITS

pytestmark = pytest.mark.slow

# Two examples per property keeps the file within a few minutes of CI; the reference
# suite runs the same strategies hundreds of times against the same oracles.
SPARK_PROPERTY = settings(
    max_examples=2,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def busy(history: list) -> bool:
    """At least one change per epoch on average: the simplest examples (all epochs
    empty), which hypothesis tries first, cost as much Spark time and test nothing."""
    return sum(len(batch) for inputs in history for batch in inputs.values()) >= len(history)


#: ``local_rows`` per tier setting: crossing puts an epoch of more than 2 input rows (and
#: a source batch of more than 2) on Spark, and smaller ones on the local tier. Crossing
#: also buckets every keyed batch the local tier writes (``SMALL_BATCH_ROWS``), which
#: small tests would otherwise never do; ``local`` writes them as single files.
#: ``local`` and ``crossing`` keep their files resident across epochs (the engine's
#: default); ``local-files`` is the local tier of a process that keeps nothing, as an
#: Airflow task runs it, reading every trace from its files.
TIERS = {"spark": 0, "local": 1_000_000, "crossing": 2, "local-files": 1_000_000}
RESIDENT_BYTES = {"local-files": 0}
tiers = pytest.mark.parametrize("tier", ["spark", "local", "crossing"])
all_tiers = pytest.mark.parametrize("tier", list(TIERS))


def compare_with_reference(
    spark: Any,
    factory: Callable[[], Circuit],
    history: list,
    driver_rows: int = DRIVER_ROWS,
    tier: str = "spark",
) -> None:
    """Step both engines through ``history``: every view equal after every epoch; after
    the last committed epoch the maintained views also equal Spark's full refresh.
    ``driver_rows=0`` keeps every upsert batch and every write of the Spark tier in Spark;
    ``tier`` picks the local tier threshold (``TIERS``)."""
    warehouse = tempfile.mkdtemp(prefix="dbspark-prop-")
    small_batch_rows = local_tier.SMALL_BATCH_ROWS
    if tier == "crossing":
        local_tier.SMALL_BATCH_ROWS = 0
    try:
        reference = ReferenceEngine(factory())
        engine = SparkEngine(
            factory(),
            warehouse,
            spark=spark,
            driver_rows=driver_rows,
            local_rows=TIERS[tier],
            resident_bytes=RESIDENT_BYTES.get(tier),
        )
        used: set[str] = set()
        sizes = []
        for epoch, inputs in enumerate(history):
            try:
                expected = reference.step(inputs).views
            except UpsertConflict as conflict:
                with pytest.raises(UpsertConflict) as raised:
                    engine.step(inputs)
                assert raised.value.source == conflict.source
                assert engine.last_committed_epoch() == epoch - 1
                break
            result = engine.step(inputs)
            got = result.views
            used |= {unit.tier for unit in result.report.units if unit.tier}
            sizes.append(sum(len(batch) for batch in inputs.values()))
            assert got.keys() == expected.keys()
            for name in expected:
                assert got[name] == expected[name], f"view {name!r} at epoch {epoch}: {inputs}"
        # The units ran where the threshold says; a crossing history used both tiers.
        if tier.startswith("local"):
            assert used <= {"local"}
            if sum(sizes):  # what a resident engine wrote, it keeps; the other keeps nothing
                assert (len(engine.local.resident) > 0) == (tier == "local")
        elif tier == "spark":
            assert used <= {"spark"}
        elif any(n <= TIERS[tier] for n in sizes) and any(n > TIERS[tier] for n in sizes):
            assert used == {"local", "spark"}, (sizes, used)
        if engine.last_committed_epoch() >= 0:
            differences = engine.verify()
            assert not any(differences.values()), f"full refresh differs: {differences}"
    finally:
        local_tier.SMALL_BATCH_ROWS = small_batch_rows
        shutil.rmtree(warehouse, ignore_errors=True)


@all_tiers
@SPARK_PROPERTY
@given(graph_history())
def test_reachability_on_spark(spark: Any, tier: str, history: list) -> None:
    compare_with_reference(spark, NAMED_CIRCUITS["reachability"], history[:4], tier=tier)


@all_tiers
@pytest.mark.parametrize("driver_rows", [DRIVER_ROWS, 0], ids=["on-driver", "in-spark"])
@SPARK_PROPERTY
@given(
    histories(
        customers=st.lists(st.lists(customer_rows(), max_size=3), min_size=1, max_size=3),
        orders=st.lists(st.lists(order_rows(), max_size=4), min_size=1, max_size=3),
    )
)
def test_orders_on_spark(spark: Any, tier: str, driver_rows: int, history: list) -> None:
    """Upserts with late rows, tombstones and NULL watermarks, decided on the driver
    (small batches) and in Spark (``upserts.py``'s two paths)."""
    compare_with_reference(spark, NAMED_CIRCUITS["orders"], history, driver_rows, tier=tier)


# --- non-recursive operators ----------------------------------------------------------------------
# Three epochs, so output that a temporal filter schedules for a later epoch
# (start and stop columns up to 3) is due while the example still runs.
@tiers
@SPARK_PROPERTY
@given(histories(events=st.lists(any_changes(EVENTS, 3), min_size=3, max_size=3)).filter(busy))
def test_general_linear_flat_map_and_delay_on_spark(spark: Any, tier: str, history: list) -> None:
    """Temporal window (epoch from data), explode (weight from data), a conditional emit,
    flat_map over ``sequence`` (NULL and empty arrays), root delays, and an aggregate of
    the window."""
    compare_with_reference(spark, temporal_circuit, history, tier=tier)


@tiers
@SPARK_PROPERTY
@given(histories(items=st.lists(any_changes(ITEMS, 4), min_size=2, max_size=3)).filter(busy))
def test_aggregates_on_spark(spark: Any, tier: str, history: list) -> None:
    """count, count(x), sum, avg, min, max with NULL values and NULL group keys, grouped
    and global; weights below zero and retractions that empty a group."""
    compare_with_reference(spark, builtin_aggregates_circuit, history, tier=tier)


# --- recursive circuits ---------------------------------------------------------------------------
@tiers
@SPARK_PROPERTY
@given(int_graph_history())
def test_transitive_closure_on_spark(spark: Any, tier: str, history: list) -> None:
    compare_with_reference(spark, NAMED_CIRCUITS["transitive_closure"], history[:3], tier=tier)


@tiers
@SPARK_PROPERTY
@given(histories(numbers=st.lists(any_changes(NUMBERS, 3), min_size=2, max_size=2)).filter(busy))
def test_geometric_on_spark(spark: Any, tier: str, history: list) -> None:
    compare_with_reference(spark, NAMED_CIRCUITS["geometric"], history, tier=tier)


@tiers
@settings(SPARK_PROPERTY, max_examples=1)
@given(histories(numbers=st.lists(any_changes(POSITIVE, 3), min_size=2, max_size=2)).filter(busy))
def test_loops_with_time_on_spark(spark: Any, tier: str, history: list) -> None:
    """A temporal emit inside a loop (output due at a later epoch, deep in the loop) and a
    loop body that reads the previous iteration through ``delay``."""
    compare_with_reference(spark, loops_with_time_circuit, history, tier=tier)


# The explicit example is the reference engine's nested-loop bug: a correction due at
# the least upper bound of two other prefixes. A nested loop costs the most Spark jobs
# per epoch: one generated example besides it.
@tiers
@settings(SPARK_PROPERTY, max_examples=1)
@given(two_graph_history())
@example(NESTED_BUG_HISTORY)
def test_nested_loops_on_spark(spark: Any, tier: str, history: list) -> None:
    compare_with_reference(spark, nested_circuit, history[:2], tier=tier)


# --- regressions ---------------------------------------------------------------------------------
@tiers
def test_null_group_key_after_the_first_epoch_on_spark(spark: Any, tier: str) -> None:
    """Found by ``test_general_linear_flat_map_and_delay_on_spark`` (window_counts, grouped
    by a NULL ``n``): the kernels pruned an aggregate's trace to its candidate keys with an
    equi-join, which drops NULL keys, so a NULL group touched after the first epoch was
    lost (fixed by the NULL-safe ``semi_join`` in ``operators.py``)."""
    history = [
        {"items": [(("a", 5), 1)]},
        {"items": [((None, 5), -2), ((None, None), 1)]},
        {"items": [((None, 5), 2), (("a", 5), -1)]},
    ]
    compare_with_reference(spark, builtin_aggregates_circuit, history, tier=tier)


def merged_rows_circuit() -> Circuit:
    """Aggregates over an upsert source (positive: a group's rows merge on the columns
    the aggregates read) and over a Z-set source (not: rows stay whole)."""
    from dbspark.circuit.aggregations import count, max_, min_, sum_
    from dbspark.circuit.expressions import col

    c = Circuit("merged_rows")
    live = c.upsert_source(
        "u", {"k": "bigint", "g": "string", "v": "bigint", "ts": "bigint"}, key="k", watermark="ts"
    )
    signed = c.zset_source("z", {"k": "bigint", "g": "string", "v": "bigint"})
    for name, stream in (("over_upserts", live.select("k", "g", "v")), ("over_zset", signed)):
        c.view(
            name,
            stream.aggregate(
                by=("g",), n=count(), top=max_(col("v")), low=min_(col("v")), total=sum_(col("v"))
            ),
        )
    return c


@all_tiers
def test_aggregates_merge_rows_only_over_positive_inputs(spark: Any, tier: str) -> None:
    """Two keys of one group share a value; one moves away, then the other: the maximum
    stays while either holds it. Over the Z-set source, a row and another row of the
    same group and value with weight -1 do not cancel: the first is still present (its
    weight is positive), as the reference engine says."""

    def u(k: int, g: str, v: int, ts: int) -> dict[str, Any]:
        return {"k": k, "g": g, "v": v, "ts": ts}

    history = [
        {"u": [u(1, "a", 5, 1), u(2, "a", 5, 1), u(3, "a", 3, 1)], "z": [((1, "a", 5), 1)]},
        {"u": [u(1, "a", 1, 2)], "z": [((2, "a", 5), -1), ((3, "a", 9), 1)]},
        {"u": [u(2, "a", 2, 3)], "z": [((3, "a", 9), -1)]},
        {"u": [u(3, "b", 3, 4)], "z": [((1, "a", 5), -1)]},
    ]
    compare_with_reference(spark, merged_rows_circuit, history, tier=tier)
