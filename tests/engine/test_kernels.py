"""The operator kernels give the same deltas on both tiers.

``engine/kernels.py`` is one definition of every operator's incremental rule, run on
Spark or on DuckDB in this process depending on the frames it is handed. Each test
feeds both tiers the same random trace (nested times, negative weights, NULL keys and
values, NaN) and compares the deltas as Z-sets. The Spark tier is itself checked
against the reference engine through the engine tests, so agreement here carries that
over to the local tier kernel by kernel.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dbspark.circuit.aggregations import avg, count, max_, min_, sum_, udf
from dbspark.circuit.expressions import col, if_else, lit, sequence
from dbspark.core.types import Schema
from dbspark.core.zset import ZSet
from dbspark.engine import kernels
from dbspark.engine.local.dialect import arrow_type
from dbspark.engine.local.frame import LocalSession
from dbspark.engine.local.tier import table_zset
from dbspark.engine.spark.compile import struct_type
from dbspark.engine.spark.frames import frame_to_zset

SCHEMA = Schema((("k", "bigint"), ("v", "double"), ("s", "string")))
RIGHT = Schema((("rk", "bigint"), ("x", "bigint")))
TIME2 = [("__epoch", "bigint"), ("__iter", "int")]
WEIGHT = [("__w", "bigint")]


@pytest.fixture(scope="module")
def local_session() -> Any:
    session = LocalSession()
    yield session
    session.close()


class Tiers:
    """Makes the same frame on both tiers and collects a result as a Z-set."""

    def __init__(self, spark: Any, session: LocalSession) -> None:
        self.spark = spark
        self.session = session

    def frames(
        self, rows: Sequence[tuple[Any, ...]], schema: Schema, extra: Sequence[tuple[str, str]]
    ) -> tuple[Any, Any]:
        spark = self.spark.createDataFrame(list(rows), struct_type(schema, extra))
        fields = [*schema.fields, *extra]
        columns = list(zip(*rows, strict=True)) if rows else [() for _ in fields]
        table = pa.table(
            {
                name: pa.array(list(values), arrow_type(kind))
                for (name, kind), values in zip(fields, columns, strict=True)
            }
        )
        return spark, self.session.frame(table)

    @staticmethod
    def zset(frame: Any, schema: Schema) -> ZSet:
        if hasattr(frame, "sparkSession"):
            return frame_to_zset(frame, schema)
        return table_zset(frame.toArrow(), schema)

    def same(self, kernel: Any, spark_args: tuple, local_args: tuple, out: Schema) -> ZSet:
        want = self.zset(kernel(*spark_args), out)
        got = self.zset(kernel(*local_args), out)
        assert got == want, f"local {got} != spark {want}"
        return want


@pytest.fixture
def tiers(spark: Any, local_session: LocalSession) -> Tiers:
    return Tiers(spark, local_session)


KEYS = st.one_of(st.none(), st.integers(0, 3))
VALUES = st.one_of(st.none(), st.sampled_from([0.0, -0.0, 1.5, -2.0, 7.25, float("nan")]))
TEXT = st.one_of(st.none(), st.sampled_from(["a", "b", "", "ß"]))
TIMES = st.tuples(st.integers(0, 2), st.integers(0, 2))
WEIGHTS = st.integers(-2, 3).filter(lambda w: w != 0)
TRACE = st.lists(st.tuples(KEYS, VALUES, TEXT, WEIGHTS, TIMES), max_size=25)
#: Histories whose accumulations never go negative (user-defined aggregates refuse those).
GROWING_TRACE = st.lists(st.tuples(KEYS, VALUES, TEXT, st.integers(1, 3), TIMES), max_size=25)
RIGHT_TRACE = st.lists(st.tuples(KEYS, st.integers(-5, 5), WEIGHTS, TIMES), max_size=20)


def _rows(trace: list[tuple]) -> list[tuple]:
    return [(*r[:-2], r[-2], *r[-1]) for r in trace]


PROPERTY = settings(
    max_examples=4,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@PROPERTY
@given(TRACE, TIMES)
def test_distinct_delta(tiers: Tiers, trace: list[tuple], t: tuple[int, int]) -> None:
    spark, local = tiers.frames(_rows(trace), SCHEMA, [*WEIGHT, *TIME2])
    names = list(SCHEMA.names)
    tiers.same(kernels.distinct_delta, (spark, names, t), (local, names, t), SCHEMA)


AGGREGATIONS = {
    "n": count(),
    "nv": count(col("v")),
    "total": sum_(col("v")),
    "mean": avg(col("v")),
    "low": min_(col("s")),
    "high": max_(col("v")),
    "texts": udf(lambda values: "|".join(map(str, values)), col("s"), "string"),
}


@functools.cache
def _aggregate_schema() -> Schema:
    from dbspark.circuit.builder import Circuit

    c = Circuit("kernels")
    source = c.zset_source("t", dict(SCHEMA.fields))
    return source.aggregate(by="k", **AGGREGATIONS).schema


@PROPERTY
@given(GROWING_TRACE, TIMES)
def test_aggregate_delta(tiers: Tiers, trace: list[tuple], t: tuple[int, int]) -> None:
    spark, local = tiers.frames(_rows(trace), SCHEMA, [*WEIGHT, *TIME2])
    out = _aggregate_schema()
    args = (SCHEMA, ["k"], AGGREGATIONS, out, t)
    tiers.same(kernels.aggregate_delta, (spark, *args), (local, *args), out)


#: A history whose accumulation is never negative at any time: each row is inserted,
#: and maybe partly retracted at a time at or after the insertion's on both coordinates.
POSITIVE_HISTORY = st.lists(
    st.tuples(
        KEYS,
        VALUES,
        TEXT,
        st.integers(1, 3),
        TIMES,
        st.one_of(st.none(), st.tuples(st.integers(0, 1), st.integers(0, 1), st.integers(1, 3))),
    ),
    max_size=25,
)


def _positive_rows(history: list[tuple]) -> list[tuple]:
    rows = []
    for k, v, s, w, (e, i), retraction in history:
        rows.append((k, v, s, w, e, i))
        if retraction is not None:
            later_e, later_i, r = retraction
            rows.append((k, v, s, -min(r, w), e + later_e, i + later_i))
    return rows


@settings(PROPERTY, max_examples=6)
@given(POSITIVE_HISTORY, TIMES)
def test_aggregate_delta_over_a_positive_input(
    tiers: Tiers, history: list[tuple], t: tuple[int, int]
) -> None:
    """Over an input with no negative weight at any time, the built-in aggregates
    computed from the rows as stored (``positive=True``: no consolidation of each row)
    equal the general rule's, on both tiers, grouped and global."""
    spark, local = tiers.frames(_positive_rows(history), SCHEMA, [*WEIGHT, *TIME2])
    builtin = {n: a for n, a in AGGREGATIONS.items() if a.kind != "udf"}
    grouped = Schema(tuple(f for f in _aggregate_schema().fields if f[0] != "texts"))
    every = Schema(tuple(f for f in grouped.fields if f[0] != "k"))
    for keys, out in ((["k"], grouped), ([], every)):
        args = (SCHEMA, keys, builtin, out, t)
        for frame in (spark, local):
            general = tiers.zset(kernels.aggregate_delta(frame, *args), out)
            rows_as_stored = kernels.aggregate_delta(frame, *args, positive=True)
            assert tiers.zset(rows_as_stored, out) == general, (keys, type(frame).__name__)


