"""Upsert sources: freshest watermark wins, tombstones delete, stale rows are ignored.

The cases come from the upsert sequence in "Upserts in Differential Dataflow"
(insert, update, delete, insert, repeat, delete), the watermark / tombstone
examples of the TrinityLake upsert spec, and the conformance vectors; the
property test checks the incremental state against a from-scratch reader.
"""

from __future__ import annotations

import pickle
from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dbspark.core.columns import TOMBSTONE
from dbspark.core.trace import Trace
from dbspark.core.upsert import (
    BadUpsertRow,
    CorruptUpsertState,
    UpsertConflict,
    UpsertError,
    UpsertSpec,
    apply_upserts,
    conform_rows,
    current_state,
    live_rows,
    rows_from_objects,
    state_row,
    state_trace,
    upserts_to_updates,
)
from dbspark.core.zset import ZSet

# --- specs used below -----------------------------------------------------------

# (first, last) keyed by first name; "seq" is the watermark, "gone" the tombstone.
NAMES = UpsertSpec(
    source="names",
    columns=("first", "last", "seq", "gone"),
    types=("string", "string", "bigint", "boolean"),
    key=("first",),
    watermark=("seq",),
    tombstone="gone",
)

# The conformance circuit "accounts": composite watermark, string tombstone.
ACCOUNTS = UpsertSpec(
    source="accounts",
    columns=("id", "status", "balance", "wm_major", "wm_minor"),
    types=("bigint", "string", "bigint", "bigint", "bigint"),
    key=("id",),
    watermark=("wm_major", "wm_minor"),
    tombstone="status",
    tombstone_value="DELETED",
)

# The conformance circuit "orders": a BIGINT tombstone (non-NULL means deleted).
ORDERS = UpsertSpec(
    source="orders",
    columns=("order_id", "cust_id", "amount", "ts", "deleted_at"),
    types=("bigint", "bigint", "bigint", "bigint", "bigint"),
    key=("order_id",),
    watermark=("ts",),
    tombstone="deleted_at",
)

# The TrinityLake example: varchar key, timestamp-like watermark, boolean tombstone.
TRINITY = UpsertSpec(
    source="trinity_orders",
    columns=("order_id", "ts", "deleted"),
    types=("string", "bigint", "boolean"),
    key=("order_id",),
    watermark=("ts",),
    tombstone="deleted",
)


def ingest(spec: UpsertSpec, batches: list[list[tuple]]) -> tuple[Trace, list[ZSet]]:
    """Apply each batch at epoch (i,); return the trace and the state deltas."""
    trace = state_trace(spec)
    deltas = [apply_upserts(spec, trace, batch, (epoch,)) for epoch, batch in enumerate(batches)]
    return trace, deltas


def live_at(trace: Trace, epoch: int) -> ZSet:
    return live_rows(trace.accumulate((epoch,)))


def project(zset: ZSet, columns: tuple[str, ...], spec: UpsertSpec) -> ZSet:
    idx = [spec.columns.index(c) for c in columns]
    return zset.map(lambda row: tuple(row[i] for i in idx))


# --- the spec -------------------------------------------------------------------


def test_state_layout() -> None:
    assert TOMBSTONE == "__tombstone"
    assert NAMES.state_columns == ("first", "last", "seq", "gone", "__tombstone")
    assert NAMES.state_types == ("string", "string", "bigint", "boolean", "boolean")
    assert state_row(NAMES, ("frank", "oz", 3, None), False) == ("frank", "oz", 3, None, False)
    assert NAMES.key_of(("frank", "oz", 3, None)) == ("frank",)
    assert NAMES.state_key_of(("frank", "oz", 3, None, False)) == ("frank",)


def test_lists_are_turned_into_tuples() -> None:
    spec = UpsertSpec("s", ["k", "w"], ["bigint", "bigint"], ["k"], ["w"])  # type: ignore[arg-type]
    assert spec.columns == ("k", "w") and spec.key == ("k",) and spec.watermark == ("w",)
    assert spec == UpsertSpec("s", ("k", "w"), ("bigint", "bigint"), ("k",), ("w",))


