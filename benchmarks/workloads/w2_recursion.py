"""W2: reachability (a recursive fixed point) on seeded random graphs.

Per graph size: the base load (epoch 0), then an epoch that deletes ``k_alpha`` edges
and inserts as many, against a full refresh (alpha comes from these, the delta fixed).
At ``sweep_nodes`` nodes, one more epoch per k of ``ks``.
"""

from __future__ import annotations

from benchmarks.circuits import reachability
from benchmarks.data.graphs import Graph, roots_batch
from benchmarks.harness import Bench
from benchmarks.workloads.compare import Series, room_for_next

WORKLOAD = "W2"
SEED = 7


def run(
    bench: Bench,
    *,
    sizes: list[int],
    k_alpha: int,
    ks: list[int],
    sweep_nodes: int | None,
    spark_only_first: bool = False,
) -> None:
    """With ``spark_only_first``, the smallest size's ±k_alpha epoch also runs with the
    local tier off (jobs per loop iteration on the Spark tier)."""
    previous = None
    for nodes in sizes:
        if not room_for_next(bench, previous, f"{WORKLOAD} {nodes} nodes and larger"):
            break
        graph = Graph(nodes, SEED + nodes)
        edges = len(graph.edges)
        series = Series(bench, WORKLOAD, f"n{nodes}", reachability(), edges, {"nodes": nodes})
        previous = series
        series.land(0, {"edges": graph.base_batch(), "roots": roots_batch()})
        series.load()
        sweep = [k for k in ks if k != k_alpha] if nodes == sweep_nodes else []
        for epoch, k in enumerate([k_alpha, *sweep], start=1):
            if not series.fits(f"n={nodes}: k={k} and later epochs", 1.5):
                break
            series.land(epoch, {"edges": graph.change_batch(k)})
            spark_only = spark_only_first and epoch == 1 and nodes == sizes[0]
            series.compare(
                epoch,
                k=k,
                alpha_point=k == k_alpha,
                spark_only=spark_only,
                not_resident=nodes == sizes[-1] and epoch == 1,
            )
