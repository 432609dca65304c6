"""Airflow DAGs for the tests: the example circuits on landing directories, without
retries (a failure must show at once), one loop whose bound is too small, and one DAG
with retries (bad input must fail at once all the same)."""

from datetime import UTC, datetime, timedelta

import pendulum

from dbspark.circuit.aggregations import count
from dbspark.circuit.builder import Circuit
from dbspark.circuit.expressions import col
from dbspark.examples.circuits import orders, reachability, word_count
from dbspark.orchestration import LandingDirectory, SqlTable, build_dag

START = datetime(2026, 1, 1, tzinfo=UTC)
landing = LandingDirectory()


def doubling_with_a_low_bound() -> Circuit:
    """X = distinct(numbers + 2X below 1000): from 1 it needs ten iterations, not three."""
    c = Circuit("doubling_low_bound")
    numbers = c.zset_source("numbers", {"n": "bigint"})
    series = numbers.iterate(
        lambda x: numbers.plus(x.select(n=col("n") * 2)).filter(col("n") < 1000).distinct(),
        name="doubling",
        max_iterations=3,
    )
    c.view("series", series)
    return c


def word_count_evolved() -> Circuit:
    """``word_count`` as a team redeploys it: a view added (words seen more than once)
    and one removed (``distinct_words``); same circuit name, so it evolves in place."""
    c = Circuit("word_count")
    words = c.zset_source("words", {"word": "string"})
    c.view("counts", words.aggregate(by="word", n=count()))
    c.view("frequent", words.aggregate(by="word", n=count()).filter(col("n") > 1))
    return c


reachability_dag = build_dag(
    reachability,
    dag_id="test_reachability",
    schedule="@daily",
    start_date=START,
    sources={"edges": landing, "roots": landing},
    iteration_tasks=6,
    retries=0,
)
orders_dag = build_dag(
    orders,
    dag_id="test_orders",
    schedule="@daily",
    start_date=START,
    sources={"customers": landing, "orders": landing},
    retries=0,
)
bounded_dag = build_dag(
    doubling_with_a_low_bound,
    dag_id="test_bounded_loop",
    schedule="@daily",
    start_date=START,
    sources={"numbers": landing},
    iteration_tasks=2,
    retries=0,
)
word_count_dag = build_dag(
    word_count,
    dag_id="test_word_count",
    schedule="@daily",
    start_date=START,
    sources={"words": landing},
    retries=0,
)
# Midnight to midnight in Berlin, which changes to summer time on 29 March 2026.
berlin_word_count_dag = build_dag(
    word_count,
    dag_id="test_word_count_berlin",
    schedule="0 0 * * *",
    start_date=pendulum.datetime(2026, 3, 28, tz="Europe/Berlin"),
    sources={"words": landing},
    retries=0,
)
# Retries, one second apart: bad input must fail without them, a retry would not help.
retrying_word_count_dag = build_dag(
    word_count,
    dag_id="test_word_count_retrying",
    schedule="@daily",
    start_date=START,
    sources={"words": landing},
    retries=2,
    retry_delay=timedelta(seconds=1),
)
# Orders pulled from an operational table (the connection ``test_orders_db``), a few rows
# per Parquet file: a pull of more than two rows is written to the task's scratch folder.
pulled_orders_dag = build_dag(
    orders,
    dag_id="test_orders_pulled",
    schedule="@daily",
    start_date=START,
    sources={
        "customers": landing,
        "orders": SqlTable(
            conn_id="test_orders_db",
            table="orders_cdc",
            watermark_column="changed_at",
            chunk_rows=1,
            spill_rows=2,
        ),
    },
    retries=0,
)
# word_count, then redefined: the second's first run evolves what the first's runs kept
# (DAGs of their own, so that no other test's runs share their intervals).
word_count_before_dag = build_dag(
    word_count,
    dag_id="test_word_count_before_evolution",
    schedule="@daily",
    start_date=START,
    sources={"words": landing},
    retries=0,
)
evolved_word_count_dag = build_dag(
    word_count_evolved,
    dag_id="test_word_count_evolved",
    schedule="@daily",
    start_date=START,
    sources={"words": landing},
    retries=0,
)
