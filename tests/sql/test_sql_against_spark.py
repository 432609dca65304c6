"""SQL views, maintained incrementally, against Spark SQL run on the sources' current rows.

The oracle is the shared README's rule for SQL circuits: after each epoch every view
equals its query run on the sources' current contents with Spark SQL's semantics. The
test keeps those contents itself (per key the row with the greatest ``ts`` unless it
is deleted; a Z-set source as a bag of copies), hands them to Spark as temporary
views, runs each view's own ``SELECT`` and compares bags. The recursive view has no
Spark SQL counterpart (Spark's ``WITH RECURSIVE`` takes only ``UNION ALL``, which does
not terminate on a cycle), so DuckDB, which takes ``UNION``, answers that one.
"""

from __future__ import annotations

import datetime as dt
import math
import random
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from pathlib import Path
from typing import Any

import duckdb
import pytest

from dbspark.engine.reference.engine import ReferenceEngine
from dbspark.sql import compile_circuit

SOURCES = {
    "customers": {
        "columns": [
            ["cust_id", "BIGINT"],
            ["region", "STRING"],
            ["segment", "STRING"],
            ["ts", "BIGINT"],
            ["deleted", "BOOLEAN"],
        ],
        "key": ["cust_id"],
        "watermark": ["ts"],
        "tombstone": "deleted",
    },
    "orders": {
        "columns": [
            ["order_id", "BIGINT"],
            ["cust_id", "BIGINT"],
            ["amount", "BIGINT"],
            ["price", "DOUBLE"],
            ["status", "STRING"],
            ["ts", "BIGINT"],
            ["deleted_at", "BIGINT"],
            ["placed", "DATE"],
            ["placed_at", "TIMESTAMP"],
            ["cost", "DECIMAL(10,2)"],
        ],
        "key": ["order_id"],
        "watermark": ["ts"],
        "tombstone": "deleted_at",
    },
    "edges": {"columns": [["src", "BIGINT"], ["dst", "BIGINT"]]},
}

