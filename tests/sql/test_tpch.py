"""TPC-H as written, maintained incrementally, against Spark SQL's batch answer.

``tpchgen-cli`` generates the six tables the queries read at a small scale factor; the
base load and then epochs of changes (updated prices, quantities, dates and priorities,
deleted line items and orders, new orders with line items, a nation moved to another
region) go through the Spark engine. After every epoch each view (Q1, Q3, Q4, Q5, Q10,
Q12, Q13, Q18, with DECIMAL prices and DATE dates) must equal the query run by Spark
SQL on the tables' current rows, value for value, with the same column types.
"""

from __future__ import annotations

import datetime as dt
import random
import subprocess
import sys
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from dbspark.engine.spark.compile import spark_type
from dbspark.examples.tpch import QUERIES, query_text, sources, tpch

TABLES = ("customer", "orders", "lineitem", "supplier", "nation", "region")
SCALE_FACTOR = "0.01"
NEW_ORDER_BASE = 10_000_000


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tpch")
    binary = Path(sys.executable).with_name("tpchgen-cli")
    command = [str(binary), "parquet", "-s", SCALE_FACTOR, "-T", ",".join(TABLES)]
    subprocess.run([*command, "-n", "1", "-q", "-o", str(folder)], check=True)
    return folder


class Tables:
    """The sources' current rows by key, kept by the test (every change has a new ``ts``)."""

    def __init__(self, folder: Path) -> None:
        self.declared = sources()
        self.rows: dict[str, dict[tuple, tuple]] = {}
        for name in TABLES:
            table = pq.read_table(folder / f"{name}.parquet")
            columns = [
                pc.cast(c, pa.string()) if pa.types.is_string_view(c.type) else c
                for c in table.columns
            ]
            records = pa.Table.from_arrays(columns, names=table.column_names).to_pylist()
            self.rows[name] = {}
            for record in records:
                row = (*record.values(), 0, False)
                self.rows[name][self.key(name, row)] = row

    def names(self, table: str) -> list[str]:
        return [n for n, _ in self.declared[table]["columns"]]

    def key(self, table: str, row: tuple) -> tuple:
        names = self.names(table)
        return tuple(row[names.index(k)] for k in self.declared[table]["key"])

    def apply(self, batch: dict[str, list[tuple]]) -> None:
        for table, rows in batch.items():
            for row in rows:
                key = self.key(table, row)
                if row[-1]:
                    self.rows[table].pop(key, None)
                else:
                    self.rows[table][key] = row

    def register(self, spark: Any) -> None:
        for table in TABLES:
            schema = ", ".join(f"{n} {t}" for n, t in self.declared[table]["columns"])
            frame = spark.createDataFrame(list(self.rows[table].values()), schema)
            frame.createOrReplaceTempView(table)


