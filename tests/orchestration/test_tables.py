"""Views published as Delta tables (``sinks/tables.py``), fed Arrow changes directly.

The tables are read back as consumers would: DuckDB over the table's PyArrow dataset,
pandas, and ``read_table``; what they hold is compared with the view each epoch's
changes add up to. The Spark path (a real engine's changes through ``export_epoch``) is
in ``test_outputs.py``.
"""

from __future__ import annotations

import datetime as dt
import itertools
import random
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from pathlib import Path
from typing import Any

import duckdb
import polars
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dbspark.core.columns import COPIES, WEIGHT
from dbspark.core.types import Schema
from dbspark.core.zset import ZSet
from dbspark.engine.local.tier import arrow_schema
from dbspark.orchestration.sinks.tables import (
    EPOCH_KEY,
    INTERVAL_KEY,
    SETTING_KEYS,
    TEXT_KEYS,
    TableEpochError,
    TableError,
    TableSettings,
    file_overlap,
    maintain_table,
    open_table,
    publish_table,
    read_table,
    table_epoch,
    table_versions,
)

SCHEMA = Schema.of(
    {"Tag": "string", "n": "bigint", "x": "double", "xs": "array<bigint>"}, what="test"
)
NO_MAINTENANCE = TableSettings(maintain_every=0)


def change(rows: Sequence[tuple[tuple[Any, ...], int]], schema: Schema = SCHEMA) -> pa.Table:
    """A change as the engine hands it over: the view's columns and ``__w``."""
    fields = [*schema.fields, (WEIGHT, "bigint")]
    columns = list(zip(*[(*row, w) for row, w in rows], strict=True)) if rows else []
    if not columns:
        columns = [[] for _ in fields]
    return pa.table(
        {name: list(values) for (name, _), values in zip(fields, columns, strict=True)},
        schema=arrow_schema(fields),
    )


def as_zset(table: pa.Table, schema: Schema = SCHEMA) -> ZSet:
    """A table of the view's columns and ``__copies`` as the multiset it stands for."""
    rows = []
    for record in table.to_pylist():
        row = tuple(
            tuple(record[n]) if record[n] is not None and t.startswith("array") else record[n]
            for n, t in schema.fields
        )
        rows.append((row, record[COPIES]))
    return ZSet(rows)


def publish(path: Path, epoch: int, rows: Any, **kwargs: Any) -> Any:
    def whole_view() -> pa.Table:
        raise AssertionError("the whole view is only asked for a table's first epoch > 0")

    options = {"whole_view": whole_view, "settings": NO_MAINTENANCE, **kwargs}
    return publish_table(
        path, circuit="c", view="v", schema=SCHEMA, epoch=epoch, change=change(rows), **options
    )


A = ("a", 1, 1.5, (1, 2))
NULLS = (None, None, None, None)
B = ("b", None, None, ())
C = ("c", 3, None, (3,))
EPOCHS = [
    [(A, 2), (NULLS, 1), (B, 1)],
    # one copy of A goes, a second row of NULLs comes, B goes, C comes
    [(A, -1), (NULLS, 1), (B, -1), (C, 1)],
    [],  # nothing changes
    [(A, -1), (B, 3)],
]


def views_by_epoch() -> list[ZSet]:
    views, total = [], ZSet([])
    for rows in EPOCHS:
        total = total + ZSet(rows)
        views.append(total)
    return views


