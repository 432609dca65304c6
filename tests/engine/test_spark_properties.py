"""The Spark engine against the reference engine on random update streams.

Each epoch, every view of the incremental Spark engine (traces in a warehouse, a
SQLite catalog) must equal the reference engine's; where the reference rejects a
batch (an upsert conflict), Spark must reject the same epoch and source. Graph
streams build a graph with cycles and self-loops and then insert and delete edges
(the deletions inside cycles are the hard case); upsert streams carry late rows,
tombstones and NULL watermarks. Few examples, fixed seed: every Spark job costs
real time, and the reference-engine suite runs the same strategies hundreds of times.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_reference_properties import customer_rows, graph_history, histories, order_rows

from dbspark.circuit.builder import Circuit
from dbspark.core.upsert import UpsertConflict
from dbspark.engine.reference.engine import ReferenceEngine
from dbspark.engine.spark.executor import SparkEngine
from dbspark.examples.circuits import NAMED_CIRCUITS

pytestmark = pytest.mark.slow

SPARK_PROPERTY = settings(
    max_examples=3,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def compare_with_reference(spark: Any, factory: Callable[[], Circuit], history: list) -> None:
    warehouse = tempfile.mkdtemp(prefix="dbspark-prop-")
    try:
        reference = ReferenceEngine(factory())
        engine = SparkEngine(factory(), warehouse, spark=spark)
        for epoch, inputs in enumerate(history):
            try:
                expected = reference.step(inputs).views
            except UpsertConflict as conflict:
                with pytest.raises(UpsertConflict) as raised:
                    engine.step(inputs)
                assert raised.value.source == conflict.source
                assert engine.last_committed_epoch() == epoch - 1
                return
            assert engine.step(inputs).views == expected, f"epoch {epoch}"
    finally:
        shutil.rmtree(warehouse, ignore_errors=True)


@SPARK_PROPERTY
@given(graph_history())
def test_reachability_on_spark(spark: Any, history: list) -> None:
    compare_with_reference(spark, NAMED_CIRCUITS["reachability"], history[:4])


@SPARK_PROPERTY
@given(
    histories(
        customers=st.lists(st.lists(customer_rows(), max_size=3), min_size=1, max_size=3),
        orders=st.lists(st.lists(order_rows(), max_size=4), min_size=1, max_size=3),
    )
)
def test_orders_on_spark(spark: Any, history: list) -> None:
    compare_with_reference(spark, NAMED_CIRCUITS["orders"], history)
