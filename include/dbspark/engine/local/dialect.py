"""The local tier's dialect: the DuckDB frame functions and ``engine/local/compile.py``."""

from __future__ import annotations

from collections.abc import Sequence
from functools import reduce

import pyarrow as pa

from dbspark.core.types import (
    BIGINT,
    BOOLEAN,
    DATE,
    DOUBLE,
    STRING,
    TIMESTAMP,
    decimal_parts,
    element_type,
    is_array,
    is_decimal,
)
from dbspark.engine import user_aggregates
from dbspark.engine.dialect import Dialect
from dbspark.engine.local import frame as functions
from dbspark.engine.local.compile import compile_expr, compile_predicate, compile_projection
from dbspark.engine.local.frame import LocalFrame, col


def arrow_type(type_name: str) -> pa.DataType:
    """The Arrow type a column of ``type_name`` is stored as."""
    name = type_name.strip().lower()
    if is_array(name):
        return pa.list_(arrow_type(element_type(name)))
    if is_decimal(name):
        return pa.decimal128(*decimal_parts(name))
    types = {
        BIGINT: pa.int64(),
        "long": pa.int64(),
        "int": pa.int32(),
        "integer": pa.int32(),
        DOUBLE: pa.float64(),
        STRING: pa.string(),
        BOOLEAN: pa.bool_(),
        DATE: pa.date32(),
        TIMESTAMP: pa.timestamp("us", tz="UTC"),
        "null": pa.int64(),
    }
    return types[name]


def semi_join(
    frame: LocalFrame, keys: LocalFrame, key_cols: Sequence[str], *, broadcast: bool = False
) -> LocalFrame:
    """Rows of ``frame`` whose key (NULL-safe) equals some row of ``keys``."""
    condition = reduce(
        lambda a, b: a & b,
        [col(f"__data.{c}").eqNullSafe(col(f"__keys.{c}")) for c in key_cols],
    )
    return frame.alias("__data").join(keys.alias("__keys"), condition, "left_semi")


def evaluate_user_aggregates(
    grouped: LocalFrame, columns: Sequence[user_aggregates.UserAggregateColumn]
) -> LocalFrame:
    """``grouped`` with each gathered list replaced by its user function's result: the
    groups are collected, the functions applied here, and the rows become a frame again."""
    table = grouped.toArrow()
    apply = user_aggregates.applier(columns)
    gathered = {c.gathered for c in columns}
    kept = [name for name in table.column_names if name not in gathered]
    results = [apply(record) for record in table.to_pylist()]
    data = {name: table.column(name) for name in kept}
    for index, column in enumerate(columns):
        data[column.output] = pa.array(
            [row[index] for row in results], arrow_type(column.result_type)
        )
    return grouped.session.frame(pa.table(data))


LOCAL = Dialect(
    name="local",
    F=functions,
    Window=functions.Window,
    compile_expr=compile_expr,
    compile_predicate=compile_predicate,
    compile_projection=compile_projection,
    column_type=str,  # LocalColumn.cast takes dbspark's type names
    semi_join=semi_join,
    evaluate_user_aggregates=evaluate_user_aggregates,
)