def test_each_epoch_is_one_version_that_readers_see_as_the_view(tmp_path: Path) -> None:
    path = tmp_path / "v" / "table"
    want = views_by_epoch()
    for epoch, rows in enumerate(EPOCHS):
        result = publish(path, epoch, rows, interval=f"2026-01-0{epoch + 1}/next")
        assert (result.version, result.skipped) == (epoch, False)
        # DuckDB over the table's dataset, pandas and Polars, as a consumer reads it.
        reader = duckdb.connect()
        reader.register("v", DeltaTable(str(path)).to_pyarrow_dataset())
        by_duckdb = reader.sql("SELECT * FROM v").to_arrow_table()
        by_pandas = pa.Table.from_pandas(DeltaTable(str(path)).to_pandas(), preserve_index=False)
        by_polars = polars.read_delta(str(path)).to_arrow()
        for table in (read_table(path), by_duckdb, by_pandas, by_polars):
            assert table.column_names == [*SCHEMA.names, COPIES]
            assert as_zset(table) == want[epoch], f"epoch {epoch}"

    # One version per epoch, each carrying its epoch and interval; the log's txn says 3.
    assert table_versions(path) == {0: 0, 1: 1, 2: 2, 3: 3}
    history = {c["version"]: c for c in DeltaTable(str(path)).history()}
    assert history[1][EPOCH_KEY] == 1 and history[1][INTERVAL_KEY] == "2026-01-02/next"
    assert history[2]["operation"] == "WRITE"  # the empty epoch: a commit without files
    assert table_epoch(path, "c", "v") == 3

    # Time travel: the view as of every epoch.
    for epoch in range(4):
        assert as_zset(read_table(path, epoch)) == want[epoch], f"as of epoch {epoch}"
    old = open_table(path, 1)
    assert as_zset(pa.table(old.to_pyarrow_table())) == want[1]
    as_of_1 = polars.read_delta(str(path), version=table_versions(path)[1])
    assert as_zset(as_of_1.to_arrow()) == want[1]
    with pytest.raises(TableError, match=r"no version of epoch 7 \(epochs in its log: 0..3\)"):
        read_table(path, 7)

    # The format's change feed: epoch 1 deleted B, added C, changed A's and NULLs' copies.
    feed = pa.table(DeltaTable(str(path)).load_cdf(starting_version=1, ending_version=1))
    kinds = {(r["Tag"], r["_change_type"], r[COPIES]) for r in feed.to_pylist()}
    assert kinds == {
        ("a", "update_preimage", 2),
        ("a", "update_postimage", 1),
        (None, "update_preimage", 1),
        (None, "update_postimage", 2),
        ("b", "delete", 1),
        ("c", "insert", 1),
    }


def test_a_retried_publish_commits_once_and_a_gap_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "table"
    publish(path, 0, EPOCHS[0])
    publish(path, 1, EPOCHS[1])
    retried = publish(path, 1, EPOCHS[1])
    # A skip still names the version that holds the epoch (the asset event's extra).
    assert retried.skipped and retried.version == 1
    assert "already holds epoch 1" in retried.describe()
    again = publish(path, 0, EPOCHS[0])
    assert again.skipped and again.version == 0
    assert DeltaTable(str(path)).version() == 1
    assert as_zset(read_table(path)) == views_by_epoch()[1]
    with pytest.raises(TableEpochError, match=r"holds epochs up to 1; epoch 3 can only follow"):
        publish(path, 3, [])
    assert DeltaTable(str(path)).version() == 1


def test_a_table_first_published_later_is_loaded_from_the_whole_view(tmp_path: Path) -> None:
    path = tmp_path / "table"
    view = views_by_epoch()[1]
    result = publish(path, 2, [], whole_view=lambda: change(list(view.items())), interval="i2")
    assert result.loaded and result.inserted == len(view)
    assert table_versions(path) == {2: 0}
    assert as_zset(read_table(path, 2)) == view
    publish(path, 3, EPOCHS[3])
    assert as_zset(read_table(path)) == views_by_epoch()[3]


KEYED = Schema.of({"k": "bigint", "s": "string"}, what="test")


def publisher(
    path: Path, settings: TableSettings, schema: Schema = KEYED
) -> Callable[[int, Any], Any]:
    """Publishes an epoch's rows of ``schema`` to the table at ``path``."""

    def go(epoch: int, rows: Any) -> Any:
        return publish_table(
            path,
            circuit="c",
            view="v",
            schema=schema,
            epoch=epoch,
            change=change(rows, schema),
            whole_view=lambda: pa.table({}),
            settings=settings,
        )

    return go


def test_a_commit_rewrites_only_the_files_holding_a_changed_row(tmp_path: Path) -> None:
    """O(change): over a view laid out in many files, changing a row removes one file
    and adds that file's other rows and the inserted row, not the view."""
    schema = Schema.of({"k": "bigint", "s": "string"}, what="test")
    rows = [((k, f"row {k:05d} " + "x" * 40), 1) for k in range(20_000)]
    path = tmp_path / "table"
    settings = TableSettings(maintain_every=0, target_file_bytes=64 * 1024)

    go = publisher(path, settings, schema)

    loaded = go(0, rows)
    files = len(DeltaTable(str(path)).file_uris())
    assert loaded.files_added == files and files >= 10, files
    result = go(1, [(rows[12_345][0], -1), ((99_999, "new"), 1)])
    assert (result.inserted, result.deleted, result.updated) == (1, 1, 0)
    assert result.files_removed == 1
    # The rewritten file's other rows; far fewer than the view (a file holds ~1/files).
    assert 0 < result.rows_copied < 3 * len(rows) / files
    commit = DeltaTable(str(path)).history(1)[0]["operationMetrics"]
    assert commit["num_target_rows_copied"] == result.rows_copied
    assert commit["num_output_rows"] == result.rows_copied + 1


