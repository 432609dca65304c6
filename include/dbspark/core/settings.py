"""Settings read from environment variables, checked where they are read.

Every layer reads some (the storage layer its compaction fanout, the Spark engine its
row thresholds), so the reader lives below them all.
"""

from __future__ import annotations

import os


def int_setting(name: str, default: int, *, minimum: int) -> int:
    """The integer in environment variable ``name`` (``default`` when unset or blank); a
    value that is not an integer of at least ``minimum`` is a ``ValueError`` naming it."""
    raw = os.environ.get(name, "").strip()
    return checked_int(name, raw, minimum=minimum) if raw else default


def checked_int(name: str, raw: str, *, minimum: int) -> int:
    """``raw`` as an integer of at least ``minimum``; otherwise a ``ValueError`` naming
    the setting ``name`` it was given for."""
    try:
        value = int(raw)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {raw!r}")
    return value
