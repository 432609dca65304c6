"""A DAG run's data interval: the slice of source time that one epoch ingests."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime


@dataclass(frozen=True)
class Interval:
    """Half-open ``[start, end)`` in UTC; one epoch ingests exactly one interval."""

    start: datetime
    end: datetime

    def __post_init__(self) -> None:
        for name in ("start", "end"):
            value = getattr(self, name)
            if value.tzinfo is None:
                raise ValueError(f"interval {name} {value} has no time zone")
            utc = value.astimezone(UTC)
            # A plain datetime, whatever came in: Airflow hands pendulum's, whose
            # arithmetic drops a standard-library time zone (a pull's ``start - lag``
            # came out naive).
            plain = datetime(*utc.timetuple()[:6], utc.microsecond, tzinfo=UTC)
            object.__setattr__(self, name, plain)
        if self.end <= self.start:
            raise ValueError(f"interval end {self.end} is not after its start {self.start}")

    @property
    def label(self) -> str:
        """``start/end`` in ISO 8601, as the catalog records it."""
        return f"{self.start.isoformat()}/{self.end.isoformat()}"

    @classmethod
    def parse(cls, label: str) -> Interval:
        start, end = label.split("/")
        return cls(datetime.fromisoformat(start), datetime.fromisoformat(end))

    @property
    def slug(self) -> str:
        """The start as ``20260101T000000Z``: path- and Hadoop-safe (no colons)."""
        return self.start.strftime("%Y%m%dT%H%M%SZ")

    def __str__(self) -> str:
        return f"[{self.start.isoformat()}, {self.end.isoformat()})"
