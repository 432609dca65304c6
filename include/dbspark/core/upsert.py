"""Upsert sources: turning keyed, watermarked rows into differential updates.

An upsert source does not say what changed; each row claims to be the current
version of the record with its primary key. The rule that decides which claim
holds:

* **Freshest wins.** Among all rows ever received for a key, the one with the
  greatest *watermark* is the current version. A watermark is one or more
  columns compared left to right (lexicographically); NULL is smaller than any
  value, so ``(NULL, 9) < (0, 0)`` and ``(1, NULL) < (1, 0)``. A double NaN is
  larger than any other double, as in Spark.
* **Tombstones delete.** If the current version is a *tombstone*, the key has
  no live row. Whether a row is a tombstone depends on the tombstone column's
  type: a boolean column must hold ``True``; a string column must equal the
  source's configured tombstone value; a column of any other type must be
  non-NULL. ``False`` and NULL are never tombstones.
* **Stale rows are ignored.** A row whose watermark is below the current
  version's changes nothing, even when the current version is a tombstone:
  a tombstone is kept in the state precisely so that a late, older row cannot
  resurrect the key. A row with a strictly greater watermark replaces the
  current version (this is how a deleted key comes back).
* **Ties are bad input.** Two *different* rows for one key with the same
  watermark are ambiguous and rejected as :class:`UpsertConflict`, whether both
  arrive in one batch (at any watermark, not only the greatest) or one is the
  stored version. Exact duplicates, including a resend of the stored version,
  are harmless no-ops. "Different" compares every user column, the tombstone
  column included.
* **Malformed rows are bad input.** A NULL in a key column, a row of the wrong
  length or a value that does not match its declared type (a boolean is not a
  BIGINT) is rejected as :class:`BadUpsertRow`.

Bad input rejects the whole batch: every check runs before any update is
produced, so a failing batch contributes nothing.

**The state collection.** Ingestion keeps, per key, exactly one *state row*:
the current version's user columns followed by a boolean flag column,
:data:`TOMBSTONE`, that is true for a tombstone. The state lives in the
source's own trace, arranged by primary key, and ingesting a batch looks the
current state up there (there is no second, private copy of the collection).
Its output is the delta of the state collection: for each key whose version
changes, ``-1`` for the old state row and ``+1`` for the new one; nothing when
nothing changes. The user-visible collection is :func:`live_rows` of the state:
the rows whose flag is false, without the flag. Because that projection is
linear, the same function turns a state delta into the live delta.

**Decisions beyond the design text.**

* A spec needs at least one watermark column. With no watermark, "freshest"
  would have to mean "latest batch", and two rows for one key in one batch
  would be undecidable; sources without a freshness column should declare one
  (for example, a load sequence number).
* The tombstone column may not be a key column (a key column is never NULL, so
  a non-boolean, non-string tombstone key would delete every row); it may be a
  watermark column.
* A BIGINT or integral value in a DOUBLE column is accepted and stored as a
  float; NaNs are stored as one canonical NaN object so that equal rows are
  equal in Python too.
* A DECIMAL value is stored at its column's scale (``10.5`` in a DECIMAL(10,2)
  is ``10.50``); one with more fraction digits than the scale, or too many
  digits before the point, is bad input, not rounded. A TIMESTAMP must be a
  timezone-aware ``datetime`` and is stored in UTC; a naive one names no instant.
* A STRING watermark is compared as text. A value that reads as a date and time with a
  UTC offset other than zero (``2026-03-08T01:30:00-05:00``) is bad input: text orders
  instants only within one offset, and a writer on local time changes offset at every
  daylight-saving change, so a later row could lose to an earlier one. ``Z`` and
  ``+00:00`` are fine, and so is text that is not a time. A check per batch for mixed
  offsets would miss the change between batches; the regular expressions
  (:data:`OFFSET_TIME`, :data:`ZERO_OFFSET`) are written so that Spark's, RE2's (DuckDB,
  Arrow) and Python's engines read them alike.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from dbspark.core import timestamps
from dbspark.core.columns import TOMBSTONE, is_reserved
from dbspark.core.errors import InputError, shown
from dbspark.core.timestamps import Time
from dbspark.core.trace import Trace
from dbspark.core.types import (
    SCALAR_TYPES,
    at_scale,
    is_decimal,
    is_scalar,
    python_value_fits,
)
from dbspark.core.zset import ZSet

_BIGINT_MIN = -(2**63)
_BIGINT_MAX = 2**63 - 1
_NAN = float("nan")  # the one NaN object stored in rows, so tuples with NaN compare equal
_MAX_LISTED = 20  # how many keys / problems an error message spells out

StateLookup = Callable[[tuple], tuple | None]

#: Text that reads as a date and time with a UTC offset (see the module docstring), as
#: a whole value; :data:`ZERO_OFFSET` at its end is an offset of zero. Unanchored: a
#: ``$`` means "at the end or before a final newline" in Python and Java but not in RE2,
#: so each engine anchors them its own way (``re.fullmatch`` here, ``\z`` in a query).
OFFSET_TIME = (
    "[0-9]{4}-[0-9]{2}-[0-9]{2}[T ][0-9]{2}:[0-9]{2}(:[0-9]{2}([.][0-9]+)?)?[+-][0-9]{2}:?[0-9]{2}"
)
ZERO_OFFSET = "[+-]00:?00"


# --- errors -------------------------------------------------------------------


class UpsertError(InputError):
    """Bad upsert input: names the source, the file and the offending keys.

    ``keys`` holds the primary-key tuples of the offending rows (a component
    that could not be read, for example in a row that is too short, is
    ``None``); ``positions`` holds the rows' 0-based indices in the batch when
    they are known.
    """

    def __init__(
        self,
        source: str,
        file: str | None,
        keys: Sequence[tuple | None],
        detail: str,
        positions: Sequence[int] = (),
        key_columns: Sequence[str] = (),
    ) -> None:
        self.source = source
        self.file = file
        self.keys = list(keys)
        self.detail = detail
        self.positions = list(positions)
        self.key_columns = tuple(key_columns)
        self.message = self._message()
        ValueError.__init__(self, self.message)  # the message names the source itself

    def __reduce__(self) -> tuple[Any, ...]:
        args = (self.source, self.file, self.keys, self.detail, self.positions, self.key_columns)
        return (type(self), args)

    def in_files(self, files: Sequence[str]) -> UpsertError:
        """The same error, naming ``files`` (those of a batch that hold its keys)."""
        args = (self.source, ", ".join(files), self.keys, self.detail, self.positions)
        return type(self)(*args, self.key_columns)

    def _message(self) -> str:
        where = f"file {self.file!r}" if self.file is not None else "no file"
        keys = ", ".join(format_key(k, self.key_columns) for k in self.keys[:_MAX_LISTED])
        if len(self.keys) > _MAX_LISTED:
            keys += f", ... ({len(self.keys) - _MAX_LISTED} more)"
        return f"upsert source {self.source!r} ({where}): {self.detail}; offending keys: {keys}"


class UpsertConflict(UpsertError):
    """Two different rows for one key with equal watermarks (in a batch, or vs the state)."""


class BadUpsertRow(UpsertError):
    """A row with a NULL key, the wrong number of columns, or a value of the wrong type."""


class CorruptUpsertState(ValueError):
    """The state trace holds something other than at most one state row per key."""


def format_key(key: tuple | None, key_columns: Sequence[str] = ()) -> str:
    """``id=1`` or ``(a=1, b='x')`` when the column names are known, else the tuple
    (each value :func:`~dbspark.core.errors.shown`, so redacted when asked)."""
    if key is None or not key_columns or len(key) != len(key_columns):
        return repr(key) if key is None else shown(key)
    parts = [f"{name}={shown(value)}" for name, value in zip(key_columns, key, strict=True)]
    return parts[0] if len(parts) == 1 else f"({', '.join(parts)})"


# --- the spec -----------------------------------------------------------------


@dataclass(frozen=True)
class UpsertSpec:
    """The schema of an upsert source and the roles of its columns.

    The spec is validated on construction (:meth:`validate`), so an invalid
    spec cannot exist. Lists given for the column tuples are turned into tuples.
    """

    source: str
    columns: tuple[str, ...]
    types: tuple[str, ...]
    key: tuple[str, ...]
    watermark: tuple[str, ...]
    tombstone: str | None = None
    tombstone_value: str | None = None

    def __post_init__(self) -> None:
        for name in ("columns", "types", "key", "watermark"):
            value = getattr(self, name)
            if isinstance(value, str):
                value = (value,)
            object.__setattr__(self, name, tuple(value))
        self.validate()

    def validate(self) -> None:
        """Raise ``ValueError`` (naming the source) if the spec is inconsistent."""
        problems = list(self._problems())
        if problems:
            raise ValueError(f"upsert source {self.source!r}: " + "; ".join(problems))

    def _problems(self) -> Iterable[str]:
        if not isinstance(self.source, str) or not self.source:
            yield "the source name must be a non-empty string"
        if not self.columns:
            yield "no columns"
        if len(self.types) != len(self.columns):
            yield f"{len(self.columns)} columns but {len(self.types)} types"
        for name in self.columns:
            if not isinstance(name, str) or not name:
                yield f"column name {name!r} is not a non-empty string"
            elif is_reserved(name):
                yield f"column {name!r}: names starting with '__' are reserved"
        duplicates = sorted({c for c in self.columns if self.columns.count(c) > 1}, key=str)
        if duplicates:
            yield f"duplicate columns {duplicates}"
        for name, kind in zip(self.columns, self.types, strict=False):
            if not is_scalar(kind):
                yield (
                    f"column {name!r} has unknown type {kind!r} "
                    f"(expected one of {SCALAR_TYPES} or decimal(p,s))"
                )
        for role, names in (("key", self.key), ("watermark", self.watermark)):
            if not names:
                yield f"the {role} needs at least one column"
            for name in names:
                if name not in self.columns:
                    yield f"{role} column {name!r} is not a column"
            if len(set(names)) != len(names):
                yield f"{role} columns repeat: {list(names)}"
        overlap = [c for c in self.watermark if c in self.key]
        if overlap:
            yield f"columns {overlap} are both key and watermark"
        yield from self._tombstone_problems()

    def _tombstone_problems(self) -> Iterable[str]:
        if self.tombstone is None:
            if self.tombstone_value is not None:
                yield "a tombstone value is given but no tombstone column"
            return
        if self.tombstone not in self.columns:
            yield f"tombstone column {self.tombstone!r} is not a column"
            return
        if self.tombstone in self.key:
            yield f"tombstone column {self.tombstone!r} is a key column"
        kind = self.types[self.columns.index(self.tombstone)]
        if kind == "string":
            if not isinstance(self.tombstone_value, str):
                yield f"string tombstone column {self.tombstone!r} needs a tombstone value"
        elif self.tombstone_value is not None:
            yield (
                f"a tombstone value only applies to a string tombstone column, "
                f"but {self.tombstone!r} is {kind}"
            )

    # --- derived layout ------------------------------------------------------
    @cached_property
    def _key_idx(self) -> tuple[int, ...]:
        return tuple(self.columns.index(c) for c in self.key)

    @cached_property
    def _wm_idx(self) -> tuple[int, ...]:
        return tuple(self.columns.index(c) for c in self.watermark)

    @cached_property
    def _tomb_idx(self) -> int | None:
        return None if self.tombstone is None else self.columns.index(self.tombstone)

    @cached_property
    def _wm_double(self) -> tuple[bool, ...]:
        return tuple(self.types[i] == "double" for i in self._wm_idx)

    @property
    def state_columns(self) -> tuple[str, ...]:
        """The columns of a state row: the user columns, then the tombstone flag."""
        return (*self.columns, TOMBSTONE)

    @property
    def state_types(self) -> tuple[str, ...]:
        return (*self.types, "boolean")

    # --- reading rows ------------------------------------------------------
    def key_of(self, row: Sequence[Any]) -> tuple:
        """The primary key of a row (also works on a state row)."""
        return tuple(row[i] for i in self._key_idx)

    def state_key_of(self, state: Sequence[Any]) -> tuple:
        """The primary key of a state row: the key function of the state trace."""
        return self.key_of(state)

    def watermark_of(self, row: Sequence[Any]) -> tuple:
        """A sort key for the row's watermark: NULL below every value, NaN above."""
        parts = []
        for i, is_double in zip(self._wm_idx, self._wm_double, strict=True):
            value = row[i]
            if value is None:
                parts.append((0,))
            elif is_double and isinstance(value, float) and math.isnan(value):
                parts.append((2,))
            else:
                parts.append((1, value))
        return tuple(parts)

    def watermark_values(self, row: Sequence[Any]) -> tuple:
        """The raw watermark column values, for messages."""
        return tuple(row[i] for i in self._wm_idx)

    def is_tombstone(self, row: Sequence[Any]) -> bool:
        """Whether a user row marks its key as deleted (see the module docstring)."""
        if self._tomb_idx is None:
            return False
        value = row[self._tomb_idx]
        kind = self.types[self._tomb_idx]
        if kind == "boolean":
            return value is True
        if kind == "string":
            return value is not None and value == self.tombstone_value
        return value is not None

    def check_row(self, row: Any) -> tuple[tuple | None, list[str], tuple | None]:
        """Check one row against the schema.

        Returns ``(normalized_row, problems, key)``: the row as a tuple with
        doubles as floats (``None`` if it has problems), what is wrong with it,
        and its key as far as it can be read.
        """
        if not isinstance(row, (tuple, list)):
            return None, [f"a row must be a tuple or list, got {type(row).__name__}"], None
        key = tuple(row[i] if i < len(row) else None for i in self._key_idx)
        if len(row) != len(self.columns):
            return None, [f"{len(row)} values for {len(self.columns)} columns"], key
        problems: list[str] = []
        values: list[Any] = []
        for name, kind, value in zip(self.columns, self.types, row, strict=True):
            if value is None:
                if name in self.key:
                    problems.append(f"NULL in key column {name!r}")
                values.append(None)
                continue
            converted = _conform(kind, value)
            if converted is _MISMATCH:
                got = f"{shown(value)} ({type(value).__name__})"
                problems.append(f"column {name!r} is {kind.upper()} but holds {got}")
            values.append(converted)
        for index in self._wm_idx:
            value = values[index]
            if self.types[index] == "string" and value is not None and _offset_time(value):
                problems.append(
                    f"STRING watermark column {self.columns[index]!r} holds {shown(value)}, "
                    "a time with a UTC offset other than zero: text orders instants only "
                    "within one offset; send UTC ('Z' or '+00:00') or declare it TIMESTAMP"
                )
        if problems:
            return None, problems, key
        return tuple(values), [], key


