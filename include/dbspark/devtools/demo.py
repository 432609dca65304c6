"""``python -m dbspark.devtools.demo``: the example DAGs, run by Airflow, explained.

For each example DAG in ``dags/`` (orders by region; graph reachability, recursive,
with edge deletions; the orders again with views written in SQL; the reachability again
as a ``.sql`` file with a JSON source declaration) this lands sample
upsert batches for several daily intervals in the landing directory, then has Airflow
run the DAG once per interval
(``dag.test``: the real task runner, task instances and metadata database, in this
process, without a scheduler). After each epoch it prints the input, every view as
published (its Delta table as of the epoch), its change feed, and for the loop how many
iterations ran and why it stopped; and it checks the published views against a full
refresh: the pure-Python reference engine recomputing the views from every batch
landed so far. At the end, ``SparkEngine.verify`` recomputes every view with Spark
from the raw input log in the warehouse. A difference makes the demo exit 1.

Everything lives under ``--home`` (default ``var/airflow``): Airflow's SQLite
metadata database and logs, the landing directory, the warehouse (traces, SQLite
catalog) and the published outputs. Running it again does nothing new (the epochs are
committed); ``--epochs N`` beyond that continues; ``--fresh`` starts over.

    python -m dbspark.devtools.demo [--epochs N] [--dag DAG_ID ...] [--home DIR] [--fresh]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import warnings
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from dbspark.circuit.builder import Circuit
from dbspark.core.columns import WEIGHT
from dbspark.core.zset import ZSet
from dbspark.devtools.engine_demo import (
    SCENARIOS,
    Inputs,
    engine_inputs,
    format_table,
    verify_views,
)

REPO = Path(__file__).resolve().parents[3]
DEFAULT_HOME = "var/airflow"
DEFAULT_EPOCHS = 5
START = datetime(2026, 1, 1, tzinfo=UTC)
STEP = timedelta(days=1)
#: The example DAGs (their ids in ``dags/``) and the demo scenario each one replays.
EXAMPLES = {
    "dbspark_orders_by_region": "orders",
    "dbspark_reachability": "reachability",
    "dbspark_orders_sql": "orders",
    "dbspark_reachable_sql": "reachability",
}


def configure(home: Path, dags_folder: Path) -> dict[str, str]:
    """Point Airflow and dbspark at ``home`` (before Airflow is imported)."""
    settings = {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags_folder),
        # The repo's plugins folder (the dbspark page comes with the installed package).
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DBSPARK__WAREHOUSE": str(home / "warehouse"),
        "AIRFLOW__DBSPARK__LANDING": str(home / "landing"),
        "AIRFLOW__DBSPARK__OUTPUTS": str(home / "published"),
        # The demo prints its own account; task logs go to files under logs/.
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING",
    }
    os.environ.update(settings)
    return settings


def migrate(home: Path) -> None:
    """Create or upgrade Airflow's metadata database (SQLite under ``home``)."""
    airflow = Path(sys.executable).with_name("airflow")
    done = subprocess.run(
        [str(airflow), "db", "migrate"], capture_output=True, text=True, env=os.environ.copy()
    )
    if done.returncode != 0:
        raise SystemExit(f"airflow db migrate failed in {home}:\n{done.stderr[-3000:]}")


def interval(epoch: int) -> Any:
    from dbspark.orchestration.intervals import Interval

    return Interval(START + epoch * STEP, START + (epoch + 1) * STEP)


