"""Which epoch a DAG run is, decided by the catalog.

Epoch ``n`` is the ``n``-th data interval, counted from the DAG's start date, and the
catalog records each epoch's interval when the epoch opens. A run may open only the
interval that follows the last recorded one (epoch 0: the one starting at the start
date), and only once the epoch before it committed; anything else fails with a
message that names the missing epoch. Airflow's ``max_active_runs=1`` and
``depends_on_past`` keep runs in order; this check is what makes the order hold even
when someone triggers, clears or backfills by hand.

Only the catalog is consulted: deciding the epoch never starts Spark.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from dbspark.orchestration.intervals import Interval
from dbspark.storage.catalog import Catalog


class EpochSequenceError(RuntimeError):
    """A run's interval is not the next epoch, or the epoch before it has not committed.

    ``backfill_from`` is the start of the first interval that has not run, when running
    the intervals from there (a backfill) is the way on."""

    def __init__(self, message: str, backfill_from: datetime | None = None) -> None:
        super().__init__(message)
        self.backfill_from = backfill_from


@dataclass(frozen=True)
class EpochOfRun:
    epoch: int
    interval: Interval
    committed: bool


def epoch_of(catalog: Catalog, circuit: str, interval: Interval) -> EpochOfRun | None:
    """The epoch already recorded for ``interval``, if any."""
    for epoch, label in catalog.epoch_labels(circuit).items():
        if label == interval.label:
            state = catalog.epoch_state(circuit, epoch)
            return EpochOfRun(epoch, interval, state == "committed")
    return None


def next_epoch(
    catalog: Catalog, circuit: str, interval: Interval, start_date: datetime
) -> EpochOfRun:
    """The epoch ``interval`` becomes when opened now, or ``EpochSequenceError``."""
    known = epoch_of(catalog, circuit, interval)
    labels = catalog.epoch_labels(circuit)
    if known is not None:
        previous = known.epoch - 1
        if previous >= 0 and catalog.epoch_state(circuit, previous) != "committed":
            raise _not_committed(circuit, previous, labels.get(previous))
        return known
    last_committed = catalog.last_committed_epoch(circuit)
    if not labels:
        if last_committed >= 0:
            raise EpochSequenceError(
                f"circuit {circuit!r} has {last_committed + 1} epochs that no DAG run "
                "recorded (run outside Airflow?); use a new warehouse for the DAG"
            )
        if interval.start != start_date:
            raise EpochSequenceError(
                f"circuit {circuit!r} has no epoch yet: epoch 0 is the interval starting at "
                f"the DAG's start date {start_date.isoformat()}, not {interval}; "
                "run (or backfill) from the start date, or give the DAG the start date of "
                "the first interval to keep",
                backfill_from=start_date,
            )
        return EpochOfRun(0, interval, False)
    last = max(labels)
    last_interval = Interval.parse(labels[last])
    if interval.start < last_interval.end:
        raise EpochSequenceError(
            f"circuit {circuit!r}: interval {interval} overlaps epoch {last} "
            f"{last_interval} or an earlier one, but no epoch records it (a changed "
            "schedule?); epochs must tile time"
        )
    if interval.start > last_interval.end:
        raise EpochSequenceError(
            f"circuit {circuit!r}: epoch {last + 1}, the interval starting at "
            f"{last_interval.end.isoformat()}, has not run; {interval} must wait for it "
            "(backfill the missing intervals in order)",
            backfill_from=last_interval.end,
        )
    if catalog.epoch_state(circuit, last) != "committed":
        raise _not_committed(circuit, last, labels[last])
    return EpochOfRun(last + 1, interval, False)


def require_epoch(catalog: Catalog, circuit: str, interval: Interval) -> EpochOfRun:
    """The epoch the run's open task recorded; the later tasks of the run use this."""
    known = epoch_of(catalog, circuit, interval)
    if known is None:
        raise EpochSequenceError(
            f"circuit {circuit!r}: no epoch is open for {interval}; the run's open task "
            "must succeed first"
        )
    return known


def _not_committed(circuit: str, epoch: int, label: str | None) -> EpochSequenceError:
    where = f" ({Interval.parse(label)})" if label else ""
    return EpochSequenceError(
        f"circuit {circuit!r}: epoch {epoch}{where} has not committed; its DAG run must "
        "finish before the next epoch opens"
    )