@PROPERTY
@given(TRACE, TIMES)
def test_global_aggregate_delta(tiers: Tiers, trace: list[tuple], t: tuple[int, int]) -> None:
    spark, local = tiers.frames(_rows(trace), SCHEMA, [*WEIGHT, *TIME2])
    aggregations = {"n": count(), "total": sum_(col("v"))}
    out = Schema((("n", "bigint"), ("total", "double")))
    args = (SCHEMA, [], aggregations, out, t)
    tiers.same(kernels.aggregate_delta, (spark, *args), (local, *args), out)


@PROPERTY
@given(TRACE, RIGHT_TRACE, TIMES)
def test_join_delta_nested(
    tiers: Tiers, left: list[tuple], right: list[tuple], t: tuple[int, int]
) -> None:
    lspark, llocal = tiers.frames(_rows(left), SCHEMA, [*WEIGHT, *TIME2])
    rspark, rlocal = tiers.frames(_rows(right), RIGHT, [*WEIGHT, *TIME2])
    out = Schema((*SCHEMA.fields, ("x", "bigint")))
    args = (["k"], ["rk"], list(SCHEMA.names), list(RIGHT.names), ["x"], list(out.names), t)
    tiers.same(kernels.join_delta_nested, (lspark, rspark, *args), (llocal, rlocal, *args), out)


