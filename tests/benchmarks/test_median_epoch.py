"""A size measured as several epochs reports the median after the warm-up, and says so."""

from __future__ import annotations

from benchmarks.harness import Measurement
from benchmarks.workloads.compare import _median_after_warm_up


def _run(epoch: int, seconds: float) -> Measurement:
    return Measurement("W1", "incremental_run", seconds, 100, 10, epoch, jobs=epoch)


def test_the_median_leaves_the_warm_up_out() -> None:
    # The warm-up (epoch 1) is the slowest; with it, the median would be 0.3, not 0.2.
    runs = [_run(1, 0.9), _run(2, 0.3), _run(3, 0.1), _run(4, 0.2)]
    median = _median_after_warm_up(runs, 4)
    assert (median.seconds, median.jobs) == (0.2, 4)
    assert (median.variant, median.epoch) == ("incremental", 4)
    assert median.params["runs_s"] == [0.9, 0.3, 0.1, 0.2]
    assert median.params["first_s"] == 0.9
    assert median.params["median_of_epochs"] == [2, 3, 4]
    assert runs[3].params == {}  # the run itself is left as it was recorded


def test_a_single_run_is_its_own_measurement() -> None:
    only = _run(1, 0.5)
    assert _median_after_warm_up([only], 1) is only