def test_a_merge_reads_only_the_files_its_change_can_touch(tmp_path: Path) -> None:
    """O(change) in time: the merge is bounded by the change's range of each column, so
    delta-rs skips the files whose statistics lie outside it. The table is loaded in
    key order, so a change on a few neighbouring keys is in one file of many: with every
    other file made unreadable, the merge still commits. Without the bounds delta-rs
    reads every file (and fails on the first broken one)."""
    schema = Schema.of({"k": "bigint", "s": "string"}, what="test")
    keys = [k * 7_919 % 20_000 for k in range(20_000)]  # every key once, shuffled
    rows = [((k, f"row {k:05d} " + "x" * 40), 1) for k in keys]
    at = {k: i for i, k in enumerate(keys)}
    path = tmp_path / "table"
    settings = TableSettings(maintain_every=0, target_file_bytes=64 * 1024)

    go = publisher(path, settings, schema)

    go(0, rows)  # the load sorts them
    actions = pa.table(DeltaTable(str(path)).get_add_actions(flatten=True)).to_pylist()
    assert len(actions) >= 10, len(actions)
    holding = [a["path"] for a in actions if a["min.k"] <= 15_000 and a["max.k"] >= 14_999]
    assert len(holding) <= 2 and max(a["max.k"] - a["min.k"] for a in actions) < 2_000
    kept = {}
    for action in actions:
        if action["path"] not in holding:
            file = path / action["path"]
            kept[file] = file.read_bytes()
            file.write_bytes(b"not parquet")
    near = [(rows[at[k]][0], -1) for k in (14_999, 15_000)] + [((15_000, "new"), 1)]
    result = go(1, near)
    assert (result.deleted, result.inserted, result.files_removed) == (2, 1, len(holding))
    for file, data in kept.items():
        file.write_bytes(data)
    view = ZSet(rows) + ZSet(near)
    assert as_zset(read_table(path), schema) == view
    # A change at both ends of k reads every file; the answer holds.
    far = [(rows[at[0]][0], -1), (rows[at[19_999]][0], -1), ((-5, None), 2)]
    go(2, far)
    assert as_zset(read_table(path), schema) == view + ZSet(far)


BOUNDED = Schema.of(
    {
        "n": "bigint",
        "s": "string",
        "d": "date",
        "ts": "timestamp",
        "m": "decimal(38,10)",
        "x": "double",
        "b": "boolean",
    },
    what="test",
)
_UTC = dt.UTC
BOUNDARY_VALUES = {
    "n": [-(2**63), 2**63 - 1, 0, -1],
    "s": ["", "a'b", "a\\b", "é\n", "zz", "\x7f", "\u00ff", "'; --"],
    "d": [dt.date(1, 1, 1), dt.date(9999, 12, 31), dt.date(1969, 12, 31), dt.date(2020, 2, 29)],
    "ts": [
        dt.datetime(1, 1, 1, tzinfo=_UTC),
        dt.datetime(2020, 1, 1, 0, 0, 0, 1, tzinfo=_UTC),
        dt.datetime(2020, 1, 1, 0, 0, 0, 2, tzinfo=_UTC),
        dt.datetime(9999, 12, 31, 23, 59, 59, 999_999, tzinfo=_UTC),
    ],
    "m": [
        Decimal("-9999999999999999999999999999.9999999999"),
        Decimal("9999999999999999999999999999.9999999999"),
        Decimal("0.0000000001"),
        Decimal("0E-10"),
    ],
    "x": [float("nan"), -0.0, 0.0, float("inf")],
    "b": [True, False, True, False],
}


