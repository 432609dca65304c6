"""Keyed reads of bucket files decode only the row groups that may hold their keys.

A loop's trace slice is read for the keys an iteration touched; its bucket files are
sorted by key in small row groups, and the local tier decodes only the groups whose
statistics admit a key of the file's own bucket (``engine/local/row_groups.py``). Each
read is checked against a plain filter of the whole batch (NULL keys, absent keys,
keys of every bucket), and the read meter against the groups that hold the keys.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dbspark.engine.local import tier as tier_module
from dbspark.engine.local.row_groups import GroupedFile, wanted_values
from dbspark.engine.local.tier import READS, LocalTier
from dbspark.storage import warehouse as warehouse_module
from dbspark.storage.warehouse import Warehouse

FIELDS = [("k", "bigint"), ("v", "bigint"), ("__epoch", "bigint"), ("__iter", "bigint")]
GROUP_ROWS = 8
ROWS = 600


@pytest.fixture
def small_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bucket every keyed batch, in row groups of ``GROUP_ROWS`` rows."""
    monkeypatch.setattr(tier_module, "SMALL_BATCH_ROWS", 0)
    monkeypatch.setattr(warehouse_module, "KEYED_GROUP_ROWS", GROUP_ROWS)


def loop_trace(root: Path, keys: list[int | None]) -> tuple[LocalTier, object, pa.Table]:
    """A tier keeping nothing resident, and a loop trace (its time carries an iteration,
    so reads keep what they decode) of one row per key, two per even key."""
    tier = LocalTier(Warehouse(root))
    rows = [(k, i, 1, 0) for i, k in enumerate(keys)] + [
        (k, -i, 1, 0) for i, k in enumerate(keys) if k is not None and k % 2 == 0
    ]
    table = tier_module.arrow_table(rows, FIELDS)
    record = tier.write_table(table, "c", "n.in0", "trace", (1, 0), bucket_by=["k"])
    return tier, record, table


def read_for(tier: LocalTier, record: object, wanted: list[int | None]) -> pa.Table:
    keys = tier.gather_keys(tier.frame([(k,) for k in wanted], [("k", "bigint")]))
    return tier.read([record], FIELDS, keys=keys, bucket_by=["k"]).toArrow()


def plain_filter(table: pa.Table, wanted: list[int | None]) -> pa.Table:
    mask = pc.is_in(table.column("k"), value_set=pa.array(wanted, pa.int64()), skip_nulls=False)
    return table.filter(mask)


def rows(table: pa.Table) -> list[tuple]:
    return sorted((tuple(r.values()) for r in table.to_pylist()), key=repr)


# ``small_groups`` only sets two constants, the same for every example.
@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    reads=st.lists(
        st.lists(st.one_of(st.none(), st.integers(-50, 700)), min_size=1, max_size=20),
        min_size=1,
        max_size=4,
    )
)
def test_a_keyed_read_finds_exactly_the_rows_of_a_filter(
    small_groups: None, tmp_path_factory: pytest.TempPathFactory, reads: list[list[int | None]]
) -> None:
    """Read after read in one epoch (groups decoded by one read serve the next)."""
    keys = [*range(0, ROWS), None, None]
    tier, record, table = loop_trace(tmp_path_factory.mktemp("wh"), keys)
    for wanted in reads:
        assert rows(read_for(tier, record, wanted)) == rows(plain_filter(table, wanted))


def test_a_read_for_a_few_keys_decodes_only_their_groups(
    small_groups: None, tmp_path: Path
) -> None:
    """The meter counts the groups decoded: for two keys, at most two groups of their two
    bucket files; then none more for the same keys again."""
    tier, record, _ = loop_trace(tmp_path, list(range(ROWS)))
    folder = tier.warehouse.abspath(record.path)
    sizes = {str(f): tier_module._column_chunk_bytes(str(f)) for f in folder.rglob("*.parquet")}
    assert all(len(groups) > 2 for groups in sizes.values())
    group_bytes = [sum(group.values()) for groups in sizes.values() for group in groups]
    READS.enabled = True
    try:
        READS.take()
        found = read_for(tier, record, [17, 301])
        assert sorted(found.column("k").to_pylist()) == [17, 301]
        first = READS.take()
        assert 0 < first <= 2 * max(group_bytes) < sum(group_bytes) / 10
        read_for(tier, record, [17])
        assert READS.take() == 0  # kept from the first read
    finally:
        READS.enabled = False


def test_groups_without_statistics_or_with_null_keys_are_all_read(tmp_path: Path) -> None:
    path = tmp_path / "f.parquet"
    table = pa.table({"k": pa.array(range(40), pa.int64()), "s": [str(i) for i in range(40)]})
    pq.write_table(table, path, row_group_size=10)
    grouped = GroupedFile(str(path))
    assert grouped.needed("k", wanted_values(pa.array([12, 13, 39], pa.int64()))) == [1, 3]
    assert grouped.needed("k", wanted_values(pa.array([12, None], pa.int64()))) == [0, 1, 2, 3]
    assert grouped.needed("s", wanted_values(pa.array(["12"]))) == [0, 1, 2, 3]
    pq.write_table(table, path, row_group_size=10, write_statistics=False)
    assert GroupedFile(str(path)).needed("k", wanted_values(pa.array([12]))) == [0, 1, 2, 3]
