"""Z-sets as Spark DataFrames: the conversions.

A Z-set in Spark is a DataFrame with the user's columns (in schema order) plus the
reserved columns of ``core/columns.py``: ``__w`` BIGINT, the row's weight (never zero
after consolidation), and when a frame carries times ``__epoch`` BIGINT and ``__iter``,
``__iter_2``, ... INT.

``zset_to_frame`` and ``frame_to_zset`` move small collections between the
driver and Spark (tests, inputs handed over in Python, results for checking);
everything else stays in Spark.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Mapping, Sequence
from decimal import Decimal
from functools import reduce
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from dbspark.core.columns import WEIGHT, WEIGHT_TYPE, time_fields
from dbspark.core.types import DATE, DOUBLE, TIMESTAMP, Schema, element_type, is_array, is_decimal
from dbspark.core.zset import ZSet
from dbspark.engine.spark.compile import struct_type
from dbspark.engine.values import from_column_value as from_spark_value
from dbspark.engine.values import to_column_value as to_spark_value


def zset_to_frame(
    spark: SparkSession,
    zset: ZSet | Iterable[tuple[Sequence[Any], int]],
    schema: Schema,
    time: Sequence[int] | None = None,
) -> DataFrame:
    """A DataFrame of ``zset`` (or ``(row, weight)`` pairs): user columns, ``__w``, and the
    time columns when ``time`` is given (``(epoch,)``, ``(epoch, iteration)``, ...)."""
    pairs = zset.items() if isinstance(zset, ZSet) else zset
    extra: list[tuple[str, str]] = [(WEIGHT, WEIGHT_TYPE)]
    coordinates: tuple[int, ...] = ()
    if time is not None:
        coordinates = tuple(int(t) for t in time)
        extra += time_fields(len(coordinates))
    types = schema.types
    data = [
        (*(to_spark_value(v, t) for v, t in zip(row, types, strict=True)), int(w), *coordinates)
        for row, w in pairs
    ]
    return spark.createDataFrame(data, struct_type(schema, extra))


def frame_to_zset(df: DataFrame, schema: Schema) -> ZSet:
    """Collect a Z-set frame: rows as tuples in schema order, weights summed (``__w``; a frame
    without it counts each row once). Time columns are ignored: every time is summed."""
    names = list(schema.names)
    has_weight = WEIGHT in df.columns
    selected = df.select(*names, *([WEIGHT] if has_weight else []))
    types = schema.types
    pairs = []
    for record in selected.collect():
        values = tuple(from_spark_value(record[i], t) for i, t in enumerate(types))
        pairs.append((values, int(record[len(names)]) if has_weight else 1))
    return ZSet(pairs)


def collect_zsets(parts: Mapping[str, tuple[DataFrame, Schema]]) -> dict[str, ZSet]:
    """Collect several Z-set frames (name -> (frame, schema)) with one Spark job.

    Each row travels as JSON text (NULL fields kept), so frames of different schemas
    share one ``union``; values are converted back per the schema's types.
    """
    if not parts:
        return {}
    shipped = []
    for name, (frame, schema) in parts.items():
        fields = [F.col(n).alias(f"c{i}") for i, n in enumerate(schema.names)]
        shipped.append(
            frame.select(
                F.lit(name).alias("__name"),
                F.to_json(F.struct(*fields), _JSON_OPTIONS).alias("__row"),
                F.col(WEIGHT).cast(WEIGHT_TYPE).alias(WEIGHT),
            )
        )
    pairs: dict[str, list[tuple[tuple, int]]] = {name: [] for name in parts}
    for record in reduce(DataFrame.unionByName, shipped).collect():
        schema = parts[record["__name"]][1]
        # Decimals travel as JSON numbers: read them exactly.
        values = json.loads(record["__row"], parse_float=Decimal)
        row = tuple(_from_json(values[f"c{i}"], t) for i, t in enumerate(schema.types))
        pairs[record["__name"]].append((row, int(record[WEIGHT])))
    return {name: ZSet(items) for name, items in pairs.items()}


_JSON_OPTIONS = {
    "ignoreNullFields": "false",
    "timestampFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX",  # the default keeps milliseconds
}


def _from_json(value: Any, type_name: str) -> Any:
    if value is None:
        return None
    if type_name == DOUBLE:
        return from_spark_value(float(value), DOUBLE)
    if type_name == DATE:
        return dt.date.fromisoformat(value)
    if type_name == TIMESTAMP:
        return dt.datetime.fromisoformat(value).astimezone(dt.UTC)
    if is_decimal(type_name):
        return Decimal(value)
    if is_array(type_name):
        inner = element_type(type_name)
        return tuple(_from_json(v, inner) for v in value)
    return value


def empty_frame(
    spark: SparkSession, schema: Schema, extra: Iterable[tuple[str, str]] = ((WEIGHT, WEIGHT_TYPE),)
) -> DataFrame:
    return spark.createDataFrame([], struct_type(schema, extra))