@given(
    st.lists(
        st.tuples(*(st.sampled_from([*values, None]) for values in BOUNDARY_VALUES.values())),
        min_size=1,
        max_size=12,
        unique=True,
    ),
    st.data(),
)
@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_the_bounds_drop_no_match_at_the_edges_of_any_type(
    tmp_path_factory: pytest.TempPathFactory, rows: list[tuple[Any, ...]], data: Any
) -> None:
    """Rows at the extremes of each type, NULLs and awkward strings: deleting any of them,
    and adding copies of others, through the bounded merge gives the exact view. A bound
    one value too narrow loses a match: a delete then finds nothing to delete (refused)
    and an insert of a held row adds a second row for it (a wrong view)."""
    # NaN != NaN would make a ZSet of doubles ambiguous: rows are compared as text.
    path = tmp_path_factory.mktemp("bounds") / "table"

    go = publisher(path, NO_MAINTENANCE, BOUNDED)

    go(0, [(row, 1) for row in rows])
    picked = data.draw(st.lists(st.sampled_from(rows), min_size=1, max_size=4, unique=True))
    edits = [(row, data.draw(st.sampled_from([-1, 1, 2]))) for row in picked]
    result = go(1, edits)
    assert result.inserted == 0 and result.updated + result.deleted == len(edits)
    want = {_text(row): 1 for row in rows}
    for row, weight in edits:
        want[_text(row)] += weight
    got = {
        _text(tuple(r[n] for n in BOUNDED.names)): r[COPIES] for r in read_table(path).to_pylist()
    }
    assert got == {row: n for row, n in want.items() if n}


def _text(row: tuple[Any, ...]) -> str:
    """A row as text that is equal for equal rows (NaN included; the reader's UTC is a
    ZoneInfo, the writer's a timezone)."""
    return repr(
        tuple(
            value.astimezone(_UTC).isoformat() if isinstance(value, dt.datetime) else repr(value)
            for value in row
        )
    )


def test_housekeeping_compacts_and_vacuums_under_the_retention(tmp_path: Path) -> None:
    """Epochs that only insert add a file each; the maintenance after every 4th epoch
    finds four times the files the load wrote, rewrites them (sorted) into one and, with
    no retention, deletes the files it replaced."""
    path = tmp_path / "table"
    settings = TableSettings(maintain_every=4, retention_hours=0)
    epochs = [[(A, 1)], *([((f"d{e}", e, None, ()), 1)] for e in range(1, 4)), []]
    views = []
    for epoch, rows in enumerate(epochs):
        result = publish(path, epoch, rows, settings=settings)
        views.append(ZSet(rows) + (views[-1] if views else ZSet([])))
    assert result.maintenance == {
        "files_compacted": 4,
        "files_written": 1,
        "files_vacuumed": 4,
        "sorted": 1,
        "overlap_before": 1.0,
        "overlap_after": 1.0,
    }
    assert "maintenance" in result.describe()
    assert len(DeltaTable(str(path)).file_uris()) == 1
    # Compaction and vacuum are versions of no epoch; the view is unchanged.
    assert table_versions(path) == {e: e for e in range(5)}
    operations = [c["operation"] for c in DeltaTable(str(path)).history(3)]
    assert operations == ["VACUUM END", "VACUUM START", "OPTIMIZE"]
    assert as_zset(read_table(path)) == views[4]
    assert as_zset(read_table(path, 4)) == views[4]
    # The view as of epoch 4 is read from after the compaction. With no retention, the
    # files epoch 3 read are gone: reading it says so.
    with pytest.raises(TableError, match="vacuumed"):
        read_table(path, 3)
    publish(path, 5, [(A, -1)], settings=settings)
    assert as_zset(read_table(path)) == views[4] + ZSet([(A, -1)])
    again = maintain_table(path, settings)  # one file again: nothing to rewrite
    assert (again["files_compacted"], again["sorted"]) == (0, 0)


def files_meeting(path: Path, column: str, low: Any, high: Any) -> list[str]:
    """The data files whose statistics on ``column`` meet ``[low, high]``: what a merge
    bounded by that range reads."""
    actions = pa.table(DeltaTable(str(path)).get_add_actions(flatten=True)).to_pylist()
    return [a["path"] for a in actions if a[f"min.{column}"] <= high and a[f"max.{column}"] >= low]


def feed_by_version(path: Path, first: int) -> dict[int, list[tuple[Any, ...]]]:
    """The change data feed from version ``first`` on: each version's rows, sorted."""
    feed = pa.table(DeltaTable(str(path)).load_cdf(starting_version=first)).to_pylist()
    versions: dict[int, list[tuple[Any, ...]]] = {}
    for r in feed:
        row = (r["k"], r["s"], r[COPIES], r["_change_type"])
        versions.setdefault(r["_commit_version"], []).append(row)
    return {version: sorted(rows) for version, rows in versions.items()}