def _offset_time(text: str) -> bool:
    return (
        re.fullmatch(OFFSET_TIME, text) is not None and re.search(ZERO_OFFSET + r"\Z", text) is None
    )


class _Mismatch:
    pass


_MISMATCH = _Mismatch()


def _conform(kind: str, value: Any) -> Any:
    """The value as stored for a column of ``kind``, or ``_MISMATCH``."""
    if kind == "boolean":
        return value if isinstance(value, bool) else _MISMATCH
    if kind == "string":
        return value if isinstance(value, str) else _MISMATCH
    if isinstance(value, bool):
        return _MISMATCH  # bool is an int subclass in Python, but not a number here
    if kind == "bigint":
        if isinstance(value, int) and _BIGINT_MIN <= value <= _BIGINT_MAX:
            return value
        return _MISMATCH
    if kind == "double":
        if isinstance(value, (int, float)):
            as_float = float(value)
            return _NAN if math.isnan(as_float) else as_float
        return _MISMATCH
    if not python_value_fits(value, kind):
        return _MISMATCH
    if is_decimal(kind):
        return at_scale(value, kind)
    if kind == "timestamp":
        return value.astimezone(dt.UTC)
    return value  # a date


# --- rows and state rows ----------------------------------------------------


def conform_rows(spec: UpsertSpec, batch: Iterable[Any], file: str | None = None) -> list[tuple]:
    """Validate and normalize every row of a batch, or raise one :class:`BadUpsertRow`."""
    rows: list[tuple] = []
    bad_keys: list[tuple | None] = []
    positions: list[int] = []
    reports: list[str] = []
    for position, raw in enumerate(batch):
        row, problems, key = spec.check_row(raw)
        if row is None:
            bad_keys.append(key)
            positions.append(position)
            if len(reports) < _MAX_LISTED:
                reports.append(
                    f"row index {position} (key {format_key(key, spec.key)}): {', '.join(problems)}"
                )
        else:
            rows.append(row)
    if positions:
        more = "" if len(positions) <= _MAX_LISTED else f"; ... ({len(positions)} bad rows)"
        detail = f"{len(positions)} bad row(s): " + "; ".join(reports) + more
        raise BadUpsertRow(spec.source, file, bad_keys, detail, positions, spec.key)
    return rows