def changes(tables: Tables, rng: random.Random, ts: int) -> dict[str, list[tuple]]:
    """One epoch of changes, at most one row per key."""

    def replace(table: str, row: tuple, **values: Any) -> tuple:
        names = tables.names(table)
        changed = list(row)
        for name, value in values.items():
            changed[names.index(name)] = value
        changed[names.index("ts")] = ts
        return tuple(changed)

    def tombstone(table: str, key: tuple) -> tuple:
        names = tables.names(table)
        row: list[Any] = [None] * len(names)
        for name, value in zip(tables.declared[table]["key"], key, strict=True):
            row[names.index(name)] = value
        row[names.index("ts")], row[names.index("deleted")] = ts, True
        return tuple(row)

    batch: dict[str, list[tuple]] = {name: [] for name in TABLES}
    items = sorted(tables.rows["lineitem"])
    for key in rng.sample(items, 300):
        row = tables.rows["lineitem"][key]
        if rng.random() < 0.3:
            batch["lineitem"].append(tombstone("lineitem", key))
            continue
        shipped = row[tables.names("lineitem").index("l_shipdate")]
        batch["lineitem"].append(
            replace(
                "lineitem",
                row,
                l_quantity=Decimal(rng.randint(1, 50)),
                l_discount=Decimal(rng.randint(0, 10)).scaleb(-2),
                l_shipdate=shipped + dt.timedelta(days=rng.randint(-40, 40)),
                l_returnflag=rng.choice("RAN"),
            )
        )
    orders = sorted(tables.rows["orders"])
    for key in rng.sample(orders, 150):
        row = tables.rows["orders"][key]
        if rng.random() < 0.1:
            batch["orders"].append(tombstone("orders", key))
            continue
        placed = row[tables.names("orders").index("o_orderdate")]
        batch["orders"].append(
            replace(
                "orders",
                row,
                o_orderdate=placed + dt.timedelta(days=rng.randint(-90, 90)),
                o_orderpriority=rng.choice(["1-URGENT", "2-HIGH", "3-MEDIUM", "5-LOW"]),
                o_comment=rng.choice(["special requests", "plain", "special packages requests"]),
            )
        )
    customers = sorted(tables.rows["customer"])
    for key in rng.sample(customers, 40):
        row = tables.rows["customer"][key]
        batch["customer"].append(
            replace(
                "customer",
                row,
                c_mktsegment=rng.choice(["BUILDING", "MACHINERY", "HOUSEHOLD"]),
                c_nationkey=rng.randint(0, 24),
            )
        )
    template = tables.rows["lineitem"][items[0]]
    for n in range(25):
        order = NEW_ORDER_BASE + ts * 1000 + n
        day = dt.date(1993, 6, 1) + dt.timedelta(days=rng.randint(0, 700))
        comment = "new special requests" if n % 3 == 0 else "new"
        customer = rng.choice(customers)[0]
        batch["orders"].append(
            (order, customer, "O", Decimal("1000.00"), day, "1-URGENT", "c", 0, comment, ts, False)
        )
        for line in range(1, rng.randint(2, 4)):
            batch["lineitem"].append(
                replace(
                    "lineitem",
                    template,
                    l_orderkey=order,
                    l_linenumber=line,
                    l_quantity=Decimal(rng.randint(90, 160)),
                    l_suppkey=rng.randint(1, 100),
                    l_shipdate=day + dt.timedelta(days=rng.randint(1, 60)),
                    l_commitdate=day + dt.timedelta(days=30),
                    l_receiptdate=day + dt.timedelta(days=rng.randint(20, 90)),
                )
            )
    nation = tables.rows["nation"][(ts,)]
    batch["nation"].append(replace("nation", nation, n_regionkey=2))  # into ASIA
    return batch


def answer(spark: Any, query: str) -> tuple[Counter, list[Any]]:
    select = query_text(query).split(" AS\n", 1)[1].rstrip().rstrip(";")
    frame = spark.sql(select)
    rows = Counter(tuple(r) for r in frame.collect())
    return rows, [f.dataType for f in frame.schema.fields]


@pytest.mark.slow
def test_tpch_views_match_spark_sql_after_every_epoch(
    spark: Any, generated: Path, warehouse_path: Path
) -> None:
    from dbspark.engine.spark.executor import SparkEngine

    circuit = tpch()
    engine = SparkEngine(circuit, warehouse_path, spark=spark)
    tables = Tables(generated)
    rng = random.Random(20)
    batches = [{name: list(tables.rows[name].values()) for name in TABLES}]
    batches += [changes(tables, rng, ts) for ts in (1, 2)]
    nonempty = set()
    for epoch, batch in enumerate(batches):
        if epoch:
            tables.apply(batch)
        result = engine.step(batch)
        tables.register(spark)
        for query in QUERIES:
            want, types = answer(spark, query)
            schema = circuit.stream(query).schema
            assert [spark_type(t) for t in schema.types] == types, query
            got = Counter()
            for row, weight in result.views[query].items():
                assert weight > 0, f"{query} holds {row} with weight {weight}"
                got[row] += weight
            assert got == want, f"epoch {epoch}, {query}: {len(got)} rows, Spark {len(want)}"
            if want:
                nonempty.add(query)
    assert nonempty == set(QUERIES), "every query must have rows in some epoch"
