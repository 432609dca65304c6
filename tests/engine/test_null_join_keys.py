"""A NULL join key matches nothing (SQL), in the incremental engine and in full refresh."""

from dbspark.circuit.builder import Circuit
from dbspark.core.zset import ZSet
from dbspark.engine.reference.engine import ReferenceEngine
from dbspark.engine.reference.full_refresh import full_refresh


def null_key_circuit() -> Circuit:
    c = Circuit("nulls")
    left = c.zset_source("left", {"k": "bigint", "a": "string"})
    right = c.zset_source("right", {"k": "bigint", "b": "string"})
    c.view("joined", left.join(right, on="k"))
    return c


def test_null_keys_do_not_join() -> None:
    history = [
        {"left": [((None, "x"), 1), ((1, "y"), 1)], "right": [((None, "p"), 1), ((1, "q"), 1)]},
        {"left": [((None, "z"), 2)]},
    ]
    circuit = null_key_circuit()
    engine = ReferenceEngine(circuit)
    expected = ZSet([((1, "y", "q"), 1)])
    for epoch, batch in enumerate(history):
        assert engine.step(batch).views["joined"] == expected
        assert full_refresh(circuit, history, epoch)["joined"] == expected