VIEWS = {
    "projected": """
        SELECT order_id, amount * 2 + 1 AS doubled, -amount AS negated, amount % 3 AS rest,
               CASE WHEN amount > 50 THEN 'big' WHEN amount > 20 THEN 'mid' ELSE 'small' END
                 AS size,
               CASE status WHEN 'open' THEN 1 WHEN 'shipped' THEN 2 END AS code,
               COALESCE(status, 'none') AS status, UPPER(COALESCE(status, 'x')) AS loud,
               LENGTH(status) AS len, ABS(amount - 50) AS distance,
               CAST(amount AS DOUBLE) / 4 AS quarter, CAST(price AS BIGINT) AS whole
        FROM orders
        WHERE amount BETWEEN 5 AND 90 AND (status IN ('open', 'shipped') OR status IS NULL)""",
    "patterns": """
        SELECT cust_id, region LIKE 'n%' AS northish, region NOT LIKE '%th' AS not_th,
               region LIKE '_a%' AS second_a
        FROM customers WHERE segment LIKE 're%' OR segment LIKE 'c_rp_rate'""",
    "case_blind": """
        SELECT cust_id, region ILIKE 'N%' AS north, segment NOT ILIKE '%TAIL' AS not_tail
        FROM customers WHERE region ILIKE '%O%' OR segment ILIKE 'ReT_il'""",
    "escaped": """
        SELECT order_id, COALESCE(status, 'a_b') LIKE 'a!_b' ESCAPE '!' AS placeholder,
               status LIKE 'ope_' ESCAPE '#' AS almost_open
        FROM orders WHERE COALESCE(status, 'x%') NOT LIKE 'x!%' ESCAPE '!'""",
    "by_region": """
        SELECT c.region, COUNT(*) AS n, SUM(o.amount) AS total, MIN(o.amount) AS least,
               MAX(o.status) AS last_status, AVG(o.price) AS mean_price, COUNT(o.status) AS s
        FROM orders o JOIN customers c ON o.cust_id = c.cust_id
        GROUP BY c.region
        HAVING COUNT(*) > 1""",
    "comma_join": """
        SELECT o.order_id, c.segment, o.amount
        FROM customers c, orders o
        WHERE c.cust_id = o.cust_id AND c.segment = 'retail' AND o.amount > 10""",
    "totals": "SELECT COUNT(*) AS n, SUM(amount) AS s, MAX(price) AS top FROM orders",
    "open_totals": """
        SELECT COUNT(*) AS n, SUM(amount) AS s FROM orders WHERE status = 'nothing'""",
    "statuses": """
        SELECT status FROM orders WHERE amount > 30
        UNION ALL
        SELECT region FROM customers""",
    "distinct_names": """
        SELECT DISTINCT region AS name FROM customers
        UNION
        SELECT segment FROM customers""",
    "nested": """
        WITH big AS (SELECT cust_id, amount FROM orders WHERE amount > 25)
        SELECT t.cust_id, t.k, t.total
        FROM (SELECT cust_id, COUNT(*) AS k, SUM(amount) AS total FROM big GROUP BY 1) t
        WHERE t.k >= 1""",
    "self_join": """
        SELECT a.src, b.dst FROM edges a JOIN edges b ON a.dst = b.src""",
    "grouped_expression": """
        SELECT amount % 4 AS bucket, COUNT(*) AS n, SUM(amount) + 1 AS total_plus
        FROM orders GROUP BY amount % 4""",
    "with_region": """
        SELECT o.order_id, c.region, c.cust_id AS c_id
        FROM orders o LEFT JOIN customers c ON o.cust_id = c.cust_id AND c.segment = 'retail'""",
    "right_joined": """
        SELECT c.cust_id, o.order_id
        FROM orders o RIGHT JOIN customers c ON o.cust_id = c.cust_id""",
    "full_joined": """
        SELECT o.order_id, o.cust_id AS o_cust, c.cust_id AS c_cust, c.region
        FROM orders o FULL OUTER JOIN customers c ON o.cust_id = c.cust_id""",
    "left_preserved": """
        SELECT o.order_id, c.region
        FROM orders o LEFT JOIN customers c ON o.cust_id = c.cust_id AND o.amount > 50""",
    "right_preserved": """
        SELECT c.cust_id, o.order_id
        FROM orders o RIGHT JOIN customers c ON o.cust_id = c.cust_id AND c.region = 'north'""",
    "full_conditions": """
        SELECT o.order_id, c.cust_id
        FROM orders o FULL OUTER JOIN customers c
          ON o.cust_id = c.cust_id AND o.status = 'open' AND c.segment = 'retail'""",
    "unmatched": """
        SELECT o.order_id FROM orders o LEFT JOIN customers c ON o.cust_id = c.cust_id
        WHERE c.region IS NULL""",
    "left_grouped": """
        SELECT c.region, COUNT(o.order_id) AS n, COUNT(*) AS rows_
        FROM customers c LEFT JOIN orders o ON o.cust_id = c.cust_id GROUP BY c.region""",
    "idle": """
        SELECT c.cust_id FROM customers c
        WHERE NOT EXISTS (SELECT 1 FROM orders o WHERE o.cust_id = c.cust_id AND o.amount > 10)""",
    "with_orders": """
        SELECT c.cust_id, c.region FROM customers c
        WHERE EXISTS (SELECT * FROM orders o WHERE c.cust_id = o.cust_id)""",
    "active": """
        SELECT cust_id, region FROM customers
        WHERE cust_id IN (SELECT cust_id FROM orders WHERE status = 'open')""",
    "any_open": """
        SELECT cust_id FROM customers WHERE EXISTS (SELECT 1 FROM orders WHERE status = 'open')""",
    "none_big": """
        SELECT order_id, amount FROM orders
        WHERE NOT EXISTS (SELECT * FROM orders WHERE amount > 95)""",
    "not_in_orders": """
        SELECT cust_id, region FROM customers
        WHERE cust_id NOT IN (SELECT cust_id FROM orders WHERE amount > 50)""",
    "not_in_with_nulls": """
        SELECT order_id, status FROM orders WHERE status NOT IN (SELECT region FROM customers)""",
    "not_in_nothing": """
        SELECT order_id FROM orders
        WHERE status NOT IN (SELECT status FROM orders WHERE amount > 1000)""",
    "not_in_correlated": """
        SELECT c.cust_id, c.region FROM customers c
        WHERE c.region NOT IN (SELECT o.status FROM orders o WHERE o.cust_id = c.cust_id)""",
    "not_in_grouped": """
        SELECT cust_id FROM customers
        WHERE segment NOT IN (SELECT status FROM orders GROUP BY status HAVING COUNT(*) > 1)""",
    "regions_without_orders": """
        SELECT region FROM customers
        EXCEPT
        SELECT c.region FROM customers c JOIN orders o ON o.cust_id = c.cust_id
        WHERE o.amount > 60""",
    "both_ends": "SELECT src FROM edges INTERSECT SELECT dst FROM edges",
    "bag_except": "SELECT status FROM orders EXCEPT ALL SELECT region FROM customers",
    "bag_both_ends": "SELECT src FROM edges INTERSECT ALL SELECT dst FROM edges",
    "bag_pairs": """
        SELECT cust_id, status FROM orders
        INTERSECT ALL
        SELECT cust_id, segment FROM customers""",
    "distinct_counts": """
        SELECT region, COUNT(DISTINCT segment) AS segments, COUNT(*) AS n,
               COUNT(DISTINCT cust_id % 2) AS parities
        FROM customers GROUP BY region""",
    "distinct_sums": """
        SELECT status, SUM(DISTINCT amount % 10) AS s, AVG(DISTINCT amount % 7) AS a,
               MAX(DISTINCT price) AS top, SUM(DISTINCT cost) AS spent, COUNT(*) AS n
        FROM orders GROUP BY status""",
    "distinct_global": """
        SELECT SUM(DISTINCT amount % 5) AS s, MIN(DISTINCT status) AS first FROM orders
        WHERE amount > 80""",
    "distinct_total": """
        SELECT COUNT(DISTINCT status) AS statuses, SUM(amount) AS s FROM orders
        WHERE amount < 70""",
    "typed_sums": """
        SELECT status, SUM(cost) AS spent, AVG(cost) AS mean_cost, MIN(placed) AS first_day,
               MAX(placed_at) AS last_at, COUNT(*) AS n
        FROM orders GROUP BY status""",
    "typed_rows": """
        SELECT order_id, cost * (1 - 0.05) AS discounted, cost + amount AS plus_amount,
               cost * price AS times_price, CAST(cost AS BIGINT) AS whole, -cost AS owed,
               CAST(placed AS STRING) AS day_text, CAST(placed_at AS DATE) AS at_day,
               CAST(placed_at AS STRING) AS at_text, COALESCE(cost, 0) AS cost_or_zero
        FROM orders
        WHERE placed >= DATE '2026-01-03' AND placed < DATE '2026-01-01' + INTERVAL '1' MONTH
          AND placed_at <= '2026-01-20 12:00:00' AND cost BETWEEN 0.5 AND 40""",
    "typed_join": """
        SELECT c.region, SUM(o.cost) AS spent, MAX(o.placed) AS last_day
        FROM orders o JOIN customers c ON o.cust_id = c.cust_id
        WHERE o.placed_at > TIMESTAMP '2026-01-05 00:00:00' GROUP BY c.region""",
    "typed_global": """
        SELECT SUM(cost) AS s, AVG(cost) AS a, MIN(placed_at) AS m FROM orders""",
}
#: Views whose columns' types must be the ones Spark SQL gives them, column by column.
TYPED_VIEWS = ["typed_sums", "typed_rows", "typed_join", "typed_global"]
RECURSIVE = """
    WITH RECURSIVE r(node) AS (
      SELECT src FROM edges WHERE src = 1
      UNION
      SELECT e.dst FROM r JOIN edges e ON e.src = r.node)
    SELECT node FROM r"""

