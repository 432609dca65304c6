"""The named circuits of the conformance suite, written as a user would write them.

Each function builds one circuit; ``NAMED_CIRCUITS`` maps the conformance
names to them. Read them as examples of the builder API. ``orders_sql`` (not a
conformance circuit) shows views written in SQL over sources declared here.
"""

from __future__ import annotations

from collections.abc import Callable

from dbspark.circuit.aggregations import count, max_, sum_
from dbspark.circuit.builder import Circuit, Stream
from dbspark.circuit.expressions import col
from dbspark.sql import add_views


def reachability(node_type: str = "string", name: str = "reachability") -> Circuit:
    """Nodes reachable from a root along edges (a root reaches itself). Recursive.

    Node ids are ``node_type`` (strings in the conformance suite, BIGINT in the
    benchmarks)."""
    c = Circuit(name)
    edges = c.zset_source("edges", {"src": node_type, "dst": node_type})
    roots = c.zset_source("roots", {"node": node_type})
    reach = roots.iterate(
        lambda reach: (
            reach.join(edges, left_on="node", right_on="src")
            .select(node=col("dst"))
            .plus(roots)
            .distinct()
        ),
        name="reach",
    )
    c.view("reach", reach)
    return c


def transitive_closure() -> Circuit:
    """Pairs joined by a path of one or more edges, over distinct(edges). Recursive."""
    c = Circuit("transitive_closure")
    edges = c.zset_source("edges", {"src": "bigint", "dst": "bigint"}).distinct()
    tc = edges.iterate(
        lambda paths: (
            paths.join(edges.select(mid=col("src"), dst2=col("dst")), left_on="dst", right_on="mid")
            .select(src=col("src"), dst=col("dst2"))
            .plus(edges)
            .distinct()
        ),
        name="closure",
    )
    c.view("tc", tc)
    return c


def geometric() -> Circuit:
    """The fixed point of X = distinct(filter(n <= 50, input + map(2n, X)))."""
    c = Circuit("geometric")
    numbers = c.zset_source("numbers", {"n": "bigint"})
    series = numbers.iterate(
        lambda x: numbers.plus(x.select(n=col("n") * 2)).filter(col("n") <= 50).distinct(),
        name="doubling",
    )
    c.view("series", series)
    return c


def word_count() -> Circuit:
    """Per word its accumulated multiplicity, and the words present."""
    c = Circuit("word_count")
    words = c.zset_source("words", {"word": "string"})
    c.view("counts", words.aggregate(by="word", n=count()))
    c.view("distinct_words", words.distinct())
    return c


def join() -> Circuit:
    """An equi-join on k; weights multiply."""
    c = Circuit("join")
    left = c.zset_source("left", {"k": "bigint", "a": "string"})
    right = c.zset_source("right", {"k": "bigint", "b": "string"})
    c.view("joined", left.join(right, on="k"))
    return c


def _orders_sources(c: Circuit) -> tuple[Stream, Stream]:
    """The live rows of the ``customers`` and ``orders`` upsert sources."""
    customers = c.upsert_source(
        "customers",
        {"cust_id": "bigint", "region": "string", "ts": "bigint", "deleted": "boolean"},
        key="cust_id",
        watermark="ts",
        tombstone="deleted",
    )
    order_rows = c.upsert_source(
        "orders",
        {
            "order_id": "bigint",
            "cust_id": "bigint",
            "amount": "bigint",
            "ts": "bigint",
            "deleted_at": "bigint",
        },
        key="order_id",
        watermark="ts",
        tombstone="deleted_at",
    )
    return customers, order_rows


def orders(*, totals: bool = True) -> Circuit:
    """Live customers and orders from upserts, and order totals per region (without
    them when not ``totals``: the circuit that view was removed from)."""
    c = Circuit("orders")
    customers, order_rows = _orders_sources(c)
    customers_current = customers.select("cust_id", "region")
    orders_current = order_rows.select("order_id", "cust_id", "amount")
    region_totals = orders_current.join(customers_current, on="cust_id").aggregate(
        by="region",
        order_count=count(),
        total_amount=sum_(col("amount")),
        max_amount=max_(col("amount")),
    )
    c.view("customers_current", customers_current)
    c.view("orders_current", orders_current)
    if totals:
        c.view("region_totals", region_totals)
    return c


#: The orders example's questions, and more, as a user would write them in SQL.
ORDERS_SQL = """
CREATE VIEW region_revenue AS
  SELECT c.region, COUNT(o.order_id) AS orders, COALESCE(SUM(o.amount), 0) AS revenue
  FROM customers c LEFT JOIN orders o ON o.cust_id = c.cust_id
  GROUP BY c.region;
CREATE VIEW idle_customers AS
  SELECT c.cust_id, c.region FROM customers c
  WHERE NOT EXISTS (SELECT 1 FROM orders o WHERE o.cust_id = c.cust_id);
CREATE VIEW order_stats AS
  SELECT COUNT(*) AS orders, SUM(amount) AS total, COUNT(DISTINCT cust_id) AS buyers
  FROM orders;
"""


def orders_sql() -> Circuit:
    """The ``orders`` sources, with views defined in SQL (``ORDERS_SQL``): revenue per
    region including regions without orders, customers who never ordered, and totals
    that hold a row even when there are no orders."""
    c = Circuit("orders_sql")
    _orders_sources(c)
    add_views(c, ORDERS_SQL)
    return c


def accounts() -> Circuit:
    """Accounts as upserts with a composite watermark and a string tombstone."""
    c = Circuit("accounts")
    rows = c.upsert_source(
        "accounts",
        {
            "id": "bigint",
            "status": "string",
            "balance": "bigint",
            "wm_major": "bigint",
            "wm_minor": "bigint",
        },
        key="id",
        watermark=("wm_major", "wm_minor"),
        tombstone="status",
        tombstone_value="DELETED",
    )
    c.view("accounts_current", rows.select("id", "status", "balance"))
    return c


NAMED_CIRCUITS: dict[str, Callable[[], Circuit]] = {
    "reachability": reachability,
    "transitive_closure": transitive_closure,
    "geometric": geometric,
    "word_count": word_count,
    "join": join,
    "orders": orders,
    "accounts": accounts,
}