def rows_from_objects(
    spec: UpsertSpec, objects: Iterable[Any], file: str | None = None
) -> list[tuple]:
    """Rows from objects keyed by column name (missing columns are NULL).

    Unknown column names or non-objects raise :class:`BadUpsertRow`; the
    rows' types are checked by :func:`upserts_to_updates`.
    """
    rows: list[tuple] = []
    bad_keys: list[tuple | None] = []
    positions: list[int] = []
    reports: list[str] = []
    for position, obj in enumerate(objects):
        if not isinstance(obj, Mapping):
            problem, key = f"expected an object, got {type(obj).__name__}", None
        else:
            unknown = [k for k in obj if k not in spec.columns]
            key = tuple(obj.get(c) for c in spec.key)
            if not unknown:
                rows.append(tuple(obj.get(c) for c in spec.columns))
                continue
            problem = f"unknown columns {unknown}"
        bad_keys.append(key)
        positions.append(position)
        if len(reports) < _MAX_LISTED:
            reports.append(f"row index {position}: {problem}")
    if positions:
        detail = f"{len(positions)} bad row(s): " + "; ".join(reports)
        raise BadUpsertRow(spec.source, file, bad_keys, detail, positions, spec.key)
    return rows


def state_row(spec: UpsertSpec, row: Sequence[Any], tombstone: bool) -> tuple:
    """The state row of a user row: its columns followed by the tombstone flag."""
    if len(row) != len(spec.columns):
        raise ValueError(
            f"upsert source {spec.source!r}: a row of {len(row)} values "
            f"for {len(spec.columns)} columns"
        )
    return (*row, bool(tombstone))


