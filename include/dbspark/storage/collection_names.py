"""The names of a circuit's collections in the warehouse and the catalog, and their parse.

Every batch belongs to a collection of its circuit. The engine names them here and
nowhere else (README, "Storage layout", lists them for a reader of the warehouse); the
catalog and the Airflow UI page read a name back with :func:`parse` or the predicates
below, never by matching text of their own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_VIEW_PREFIX = "view."
_INPUT_SUFFIX = ".input"


def delta(node_id: int) -> str:
    """A node's output delta (stored when another unit, or another time, reads it)."""
    return f"n{node_id}"


def arranged(node_id: int, port: int) -> str:
    """A stateful operator's input ``port``, arranged by key: its trace."""
    return f"n{node_id}.in{port}"


def state(node_id: int) -> str:
    """An upsert source's current rows, by key: the trace its upserts are decided against."""
    return f"n{node_id}.state"


def input_log(node_id: int) -> str:
    """A source's raw input, every epoch's batch as it came: what full refresh replays."""
    return f"n{node_id}{_INPUT_SUFFIX}"


def scheduled(node_id: int) -> str:
    """A general linear operator's output due at a later epoch."""
    return f"n{node_id}.scheduled"


def view(name: str) -> str:
    """A view's published changes."""
    return f"{_VIEW_PREFIX}{name}"


#: SQL ``LIKE`` patterns of the collections that grow with every epoch and are read only
#: by name: the published views and the raw input logs.
VIEW_LIKE = f"{_VIEW_PREFIX}%"
INPUT_LOG_LIKE = f"%{_INPUT_SUFFIX}"

_NODE = re.compile(r"n(?P<node>\d+)(?:\.(?:in(?P<port>\d+)|(?P<part>state|input|scheduled)))?")


@dataclass(frozen=True)
class CollectionName:
    """A collection name read back: ``kind`` is ``delta``, ``arranged``, ``state``,
    ``input``, ``scheduled`` or ``view``; ``node`` the node id (None for a view), ``port``
    an arranged input's port, ``view`` a view's name."""

    kind: str
    node: int | None = None
    port: int | None = None
    view: str | None = None


def parse(collection: str) -> CollectionName | None:
    """What ``collection`` names, or None when no function here makes such a name."""
    if collection.startswith(_VIEW_PREFIX):
        return CollectionName("view", view=collection.removeprefix(_VIEW_PREFIX))
    match = _NODE.fullmatch(collection)
    if match is None:
        return None
    node = int(match["node"])
    if match["port"] is not None:
        return CollectionName("arranged", node, port=int(match["port"]))
    return CollectionName(match["part"] or "delta", node)


def renumbered(collection: str, node_id: int) -> str:
    """``collection``'s name for the same kind of state of node ``node_id`` (an evolved
    circuit's node that computes what another id's node did)."""
    parsed = parse(collection)
    if parsed is None or parsed.node is None:
        raise ValueError(f"collection {collection!r} does not belong to a node")
    if parsed.kind == "arranged":
        assert parsed.port is not None
        return arranged(node_id, parsed.port)
    named = {
        "delta": delta,
        "state": state,
        "input": input_log,
        "scheduled": scheduled,
    }[parsed.kind]
    return named(node_id)


EVOLVE_PREFIX = "evolve:"


def evolve_stage(fingerprint: str) -> str:
    """The stage an evolution to the definition ``fingerprint`` commits as."""
    return f"{EVOLVE_PREFIX}{fingerprint}"


def evolve_outputs_stage(fingerprint: str) -> str:
    """The stage that records the outputs brought along after that evolution."""
    return f"evolve-outputs:{fingerprint}"


def view_name(collection: str) -> str | None:
    """The view whose published changes ``collection`` holds, or None."""
    parsed = parse(collection)
    return parsed.view if parsed is not None else None


def is_input_log(collection: str) -> bool:
    parsed = parse(collection)
    return parsed is not None and parsed.kind == "input"


# --- the catalog's names of rebuild commits ---------------------------------------------
REBUILD_PREFIX = "rebuild:"
_REBUILD_BY = ";by="


def rebuild_stage(view_name: str, token: str, by: str | None = None) -> str:
    """The stage a rebuild of ``view_name`` commits as: ``rebuild:view.<name>@<token>``,
    and ``;by=<who>`` when something named asked (a DAG run: ``dag_id/run_id``)."""
    stage = f"{REBUILD_PREFIX}{view(view_name)}@{token}"
    return stage if by is None else f"{stage}{_REBUILD_BY}{by}"


def rebuild_by(stage: str) -> str | None:
    """Who asked for the rebuild committed as ``stage`` (None: not a rebuild, or unnamed)."""
    if not stage.startswith(REBUILD_PREFIX) or _REBUILD_BY not in stage:
        return None
    return stage.split(_REBUILD_BY, 1)[1]