BAD_SPECS = [
    # (what is wrong, keyword arguments, a fragment of the message)
    ("no watermark", dict(watermark=()), "watermark needs at least one column"),
    ("no key", dict(key=()), "key needs at least one column"),
    ("unknown key", dict(key=("nope",)), "key column 'nope'"),
    ("unknown watermark", dict(watermark=("nope",)), "watermark column 'nope'"),
    ("key is watermark", dict(watermark=("k",)), "both key and watermark"),
    ("types length", dict(types=("bigint", "bigint")), "3 columns but 2 types"),
    ("unknown type", dict(types=("bigint", "int", "string")), "unknown type 'int'"),
    ("reserved name", dict(columns=("k", "__w", "t")), "reserved"),
    ("duplicate column", dict(columns=("k", "k", "t")), "duplicate"),
    ("unknown tombstone", dict(tombstone="nope"), "tombstone column 'nope'"),
    ("tombstone is key", dict(tombstone="k"), "is a key column"),
    ("string tombstone no value", dict(tombstone="t"), "needs a tombstone value"),
    ("value for bigint", dict(tombstone="w", tombstone_value="x"), "only applies"),
    ("value no column", dict(tombstone_value="x"), "no tombstone column"),
]


@pytest.mark.parametrize(
    "changes, fragment", [c[1:] for c in BAD_SPECS], ids=[c[0] for c in BAD_SPECS]
)
def test_bad_specs_are_rejected(changes: dict[str, Any], fragment: str) -> None:
    args: dict[str, Any] = dict(
        source="src",
        columns=("k", "w", "t"),
        types=("bigint", "bigint", "string"),
        key=("k",),
        watermark=("w",),
    )
    args.update(changes)
    with pytest.raises(ValueError, match="'src'") as info:
        UpsertSpec(**args)
    assert fragment in str(info.value)


def test_tombstone_may_be_a_watermark_column() -> None:
    spec = UpsertSpec(
        "s", ("k", "w", "d"), ("bigint", "bigint", "boolean"), ("k",), ("w", "d"), "d"
    )
    spec.validate()


# --- the upsert sequence of seed 000 ----------------------------------------------

FRANK_BATCHES = [
    [("frank", "mcsherry", 0, False)],  # insert
    [("frank", "zappa", 1, False)],  # update
    [("frank", None, 2, True)],  # delete
    [("frank", "oz", 3, False)],  # insert
    [("frank", "oz", 3, False)],  # the same row again: a no-op
    [("frank", None, 5, True)],  # delete
]

FRANK_STATE_DELTAS = [
    {("frank", "mcsherry", 0, False, False): 1},
    {("frank", "mcsherry", 0, False, False): -1, ("frank", "zappa", 1, False, False): 1},
    {("frank", "zappa", 1, False, False): -1, ("frank", None, 2, True, True): 1},
    {("frank", None, 2, True, True): -1, ("frank", "oz", 3, False, False): 1},
    {},
    {("frank", "oz", 3, False, False): -1, ("frank", None, 5, True, True): 1},
]

# The differential updates the seed lists for the sequence, as (data, time, diff).
FRANK_UPDATES = [
    (("frank", "mcsherry"), 0, 1),
    (("frank", "mcsherry"), 1, -1),
    (("frank", "zappa"), 1, 1),
    (("frank", "zappa"), 2, -1),
    (("frank", "oz"), 3, 1),
    (("frank", "oz"), 5, -1),
]


def test_frank_sequence_state_deltas() -> None:
    _, deltas = ingest(NAMES, FRANK_BATCHES)
    assert [d.as_dict() for d in deltas] == FRANK_STATE_DELTAS


def test_frank_sequence_gives_the_seeds_differential_updates() -> None:
    _, deltas = ingest(NAMES, FRANK_BATCHES)
    updates = [
        (row, epoch, weight)
        for epoch, delta in enumerate(deltas)
        for row, weight in project(live_rows(delta), ("first", "last"), NAMES).items()
    ]
    assert sorted(updates, key=lambda u: (u[1], u[2], u[0])) == sorted(
        FRANK_UPDATES, key=lambda u: (u[1], u[2], u[0])
    )