def live_rows(state: ZSet) -> ZSet:
    """The live collection of a state collection (or delta): unflagged rows, flag dropped.

    Linear, so it maps a state delta to the delta of the live collection.
    """
    return ZSet((row[:-1], weight) for row, weight in state.items() if not row[-1])


def state_trace(spec: UpsertSpec) -> Trace:
    """An empty trace for the source's state, arranged by primary key."""
    return Trace(key_of=spec.state_key_of)


def current_state(trace: Trace, key: tuple, time: Time | None = None) -> tuple | None:
    """The state row of ``key`` in a state trace arranged by primary key, or ``None``.

    Accumulates every update for the key (or those at or before ``time`` in
    the product order). A healthy state trace accumulates to at most one row
    per key, with weight one; anything else raises :class:`CorruptUpsertState`.
    """
    totals: dict[Hashable, int] = {}
    for row, t, weight in trace.updates_for_key(key):
        if time is None or timestamps.less_equal(t, time):
            totals[row] = totals.get(row, 0) + weight
    present = {row: w for row, w in totals.items() if w != 0}
    if not present:
        return None
    if len(present) > 1 or next(iter(present.values())) != 1:
        raise CorruptUpsertState(
            f"state trace holds {present!r} for key {key!r}; expected one row at weight 1"
        )
    (row,) = present
    return row  # type: ignore[return-value]


