"""Bad input: the one error a caller catches for anything a user hands an epoch.

A batch that does not fit its source (a row of the wrong shape or type, an upsert
conflict, a NULL key) and a batch for a source the circuit does not have are both
``InputError``. It names the source and, when there is one, the file; the epoch it
was meant for commits nothing. ``core/upsert.py``'s ``UpsertError`` is the kind that
also names the offending keys.
"""

from __future__ import annotations

import os
from typing import Any

#: The setting that keeps row values out of input errors (``1``, ``true`` or ``yes``).
#: A DAG's tasks also take it from ``[dbspark] redact_input_values`` in ``airflow.cfg``.
REDACT_SETTING = "DBSPARK_REDACT_INPUT_VALUES"
#: What an error shows instead of a row's value when values are redacted.
REDACTED = "<redacted>"


def redacting() -> bool:
    """Whether input errors leave row values out (read at each error: a task may turn it
    on after the engine was built)."""
    return os.environ.get(REDACT_SETTING, "").strip().lower() in ("1", "true", "yes")


#: The characters of a value an error shows: a row with a 200,000-character string
#: made a 300 KB message, in a task log and in every retry's.
SHOWN_CHARACTERS = 1_000


def shown(value: Any) -> str:
    """A row's value (a field, a key, a whole row or record) as an error message shows
    it: its ``repr`` (cut at :data:`SHOWN_CHARACTERS`, saying how long it was), or
    :data:`REDACTED` when :func:`redacting`. Messages keep the source, the file, the row
    or line number and the column names either way, so an operator can find the row
    without the log holding what it says."""
    if redacting():
        return REDACTED
    text = repr(value)
    if len(text) <= SHOWN_CHARACTERS:
        return text
    return f"{text[:SHOWN_CHARACTERS]}... ({len(text):,} characters in all)"


def shown_text(text: str, limit: int = 200) -> str:
    """A record's raw text (a CSV or JSON line) as an error shows it: its first
    ``limit`` characters, or :data:`REDACTED`."""
    return REDACTED if redacting() else text[:limit]


class InputError(ValueError):
    """Input that does not fit its source; nothing of the epoch was committed."""

    def __init__(self, source: str, message: str, file: str | None = None) -> None:
        where = f"source {source!r}" + (f", file {file}" if file else "")
        super().__init__(f"{where}: {message}")
        self.source = source
        self.file = file
        self.message = message

    def __reduce__(self) -> tuple[Any, ...]:
        # Errors cross process boundaries (spark-submit units, Airflow tasks).
        return (type(self), (self.source, self.message, self.file))


def require_sources(
    circuit_name: str, sources: Any, names: Any, *, epoch: int | None = None
) -> None:
    """Raise :class:`InputError` for the first of ``names`` that is not one of
    ``sources`` (saying which epoch's input it was in, when given)."""
    unknown = sorted(set(names) - set(sources))
    if not unknown:
        return
    known = ", ".join(sorted(sources)) or "none"
    where = "" if epoch is None else f"epoch {epoch}: "
    raise InputError(
        unknown[0], f"{where}circuit {circuit_name!r} has no such source (its sources: {known})"
    )
