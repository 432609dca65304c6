"""An ingest's batch fingerprint is the same on both tiers: a batch ingested by the
local tier and offered again to the Spark tier (or the other way round) must be
recognised as the batch already committed, with NULLs or without."""

from __future__ import annotations

import pyarrow as pa
import pytest

from dbspark.engine.local.tier import table_fingerprint
from dbspark.engine.spark.ingest import frame_fingerprint

ROWS = {
    "without NULLs": {"k": [1, 2, 3], "s": ["a", "b", "é"], "f": [True, False, True]},
    "with NULLs": {"k": [1, None, 3], "s": ["a", "b", None], "f": [None, False, True]},
    "one NULL column": {"k": [1, 2, 3], "s": [None, None, None], "f": [True, True, False]},
}


@pytest.mark.parametrize("rows", ROWS.values(), ids=ROWS.keys())
def test_the_local_fingerprint_is_sparks(spark, rows: dict) -> None:
    table = pa.table(
        {
            "k": pa.array(rows["k"], pa.int64()),
            "s": pa.array(rows["s"], pa.string()),
            "f": pa.array(rows["f"], pa.bool_()),
        }
    )
    frame = spark.createDataFrame(table.to_pandas(), "k bigint, s string, f boolean")
    assert table_fingerprint(table) == frame_fingerprint(frame)
    swapped = table.select(["s", "f", "k"])  # column order does not matter
    assert table_fingerprint(swapped) == table_fingerprint(table)
    assert table_fingerprint(table.slice(1)) != table_fingerprint(table)