# --- from upserts to updates -------------------------------------------------


def upserts_to_updates(
    spec: UpsertSpec,
    batch: Iterable[Any],
    lookup: StateLookup,
    file: str | None = None,
) -> ZSet:
    """The state delta that one batch of upserts causes (see the module docstring).

    ``lookup(key)`` returns the key's current state row (user columns plus the
    flag) or ``None``. Raises :class:`BadUpsertRow` or :class:`UpsertConflict`
    before producing anything if the batch is bad input.
    """
    rows = conform_rows(spec, batch, file)

    # Per key: distinct rows per watermark, and the batch's greatest watermark.
    by_key: dict[tuple, dict[tuple, list[tuple]]] = {}
    for row in rows:
        versions = by_key.setdefault(spec.key_of(row), {}).setdefault(spec.watermark_of(row), [])
        if row not in versions:
            versions.append(row)

    conflicts: list[tuple] = []
    reports: list[str] = []
    updates: list[tuple[tuple, int]] = []
    for key, versions in by_key.items():
        stored = lookup(key)
        if stored is not None:
            _check_state_row(spec, key, stored)
        canonical = None if stored is None else _canonical(stored)
        clash = _find_tie(spec, versions, canonical)
        if clash is not None:
            conflicts.append(key)
            if len(reports) < _MAX_LISTED:
                reports.append(_describe_tie(spec, key, clash, canonical))
            continue
        if conflicts:
            continue  # the batch fails anyway; only keep collecting conflicts
        newest = max(versions)
        (winner,) = versions[newest]
        if stored is not None and newest <= spec.watermark_of(stored):
            continue  # stale, or a resend of the stored version
        if stored is not None:
            updates.append((stored, -1))
        updates.append((state_row(spec, winner, spec.is_tombstone(winner)), 1))

    if conflicts:
        detail = f"{len(conflicts)} key(s) with different rows at an equal watermark: " + "; ".join(
            reports
        )
        raise UpsertConflict(spec.source, file, conflicts, detail, (), spec.key)
    return ZSet(updates)