@PROPERTY
@given(TRACE, RIGHT_TRACE, TRACE, RIGHT_TRACE)
def test_join_delta_root(
    tiers: Tiers, d_left: list[tuple], d_right: list[tuple], before_l: list, before_r: list
) -> None:
    def root(rows: list[tuple]) -> list[tuple]:
        return [(*r[:-2], r[-2]) for r in rows]

    dl = tiers.frames(root(d_left), SCHEMA, WEIGHT)
    dr = tiers.frames(root(d_right), RIGHT, WEIGHT)
    bl = tiers.frames(root(before_l), SCHEMA, WEIGHT)
    br = tiers.frames(root(before_r), RIGHT, WEIGHT)
    out = Schema((*SCHEMA.fields, ("x", "bigint")))
    args = (["k"], ["rk"], list(SCHEMA.names), ["x"], list(out.names))
    tiers.same(
        kernels.join_delta_root,
        (dl[0], dr[0], bl[0], br[0], *args),
        (dl[1], dr[1], bl[1], br[1], *args),
        out,
    )


@PROPERTY
@given(TRACE)
def test_linear_kernels(tiers: Tiers, trace: list[tuple]) -> None:
    rows = [(*r[:-2], r[-2]) for r in trace]
    spark, local = tiers.frames(rows, SCHEMA, WEIGHT)
    projected = Schema((("k", "bigint"), ("twice", "double"), ("label", "string")))
    columns = {"k": col("k"), "twice": col("v") * 2, "label": if_else(col("k") > 1, "hi", col("s"))}
    tiers.same(kernels.select, (spark, columns, SCHEMA), (local, columns, SCHEMA), projected)
    keep = (col("k") >= 1) | col("s").is_null()
    tiers.same(kernels.filter_, (spark, keep, SCHEMA), (local, keep, SCHEMA), SCHEMA)
    tiers.same(kernels.negate, (spark,), (local,), SCHEMA)
    tiers.same(kernels.minus, (spark, spark), (local, local), SCHEMA)
    expanded = Schema((*SCHEMA.fields, ("n", "bigint")))
    counts = sequence(lit(0), col("k"))
    tiers.same(
        kernels.flat_map, (spark, "n", counts, SCHEMA), (local, "n", counts, SCHEMA), expanded
    )
    tiers.same(
        kernels.consolidate, (spark, list(SCHEMA.names)), (local, list(SCHEMA.names)), SCHEMA
    )


@PROPERTY
@given(TRACE)
def test_general_linear(tiers: Tiers, trace: list[tuple]) -> None:
    rows = [(*r[:-2], r[-2]) for r in trace]
    spark, local = tiers.frames(rows, SCHEMA, WEIGHT)
    out = Schema((("k", "bigint"), ("s", "string"), ("__epoch", "bigint")))
    emits = [
        {
            "columns": {"k": col("k"), "s": col("s")},
            "weight": col("k"),
            "epoch": None,
            "when": None,
        },
        {
            "columns": {"k": col("k") + 10, "s": lit("later")},
            "weight": lit(1),
            "epoch": col("k") + 1,
            "when": col("v") > 0,
        },
    ]
    user = Schema((("k", "bigint"), ("s", "string")))
    args = (emits, SCHEMA, user, 1)
    tiers.same(kernels.general_linear, (spark, *args), (local, *args), out)


def test_equal_rows_from_several_parts_all_count(tiers: Tiers) -> None:
    """A row that two parts of a union both produce counts twice (``UNION ALL``)."""
    rows = [(1, 1.5, "a", 1), (1, 1.5, "a", 1), (2, None, None, 1)]
    spark, local = tiers.frames(rows, SCHEMA, WEIGHT)
    want = tiers.same(kernels.plus, (spark, spark), (local, local), SCHEMA)
    assert want.weight((1, 1.5, "a")) == 4
