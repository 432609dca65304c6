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
