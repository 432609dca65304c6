"""TPC-H data from ``tpchgen-cli`` (a PyPI wheel), and upsert epochs over it.

The generator's tables are cached per scale factor. The columns W1's Q3 reads keep their
TPC-H types (DECIMAL(15,2) prices and discounts, DATE dates; ``benchmarks.circuits``).
Each table gains the upsert columns ``ts`` (0 for the base load, the epoch number
afterwards) and ``deleted``.

A change epoch touches ``fraction`` of each table's rows: half of them are updated,
a quarter deleted (tombstones) and a quarter inserted as new orders (with one line
item each). Keys are drawn without replacement within an epoch, and the epoch is
``ts``, so no key sees two rows with one watermark.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from benchmarks.circuits import TPCH_COLUMNS, TPCH_SCHEMAS

TABLES = ("customer", "orders", "lineitem")
#: New orders get keys above this, so they never meet generated ones.
NEW_KEY_BASE = 10**12
#: The type of prices and discounts.
PRICE = pa.decimal128(15, 2)
SEGMENTS = ("AUTOMOBILE", "BUILDING", "FURNITURE", "HOUSEHOLD", "MACHINERY")


def tpchgen_binary() -> str:
    """The ``tpchgen-cli`` executable installed next to this interpreter."""
    candidate = Path(sys.executable).with_name("tpchgen-cli")
    if candidate.exists():
        return str(candidate)
    found = shutil.which("tpchgen-cli")
    if found is None:
        raise RuntimeError("tpchgen-cli is not installed (pip install tpchgen-cli==4.0.0)")
    return found


def generate(scale_factor: float, cache: Path) -> Path:
    """The generator's Parquet files for ``scale_factor`` (generated once, then cached)."""
    folder = cache / f"sf{scale_factor:g}"
    done = folder / ".complete"
    if done.exists():
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    command = [tpchgen_binary(), "parquet", "-s", f"{scale_factor:g}", "-T", ",".join(TABLES)]
    subprocess.run([*command, "-n", "1", "-q", "-o", str(folder)], check=True)
    done.touch()
    return folder


def _dates(days: np.ndarray) -> pa.Array:
    """Days since 1970-01-01 as DATE values."""
    return pa.array(np.asarray(days, dtype=np.int32), pa.int32()).cast(pa.date32())


def _day_numbers(dates: pa.ChunkedArray) -> np.ndarray:
    return pc.cast(dates, pa.int32()).to_numpy()


def _hundredths(values: np.ndarray) -> pa.Array:
    """Whole hundredths as DECIMAL(15,2) values (1234 is 12.34)."""
    return pa.array([Decimal(int(v)).scaleb(-2) for v in values], PRICE)


def base_tables(generated: Path) -> dict[str, pa.Table]:
    """The generated tables with W1's columns, as the base load (``ts`` 0)."""
    read = {name: pq.read_table(generated / f"{name}.parquet") for name in TABLES}
    columns = {}
    for name, table in read.items():
        columns[name] = {column: _plain(table[column]) for column in TPCH_COLUMNS[name]}
    return {name: _with_upsert_columns(cols, ts=0) for name, cols in columns.items()}


def _plain(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """A generated column in the type its source declares: strings as plain strings,
    integers as BIGINT (DATE and DECIMAL columns are already theirs)."""
    if pa.types.is_string_view(column.type):
        return pc.cast(column, pa.string())
    if pa.types.is_integer(column.type):
        return pc.cast(column, pa.int64())
    return column


def _with_upsert_columns(columns: dict[str, object], *, ts: int, deleted: bool = False) -> pa.Table:
    table = pa.table(columns)
    n = table.num_rows
    table = table.append_column("ts", pa.array(np.full(n, ts, dtype=np.int64)))
    table = table.append_column("deleted", pa.array(np.full(n, deleted, dtype=bool)))
    return table.select(list(TPCH_SCHEMAS[_name_of(table)]))


def _name_of(table: pa.Table) -> str:
    first = table.column_names[0]
    return {"c_custkey": "customer", "o_orderkey": "orders", "l_orderkey": "lineitem"}[first]


def change_tables(
    base: dict[str, pa.Table], fraction: float, epoch: int, seed: int
) -> dict[str, pa.Table]:
    """One epoch's upserts: about ``fraction`` of each table's rows changed."""
    rng = np.random.default_rng([seed, epoch])
    out = {}
    for name, table in base.items():
        touched = max(4, round(table.num_rows * fraction))
        picked = rng.choice(table.num_rows, size=min(touched, table.num_rows), replace=False)
        half = len(picked) // 2
        updates = table.take(pa.array(picked[:half]))
        deletes = table.take(pa.array(picked[half : half + len(picked) // 4]))
        updates = _updated(name, updates, rng)
        parts = [_restamped(updates, epoch, False), _restamped(deletes, epoch, True)]
        out[name] = pa.concat_tables(parts)
    inserts = len(out["orders"]) // 3 or 1
    new_keys = NEW_KEY_BASE * epoch + np.arange(inserts, dtype=np.int64)
    customers = base["customer"]["c_custkey"].to_numpy()
    new_orders = {
        "o_orderkey": new_keys,
        "o_custkey": rng.choice(customers, size=inserts),
        "o_orderdate": _dates(rng.integers(8036, 10440, size=inserts)),  # 1992-01-01 .. 1998-08-02
        "o_shippriority": np.zeros(inserts, dtype=np.int64),
    }
    new_lines = {
        "l_orderkey": new_keys,
        "l_linenumber": np.ones(inserts, dtype=np.int64),
        "l_extendedprice": _hundredths(rng.integers(90_000, 10_000_000, size=inserts)),
        "l_discount": _hundredths(rng.integers(0, 11, size=inserts)),
        "l_shipdate": _dates(rng.integers(8036, 10440, size=inserts)),
    }
    out["orders"] = pa.concat_tables([out["orders"], _with_upsert_columns(new_orders, ts=epoch)])
    out["lineitem"] = pa.concat_tables([out["lineitem"], _with_upsert_columns(new_lines, ts=epoch)])
    return out


def _restamped(table: pa.Table, epoch: int, deleted: bool) -> pa.Table:
    n = table.num_rows
    table = table.set_column(
        table.column_names.index("ts"), "ts", pa.array(np.full(n, epoch, dtype=np.int64))
    )
    return table.set_column(
        table.column_names.index("deleted"), "deleted", pa.array(np.full(n, deleted, dtype=bool))
    )


def _updated(name: str, table: pa.Table, rng: np.random.Generator) -> pa.Table:
    """Change the columns the query reads, so updates move rows in and out of it."""
    n = table.num_rows

    def replace(column: str, values: object) -> None:
        nonlocal table
        array = values if isinstance(values, pa.Array) else pa.array(values)
        table = table.set_column(table.column_names.index(column), column, array)

    if name == "customer":
        replace("c_mktsegment", rng.choice(SEGMENTS, size=n).astype(str).tolist())
    elif name == "orders":
        shift = rng.integers(-60, 61, size=n)
        replace("o_orderdate", _dates(_day_numbers(table["o_orderdate"]) + shift))
    else:
        replace("l_discount", _hundredths(rng.integers(0, 11, size=n)))
        shift = rng.integers(-60, 61, size=n)
        replace("l_shipdate", _dates(_day_numbers(table["l_shipdate"]) + shift))
    return table
