"""The benchmark report's plot of epoch time against delta size, from measurements made
up here (no Spark: the report only reads what a run recorded)."""

from __future__ import annotations

from pathlib import Path

from benchmarks import report
from benchmarks.harness import Measurement, Results


def _run(out: Path) -> Results:
    results = Results(out, {})
    for delta, seconds, tiers in (
        (6_000, 0.5, "local"),
        (60_000, 0.9, "local"),
        (380_000, 9.0, "spark"),
    ):
        results.add(
            Measurement("W1", "incremental", seconds, 7_000_000, delta, params={"tiers": tiers})
        )
        results.add(Measurement("W1", "full_refresh", 20.0 + delta / 1e5, 7_000_000, delta))
        results.add(Measurement("W1", "warm_batch", 1.0, 7_000_000, delta))
    # A second, smaller base with one delta only: not plotted.
    results.add(Measurement("W1", "incremental", 0.3, 700_000, 600))
    results.add(Measurement("W2", "incremental", 1.0, 1_000_000, 20))
    return results


def test_the_delta_plot_shows_each_swept_base(tmp_path: Path) -> None:
    from matplotlib import pyplot as plt

    written = report._delta_plot(_run(tmp_path), plt)
    assert written == tmp_path / "delta.png"
    assert written.stat().st_size > 1000


def test_no_delta_plot_without_a_sweep(tmp_path: Path) -> None:
    from matplotlib import pyplot as plt

    results = Results(tmp_path, {})
    results.add(Measurement("W1", "incremental", 0.3, 700_000, 600))
    assert report._delta_plot(results, plt) is None
    assert not (tmp_path / "delta.png").exists()


def test_publish_cost_is_set_against_the_snapshot_of_the_same_view(tmp_path: Path) -> None:
    results = Results(tmp_path, {})
    results.add(Measurement("P", "snapshot_write", 0.2, size=1_000_000))
    results.add(Measurement("P", "snapshot_write", 0.02, size=100_000))
    results.add(Measurement("P", "table_load", 0.5, size=1_000_000, params={"file_bytes": 2**20}))
    for delta, seconds, rewritten in ((1_000, 0.9, 999_000), (100_000, 0.8, 900_000)):
        results.add(
            Measurement(
                "P",
                "table_commit",
                seconds,
                size=1_000_000,
                delta=delta,
                ok=True,
                params={
                    "change": "spread",
                    "file_bytes": 2**20,
                    "rows_rewritten": rewritten,
                    "files_rewritten": 11,
                    "files_in_table": 12,
                    "scan_ms": 150,
                },
            )
        )
    report.summarize(results)
    small, large = results.summary["P"]
    assert (small["delta_rows"], small["snapshot_s"], small["over_snapshot"]) == (1_000, 0.2, 4.5)
    assert (large["over_snapshot"], large["load_s"], large["rows_rewritten"]) == (4.0, 0.5, 900_000)
    text = report.write(results).read_text()
    assert "## P: publishing an epoch" in text
    assert (
        "| 1000000 | 1048576 | 12 | spread | 1000 | 0.9 | 0.2 | 4.5 | 0.5 | 150 | 999000 | 11 "
        "| yes |" in text
    )