def test_frank_sequence_live_collection_epoch_by_epoch() -> None:
    trace, _ = ingest(NAMES, FRANK_BATCHES)
    expected = [
        {("frank", "mcsherry")},
        {("frank", "zappa")},
        set(),
        {("frank", "oz")},
        {("frank", "oz")},
        set(),
    ]
    for epoch, rows in enumerate(expected):
        live = project(live_at(trace, epoch), ("first", "last"), NAMES)
        assert live == ZSet.from_rows(rows), epoch
        state = trace.accumulate((epoch,))
        assert len(state) == 1  # the key's state survives its deletion, as a tombstone


def test_repeat_with_a_fresher_watermark_only_moves_the_watermark() -> None:
    batches = [*FRANK_BATCHES[:4], [("frank", "oz", 4, False)]]
    trace, deltas = ingest(NAMES, batches)
    assert deltas[4].as_dict() == {
        ("frank", "oz", 3, False, False): -1,
        ("frank", "oz", 4, False, False): 1,
    }
    assert project(live_rows(deltas[4]), ("first", "last"), NAMES).is_empty()
    # The fresher watermark is remembered: a different row at 3 is now merely stale,
    # where against the old state it would have been a conflict.
    assert apply_upserts(NAMES, trace, [("frank", "hendrix", 3, False)], (5,)).is_empty()
    before, _ = ingest(NAMES, batches[:4])
    with pytest.raises(UpsertConflict):
        apply_upserts(NAMES, before, [("frank", "hendrix", 3, False)], (4,))


def test_accounts_vector_composite_watermark_and_string_tombstone() -> None:
    # conformance/vectors/upsert_sequence.json, as (id, status, balance, wm_major, wm_minor)
    batches = [
        [(1, "open", 10, 1, 0)],
        [(1, "open", 20, 2, 0)],
        [(1, "DELETED", None, 3, 0)],
        [(1, "open", 30, 4, 0)],
        [(1, "open", 30, 4, 0)],
        [(1, "DELETED", None, 5, 0)],
    ]
    open_10, open_20, open_30 = {(1, "open", 10)}, {(1, "open", 20)}, {(1, "open", 30)}
    expected = [open_10, open_20, set(), open_30, open_30, set()]
    trace, deltas = ingest(ACCOUNTS, batches)
    assert deltas[4].is_empty()
    for epoch, rows in enumerate(expected):
        live = project(live_at(trace, epoch), ("id", "status", "balance"), ACCOUNTS)
        assert live == ZSet.from_rows(rows), epoch


# --- seed 004: watermark and tombstone keys ---------------------------------------


@pytest.mark.parametrize("split", [False, True], ids=["one batch", "two batches"])
@pytest.mark.parametrize("reverse", [False, True], ids=["in order", "reversed"])
def test_trinity_examples(split: bool, reverse: bool) -> None:
    rows = [("1", 100, None), ("1", 200, None), ("2", 100, None), ("2", 200, True)]
    older, newer = rows[0::2], rows[1::2]
    first, second = (newer, older) if reverse else (older, newer)
    batches = [first, second] if split else [first + second]
    trace, _ = ingest(TRINITY, batches)
    last = len(batches) - 1
    # order 1: the row at ts=200 is the one the reader returns; order 2 is deleted.
    assert live_at(trace, last) == ZSet.from_rows([("1", 200, None)])
    assert current_state(trace, ("2",)) == ("2", 200, True, True)


