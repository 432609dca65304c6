"""What changed between two definitions of a circuit, view by view (issue 16).

A circuit's fingerprint (``fingerprint.py``) is one hash of its whole definition, so the
catalog can only say that a definition changed. Evolving a circuit in place needs to
know what changed: which views are new, which were removed, which compute something
else, and whether a source's key, watermark or tombstone changed (which changes what
its stored state means, so no view over it can continue). This module gives every node
a fingerprint of what it computes, independent of its position in the circuit:

- a node's fingerprint hashes its operator, schema, parameters (callables by their
  code), the depth and name of its scope, and the fingerprints of its inputs, in order
  (a Merkle hash): a view's fingerprint changes exactly when something it reads, at any
  distance, changed;
- node ids, labels of inner nodes and the order nodes were added in are not hashed, so
  adding a view, or building the same views in another order, leaves the others' as
  they were; a source is also hashed by its name, and a loop variable's feedback by its
  distance to the node it reads.

:func:`signature` is what a warehouse keeps of a definition; :func:`compare` says how a
new definition differs from a kept signature (:class:`Evolution`), and :func:`map_nodes`
which of the new definition's nodes compute what a kept node computed, so that their
stored state (named by node id) carries over when the circuit evolves in place
(``engine/spark/evolve.py``). Since signature format 2 the signature keeps every node's
fingerprint, by id, for that mapping; a format 1 signature can say what changed, but
its circuit cannot evolve.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dbspark.circuit.builder import Circuit
from dbspark.circuit.fingerprint import _normal

SIGNATURE_FORMAT = 2
#: Formats ``compare`` reads (format 1 lacks the nodes' fingerprints).
READABLE_FORMATS = (1, 2)
SOURCE_OPS = ("zset_source", "upsert_source")
#: What an upsert source's stored state depends on, beyond its schema.
SOURCE_SEMANTICS = ("key", "watermark", "tombstone", "tombstone_value")


def node_fingerprints(circuit: Circuit) -> dict[int, str]:
    """Node id -> a hash of what the node computes (see the module docstring)."""
    prints: dict[int, str] = {}
    scopes = {scope.id: (scope.depth, scope.name) for scope in circuit.scopes}
    for node in circuit.nodes:  # inputs always come before the node that reads them
        params = dict(node.params)
        if "feedback" in params:  # a loop variable reads its body's result, added later
            params["feedback"] = int(params["feedback"]) - node.id
        payload = [
            node.op,
            str(node.schema),
            scopes.get(node.scope, node.scope),
            _normal(params),
            [prints[i] for i in node.inputs],
            node.label if node.op in SOURCE_OPS else None,
        ]
        text = json.dumps(payload, sort_keys=True, default=str)
        prints[node.id] = hashlib.sha256(text.encode()).hexdigest()[:16]
    return prints


def signature(circuit: Circuit) -> dict[str, Any]:
    """What a warehouse keeps of ``circuit``'s definition to tell later what changed:
    each view's and each source's fingerprint, and each source's schema and upsert
    semantics (JSON-able)."""
    prints = node_fingerprints(circuit)
    sources = {}
    for name, node_id in sorted(circuit.sources.items()):
        node = circuit.node(node_id)
        entry: dict[str, Any] = {"fingerprint": prints[node_id], "op": node.op}
        entry["schema"] = str(node.params.get("user_schema", node.schema))
        for key in SOURCE_SEMANTICS:
            if key in node.params:
                value = node.params[key]
                entry[key] = list(value) if isinstance(value, tuple | list) else value
        sources[name] = entry
    return {
        "format": SIGNATURE_FORMAT,
        "circuit": circuit.name,
        "views": {name: prints[node_id] for name, node_id in sorted(circuit.views.items())},
        "sources": sources,
        "nodes": [prints[node.id] for node in circuit.nodes],
    }


@dataclass
class Evolution:
    """How a circuit's new definition differs from a kept signature. Views are
    ``added``, ``removed``, ``changed`` (they compute something else: their own operators
    or anything upstream changed) or ``unchanged``; ``sources`` says, per source whose
    definition changed, what changed."""

    circuit: str
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    sources: dict[str, list[str]] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not (self.added or self.removed or self.changed or self.sources)

    @property
    def source_semantics_changed(self) -> list[str]:
        """The sources whose key, watermark, tombstone or kind changed: their stored
        state means something else under the new definition."""
        return sorted(
            name
            for name, what in self.sources.items()
            if any(not line.startswith(("added", "removed", "schema")) for line in what)
        )

    def describe(self) -> str:
        """The differences, one kind per line (for errors and task logs)."""
        lines = []
        for label, names in (
            ("views added", self.added),
            ("views removed", self.removed),
            ("views changed (their own definition or something they read)", self.changed),
            ("views unchanged", self.unchanged),
        ):
            if names:
                lines.append(f"{label}: {', '.join(names)}")
        for name, what in sorted(self.sources.items()):
            lines.append(f"source {name!r}: {'; '.join(what)}")
        return "\n".join(lines) if lines else "no difference in views or sources"

    def refusal(self, obstacles: list[str] | None = None) -> str:
        """Why a warehouse kept for the old definition cannot run the new one, what
        changed, and what to do. ``obstacles``: why it cannot evolve in place
        (:func:`evolution_obstacles`); None when evolving was not asked for."""
        text = (
            f"the definition of circuit {self.circuit!r} changed since its warehouse's "
            f"state was kept:\n  " + self.describe().replace("\n", "\n  ")
        )
        semantic = self.source_semantics_changed
        if semantic:
            names = ", ".join(repr(n) for n in semantic)
            text += (
                f"\nA source's key, watermark or tombstone decides what its stored state "
                f"means (which row per key is current), so source {names} cannot continue "
                f"from its state: rebuild from the raw input under the new definition, as "
                f"a new circuit name or on a new warehouse, whose first epoch ingests the "
                f"input again (or restore the old definition)."
            )
        elif obstacles:
            text += (
                "\nIt cannot evolve in place: "
                + "; ".join(obstacles)
                + ". Restore the old definition, or run the new one as a new circuit name "
                "or on a new warehouse."
            )
        else:
            text += (
                "\nIt can evolve in place (views added or changed rebuilt from the raw "
                "input log, views removed retired, the others continuing): open the engine "
                "with evolve=True (an Airflow DAG run does so in its open_epoch task), or "
                "restore the old definition."
            )
        return text


def compare(kept: Mapping[str, Any], circuit: Circuit) -> Evolution:
    """How ``circuit`` differs from the ``kept`` signature of its earlier definition."""
    if kept.get("format") not in READABLE_FORMATS:
        raise ValueError(
            f"a circuit signature of format {kept.get('format')!r}; this version reads "
            f"formats {', '.join(map(str, READABLE_FORMATS))}"
        )
    new = signature(circuit)
    evolution = Evolution(circuit.name)
    old_views, new_views = dict(kept["views"]), new["views"]
    for name in sorted(set(old_views) | set(new_views)):
        if name not in old_views:
            evolution.added.append(name)
        elif name not in new_views:
            evolution.removed.append(name)
        elif old_views[name] != new_views[name]:
            evolution.changed.append(name)
        else:
            evolution.unchanged.append(name)
    old_sources, new_sources = dict(kept["sources"]), new["sources"]
    for name in sorted(set(old_sources) | set(new_sources)):
        if name not in old_sources:
            evolution.sources[name] = ["added"]
        elif name not in new_sources:
            evolution.sources[name] = ["removed"]
        elif old_sources[name]["fingerprint"] != new_sources[name]["fingerprint"]:
            evolution.sources[name] = _source_changes(old_sources[name], new_sources[name])
    return evolution


def _source_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    changes = []
    if old.get("op") != new.get("op"):
        changes.append(f"kind {old.get('op')} -> {new.get('op')}")
    for key in SOURCE_SEMANTICS:
        if old.get(key) != new.get(key):
            changes.append(f"{key} {old.get(key)!r} -> {new.get(key)!r}")
    if old.get("schema") != new.get("schema"):
        changes.append(f"schema {old.get('schema')} -> {new.get('schema')}")
    return changes or ["definition changed"]


@dataclass
class NodeMapping:
    """Where an evolved circuit's stored state comes from. ``kept`` maps each new node
    id whose node computes what a kept node computed (the same fingerprint) to the old
    id its state is stored under; ``fresh`` new nodes compute something no old node did;
    ``retired`` old ids no new node keeps."""

    kept: dict[int, int]
    fresh: list[int]
    retired: list[int]


def map_nodes(kept: Mapping[str, Any], circuit: Circuit) -> NodeMapping | None:
    """Each node of ``circuit`` matched to a node of the ``kept`` signature's definition
    computing the same thing (nodes of one fingerprint matched in id order); None when
    the signature predates the nodes' fingerprints (format 1)."""
    old = kept.get("nodes")
    if kept.get("format") != SIGNATURE_FORMAT or not isinstance(old, list):
        return None
    unused: dict[str, list[int]] = {}
    for old_id, fingerprint in enumerate(old):
        unused.setdefault(fingerprint, []).append(old_id)
    mapping = NodeMapping({}, [], [])
    for new_id, fingerprint in sorted(node_fingerprints(circuit).items()):
        candidates = unused.get(fingerprint)
        if candidates:
            mapping.kept[new_id] = candidates.pop(0)
        else:
            mapping.fresh.append(new_id)
    mapping.retired = sorted(i for ids in unused.values() for i in ids)
    return mapping