def spread_edits(current: dict[int, str], epoch: int, count: int) -> list[Any]:
    """A change of ``count`` keys picked at random over the whole range: each row's
    ``s`` is replaced (``current`` follows)."""
    edits = []
    for k in random.Random(epoch).sample(sorted(current), count):
        new = f"row {k:05d} epoch {epoch} " + "x" * 30
        edits += [((k, current[k]), -1), ((k, new), 1)]
        current[k] = new
    return edits


def test_housekeeping_sorts_a_table_whose_merges_scattered_its_ranges(tmp_path: Path) -> None:
    """Changes spread over the keys leave the merges' output files each spanning much
    of them (delta-rs writes merge output in no key order), so a change on two
    neighbouring keys reads most files. Housekeeping measures that, rewrites the
    table sorted by its first bounded column, and the next such change reads one file
    of many again. The rewrite is an OPTIMIZE (no data change): every epoch still reads
    as it was, the change feed of the earlier epochs is the same, the txn still says
    the last epoch."""
    path = tmp_path / "table"
    settings = TableSettings(maintain_every=0, target_file_bytes=64 * 1024)
    go = publisher(path, settings)
    current = {k: f"row {k:05d} " + "x" * 40 for k in range(20_000)}
    go(0, [(row, 1) for row in current.items()])
    views = [ZSet([(row, 1) for row in current.items()])]
    for epoch in (1, 2):
        edits = spread_edits(current, epoch, 300)
        go(epoch, edits)
        views.append(views[-1] + ZSet(edits))
    assert len(DeltaTable(str(path)).file_uris()) >= 10
    # Ranges now overlap: two neighbouring keys fall in many files (8-11 of 12-15 seen).
    assert len(files_meeting(path, "k", 10_000, 10_001)) >= 4
    feed = feed_by_version(path, 1)
    assert sorted(feed) == [1, 2]

    result = maintain_table(path, settings)
    assert result["sorted"] == 1, result
    assert result["overlap_before"] > 3 and result["overlap_after"] == 1.0, result
    table = DeltaTable(str(path))
    ranges = sorted(
        (a["min.k"], a["max.k"]) for a in pa.table(table.get_add_actions(flatten=True)).to_pylist()
    )
    assert all(high < low for (_, high), (low, _) in itertools.pairwise(ranges))
    assert max(high - low for low, high in ranges) < 2_000, ranges
    # Nothing of the epochs moved: their versions, the txn, time travel, the feed.
    assert table_versions(path) == {0: 0, 1: 1, 2: 2}
    assert table_epoch(path, "c", "v") == 2
    for epoch, view in enumerate(views):
        assert as_zset(read_table(path, epoch), KEYED) == view, f"as of epoch {epoch}"
    assert feed_by_version(path, 1) == feed  # the sort's version adds no change
    assert table.history(1)[0]["operation"] == "OPTIMIZE"

    # A change on two neighbouring keys reads the file that holds them: every other
    # file is made unreadable, and the merge still commits.
    holding = files_meeting(path, "k", 10_000, 10_001)
    assert len(holding) == 1
    kept = {}
    for action in pa.table(table.get_add_actions(flatten=True)).to_pylist():
        if action["path"] not in holding:
            file = path / action["path"]
            kept[file] = file.read_bytes()
            file.write_bytes(b"not parquet")
    near = [((k, current[k]), -1) for k in (10_000, 10_001)] + [((10_000, "new"), 1)]
    merged = go(3, near)
    for file, data in kept.items():
        file.write_bytes(data)
    assert (merged.deleted, merged.inserted, merged.files_removed) == (2, 1, 1)
    assert as_zset(read_table(path), KEYED) == views[-1] + ZSet(near)