def test_orders_vector_late_rows_and_bigint_tombstone() -> None:
    # The "orders" source of conformance/vectors/watermarks_and_tombstones.json.
    batches = [
        [(1, 7, 5, 100, None), (1, 7, 9, 200, None), (2, 7, 4, 100, None), (2, 7, 4, 200, 200)],
        [(1, 7, 1, 150, None), (2, 7, 3, 150, None), (3, 7, 6, 300, None)],
        [(3, 7, None, 400, 400)],
        [],
    ]
    expected = [
        {(1, 7, 9)},
        {(1, 7, 9), (3, 7, 6)},  # late rows for 1 and 2 (older than a tombstone) are ignored
        {(1, 7, 9)},
        {(1, 7, 9)},
    ]
    trace, deltas = ingest(ORDERS, batches)
    assert deltas[1].as_dict() == {(3, 7, 6, 300, None, False): 1}
    assert deltas[3].is_empty()
    for epoch, rows in enumerate(expected):
        live = project(live_at(trace, epoch), ("order_id", "cust_id", "amount"), ORDERS)
        assert live == ZSet.from_rows(rows), epoch


def test_late_row_after_tombstone_changes_nothing_and_fresher_row_reinserts() -> None:
    trace = state_trace(TRINITY)
    apply_upserts(TRINITY, trace, [("a", 10, False)], (0,))
    delete = apply_upserts(TRINITY, trace, [("a", 20, True)], (1,))
    assert live_rows(delete).as_dict() == {("a", 10, False): -1}
    assert apply_upserts(TRINITY, trace, [("a", 15, False)], (2,)).is_empty()
    assert apply_upserts(TRINITY, trace, [("a", None, False)], (3,)).is_empty()
    back = apply_upserts(TRINITY, trace, [("a", 21, None)], (4,))
    assert back.as_dict() == {("a", 20, True, True): -1, ("a", 21, None, False): 1}
    assert live_at(trace, 4) == ZSet.from_rows([("a", 21, None)])


def test_tombstone_for_an_unknown_key_is_remembered() -> None:
    trace = state_trace(TRINITY)
    delta = apply_upserts(TRINITY, trace, [("ghost", 5, True)], (0,))
    assert delta.as_dict() == {("ghost", 5, True, True): 1}
    assert live_rows(delta).is_empty()
    assert apply_upserts(TRINITY, trace, [("ghost", 4, False)], (1,)).is_empty()
    assert live_at(trace, 1).is_empty()


def test_newer_tombstone_replaces_older_tombstone() -> None:
    trace = state_trace(TRINITY)
    apply_upserts(TRINITY, trace, [("a", 5, True)], (0,))
    delta = apply_upserts(TRINITY, trace, [("a", 8, True)], (1,))
    assert delta.as_dict() == {("a", 5, True, True): -1, ("a", 8, True, True): 1}
    assert apply_upserts(TRINITY, trace, [("a", 7, False)], (2,)).is_empty()


# --- composite watermarks -----------------------------------------------------------

WATERMARK_ORDER = [
    # (older, newer) for a watermark (major, minor)
    ((None, 9), (0, 0)),  # NULL in the first column loses to any value
    ((None, None), (None, 0)),
    ((1, None), (1, 0)),  # NULL smallest in the second column too
    ((1, 5), (2, 0)),  # left to right: the first column decides
    ((1, 0), (1, 1)),
    ((-5, 100), (-4, -100)),
]


@pytest.mark.parametrize("older, newer", WATERMARK_ORDER, ids=str)
def test_watermark_order(older: tuple, newer: tuple) -> None:
    old_row, new_row = (1, "open", 1, *older), (1, "open", 2, *newer)
    assert ACCOUNTS.watermark_of(old_row) < ACCOUNTS.watermark_of(new_row)
    for batches in (
        [[old_row], [new_row]],
        [[new_row], [old_row]],
        [[old_row, new_row]],
        [[new_row, old_row]],
    ):
        trace, _ = ingest(ACCOUNTS, batches)
        assert live_at(trace, len(batches) - 1) == ZSet.from_rows([new_row]), batches