REGIONS = ["north", "south", "east", None]
SEGMENTS = ["retail", "retail", "corporate", None]
STATUSES = ["open", "shipped", "returned", None]


def history(seed: int, epochs: int = 4) -> list[dict[str, list[Any]]]:
    """Random upserts, deletions and edge changes, with ``ts`` rising per epoch."""
    rng = random.Random(seed)
    edges: Counter[tuple[int, int]] = Counter()
    out = []
    for epoch in range(epochs):
        ts = epoch + 1
        customers = []
        for cust in rng.sample(range(1, 7), rng.randint(1, 5)):
            if epoch and rng.random() < 0.2:
                customers.append((cust, None, None, ts, True))
            else:
                row = (cust, rng.choice(REGIONS), rng.choice(SEGMENTS), ts, False)
                customers.append(row)
        orders = []
        for order in rng.sample(range(1, 30), rng.randint(0, 12)):
            if epoch and rng.random() < 0.2:
                orders.append((order, None, None, None, None, ts, ts, None, None, None))
            else:
                # Quarters: a sum of them is exact in a double in any order, so full
                # refresh and the maintained view agree to the last bit (``verify``).
                price = rng.randint(4, 240) / 4
                day = rng.randint(1, 31)
                moment = dt.datetime(2026, 1, day, rng.randint(0, 23), tzinfo=dt.UTC)
                moment += dt.timedelta(microseconds=rng.choice([0, 0, 250000, 1]))
                cost = None if rng.random() < 0.1 else Decimal(rng.randint(-500, 5000)).scaleb(-2)
                orders.append(
                    (
                        order,
                        rng.randint(1, 7),
                        rng.randint(0, 100),
                        price,
                        rng.choice(STATUSES),
                        ts,
                        None,
                        None if rng.random() < 0.1 else dt.date(2026, 1, day),
                        moment,
                        cost,
                    )
                )
        changes = []
        for _ in range(rng.randint(1, 6)):
            edge = (rng.randint(1, 5), rng.randint(1, 5))
            weight = -1 if edges[edge] > 0 and rng.random() < 0.4 else 1
            edges[edge] += weight
            changes.append((edge, weight))
        out.append({"customers": customers, "orders": orders, "edges": changes})
    return out


