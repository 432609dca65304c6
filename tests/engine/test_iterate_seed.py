"""The iterate examples of seed 002 ("Differential Dataflow from scratch in Python").

The seed prints, for its geometric-series loop, the output difference of the
loop body at every ``(version, iteration)``: the DD ``debug`` lines of its final
(partially ordered) implementation. The reference engine must produce exactly
those differences at the loop's result node, iteration by iteration, including
the retractions at version 2 that its earlier, totally ordered implementations
got wrong. The seed's "couch" example (a ``distinct`` that must emit ``-1`` at a
time with no input) is rebuilt as a small loop. Final view contents are checked
against the seed and against the full refresh.
"""

from __future__ import annotations

from dbspark.circuit.builder import Circuit, Stream
from dbspark.circuit.expressions import col, lit
from dbspark.core.zset import ZSet
from dbspark.engine.reference.engine import ReferenceEngine
from dbspark.engine.reference.full_refresh import full_refresh

# The seed's input: insert 1; then insert 16 and 3; then retract 3.
SEED_INPUTS = [
    [((1,), 1)],
    [((16,), 1), ((3,), 1)],
    [((3,), -1)],
]

# The seed's debug output, per version, one entry per iteration (v5/vFinal).
SEED_DEBUG = {
    0: [[(1, 1), (2, 1)], [(4, 1)], [(8, 1)], [(16, 1)], [(32, 1)]],
    1: [[(3, 1), (6, 1), (16, 1), (32, 1)], [(12, 1)], [(24, 1)], [(16, -1), (48, 1)], [(32, -1)]],
    2: [[(3, -1), (6, -1)], [(12, -1)], [(24, -1)], [(48, -1)]],
}

SEED_VIEWS = [
    {1, 2, 4, 8, 16, 32},
    {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48},
    {1, 2, 4, 8, 16, 32},
]


def seed_geometric() -> Circuit:
    """The seed's body, on the loop variable: distinct(filter(n <= 50, X + map(2n, X)))."""
    c = Circuit("seed_geometric")
    numbers = c.zset_source("numbers", {"n": "bigint"})
    series = numbers.iterate(
        lambda x: x.plus(x.select(n=col("n") * 2)).filter(col("n") <= 50).distinct(),
        name="geometric_series",
    )
    c.view("series", series)
    return c


def as_zset(pairs: list[tuple[int, int]]) -> ZSet:
    return ZSet(((n,), w) for n, w in pairs)


def deltas_per_iteration(engine: ReferenceEngine, node_id: int, epoch: int) -> list[ZSet]:
    """The node's deltas at (epoch, 0), (epoch, 1), ... up to the last non-empty one."""
    deltas = [engine.delta(node_id, (epoch, i)) for i in range(60)]
    while deltas and not deltas[-1]:
        deltas.pop()
    return deltas


def test_seed_debug_output_per_version_and_iteration() -> None:
    circuit = seed_geometric()
    result = circuit.scopes[1].result
    engine = ReferenceEngine(circuit, compact=False)
    for epoch, batch in enumerate(SEED_INPUTS):
        engine.step({"numbers": batch})
        expected = [as_zset(line) for line in SEED_DEBUG[epoch]]
        assert deltas_per_iteration(engine, result, epoch) == expected, f"version {epoch}"


def test_seed_debug_output_read_before_compaction() -> None:
    """The default (compacting) engine: read each epoch's deltas right after its step."""
    circuit = seed_geometric()
    result = circuit.scopes[1].result
    engine = ReferenceEngine(circuit)
    for epoch, batch in enumerate(SEED_INPUTS):
        engine.step({"numbers": batch})
        expected = [as_zset(line) for line in SEED_DEBUG[epoch]]
        assert deltas_per_iteration(engine, result, epoch) == expected, f"version {epoch}"