def test_double_watermark_nan_is_largest_and_ints_become_floats() -> None:
    spec = UpsertSpec("m", ("k", "x"), ("bigint", "double"), ("k",), ("x",))
    assert spec.watermark_of((1, None)) < spec.watermark_of((1, -1e300))
    assert spec.watermark_of((1, 1e300)) < spec.watermark_of((1, float("nan")))
    trace = state_trace(spec)
    apply_upserts(spec, trace, [(1, 3)], (0,))
    (row,) = live_at(trace, 0).rows()
    assert row == (1, 3.0) and isinstance(row[1], float)
    apply_upserts(spec, trace, [(1, float("nan"))], (1,))
    # A resend of the NaN row (a different NaN object) is the same row: a no-op.
    assert apply_upserts(spec, trace, [(1, float("nan"))], (2,)).is_empty()


# --- tombstone rules per type ----------------------------------------------------------

TOMBSTONE_RULES = [
    # (type, configured value, column value, is a tombstone)
    ("boolean", None, True, True),
    ("boolean", None, False, False),
    ("boolean", None, None, False),
    ("string", "DELETED", "DELETED", True),
    ("string", "DELETED", "deleted", False),
    ("string", "DELETED", "", False),
    ("string", "DELETED", None, False),
    ("string", "", "", True),
    ("bigint", None, 0, True),
    ("bigint", None, 1234, True),
    ("bigint", None, None, False),
    ("double", None, 0.0, True),
    ("double", None, None, False),
]


@pytest.mark.parametrize("kind, configured, value, deleted", TOMBSTONE_RULES, ids=str)
def test_tombstone_rules(kind: str, configured: str | None, value: Any, deleted: bool) -> None:
    spec = UpsertSpec(
        "t", ("k", "w", "d"), ("bigint", "bigint", kind), ("k",), ("w",), "d", configured
    )
    assert spec.is_tombstone((1, 1, value)) is deleted
    trace = state_trace(spec)
    apply_upserts(spec, trace, [(1, 0, None)], (0,))  # a live row first
    delta = apply_upserts(spec, trace, [(1, 1, value)], (1,))
    assert current_state(trace, (1,))[-1] is deleted  # type: ignore[index]
    expected_live = {(1, 0, None): -1} if deleted else {(1, 0, None): -1, (1, 1, value): 1}
    assert live_rows(delta).as_dict() == expected_live


def test_no_tombstone_column_means_nothing_is_deleted() -> None:
    spec = UpsertSpec("plain", ("k", "w"), ("bigint", "bigint"), ("k",), ("w",))
    assert not spec.is_tombstone((1, 1))


# --- conflicts -------------------------------------------------------------------------


def test_in_batch_conflict_names_source_file_and_key() -> None:
    batch = [("frank", "zappa", 1, False), ("frank", "oz", 1, False), ("moon", "unit", 1, False)]
    with pytest.raises(UpsertConflict) as info:
        upserts_to_updates(NAMES, batch, lambda key: None, file="batch-0001.json")
    error = info.value
    assert (error.source, error.file, error.keys) == ("names", "batch-0001.json", [("frank",)])
    message = str(error)
    assert "'names'" in message and "batch-0001.json" in message and "first='frank'" in message
    assert "moon" not in message


def test_conflict_at_a_watermark_below_the_greatest_is_still_bad_input() -> None:
    batch = [(1, "a", 1, 1, 0), (1, "b", 2, 1, 0), (1, "c", 3, 2, 0)]
    with pytest.raises(UpsertConflict):
        upserts_to_updates(ACCOUNTS, batch, lambda key: None)


def test_null_watermarks_tie_too() -> None:
    batch = [(1, "a", 1, None, None), (1, "b", 1, None, None)]
    with pytest.raises(UpsertConflict):
        upserts_to_updates(ACCOUNTS, batch, lambda key: None)


def test_identical_duplicates_are_fine() -> None:
    row = ("frank", "oz", 3, False)
    delta = upserts_to_updates(NAMES, [row, row, list(row)], lambda key: None)
    assert delta.as_dict() == {("frank", "oz", 3, False, False): 1}