def loops_to_rebuild(mapping: NodeMapping, circuit: Circuit) -> list[int]:
    """The loops (scope ids) a new or changed node is inside. A loop's stored state is
    every iteration's differences, which hang together through the feedback: a variable
    is hashed by its distance to what it reads, not by the body, so a node of a changed
    loop may keep its fingerprint while the iterates it sees change. Such a loop is
    rebuilt whole (:func:`rebuilt_whole`)."""
    loops = set()
    for node_id in mapping.fresh:
        scope = circuit.scope(circuit.node(node_id).scope)
        while scope.parent is not None and circuit.scope(scope.parent).parent is not None:
            scope = circuit.scope(scope.parent)  # the outermost loop it is in
        if scope.parent is not None:
            loops.add(scope.id)
    return sorted(loops)


def rebuilt_whole(mapping: NodeMapping, circuit: Circuit) -> NodeMapping:
    """``mapping`` with every node of a loop to rebuild (:func:`loops_to_rebuild`)
    fresh, its old node's state retired."""
    inside = {n for loop in loops_to_rebuild(mapping, circuit) for n in circuit.nodes_within(loop)}
    moved = {new: old for new, old in mapping.kept.items() if new in inside}
    return NodeMapping(
        {new: old for new, old in mapping.kept.items() if new not in moved},
        sorted([*mapping.fresh, *moved]),
        sorted([*mapping.retired, *moved.values()]),
    )


def evolution_obstacles(evolution: Evolution, mapping: NodeMapping | None) -> list[str]:
    """Why the circuit cannot evolve in place from the kept definition (empty: it can):
    a source changed in anything but being added or removed, or a signature too old to
    map nodes. A new or changed node in a loop has its loop rebuilt whole
    (:func:`rebuilt_whole`)."""
    reasons = []
    for name, what in sorted(evolution.sources.items()):
        if what not in (["added"], ["removed"]):
            reasons.append(f"source {name!r} changed ({'; '.join(what)})")
    if mapping is None:
        reasons.append(
            "the warehouse's signature was kept by an older version of dbspark, without "
            "the nodes' fingerprints"
        )
    return reasons
