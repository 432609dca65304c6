"""``python -m dbspark.refresh``: verify on the tier asked for, and its exit status."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from dbspark import refresh
from dbspark.engine.spark.executor import SparkEngine
from dbspark.examples.circuits import NAMED_CIRCUITS


def _warehouse(spark: Any, root: Path) -> SparkEngine:
    engine = SparkEngine(NAMED_CIRCUITS["orders"](), root, spark=lambda: spark)
    engine.step({"customers": [(7, "EU", 1, False)], "orders": [(1, 7, 50, 1, None)]})
    engine.step({"orders": [(1, 7, 70, 2, None), (2, 7, 20, 1, None)]})
    return engine


def test_verify_exits_by_the_answer_on_either_tier(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "wh"
    engine = _warehouse(spark, root)
    args = ["verify", "orders", "--warehouse", str(root)]
    assert refresh.main(args) == 0
    out = capsys.readouterr().out
    assert "at epoch 1 in this process" in out  # a small log: the reference engine
    assert "view orders_current at epoch 1: matches full refresh" in out

    # One bogus committed row in a view's storage: both tiers find it and exit 1.
    bogus = pa.table({"order_id": [9], "cust_id": [7], "amount": [1], "__epoch": [1], "__w": [1]})
    record = engine.local.write_table(bogus, "orders", "view.orders_current", "trace", (1,))
    engine.catalog.commit("orders", "damage", (1,), [record])
    for tier, where in (("local", "in this process"), ("spark", "with Spark")):
        assert refresh.main([*args, "--tier", tier]) == 1
        out = capsys.readouterr().out
        assert f"at epoch 1 {where}" in out
        assert "view orders_current at epoch 1: DIFFERS in 1 rows" in out
        assert "(9, 7, 1) weight(full refresh - maintained) = -1" in out
        assert "view region_totals at epoch 1: matches full refresh" in out


def test_bad_arguments_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        refresh.main(["verify", "orders", "--warehouse", str(tmp_path), "--tier", "gpu"])
    assert exit_.value.code == 2
    assert "invalid choice: 'gpu'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        refresh.main(["rebuild", "orders", "--warehouse", str(tmp_path), "--tier", "spark"])
    assert "--tier applies to verify only" in capsys.readouterr().err
    assert refresh.main(["verify", "orders", "--warehouse", str(tmp_path)]) == 2
    assert "no warehouse at" in capsys.readouterr().err