class CurrentTables:
    """The sources' current contents, kept by the test's own rule."""

    def __init__(self) -> None:
        self.upserts: dict[str, dict[Any, tuple]] = {"customers": {}, "orders": {}}
        self.edges: Counter[tuple] = Counter()

    def apply(self, batch: dict[str, list[Any]]) -> None:
        # ``ts`` rises with every epoch and a key appears once per batch, so the newest
        # row always wins; a tombstone (``deleted`` true, ``deleted_at`` set) deletes.
        for row in batch["customers"]:
            self.upserts["customers"][row[0]] = (row[4] is True, row)
        for row in batch["orders"]:
            self.upserts["orders"][row[0]] = (row[6] is not None, row)
        for edge, weight in batch["edges"]:
            self.edges[edge] += weight

    def rows(self, source: str) -> list[tuple]:
        if source == "edges":
            return [edge for edge, n in self.edges.items() for _ in range(n)]
        return [row for deleted, row in self.upserts[source].values() if not deleted]


def register(spark: Any, tables: CurrentTables) -> None:
    """The sources' current contents as Spark temporary views, once per epoch."""
    for source, spec in SOURCES.items():
        schema = ", ".join(f"{name} {kind}" for name, kind in spec["columns"])
        spark.createDataFrame(tables.rows(source), schema).createOrReplaceTempView(source)


def spark_answer(spark: Any, query: str) -> Counter:
    """``query``'s answer over the sources last :func:`register`-ed."""
    return bag(tuple(row) for row in spark.sql(query).collect())


#: Spark SQL's answers by (seed, epoch, view): the reference engine's test and the Spark
#: engine's run the same histories (one worker runs this file), and each answer costs a
#: Spark query.
_ANSWERS: dict[tuple[int, int, str], Counter] = {}
#: Spark SQL answers an epoch's views from this many threads at once: a query over a few
#: rows mostly waits on Spark's scheduling, which concurrent jobs overlap (an epoch's 44
#: views took 25-30% less time from 4 threads than one after another).
ORACLE_THREADS = 4


def answers(
    spark: Any, seed: int, epochs: int
) -> Iterator[tuple[dict[str, list[Any]], CurrentTables, Callable[[str], Counter]]]:
    """Each epoch's batch of ``history(seed)``, the sources' contents after it, and a
    function from a view's name to Spark SQL's answer over them."""
    tables = CurrentTables()
    for epoch, batch in enumerate(history(seed, epochs)):
        tables.apply(batch)
        registered = False

        def answer(name: str, epoch: int = epoch) -> Counter:
            nonlocal registered
            key = (seed, epoch, name)
            if key not in _ANSWERS:
                if not registered:
                    register(spark, tables)
                    registered = True
                # Every view of the epoch at once: each test compares them all, or a
                # subset that an earlier test of the same history already asked for.
                missing = [n for n in VIEWS if (seed, epoch, n) not in _ANSWERS]
                with ThreadPoolExecutor(ORACLE_THREADS) as pool:
                    found = pool.map(lambda n: spark_answer(spark, VIEWS[n]), missing)
                    for view, bag_of_rows in zip(missing, found, strict=True):
                        _ANSWERS[(seed, epoch, view)] = bag_of_rows
            return _ANSWERS[key]

        yield batch, tables, answer


def duckdb_answer(tables: CurrentTables, query: str) -> Counter:
    connection = duckdb.connect()
    connection.execute("CREATE TABLE edges (src BIGINT, dst BIGINT)")
    if tables.rows("edges"):
        connection.executemany("INSERT INTO edges VALUES (?, ?)", tables.rows("edges"))
    return bag(connection.execute(query).fetchall())


def bag(rows: Any) -> Counter:
    return Counter(tuple(_comparable(v) for v in row) for row in rows)