def test_conflict_with_the_stored_row() -> None:
    trace, _ = ingest(NAMES, [[("frank", "oz", 3, False)]])
    with pytest.raises(UpsertConflict) as info:
        apply_upserts(NAMES, trace, [("frank", "zappa", 3, False)], (1,), file="late.json")
    assert info.value.keys == [("frank",)] and info.value.file == "late.json"
    # The tombstone column counts: a tombstone with the stored watermark conflicts as well.
    with pytest.raises(UpsertConflict):
        apply_upserts(NAMES, trace, [("frank", "oz", 3, True)], (1,))
    # A stale row tying the stored watermark conflicts even when a fresher row wins.
    with pytest.raises(UpsertConflict):
        apply_upserts(NAMES, trace, [("frank", "x", 3, False), ("frank", "y", 9, False)], (1,))
    assert trace.times() == {(0,)}  # nothing was inserted
    assert apply_upserts(NAMES, trace, [("frank", "oz", 3, False)], (1,)).is_empty()


def test_conflict_with_a_stored_tombstone() -> None:
    trace, _ = ingest(ACCOUNTS, [[(1, "DELETED", None, 3, 0)]])
    with pytest.raises(UpsertConflict):
        apply_upserts(ACCOUNTS, trace, [(1, "open", 30, 3, 0)], (1,))
    assert apply_upserts(ACCOUNTS, trace, [(1, "DELETED", None, 3, 0)], (1,)).is_empty()


def test_conflicts_reject_the_whole_batch() -> None:
    trace = state_trace(NAMES)
    batch = [("ok", "fine", 1, False), ("bad", "x", 1, False), ("bad", "y", 1, False)]
    with pytest.raises(UpsertConflict) as info:
        apply_upserts(NAMES, trace, batch, (0,))
    assert info.value.keys == [("bad",)]
    assert len(trace) == 0


def test_all_conflicting_keys_are_reported() -> None:
    batch = [(k, v, 1, False) for k in ("a", "b", "c") for v in ("x", "y")]
    with pytest.raises(UpsertConflict) as info:
        upserts_to_updates(NAMES, batch, lambda key: None)
    assert info.value.keys == [("a",), ("b",), ("c",)]


def test_errors_are_value_errors_and_pickle() -> None:
    error = UpsertConflict("s", "f.json", [(1,)], "detail", (), ("id",))
    assert isinstance(error, UpsertError) and isinstance(error, ValueError)
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is UpsertConflict and str(again) == str(error)
    assert (again.source, again.file, again.keys) == ("s", "f.json", [(1,)])
    assert "no file" in str(UpsertConflict("s", None, [(1,)], "detail"))


# --- bad rows --------------------------------------------------------------------------

BAD_ROWS = [
    # (what is wrong, row for ORDERS, key reported, message fragment)
    ("NULL key", (None, 7, 5, 100, None), (None,), "NULL in key column 'order_id'"),
    ("too short", (1, 7, 5), (1,), "3 values for 5 columns"),
    ("too long", (1, 7, 5, 100, None, 0), (1,), "6 values for 5 columns"),
    ("string in bigint", (1, 7, "5", 100, None), (1,), "column 'amount' is BIGINT"),
    ("bool in bigint", (1, 7, True, 100, None), (1,), "column 'amount' is BIGINT"),
    ("bool watermark", (1, 7, 5, False, None), (1,), "column 'ts' is BIGINT"),
    ("float in bigint", (1, 7, 5.0, 100, None), (1,), "column 'amount' is BIGINT"),
    ("out of range", (1, 7, 2**63, 100, None), (1,), "column 'amount' is BIGINT"),
    ("not a row", "1,7,5,100,", None, "must be a tuple or list"),
]


@pytest.mark.parametrize(
    "row, key, fragment", [b[1:] for b in BAD_ROWS], ids=[b[0] for b in BAD_ROWS]
)
def test_bad_rows_are_rejected(row: Any, key: tuple | None, fragment: str) -> None:
    trace, _ = ingest(ORDERS, [[(9, 7, 1, 1, None)]])
    before = sorted(trace.updates(), key=repr)
    good = (8, 7, 1, 1, None)
    with pytest.raises(BadUpsertRow) as info:
        apply_upserts(ORDERS, trace, [good, row], (1,), file="orders-1.json")
    error = info.value
    assert (error.source, error.file, error.keys, error.positions) == (
        "orders",
        "orders-1.json",
        [key],
        [1],
    )
    message = str(error)
    assert fragment in message and "'orders'" in message and "orders-1.json" in message
    assert "row index 1" in message
    if key is not None:
        assert f"order_id={key[0]!r}" in message
    assert sorted(trace.updates(), key=repr) == before  # nothing was inserted


