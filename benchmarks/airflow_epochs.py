"""``python -m benchmarks.airflow_epochs HOME N``: N empty epochs of a one-source DAG
through Airflow (``dag.test``), printing their wall times as one JSON list.

A child process of W0, because Airflow reads its configuration from the environment
at import and keeps it for the life of the process.
"""

from __future__ import annotations

import json
import sys
import textwrap
import time
from pathlib import Path

DAG_ID = "bench_empty_epochs"

# Airflow's DAG processor only imports files that mention both "airflow" and "dag".
DAG_FILE = textwrap.dedent(
    """
    \"\"\"Airflow DAG of the benchmark's empty epochs: word count, nothing landed.\"\"\"

    from datetime import UTC, datetime

    from dbspark.examples.circuits import word_count
    from dbspark.orchestration import LandingDirectory, build_dag

    dag = build_dag(
        word_count,
        dag_id="bench_empty_epochs",
        schedule="@daily",
        start_date=datetime(2026, 1, 1, tzinfo=UTC),
        # Nothing lands, and no writer marks the intervals complete: each epoch is empty.
        sources={"words": LandingDirectory(require_partition=False)},
    )
    """
)


def main(argv: list[str]) -> int:
    home, epochs = Path(argv[0]).resolve(), int(argv[1])
    from dbspark.devtools import demo

    (home / "dags").mkdir(parents=True, exist_ok=True)
    (home / "dags" / "bench_empty.py").write_text(DAG_FILE)
    demo.configure(home, home / "dags")
    demo.migrate(home)
    dags = demo.load_dags(home / "dags")
    if DAG_ID not in dags:
        print(f"no DAG {DAG_ID!r} in {home / 'dags'} (found: {sorted(dags)})", file=sys.stderr)
        return 1
    dag = dags[DAG_ID]
    seconds = []
    for epoch in range(epochs):
        start = time.perf_counter()
        run = dag.test(logical_date=demo.interval(epoch).end)
        seconds.append(time.perf_counter() - start)
        state = str(getattr(run.state, "value", run.state))
        if state != "success":
            print(f"epoch {epoch}: the DAG run ended {state}", file=sys.stderr)
            return 1
    print(json.dumps(seconds))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
