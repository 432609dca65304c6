"""The names of a circuit's collections in the warehouse and the catalog.

Every batch belongs to a collection of its circuit; the stage executor names them here
and nowhere else (README, "Storage layout", lists them for a reader of the warehouse).
"""

from __future__ import annotations


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
    return f"n{node_id}.input"


def scheduled(node_id: int) -> str:
    """A general linear operator's output due at a later epoch."""
    return f"n{node_id}.scheduled"


def view(name: str) -> str:
    """A view's published changes."""
    return f"view.{name}"
