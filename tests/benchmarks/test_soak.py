"""The soak benchmark (``python -m benchmarks.soak``), a few epochs of it on the test
PostgreSQL: the same code as the 500-epoch run, which is not in CI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import soak
from tests.scratch_databases import scratch_database

pytestmark = pytest.mark.slow


def test_a_short_soak_verifies_and_reports(postgres_url: str, tmp_path: Path) -> None:
    with scratch_database(postgres_url, "soak") as catalog_url:
        verdicts = soak.run(
            tmp_path,
            epochs=16,
            size=12,
            seed=1,
            maintain_every=5,
            catalog_url=catalog_url,
            log_retention_epochs=3,
        )
    assert verdicts["verify_ok"] and verdicts["verify_differing"] == {}
    assert verdicts["epochs"] == 16
    written = json.loads((tmp_path / "soak.json").read_text())
    assert [r["epoch"] for r in written["epochs"]] == list(range(16))
    assert [r["collected"] for r in written["epochs"]].count(True) == 3
    # Compaction keeps the live batches of a collection about logarithmic in the epochs.
    assert written["epochs"][-1]["live_batches"] < 16 * 4
    # The raw input logs, merged past the last 3 epochs at each maintenance: two sources,
    # 16 epochs, but only the unmerged epochs and a few merged runs live.
    logs = [r["input_log_batches"] for r in written["epochs"]]
    assert logs[14] < logs[13] and logs[-1] <= 2 * 4 + 2 * 4, logs  # merged at epoch 14
    assert (tmp_path / "soak.png").stat().st_size > 0
    assert "| verify_ok | True |" in (tmp_path / "soak.md").read_text()


def test_late_rows_are_older_than_what_they_would_replace() -> None:
    history = soak.History(seed=5)
    stored: dict[int, int] = {}
    for epoch in range(30):
        batch = history.epoch(epoch, 20)
        keys = [row[0] for row in batch["orders"]]
        assert len(keys) == len(set(keys)), "one version of a key per batch"
        late = [row for row in batch["orders"] if row[3] < history.ts]
        assert late or epoch == 0, "every epoch after the first sends late rows"
        for order, _cust, _amount, ts, _deleted in late:
            assert ts < stored[order], "a late row is older than the version stored"
        for order, _cust, _amount, ts, _deleted in batch["orders"]:
            if ts == history.ts:
                stored[order] = ts
