"""Airflow DAG downstream of dbspark: runs whenever ``region_totals`` is published.

``dbspark_orders_by_region``'s ``publish`` task emits an event on the view's Asset
(``dbspark://orders/region_totals``) for every epoch it publishes. This DAG is scheduled
on that Asset, so it needs no schedule of its own. Its one task reads each triggering
event's ``extra`` (epoch, data interval, rows inserted/deleted, where the change feed
is) and logs which regions' totals changed, read from the epoch's exported change feed.

One run may carry several events: the scheduler folds the events that arrive between
two of its loops into one run (a backfill of several intervals often does), so the
task walks all of them, in order.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from airflow.sdk import dag, task

from dbspark.examples.circuits import orders
from dbspark.orchestration import view_asset
from dbspark.orchestration.sinks.files import read_change_rows

log = logging.getLogger("dbspark.region_totals_report")

circuit = orders()
region_totals = view_asset(circuit, "region_totals")


def describe_change(extra: Mapping[str, Any]) -> str:
    """One event's change, in words: the epoch, its interval, and each region whose
    totals were inserted (+) or retracted (-), from the change feed the event points at."""
    schema = circuit.node(circuit.views["region_totals"]).schema
    lines = [
        f"epoch {extra['epoch']} [{extra['data_interval_start']}, {extra['data_interval_end']}): "
        f"+{extra['rows_inserted']}/-{extra['rows_deleted']} rows of region_totals"
    ]
    if extra.get("changes"):
        for row, weight in sorted(read_change_rows(Path(extra["changes"]), schema), key=str):
            values = dict(zip(schema.names, row, strict=True))
            lines.append(f"  {'+' if weight > 0 else '-'}{abs(weight)} {values}")
    return "\n".join(lines)


@dag(
    dag_id="region_totals_report",
    schedule=region_totals,
    tags=["dbspark", "example"],
    doc_md=__doc__,
)
def region_totals_report() -> None:
    @task
    def report(*, triggering_asset_events: Any = None) -> list[int]:
        """Log each triggering event's change; return the epochs seen (for XCom)."""
        epochs = []
        for event in (triggering_asset_events or {}).get(region_totals, []):
            log.info("%s", describe_change(event.extra))
            epochs.append(event.extra["epoch"])
        return epochs

    report()


region_totals_report()