def test_seed_final_views_and_view_deltas() -> None:
    circuit = seed_geometric()
    engine = ReferenceEngine(circuit)
    previous: set[int] = set()
    for epoch, batch in enumerate(SEED_INPUTS):
        step = engine.step({"numbers": batch})
        expected = ZSet(((n,), 1) for n in SEED_VIEWS[epoch])
        assert step.views["series"] == expected
        assert full_refresh(circuit, [{"numbers": b} for b in SEED_INPUTS[: epoch + 1]]) == {
            "series": expected
        }
        # The view's delta is the sum of the epoch's debug lines.
        total = ZSet()
        for line in SEED_DEBUG[epoch]:
            total = total + as_zset(line)
        assert step.view_deltas["series"] == total
        assert total == ZSet(((n,), 1) for n in SEED_VIEWS[epoch] - previous) + ZSet(
            ((n,), -1) for n in previous - SEED_VIEWS[epoch]
        )
        previous = SEED_VIEWS[epoch]


def test_seed_loop_reports_stop_after_the_last_correction() -> None:
    circuit = seed_geometric()
    engine = ReferenceEngine(circuit)
    for epoch, batch in enumerate(SEED_INPUTS):
        (report,) = engine.step({"numbers": batch}).loops
        sizes = [len(line) for line in SEED_DEBUG[epoch]]
        assert report.delta_sizes[: len(sizes)] == sizes
        assert not any(report.delta_sizes[len(sizes) :])
        assert report.stop_reason.startswith("converged")


# --- the couch ---------------------------------------------------------------------------
HOUSEHOLD = [(("chair",), 4), (("desk",), 2), (("towel",), 5)]


def couch_circuit() -> tuple[Circuit, int, int]:
    """A loop whose ``distinct`` sees ``a`` at iteration 0 onwards and ``b`` from iteration 1.

    The distinct's accumulated input at ``(e, i)`` is ``a(e) + [i >= 1] b(e)``. With the
    household in ``a`` at epoch 0, the couch in ``b`` at epoch 0 and in ``a`` at epoch 1,
    the couch arrives at ``(1, 0)`` and at ``(0, 1)`` and nowhere else.
    Returns the circuit, the distinct node and its input node.
    """
    c = Circuit("couch")
    a = c.zset_source("a", {"item": "string"})
    b = c.zset_source("b", {"item": "string"})

    def body(x: Stream) -> Stream:
        # ``b`` brought into the loop (through a stream of the loop), then delayed one iteration.
        b_inside = x.filter(lit(False)).plus(b)
        return a.plus(b_inside.delay()).distinct()

    c.view("items", a.iterate(body, name="couch"))
    distinct = c.scopes[1].result
    assert c.node(distinct).op == "distinct"
    return c, distinct, c.node(distinct).inputs[0]


def test_couch_distinct_emits_a_retraction_with_no_input() -> None:
    circuit, distinct, distinct_input = couch_circuit()
    engine = ReferenceEngine(circuit, compact=False)
    history = [{"a": HOUSEHOLD, "b": [(("couch",), 1)]}, {"a": [(("couch",), 1)]}]
    for batches in history:
        engine.step(batches)
    couch = ZSet([(("couch",), 1)])
    # The couch arrives at (0, 1) and at (1, 0), each time once...
    assert engine.delta(distinct_input, (0, 1)) == couch
    assert engine.delta(distinct_input, (1, 0)) == couch
    assert engine.delta(distinct, (0, 1)) == couch
    assert engine.delta(distinct, (1, 0)) == couch
    # ... and at (1, 1), with no input at all, distinct must take one copy back.
    assert engine.delta(distinct_input, (1, 1)) == ZSet()
    assert engine.delta(distinct, (1, 1)) == -couch
    # Accumulated over every time <= (1, 1): one couch, as the seed says.
    accumulated = ZSet()
    for t in [(0, 0), (0, 1), (1, 0), (1, 1)]:
        accumulated = accumulated + engine.delta(distinct, t)
    assert accumulated == ZSet([(("chair",), 1), (("desk",), 1), (("towel",), 1), couch_row()])


def couch_row() -> tuple[tuple[str], int]:
    return (("couch",), 1)


def test_couch_final_views() -> None:
    circuit, _, _ = couch_circuit()
    engine = ReferenceEngine(circuit)
    history = [{"a": HOUSEHOLD, "b": [(("couch",), 1)]}, {"a": [(("couch",), 1)]}]
    expected = ZSet([(("chair",), 1), (("desk",), 1), (("towel",), 1), couch_row()])
    for epoch, batches in enumerate(history):
        assert engine.step(batches).views["items"] == expected
        assert full_refresh(circuit, history[: epoch + 1])["items"] == expected