def land(
    circuit: Circuit,
    epoch: int,
    inputs: Inputs,
    landing: Any = None,
    *,
    zset_format: str = "parquet",
) -> list[str]:
    """Write one epoch's batches as files in the landing directory (idempotently), then
    mark every source's partition complete, as a writer must when nothing arrived for a
    source (a missing partition is an error); ``landing`` None is the configured one
    (``[dbspark] landing``). Upserts land as JSON lines, Z-sets as ``zset_format``."""
    from dbspark.orchestration.sources import LandingDirectory

    landing = landing or LandingDirectory()
    written = []
    for source, batch in inputs.items():
        if not batch:
            continue
        node = circuit.node(circuit.sources[source])
        if node.op == "upsert_source":
            columns = list(node.params["user_schema"].names)
            path = landing.land(source, interval(epoch), batch, columns, "jsonl", name="demo")
        else:
            columns = [*node.schema.names, WEIGHT]
            rows = [(*row, weight) for row, weight in batch]
            path = landing.land(source, interval(epoch), rows, columns, zset_format, name="demo")
        written.append(str(path))
    for source in circuit.sources:
        landing.complete(source, interval(epoch))
    return written


def load_dags(dags_folder: Path) -> dict[str, Any]:
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(str(dags_folder))
    if bag.import_errors:
        problems = "\n".join(f"{f}: {e}" for f, e in bag.import_errors.items())
        raise SystemExit(f"the DAG files in {dags_folder} do not import:\n{problems}")
    return bag.dags


def run_demo(dag: Any, name: str, epochs: int, out: Any) -> bool:
    """Run one example DAG for ``epochs`` epochs and print them; True when all verified."""
    from dbspark.engine.reference.full_refresh import full_refresh
    from dbspark.orchestration.airflow.deployment import DeploymentOptions, resolve
    from dbspark.orchestration.airflow.tasks import EpochTasks

    def say(text: str = "") -> None:
        print(text, file=out, flush=True)

    scenario = SCENARIOS[name]()
    circuit = dag_circuit(dag)
    deployment = resolve(DeploymentOptions())
    catalog = EpochTasks._catalog(deployment)
    say("=" * 78)
    say(f"DAG {dag.dag_id}: circuit {circuit.name} ({scenario.summary})")
    say(f"  tasks: {', '.join(t.task_id for t in dag.tasks)}")
    say(f"  {deployment.describe()}")
    history: list[Inputs] = []
    ok = True
    for epoch, (what, inputs) in enumerate(scenario.epochs(epochs)):
        history.append(engine_inputs(circuit, inputs))
        when = interval(epoch)
        say("-" * 78)
        say(f"epoch {epoch} = data interval {when}: {what}")
        for path in land(circuit, epoch, inputs):
            say(f"  landed {Path(path).relative_to(Path(os.environ['AIRFLOW_HOME']))}")
        if catalog.epoch_state(circuit.name, epoch) == "committed":
            say("  already committed in the warehouse: nothing to run")
        else:
            began = datetime.now(UTC)
            run = dag.test(logical_date=when.end)  # a manual run covers [start, end)
            record_real_start(run, began)
            state = str(getattr(run.state, "value", run.state))
            say(f"  DAG run {run.run_id}: {state}")
            if state != "success":
                say(f"  the run failed; task logs are under {deployment_logs()}")
                return False
        views = show_epoch(circuit, epoch, deployment.outputs, catalog, say)
        problems = verify_views(full_refresh, circuit, history, epoch, views)
        if problems:
            ok = False
            for problem in problems:
                say(f"  MISMATCH with full refresh: {problem}")
        else:
            say("  verified: every view equals the full refresh of all input so far")
    ok = verify_in_spark(circuit, deployment, say) and ok
    catalog.close()
    return ok


