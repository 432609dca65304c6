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


def test_rebuild_with_outputs_corrects_them(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from dbspark.orchestration.sinks.export import export_epoch
    from dbspark.orchestration.sinks.tables import read_table, table_path

    root, outputs = tmp_path / "wh", tmp_path / "out"
    engine = SparkEngine(NAMED_CIRCUITS["orders"](), root, spark=lambda: spark)
    batches = [
        {"customers": [(7, "EU", 1, False)], "orders": [(1, 7, 50, 1, None)]},
        {"orders": [(1, 7, 70, 2, None), (2, 7, 20, 1, None)]},
    ]
    for epoch, batch in enumerate(batches):  # as the DAG's publish task exports
        checked = {name: engine.check_batch(name, rows) for name, rows in batch.items()}
        engine.open_epoch(epoch)
        for name in engine.circuit.sources:
            engine.ingest(name, epoch, checked.get(name))
        for stage in engine.plan.stages_in_scope(0):
            if engine.circuit.node(stage.anchor).op != "upsert_source":
                engine.run_stage(stage.id, (epoch,))
        engine.publish(epoch)
        export_epoch(engine, epoch, root=outputs)
        engine.close_epoch(epoch)
    table = table_path(outputs, "orders", "region_totals")
    # A row of the published table lost behind dbspark's back.
    from deltalake import DeltaTable

    DeltaTable(str(table)).delete("region = 'EU'")
    args = ["rebuild", "orders", "--warehouse", str(root), "--view", "region_totals"]
    assert refresh.main([*args, "--outputs", str(outputs)]) == 0
    out = capsys.readouterr().out
    assert "view region_totals rebuilt from scratch at epoch 1" in out
    assert "outputs of view region_totals: table" in out and "merged +1" in out
    assert read_table(table).to_pylist() == [
        {"region": "EU", "order_count": 2, "total_amount": 90, "max_amount": 70, "__copies": 1}
    ]
    # Again: every output holds the rebuilt view.
    assert refresh.main([*args, "--outputs", str(outputs)]) == 0
    assert "its outputs held the rebuilt view of epoch 1" in capsys.readouterr().out
    for epoch in (0, 1):
        marker = outputs / "orders" / "region_totals" / "changes" / f"epoch={epoch}"
        (marker / "_dbspark.json").unlink()
    # The feed's early changes gone: the view the engine held before the rebuild stands
    # for what the feed sums to, so the feed (which was right) takes no correction.
    DeltaTable(str(table)).delete("region = 'EU'")
    assert refresh.main([*args, "--outputs", str(outputs)]) == 0
    assert "merged +1" in capsys.readouterr().out
    assert not (outputs / "orders" / "region_totals" / "corrections").exists()
    # Without that view, no table and a feed that cannot be summed: refused, saying why.
    from dbspark.orchestration.sinks.export import correct_views
    from dbspark.orchestration.sinks.files import ExportError

    table.rename(tmp_path / "moved")
    with pytest.raises(ExportError, match="has no table, and its change feed lacks early"):
        correct_views(engine, ["region_totals"], root=outputs)
    with pytest.raises(SystemExit):
        refresh.main(["verify", "orders", "--warehouse", str(root), "--outputs", str(outputs)])
    assert "--outputs applies to rebuild only" in capsys.readouterr().err


def test_a_run_holds_a_lease_until_it_ends(spark: Any, tmp_path: Path, monkeypatch) -> None:
    """Garbage collection keeps what a verify or rebuild reads while it runs."""
    root = tmp_path / "wh"
    _warehouse(spark, root).catalog.close()
    seen: list[str] = []
    real = SparkEngine.verify

    def verify(engine: SparkEngine, tier: str | None = None) -> Any:
        seen.extend(lease.holder for lease in engine.catalog.leases("orders"))
        return real(engine, tier=tier)

    monkeypatch.setattr(SparkEngine, "verify", verify)
    assert refresh.main(["verify", "orders", "--warehouse", str(root)]) == 0
    [holder] = seen
    assert holder.startswith("python -m dbspark.refresh verify (")
    engine = SparkEngine(NAMED_CIRCUITS["orders"](), root, spark=lambda: spark)
    assert engine.catalog.leases("orders") == []
    engine.catalog.close()


def test_compact_logs_then_verify(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "wh"
    engine = _warehouse(spark, root)
    engine.step({"orders": [(3, 7, 5, 1, None)], "customers": [(8, "US", 1, False)]})
    engine.step({"orders": [(1, 7, 0, 3, 3)]})  # a tombstone
    args = ["--warehouse", str(root)]
    assert refresh.main(["compact-logs", "orders", *args, "--keep-epochs", "1"]) == 0
    out = capsys.readouterr().out
    assert "raw input logs of 'orders' up to epoch 2: 2 merges replaced 4 batches" in out
    assert "full refresh replays from epoch 2" in out
    for tier in ("local", "spark"):
        assert refresh.main(["verify", "orders", *args, "--tier", tier]) == 0
    with pytest.raises(SystemExit):
        refresh.main(["verify", "orders", *args, "--keep-epochs", "1"])
    assert "--keep-epochs applies to compact-logs only" in capsys.readouterr().err