def updates_against(
    spec: UpsertSpec, batch: Iterable[Any], stored: ZSet, file: str | None = None
) -> ZSet:
    """``upserts_to_updates`` against ``stored``: the stored state rows (with weights, not
    necessarily consolidated) of at least the batch's keys, as an engine reads them from
    its state trace for those keys. Every stored time is at or before the batch's, so
    one time stands for them all; a corrupt state is judged by ``current_state``."""
    trace = state_trace(spec)
    trace.insert(stored, (0,))
    return upserts_to_updates(spec, batch, lambda key: current_state(trace, key), file)


def _find_tie(
    spec: UpsertSpec, versions: dict[tuple, list[tuple]], stored: tuple | None
) -> list[tuple] | None:
    """Two or more different rows that share a watermark, if there are any."""
    stored_wm = None if stored is None else spec.watermark_of(stored)
    for wm, rows in versions.items():
        if stored is not None and wm == stored_wm and stored[:-1] not in rows:
            return [stored[:-1], *rows]
        if len(rows) > 1:
            return rows
    return None


def _canonical(row: tuple) -> tuple:
    """The row with every NaN replaced by the canonical one (for comparisons only)."""
    return tuple(_NAN if isinstance(v, float) and math.isnan(v) else v for v in row)


def _describe_tie(spec: UpsertSpec, key: tuple, rows: list[tuple], stored: tuple | None) -> str:
    wm = spec.watermark_values(rows[0])
    carriers = ", ".join(shown(r) for r in rows[:3]) + (", ..." if len(rows) > 3 else "")
    # _find_tie lists the stored version first when one of the rows is the stored version
    against_stored = stored is not None and rows[0] == stored[:-1]
    what = (
        "a different row with the same watermark as the stored version"
        if against_stored
        else "two different rows with the same watermark in one batch"
    )
    return f"key {format_key(key, spec.key)}: {what}, watermark {shown(wm)} carried by {carriers}"


def _check_state_row(spec: UpsertSpec, key: tuple, stored: Any) -> None:
    if (
        not isinstance(stored, tuple)
        or len(stored) != len(spec.columns) + 1
        or not isinstance(stored[-1], bool)
        or spec.key_of(stored) != key
    ):
        raise CorruptUpsertState(
            f"upsert source {spec.source!r}: stored state for key {key!r} is {stored!r}, "
            f"not a row of {spec.state_columns}"
        )


def apply_upserts(
    spec: UpsertSpec,
    trace: Trace,
    batch: Iterable[Any],
    time: Time,
    file: str | None = None,
) -> ZSet:
    """Ingest one batch into the source's state trace at ``time``; return the state delta.

    The current state is read from ``trace`` itself (as of ``time``), which
    must be arranged by primary key (:func:`state_trace`). On bad input
    nothing is inserted.
    """
    delta = upserts_to_updates(spec, batch, lambda key: current_state(trace, key, time), file)
    trace.insert(delta, time)
    return delta