def _comparable(value: Any) -> Any:
    if isinstance(value, float) and not math.isnan(value):
        return round(value, 9)
    if isinstance(value, dt.datetime):  # Spark's rows hold naive local times
        return value.astimezone(dt.UTC)
    return value


def check_types(spark: Any, tables: CurrentTables, circuit: Any, views: list[str]) -> None:
    """Each typed view's column types are the ones Spark SQL gives its query."""
    from dbspark.engine.spark.compile import spark_type

    register(spark, tables)
    for name in views:
        theirs = [f.dataType for f in spark.sql(VIEWS[name]).schema.fields]
        ours = [spark_type(t) for t in circuit.stream(name).schema.types]
        assert ours == theirs, f"view {name}: {ours} against Spark's {theirs}"


def maintained(zset: Any) -> Counter:
    found: Counter = Counter()
    for row, weight in zset.items():
        assert weight > 0, f"a view holds {row} with weight {weight}"
        found[tuple(_comparable(v) for v in row)] += weight
    return found


def script() -> str:
    views = [f"CREATE VIEW {name} AS {query};" for name, query in VIEWS.items()]
    return "\n".join([*views, f"CREATE MATERIALIZED VIEW reach AS {RECURSIVE};"])


@pytest.mark.parametrize("seed", range(3))
def test_reference_engine_matches_spark_sql(spark: Any, seed: int) -> None:
    circuit = compile_circuit("sql_differential", SOURCES, script())
    engine = ReferenceEngine(circuit)
    check_types(spark, CurrentTables(), circuit, TYPED_VIEWS)
    for epoch, (batch, tables, answer) in enumerate(answers(spark, seed, epochs=4)):
        result = engine.step(batch)
        for name in VIEWS:
            assert maintained(result.views[name]) == answer(name), (
                f"seed {seed}, epoch {epoch}, view {name}"
            )
        assert maintained(result.views["reach"]) == duckdb_answer(tables, RECURSIVE), (
            f"seed {seed}, epoch {epoch}, view reach"
        )


#: The views whose operators only SQL brings (the constant of a global aggregate, the
#: composed joins, set operations, distinct counts, LIKE), for the Spark tier, where
#: every stage costs several Spark jobs; the local tier runs them all.
SPARK_TIER_VIEWS = [
    "totals",
    "open_totals",
    "patterns",
    "full_joined",
    "idle",
    "active",
    "regions_without_orders",
    "distinct_counts",
    "distinct_total",
    "typed_rows",
    "typed_global",
]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("local_rows", "views", "epochs"),
    [(None, list(VIEWS), 3), (0, SPARK_TIER_VIEWS, 2)],
    ids=["local-tier", "spark-tier"],
)
def test_spark_engine_matches_spark_sql(
    spark: Any, warehouse_path: Path, local_rows: Any, views: list[str], epochs: int
) -> None:
    from dbspark.engine.spark.executor import SparkEngine

    chosen = "\n".join(f"CREATE VIEW {name} AS {VIEWS[name]};" for name in views)
    circuit = compile_circuit(
        "sql_differential", SOURCES, f"{chosen}\nCREATE VIEW reach AS {RECURSIVE};"
    )
    engine = SparkEngine(circuit, warehouse_path, spark=spark, local_rows=local_rows)
    for epoch, (batch, tables, answer) in enumerate(answers(spark, seed=0, epochs=epochs)):
        result = engine.step(batch)
        for name in views:
            assert maintained(result.views[name]) == answer(name), f"epoch {epoch}, view {name}"
        assert maintained(result.views["reach"]) == duckdb_answer(tables, RECURSIVE)
    # On Spark, whatever the log's size: the only run of Spark's full refresh (what
    # rebuild and a large verify use) over every view of the SQL subset.
    assert engine.verify(tier="spark") == {name: [] for name in circuit.views}


def test_view_names_and_order_of_columns_follow_the_select_list() -> None:
    circuit = compile_circuit("names", SOURCES, script())
    assert list(circuit.views) == [*VIEWS, "reach"]
    schema = circuit.node(circuit.views["by_region"]).schema
    assert schema.names == (
        "region",
        "n",
        "total",
        "least",
        "last_status",
        "mean_price",
        "s",
    )
    unnamed = compile_circuit(
        "unnamed", SOURCES, "CREATE VIEW v AS SELECT amount + 1, order_id FROM orders;"
    )
    assert unnamed.node(unnamed.views["v"]).schema.names == ("_c0", "order_id")
