"""Seeded random directed graphs for the recursion workload, and edge-change epochs.

A graph of ``nodes`` nodes has ``EDGES_PER_NODE * nodes`` distinct edges without
self-loops, drawn uniformly; node 0 is the root. With four edges per node the graph's
depth from the root grows like log4(nodes), so the loop's iteration count stays small
while the graph grows (what the workload varies is the base size, not the depth).
"""

from __future__ import annotations

import random

import pyarrow as pa

EDGES_PER_NODE = 4
ROOT = 0


class Graph:
    """A mutable edge set with the Z-set batches that change it."""

    def __init__(self, nodes: int, seed: int) -> None:
        if nodes < 2:
            raise ValueError(f"a graph needs at least 2 nodes, got {nodes}")
        self.nodes = nodes
        self.rng = random.Random(seed)
        self.edges: set[tuple[int, int]] = set()
        target = EDGES_PER_NODE * nodes
        while len(self.edges) < target:
            self.edges.add(self._random_edge())

    def _random_edge(self) -> tuple[int, int]:
        while True:
            src, dst = self.rng.randrange(self.nodes), self.rng.randrange(self.nodes)
            if src != dst:
                return src, dst

    def base_batch(self) -> pa.Table:
        """Every edge with weight +1 (sorted, so the same seed lands the same file)."""
        return _batch(sorted(self.edges), [])

    def change_batch(self, k: int) -> pa.Table:
        """Delete ``k`` existing edges and insert ``k`` new ones (weights -1 and +1)."""
        if k > len(self.edges):
            raise ValueError(f"cannot delete {k} of {len(self.edges)} edges")
        removed = self.rng.sample(sorted(self.edges), k)
        self.edges.difference_update(removed)
        added: set[tuple[int, int]] = set()
        while len(added) < k:
            edge = self._random_edge()
            if edge not in self.edges and edge not in removed:
                added.add(edge)
        self.edges.update(added)
        return _batch(sorted(added), sorted(removed))


def roots_batch() -> pa.Table:
    return pa.table({"node": pa.array([ROOT], pa.int64()), "__w": pa.array([1], pa.int64())})


def _batch(added: list[tuple[int, int]], removed: list[tuple[int, int]]) -> pa.Table:
    rows = [(s, d, 1) for s, d in added] + [(s, d, -1) for s, d in removed]
    return pa.table(
        {
            "src": pa.array([r[0] for r in rows], pa.int64()),
            "dst": pa.array([r[1] for r in rows], pa.int64()),
            "__w": pa.array([r[2] for r in rows], pa.int64()),
        }
    )