def test_bad_row_types_for_string_boolean_double() -> None:
    spec = UpsertSpec(
        "typed", ("k", "s", "b", "d"), ("string", "string", "boolean", "double"), ("k",), ("d",)
    )
    for row in [
        ("a", 1, True, 1.0),
        ("a", "x", 1, 1.0),
        ("a", "x", True, "1"),
        (1, "x", None, 0.5),
    ]:
        with pytest.raises(BadUpsertRow):
            conform_rows(spec, [row])
    assert conform_rows(spec, [("a", None, None, None), ("a", "x", False, 2)]) == [
        ("a", None, None, None),
        ("a", "x", False, 2.0),
    ]
    with pytest.raises(BadUpsertRow):
        conform_rows(spec, [("a", "x", None, True)])  # bool is not a double either


def test_all_bad_rows_are_reported_before_conflicts() -> None:
    batch = [(1, 7, 1, 1, None), (1, 7, 2, 1, None), (None, 7, 1, 1, None), (3, "x", 1, 1, None)]
    with pytest.raises(BadUpsertRow) as info:
        upserts_to_updates(ORDERS, batch, lambda key: None)
    assert info.value.keys == [(None,), (3,)] and info.value.positions == [2, 3]


def test_rows_from_objects() -> None:
    objects = [{"order_id": 1, "ts": 5}, {"order_id": 2, "amount": 3, "ts": 6, "deleted_at": 6}]
    assert rows_from_objects(ORDERS, objects) == [(1, None, None, 5, None), (2, None, 3, 6, 6)]
    with pytest.raises(BadUpsertRow, match="unknown columns") as info:
        rows_from_objects(ORDERS, [{"order_id": 4, "colour": "red"}, [1]], file="o.json")
    assert info.value.keys == [(4,), None] and info.value.positions == [0, 1]


# --- reading the state trace ------------------------------------------------------------


def test_current_state_as_of_a_time() -> None:
    trace, _ = ingest(NAMES, FRANK_BATCHES)
    assert current_state(trace, ("frank",), (0,)) == ("frank", "mcsherry", 0, False, False)
    assert current_state(trace, ("frank",), (3,)) == ("frank", "oz", 3, False, False)
    assert current_state(trace, ("frank",)) == ("frank", None, 5, True, True)
    assert current_state(trace, ("nobody",)) is None


def test_current_state_detects_corruption() -> None:
    trace = state_trace(NAMES)
    trace.insert(ZSet.from_rows([("a", "x", 1, False, False), ("a", "y", 2, False, False)]), (0,))
    with pytest.raises(CorruptUpsertState):
        current_state(trace, ("a",))
    with pytest.raises(CorruptUpsertState):
        apply_upserts(NAMES, trace, [("a", "z", 3, False)], (1,))
    doubled = state_trace(NAMES)
    doubled.insert(ZSet({("a", "x", 1, False, False): 2}), (0,))
    with pytest.raises(CorruptUpsertState):
        current_state(doubled, ("a",))


def test_lookup_must_return_a_state_row_for_the_key() -> None:
    with pytest.raises(CorruptUpsertState):
        upserts_to_updates(NAMES, [("a", "x", 1, False)], lambda key: ("a", "x", 0, False))
    with pytest.raises(CorruptUpsertState):
        upserts_to_updates(NAMES, [("a", "x", 1, False)], lambda key: ("b", "x", 0, False, False))