def record_real_start(run: Any, began: datetime) -> None:
    """Store when ``run`` really started. ``dag.test()`` records a run as started at its
    logical date, so the UI showed each demo run lasting the months between that date
    and today."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    with create_session() as session:
        session.query(DagRun).filter(DagRun.id == run.id).update({DagRun.start_date: began})


def dag_circuit(dag: Any) -> Circuit:
    from dbspark.orchestration.airflow.dag import circuit_of

    return circuit_of(dag.dag_id)


def deployment_logs() -> Path:
    return Path(os.environ["AIRFLOW_HOME"]) / "logs"


def show_epoch(
    circuit: Circuit, epoch: int, outputs: Path, catalog: Any, say: Any
) -> dict[str, ZSet]:
    """Print what the epoch published (read back from the view's table as of the epoch
    and the epoch's change directory)."""
    from dbspark.orchestration.sinks.files import CHANGES, output_dir, read_change_rows
    from dbspark.orchestration.sinks.tables import table_path, table_rows

    for loop in _top_loops(circuit):
        iterations = catalog.loop_iterations(circuit.name, loop, (epoch,))
        if iterations:
            sizes = ", ".join(str(it.delta_rows) for it in iterations)
            say(f"  loop {loop}: {len(iterations)} iterations, delta rows {sizes}")
            say(f"    stopped because {iterations[-1].reason}")
    views = {}
    for view, node_id in circuit.views.items():
        schema = circuit.node(node_id).schema
        published = ZSet(table_rows(table_path(outputs, circuit.name, view), schema, epoch))
        change = ZSet(
            read_change_rows(output_dir(outputs, circuit.name, view, CHANGES, epoch), schema)
        )
        views[view] = published
        plus = sum(w for _, w in change.items() if w > 0)
        minus = -sum(w for _, w in change.items() if w < 0)
        say(f"  view {view}: {len(published)} rows (change +{plus} -{minus})")
        for line in format_table(schema, published, indent="    "):
            say(line)
    return views


def _top_loops(circuit: Circuit) -> list[str]:
    return [s.name for s in circuit.scopes if s.parent == 0]


def verify_in_spark(circuit: Circuit, deployment: Any, say: Any) -> bool:
    """``SparkEngine.verify`` on Spark: Spark recomputes every view from the stored raw
    inputs. (A small log would be verified in this process by default; the demo shows
    that Spark's full refresh, which ``rebuild`` and a large ``verify`` use, agrees.)"""
    from dbspark.engine.spark.executor import SparkEngine
    from dbspark.orchestration.airflow.deployment import spark_for

    with spark_for(deployment) as spark:
        engine = SparkEngine(
            circuit, deployment.warehouse, spark=spark, catalog_url=deployment.catalog_url
        )
        differences = {v: d for v, d in engine.verify(tier="spark").items() if d}
        engine.catalog.close()
    if differences:
        for view, rows in differences.items():
            say(f"  SPARK FULL REFRESH DIFFERS for view {view}: {rows[:10]}")
        return False
    say(f"  Spark full refresh over the warehouse's input log agrees on {sorted(circuit.views)}")
    return True


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dbspark.devtools.demo")
    parser.add_argument("--epochs", type=int, default=DEFAULT_EPOCHS)
    parser.add_argument("--dag", action="append", choices=list(EXAMPLES))
    parser.add_argument("--home", default=DEFAULT_HOME, help="Airflow home and all data")
    parser.add_argument("--dags-folder", default=str(REPO / "dags"))
    parser.add_argument("--fresh", action="store_true", help="delete --home first")
    args = parser.parse_args(argv)
    if args.epochs < 1:
        parser.error("--epochs must be at least 1")
    # Airflow's in-process API client trips a third-party deprecation notice; not ours.
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
    home = Path(args.home).resolve()
    if args.fresh and home.exists():
        shutil.rmtree(home)
    home.mkdir(parents=True, exist_ok=True)
    configure(home, Path(args.dags_folder).resolve())
    migrate(home)
    dags = load_dags(Path(args.dags_folder))
    ok = True
    for dag_id in args.dag or list(EXAMPLES):
        if dag_id not in dags:
            print(f"no DAG {dag_id!r} in {args.dags_folder}", file=sys.stderr)
            return 1
        ok = run_demo(dags[dag_id], EXAMPLES[dag_id], args.epochs, sys.stdout) and ok
    print("=" * 78)
    print("all epochs verified" if ok else "SOME EPOCHS DID NOT VERIFY")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