def test_housekeeping_leaves_a_table_still_in_order_as_it_is(tmp_path: Path) -> None:
    """Changes on a few neighbouring keys rewrite the file that holds them into files
    of the same range, so the table stays in order: housekeeping rewrites nothing (not
    even by size: delta-rs's compaction joins files in log order, across ranges)."""
    path = tmp_path / "table"
    settings = TableSettings(maintain_every=0, target_file_bytes=64 * 1024)
    go = publisher(path, settings)
    current = {k: f"row {k:05d} " + "x" * 40 for k in range(20_000)}
    go(0, [(row, 1) for row in current.items()])
    view = ZSet([(row, 1) for row in current.items()])
    for epoch, first in enumerate((3_000, 12_000, 7_500, 18_000), start=1):
        edits = []
        for k in range(first, first + 20):
            edits += [((k, current[k]), -1), ((k, f"edited {epoch}"), 1)]
            current[k] = f"edited {epoch}"
        go(epoch, edits)
        view = view + ZSet(edits)
    before = DeltaTable(str(path))
    files, version = set(before.file_uris()), before.version()

    result = maintain_table(path, settings)
    assert result["sorted"] == 0 and result["overlap_before"] < 1.2, result
    assert (result["files_compacted"], result["files_written"]) == (0, 0)
    after = DeltaTable(str(path))
    assert set(after.file_uris()) == files and after.version() == version
    assert as_zset(read_table(path), KEYED) == view


IDS = Schema.of({"id": "string", "n": "bigint"}, what="test")


def scattered_id_table(path: Path, settings: TableSettings, id_of: Callable[[int], str]) -> None:
    """A table of ``IDS`` (ids ``id_of(0..19_999)``) loaded in order, then changed twice
    over the whole range, so that its files' ranges overlap."""
    go = publisher(path, settings, IDS)
    current = {id_of(k): k for k in range(20_000)}
    go(0, [(row, 1) for row in current.items()])
    assert file_overlap(DeltaTable(str(path)), "id") == 1.0  # the load sorts fully
    for epoch in (1, 2):
        edits = []
        for name in random.Random(epoch).sample(sorted(current), 300):
            edits += [((name, current[name]), -1), ((name, current[name] + 1), 1)]
            current[name] += 1
        go(epoch, edits)


def test_housekeeping_does_not_sort_strings_a_z_order_cannot_tell_apart(tmp_path: Path) -> None:
    """delta-rs's z-order keys a string by its first 14 bytes. Ids that all share a
    longer prefix would come out of it in any order, scattering the files: housekeeping
    compacts them by size instead."""
    path = tmp_path / "table"
    settings = TableSettings(maintain_every=0, target_file_bytes=64 * 1024)
    scattered_id_table(path, settings, lambda k: f"customer-account-{k:08d}")
    result = maintain_table(path, settings)
    assert result["sorted"] == 0 and result["overlap_before"] > 2, result
    assert DeltaTable(str(path)).history(1)[0].get("dbspark.sorted_by") is None


def test_housekeeping_does_not_sort_again_what_its_sort_could_not_order(tmp_path: Path) -> None:
    """Ids in two groups (``a-...``, ``b-...``) that share 14 bytes within each: the
    sort orders the groups only, so its files still overlap. The next housekeeping
    compares the table with what that sort left, not with the load's order, and does
    not rewrite it again for nothing."""
    path = tmp_path / "table"
    settings = TableSettings(maintain_every=0, target_file_bytes=64 * 1024)
    scattered_id_table(path, settings, lambda k: f"{'ab'[k % 2]}-customer-account-{k:08d}")
    first = maintain_table(path, settings)
    assert first["sorted"] == 1 and first["overlap_before"] > 2, first
    assert first["overlap_after"] > 2, first  # the sort could not order within a group
    again = maintain_table(path, settings)
    assert again["sorted"] == 0 and again["files_written"] == 0, again


def test_housekeeping_compacts_a_table_with_no_column_to_order_by(tmp_path: Path) -> None:
    """A view of doubles has no bounded column: its merges read every file whatever
    the order, so its small files are compacted by size."""
    schema = Schema.of({"x": "double"}, what="test")
    path = tmp_path / "table"
    settings = TableSettings(maintain_every=0)
    go = publisher(path, settings, schema)
    for epoch in range(4):
        go(epoch, [((float(epoch),), 1)])
    result = maintain_table(path, settings)
    assert result == {
        "files_compacted": 4,
        "files_written": 1,
        "files_vacuumed": 0,
        "sorted": 0,
        "overlap_before": None,
        "overlap_after": None,
    }