def test_live_rows_is_linear() -> None:
    a = ZSet({("k", 1, False): 1, ("j", 1, True): 1})
    b = ZSet({("k", 1, False): -1, ("k", 2, False): 1})
    assert live_rows(a + b) == live_rows(a) + live_rows(b)
    assert live_rows(-a) == -live_rows(a)


# --- property: incremental state == a reader over every row ever accepted ----------------

PROP = UpsertSpec(
    source="prop",
    columns=("k", "v", "w1", "w2", "dead"),
    types=("bigint", "string", "bigint", "bigint", "boolean"),
    key=("k",),
    watermark=("w1", "w2"),
    tombstone="dead",
)

KEYS = st.integers(1, 3)
WM = st.sampled_from([None, 0, 1, 2])
ROW = st.tuples(
    KEYS, st.sampled_from([None, "a", "b"]), WM, WM, st.sampled_from([None, False, True])
)


def freshness(row: tuple) -> tuple:
    """The oracle's own ordering: per watermark column, NULL first, then by value."""
    return tuple((0, 0) if value is None else (1, value) for value in (row[2], row[3]))


def oracle_winners(history: dict[int, list[tuple]]) -> dict[int, tuple]:
    winners = {}
    for key, rows in history.items():
        best = max(freshness(r) for r in rows)
        top = {r for r in rows if freshness(r) == best}
        assert len(top) == 1, f"accepted history is ambiguous for {key}: {top}"
        winners[key] = top.pop()
    return winners


def oracle_conflicts(history: dict[int, list[tuple]], batch: list[tuple]) -> set[tuple]:
    """Keys with two different rows at one watermark, among the batch and the current winner."""
    winners = oracle_winners(history)
    conflicts = set()
    for key in {r[0] for r in batch}:
        seen = [r for r in batch if r[0] == key]
        if key in winners:
            seen.append(winners[key])
        per_watermark: dict[tuple, set[tuple]] = {}
        for r in seen:
            per_watermark.setdefault((r[2], r[3]), set()).add(r)
        if any(len(rows) > 1 for rows in per_watermark.values()):
            conflicts.add((key,))
    return conflicts


@st.composite
def batches(draw: st.DrawFn) -> list[list[tuple]]:
    result = draw(st.lists(st.lists(ROW, max_size=5), min_size=1, max_size=8))
    if draw(st.booleans()):
        # Make each (key, watermark) determine the whole row: no conflicts at all.
        def pick(r: tuple) -> tuple:
            h = hash((r[0], r[2], r[3]))
            return (r[0], ["a", "b", None][h % 3], r[2], r[3], [None, False, True][h // 3 % 3])

        result = [[pick(r) for r in batch] for batch in result]
    return result


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches())
def test_incremental_state_matches_from_scratch_reader(stream: list[list[tuple]]) -> None:
    trace = state_trace(PROP)
    history: dict[int, list[tuple]] = {}
    live_so_far = ZSet()
    for epoch, batch in enumerate(stream):
        expected_conflicts = oracle_conflicts(history, batch)
        before = sorted(trace.updates(), key=repr)
        if expected_conflicts:
            with pytest.raises(UpsertConflict) as info:
                apply_upserts(PROP, trace, batch, (epoch,))
            assert set(info.value.keys) == expected_conflicts
            assert sorted(trace.updates(), key=repr) == before
        else:
            delta = apply_upserts(PROP, trace, batch, (epoch,))
            live_so_far = live_so_far + live_rows(delta)
            for row in batch:
                history.setdefault(row[0], []).append(row)

        winners = oracle_winners(history)
        expected_live = ZSet.from_rows(w for w in winners.values() if w[4] is not True)
        assert live_so_far == expected_live
        state = trace.accumulate((epoch,))
        assert live_rows(state) == expected_live
        # exactly one state row per key ever accepted, weight one, flag = tombstone
        assert all(weight == 1 for _, weight in state.items())
        per_key = Counter(PROP.state_key_of(row) for row in state.rows())
        assert set(per_key) == {(k,) for k in winners} and set(per_key.values()) <= {1}
        for key, winner in winners.items():
            assert current_state(trace, (key,)) == (*winner, winner[4] is True)
