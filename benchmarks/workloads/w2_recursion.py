"""W2: reachability (a recursive fixed point) on seeded random graphs.

Per graph size: the base load (epoch 0), then an epoch that deletes ``k_alpha`` edges
and inserts as many, against a full refresh (alpha comes from these, the delta fixed).
At ``sweep_nodes`` nodes, one more epoch per k of ``ks``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from benchmarks.circuits import reachability
from benchmarks.data import land
from benchmarks.data.graphs import Graph, roots_batch
from benchmarks.harness import Budget, Meter, Results
from benchmarks.workloads.compare import epoch_against_refresh, load, new_engine

WORKLOAD = "W2"
SEED = 7


def run(
    spark,
    meter: Meter,
    results: Results,
    budget: Budget,
    work: Path,
    *,
    sizes: list[int],
    k_alpha: int,
    ks: list[int],
    sweep_nodes: int | None,
) -> None:
    for nodes in sizes:
        graph = Graph(nodes, SEED + nodes)
        root = work / WORKLOAD / f"n{nodes}"
        shutil.rmtree(root, ignore_errors=True)
        landing = root / "landing"
        land(landing, "edges", 0, graph.base_batch())
        land(landing, "roots", 0, roots_batch())
        engine = new_engine(reachability(), root, spark)
        edges = len(graph.edges)
        params = {"nodes": nodes}
        loaded = load(engine, landing, meter, results, workload=WORKLOAD, size=edges, params=params)
        sweep = [k for k in ks if k != k_alpha] if nodes == sweep_nodes else []
        for epoch, k in enumerate([k_alpha, *sweep], start=1):
            if not budget.allows(1.5 * loaded.seconds):
                results.skip(f"W2 n={nodes}: k={k} and later epochs (time budget)")
                break
            land(landing, "edges", epoch, graph.change_batch(k))
            epoch_against_refresh(
                engine,
                epoch,
                landing,
                root,
                meter,
                results,
                workload=WORKLOAD,
                size=edges,
                params={**params, "k": k, "alpha_point": k == k_alpha},
            )
