"""``python -m benchmarks.airflow_epochs HOME N``: N empty epochs of a one-source DAG
through Airflow (``dag.test``), printing their wall times as one JSON list.

A child process of W0, because Airflow reads its configuration from the environment
at import and keeps it for the life of the process.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    home, epochs = Path(argv[0]).resolve(), int(argv[1])
    from dbspark.orchestration import demo

    demo.configure(home, home / "dags")
    demo.migrate(home)
    dag = demo.load_dags(home / "dags")["bench_empty_epochs"]
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