def test_housekeeping_pages_through_the_history_newest_first(tmp_path: Path) -> None:
    """Housekeeping reads the log's commits a page at a time (each one request on an
    object store), and the pages together are the whole history, newest first."""
    from dbspark.orchestration.sinks.tables import _newest_first

    path = tmp_path / "table"
    for epoch, rows in enumerate([*EPOCHS, [], [], [], []]):
        publish(path, epoch, rows)
    table = DeltaTable(str(path))
    whole = [commit["version"] for commit in table.history()]
    assert whole == list(range(7, -1, -1))
    for first in (1, 2, 3, 64):
        assert [commit["version"] for commit in _newest_first(table, first)] == whole


def test_bad_tables_and_changes_are_named(tmp_path: Path) -> None:
    path = tmp_path / "table"
    with pytest.raises(TableError, match=r"change of view 'v' at epoch 0 lacks columns \['xs'\]"):
        publish_table(
            path,
            circuit="c",
            view="v",
            schema=SCHEMA,
            epoch=0,
            change=change(EPOCHS[0]).drop_columns(["xs"]),
            whole_view=lambda: pa.table({}),
            settings=NO_MAINTENANCE,
        )
    with pytest.raises(TableError, match="has rows of weight <= 0"):
        publish(path, 0, [(A, -1)])
    assert not (path / "_delta_log").exists()
    foreign = tmp_path / "foreign"
    write_deltalake(str(foreign), pa.table({"x": [1]}))
    with pytest.raises(TableError, match=r"no dbspark publish of view 'v' .* move it away"):
        publish(foreign, 0, EPOCHS[0])
    with pytest.raises(TableError, match="no published table at"):
        read_table(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="retention_hours must be >= 0"):
        TableSettings(retention_hours=-1)


def test_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert TableSettings.from_environment() == TableSettings()
    monkeypatch.setenv("DBSPARK_TABLE_RETENTION_HOURS", "0")
    monkeypatch.setenv("DBSPARK_TABLE_MAINTAIN_EVERY", "3")
    assert TableSettings.from_environment() == TableSettings(retention_hours=0, maintain_every=3)
    monkeypatch.setenv("DBSPARK_TABLE_TARGET_FILE_BYTES", "0")
    with pytest.raises(ValueError, match="DBSPARK_TABLE_TARGET_FILE_BYTES must be an integer >= 1"):
        TableSettings.from_environment()


def test_two_publishers_of_one_epoch_end_as_one_commit(tmp_path: Path) -> None:
    """A publisher that checked the table before another committed the same epoch loses
    the commit and skips, whether it was creating the table or merging into it."""
    path = tmp_path / "table"
    view = views_by_epoch()[1]
    rows = change(list(view.items()))
    winner: list[Any] = []

    def whole_view_while_another_publishes() -> pa.Table:
        # Called after the loser found no table and before it creates one.
        winner.append(publish(path, 1, [], whole_view=lambda: rows))
        return rows

    loser = publish(path, 1, [], whole_view=whole_view_while_another_publishes)
    assert winner[0].loaded and loser.skipped
    assert table_versions(path) == {1: 0} and DeltaTable(str(path)).version() == 0
    assert as_zset(read_table(path)) == view

    # Merges: publishers of epoch 2 at once. Whichever order they commit in, one commit
    # of the epoch's change remains and the others skip.
    start = threading.Barrier(3)

    def racer() -> Any:
        start.wait()
        return publish(path, 2, EPOCHS[3])

    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(lambda _: racer(), range(3)))
    assert sorted(r.skipped for r in results) == [False, True, True]
    assert table_versions(path) == {1: 0, 2: 1}
    assert as_zset(read_table(path)) == view + ZSet(EPOCHS[3])


