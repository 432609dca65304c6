"""The catalog decides which epoch a DAG run is, and refuses runs out of order."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from dbspark.orchestration.epochs import EpochSequenceError, next_epoch, require_epoch
from dbspark.orchestration.intervals import Interval
from dbspark.storage.catalog import Catalog, CatalogError

START = datetime(2026, 1, 1, tzinfo=UTC)


def day(n: int) -> Interval:
    return Interval(START + timedelta(days=n), START + timedelta(days=n + 1))


@pytest.fixture
def catalog(tmp_path):
    catalog = Catalog.for_warehouse(tmp_path)
    catalog.register_circuit("c", "f")
    yield catalog
    catalog.close()


def _open(catalog, n, commit=True):
    run = next_epoch(catalog, "c", day(n), START)
    catalog.open_epoch("c", run.epoch, day(n).label)
    if commit:
        catalog.commit_epoch("c", run.epoch)
    return run


def test_epoch_zero_is_the_interval_at_the_start_date(catalog):
    with pytest.raises(EpochSequenceError, match="epoch 0 is the interval starting at"):
        next_epoch(catalog, "c", day(1), START)
    assert next_epoch(catalog, "c", day(0), START).epoch == 0


def test_epochs_follow_the_intervals_and_a_committed_one_is_reported(catalog):
    assert _open(catalog, 0).epoch == 0
    assert _open(catalog, 1).epoch == 1
    again = next_epoch(catalog, "c", day(1), START)
    assert (again.epoch, again.committed) == (1, True)
    assert require_epoch(catalog, "c", day(1)).epoch == 1


def test_a_gap_names_the_missing_epoch(catalog):
    _open(catalog, 0)
    with pytest.raises(EpochSequenceError) as error:
        next_epoch(catalog, "c", day(3), START)
    assert "epoch 1, the interval starting at 2026-01-02T00:00:00+00:00, has not run" in str(
        error.value
    )


def test_the_next_epoch_waits_for_the_previous_commit(catalog):
    _open(catalog, 0)
    _open(catalog, 1, commit=False)
    with pytest.raises(EpochSequenceError, match=r"epoch 1 \(\[2026-01-02.*has not committed"):
        next_epoch(catalog, "c", day(2), START)
    # Re-running the open epoch's own run is fine: it resumes.
    assert next_epoch(catalog, "c", day(1), START).epoch == 1


def test_an_overlapping_interval_is_refused(catalog):
    _open(catalog, 0)
    shifted = Interval(START + timedelta(hours=12), START + timedelta(days=1, hours=12))
    with pytest.raises(EpochSequenceError, match="overlaps epoch 0"):
        next_epoch(catalog, "c", shifted, START)


def test_one_interval_cannot_become_two_epochs(catalog):
    catalog.open_epoch("c", 0, day(0).label)
    with pytest.raises(CatalogError, match="already epoch 0"):
        catalog.open_epoch("c", 1, day(0).label)
    with pytest.raises(CatalogError, match=r"is .*not"):
        catalog.open_epoch("c", 0, day(1).label)


def test_later_tasks_need_the_open_task_first(catalog):
    with pytest.raises(EpochSequenceError, match="no epoch is open"):
        require_epoch(catalog, "c", day(0))


def test_an_interval_from_airflow_stays_zoned_under_arithmetic():
    """Airflow hands pendulum datetimes; their arithmetic on a standard-library UTC drops
    the zone, which made every SQL pull with a data interval from Airflow fail."""
    from datetime import UTC, datetime, timedelta

    import pendulum

    from dbspark.orchestration.intervals import Interval

    start = pendulum.datetime(2026, 1, 1, 0, 0, 0, 123456, tz="Europe/Berlin")
    interval = Interval(start, start.add(days=1))
    assert type(interval.start) is datetime and interval.start.tzinfo is UTC
    assert interval.start == start and interval.end == start.add(days=1)
    earlier = interval.start - timedelta(hours=1)
    assert earlier.tzinfo is UTC
    assert Interval(earlier, interval.end).start == datetime(2025, 12, 31, 22, 0, 0, 123456, UTC)