def test_publishers_of_an_empty_epoch_end_as_one_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An empty epoch's commit adds no file, but carries the epoch's ``txn``: a
    publisher that checked the table before another committed the same empty epoch is
    refused by delta-rs (a concurrent transaction of the same application) and skips."""
    from dbspark.orchestration.sinks import tables

    path = tmp_path / "table"
    publish(path, 0, EPOCHS[0])
    checked, winner = tables._checked, []

    def checked_then_another_publishes(*args: Any) -> Any:
        found = checked(*args)
        monkeypatch.setattr(tables, "_checked", checked)
        winner.append(publish(path, 1, []))
        return found

    monkeypatch.setattr(tables, "_checked", checked_then_another_publishes)
    loser = publish(path, 1, [])
    assert not winner[0].skipped and loser.skipped
    epochs = [commit.get(EPOCH_KEY) for commit in DeltaTable(str(path)).history()]
    assert sorted(epochs) == [0, 1] and table_versions(path) == {0: 0, 1: 1}


def test_publishers_of_an_insert_beyond_every_file_still_end_as_one_commit(
    tmp_path: Path,
) -> None:
    """The bounds are also delta-rs's conflict predicate: racing merges that only add
    rows outside every file's range read no file, and must still conflict."""
    schema = Schema.of({"k": "bigint"}, what="test")
    path = tmp_path / "table"

    def go(epoch: int, keys: list[int]) -> Any:
        return publish_table(
            path,
            circuit="c",
            view="v",
            schema=schema,
            epoch=epoch,
            change=change([((k,), 1) for k in keys], schema),
            whole_view=lambda: pa.table({}),
            settings=NO_MAINTENANCE,
        )

    go(0, list(range(10)))
    for epoch in (1, 2):
        start = threading.Barrier(3)

        def racer(_: int, epoch: int = epoch, start: threading.Barrier = start) -> Any:
            start.wait()
            return go(epoch, [1_000 + epoch])

        with ThreadPoolExecutor(3) as pool:
            results = list(pool.map(racer, range(3)))
        assert sorted(r.skipped for r in results) == [False, True, True]
    assert table_versions(path) == {0: 0, 1: 1, 2: 2}
    assert sorted(r["k"] for r in read_table(path).to_pylist()) == [*range(10), 1_001, 1_002]


def test_an_unwritable_location_fails_clearly_and_a_retry_completes(tmp_path: Path) -> None:
    blocked = tmp_path / "outputs"
    blocked.write_text("a file where the outputs directory should be")
    path = blocked / "c" / "v" / "table"
    with pytest.raises(TableError, match=r"could not commit epoch 0 of view 'v' .* a retry"):
        publish(path, 0, EPOCHS[0])
    blocked.unlink()
    assert publish(path, 0, EPOCHS[0]).loaded
    assert as_zset(read_table(str(path))) == views_by_epoch()[0]


def test_settings_come_from_airflow_cfg_then_the_environment_then_defaults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for _, variable, _ in SETTING_KEYS.values():
        monkeypatch.delenv(variable, raising=False)
    assert TableSettings.from_environment() == TableSettings()
    monkeypatch.setenv("DBSPARK_TABLE_MAINTAIN_EVERY", "3")
    monkeypatch.setenv("DBSPARK_TABLE_RETENTION_HOURS", "5")
    configured = {"table_retention_hours": "0", "table_target_file_bytes": " 1024 "}
    assert TableSettings.from_environment(configured) == TableSettings(
        retention_hours=0, maintain_every=3, target_file_bytes=1024
    )
    # A blank key in airflow.cfg is unset: the variable applies.
    assert TableSettings.from_environment({"table_maintain_every": ""}).maintain_every == 3
    with pytest.raises(
        ValueError, match=r"\[dbspark\] table_maintain_every must be an integer >= 0"
    ):
        TableSettings.from_environment({"table_maintain_every": "-1"})
    with pytest.raises(ValueError, match=r"\[dbspark\] table_target_file_bytes .* got '1k'"):
        TableSettings.from_environment({"table_target_file_bytes": "1k"})
    monkeypatch.setenv("DBSPARK_TABLE_RETENTION_HOURS", "soon")
    with pytest.raises(ValueError, match="DBSPARK_TABLE_RETENTION_HOURS must be an integer"):
        TableSettings.from_environment()


def test_airflow_cfg_keys_reach_the_publish_unit(monkeypatch: pytest.MonkeyPatch) -> None:
    """``[dbspark] table_*`` (here as ``AIRFLOW__DBSPARK__*``) are what the deployment
    hands the publish unit, and only the keys that are set."""
    from dbspark.orchestration.airflow.deployment import table_settings

    keys = [key for key, _, _ in SETTING_KEYS.values()] + [k for k, _ in TEXT_KEYS.values()]
    for key in keys:
        monkeypatch.delenv(f"AIRFLOW__DBSPARK__{key.upper()}", raising=False)
    assert table_settings() == {}
    monkeypatch.setenv("AIRFLOW__DBSPARK__TABLE_MAINTAIN_EVERY", "2")
    assert table_settings() == {"table_maintain_every": "2"}
    for key in keys:
        monkeypatch.setenv(f"AIRFLOW__DBSPARK__{key.upper()}", "7")
    assert set(table_settings()) == set(keys)
