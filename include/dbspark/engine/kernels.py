"""The kernels of every operator family, once for both tiers: frames in, delta frames out.

A collection travels as a frame of the user's columns plus ``__w`` (the weight);
traces also carry their time columns (``__epoch``, ``__iter``, ...). These functions
know nothing about storage; the executor feeds them the deltas and the (key-pruned)
trace rows they need. They are written in PySpark's vocabulary and run on whichever
tier made the frames they are given: ``dialect_of`` supplies the functions and the
expression compiler (PySpark on the Spark tier, DuckDB in this process on the local
tier; see ``engine/dialect.py``).

Incremental rules, the same as the reference engine's:

* **linear** (select, filter, flat_map, negate, plus, minus, upsert_live):
  apply to the delta. Spark fuses a chain of them into one projection because
  the executor composes them lazily on one DataFrame.
* **general linear** (``join_function``): each emit is a projection whose
  weight multiplies and whose epoch is joined (``greatest``) with the input
  time; rows for a later epoch are returned separately, to be scheduled.
* **stateful** (distinct, aggregate, join): for the keys that can change at
  time ``t``, the output is the finite difference over the corners of the unit
  box below ``t`` of ``f(inputs accumulated at the corner)``. Each corner's
  accumulation is one conditional sum, so all corners come out of a single
  ``groupBy``. At the root clock a join uses the cheaper bilinear rule
  ``dA ⋈ B_before + A_now ⋈ dB`` instead.
* **upsert ingest** (``core/upsert.py``'s rule, set-based): only the batch's keys can
  change; per key the freshest row wins, and the delta is ``-stored +winner`` where the
  winner is fresher. Bad input (NULL keys, ties) is found first, by one query.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import reduce
from types import ModuleType
from typing import Any

from dbspark.circuit.aggregations import Aggregation
from dbspark.circuit.expressions import Expr, infer_type, output_type
from dbspark.core.columns import EPOCH, TOMBSTONE, WEIGHT, time_columns
from dbspark.core.timestamps import Time, box_corners
from dbspark.core.types import STRING, Schema
from dbspark.core.upsert import OFFSET_TIME, ZERO_OFFSET, UpsertSpec
from dbspark.engine import user_aggregates
from dbspark.engine.dialect import Dialect, dialect_of

#: A frame of either tier (a PySpark ``DataFrame`` or a ``LocalFrame``), and a column.
DataFrame = Any
Column = Any


def consolidate(df: DataFrame, columns: Sequence[str]) -> DataFrame:
    """Group by ``columns``, sum ``__w``, drop zero weights (``columns`` + ``__w`` remain)."""
    F = dialect_of(df).F
    return (
        df.groupBy(*columns)
        .agg(F.sum(WEIGHT).cast("bigint").alias(WEIGHT))
        .where(F.col(WEIGHT) != 0)
    )


# --- linear --------------------------------------------------------------------------------
def select(df: DataFrame, columns: dict[str, Expr], schema: Schema) -> DataFrame:
    d = dialect_of(df)
    F = d.F
    return df.select(*d.compile_projection(columns, schema), F.col(WEIGHT))


def filter_(df: DataFrame, predicate: Expr, schema: Schema) -> DataFrame:
    d = dialect_of(df)
    return df.where(d.compile_predicate(predicate, schema))


def flat_map(df: DataFrame, name: str, array: Expr, schema: Schema) -> DataFrame:
    d = dialect_of(df)
    F = d.F
    element = F.explode(d.compile_expr(array, schema)).alias(name)
    return df.select(*[F.col(c) for c in schema.names], element, F.col(WEIGHT))


def negate(df: DataFrame) -> DataFrame:
    d = dialect_of(df)
    F = d.F
    return df.withColumn(WEIGHT, -F.col(WEIGHT))


def plus(a: DataFrame, b: DataFrame) -> DataFrame:
    return a.unionByName(b)


def minus(a: DataFrame, b: DataFrame) -> DataFrame:
    return a.unionByName(negate(b))


def upsert_live(df: DataFrame) -> DataFrame:
    d = dialect_of(df)
    F = d.F
    return df.where(~F.col(TOMBSTONE)).drop(TOMBSTONE)


def general_linear(
    df: DataFrame, emits: Sequence[dict[str, Any]], schema: Schema, out_schema: Schema, epoch: int
) -> DataFrame:
    """All emits of a ``join_function``, with an ``__epoch`` column: the epoch each row is due."""
    d = dialect_of(df)
    F = d.F
    parts = []
    for item in emits:
        part = df
        if item["when"] is not None:
            part = part.where(d.compile_predicate(item["when"], schema))
        factor = d.compile_expr(item["weight"], schema)
        if item["epoch"] is None:
            due = F.lit(epoch).cast("bigint")
        else:
            emitted = d.compile_expr(item["epoch"], schema)
            part = part.where(emitted.isNotNull())
            due = F.greatest(F.lit(epoch).cast("bigint"), emitted.cast("bigint"))
        projected = [
            c.cast(d.column_type(t)).alias(name)
            for c, (name, t) in zip(
                d.compile_projection(item["columns"], schema), out_schema.fields, strict=True
            )
        ]
        weight = (F.col(WEIGHT) * factor).cast("bigint")
        part = part.where(factor.isNotNull() & (factor != 0))
        parts.append(part.select(*projected, weight.alias(WEIGHT), due.alias(EPOCH)))
    combined = reduce(plus, parts)
    return consolidate(combined, [*out_schema.names, EPOCH])


# --- the unit box below a time -------------------------------------------------------------
def at_or_before(F: ModuleType, t: Time) -> Column:
    """Rows of a trace whose time is at or before ``t`` in the product order."""
    names = time_columns(len(t))
    return reduce(lambda a, b: a & b, [F.col(n) <= v for n, v in zip(names, t, strict=True)])


def _weight_at(F: ModuleType, corner: Time) -> Column:
    """A row's weight counted at ``corner``: its ``__w`` if it lies at or before, else 0."""
    return F.when(at_or_before(F, corner), F.col(WEIGHT)).otherwise(F.lit(0))


def _accumulated(F: ModuleType, corner: Time) -> Column:
    return F.sum(_weight_at(F, corner)).cast("bigint")


def candidates(trace: DataFrame, key_columns: Sequence[str], t: Time) -> DataFrame:
    """Keys that may have output at ``t``: for each coordinate, an update at or before ``t``
    lying exactly on ``t``'s value of that coordinate."""
    d = dialect_of(trace)
    F = d.F
    names = time_columns(len(t))
    rows = trace.where(at_or_before(F, t))
    flags = [
        F.max(F.when(F.col(n) == v, F.lit(1)).otherwise(F.lit(0))).alias(f"__on{axis}")
        for axis, (n, v) in enumerate(zip(names, t, strict=True))
    ]
    grouped = rows.groupBy(*key_columns).agg(*flags)
    condition = reduce(lambda a, b: a & b, [F.col(f"__on{axis}") == 1 for axis in range(len(t))])
    return grouped.where(condition).select(*key_columns)


# --- distinct -----------------------------------------------------------------------------------
def distinct_delta(trace: DataFrame, columns: Sequence[str], t: Time) -> DataFrame:
    """The change of ``distinct`` at ``t`` for the rows present in ``trace`` (already pruned)."""
    d = dialect_of(trace)
    F = d.F
    box = box_corners(t)
    keys = candidates(trace, columns, t)
    per_row = (
        d.semi_join(trace, keys, columns)
        .groupBy(*columns)
        .agg(*[_accumulated(F, c).alias(f"__acc{i}") for i, (_, c) in enumerate(box)])
    )
    weight = reduce(
        lambda a, b: a + b,
        [
            F.when(F.col(f"__acc{i}") > 0, F.lit(sign)).otherwise(F.lit(0))
            for i, (sign, _) in enumerate(box)
        ],
    )
    return per_row.select(*columns, weight.cast("bigint").alias(WEIGHT)).where(F.col(WEIGHT) != 0)


# --- aggregate ----------------------------------------------------------------------------------
def aggregate_delta(
    trace: DataFrame,
    schema: Schema,
    keys: Sequence[str],
    aggregations: dict[str, Aggregation],
    out_schema: Schema,
    t: Time,
    *,
    touched_only: bool = False,
    positive: bool = False,
) -> DataFrame:
    """The change of the per-group aggregates at ``t``, for the groups present in ``trace``
    (already pruned to the touched keys). User-defined aggregates are evaluated on the
    driver for those groups only (``user_aggregates``). ``touched_only`` says every
    group in ``trace`` may change at ``t`` (a root-clock read of exactly the touched
    keys): the groups are not looked for again. Either way the answer is the same, since
    a group with no update at ``t`` has the same value at every corner. ``positive``
    says the input collection has no negative weight at any time (the planner's
    ``positive_nodes``), which lets the built-in aggregates skip consolidating every row
    (``_grouped_over_positive``)."""
    d = dialect_of(trace)
    F = d.F
    box = box_corners(t)
    group_keys = candidates(trace, keys, t) if keys and not touched_only else None
    rows = trace if group_keys is None else d.semi_join(trace, group_keys, keys)
    if not keys:
        rows = rows.where(F.lit(True))
    if positive and all(a.kind != "udf" for a in aggregations.values()):
        grouped = _grouped_over_positive(d, rows, schema, keys, aggregations, out_schema, box)
        return _changes_at_corners(d, grouped, keys, aggregations, out_schema, box)
    per_row = rows.groupBy(*schema.names).agg(
        *[_accumulated(F, c).alias(f"__acc{i}") for i, (_, c) in enumerate(box)]
    )
    per_corner_aggs = []
    finished: dict[str, Column] = {}  # a corner's value computed from plain aggregates
    intermediate: set[str] = set()  # the plain aggregates those are computed from
    user_columns = []
    for i, _ in enumerate(box):
        acc = F.col(f"__acc{i}")
        per_corner_aggs.append(
            F.max(F.when(acc != 0, F.lit(1)).otherwise(F.lit(0))).alias(f"__present{i}")
        )
        for name, aggregation in aggregations.items():
            if aggregation.kind == "udf":
                column = _user_aggregate(aggregation, schema, out_schema, name, i)
                user_columns.append(column)
                value = d.compile_expr(aggregation.expr, schema)
                per_corner_aggs.append(user_aggregates.gather(F, value, acc).alias(column.gathered))
                continue
            out_type = d.column_type(out_schema.type_of(name))
            parts, finish = _aggregate_column(d, aggregation, schema, acc, out_type, f"{name}__{i}")
            per_corner_aggs.extend(column.alias(part) for part, column in parts.items())
            if finish is not None:
                finished[f"{name}__{i}"] = finish
                intermediate.update(parts)
    grouped = (
        per_row.groupBy(*keys).agg(*per_corner_aggs) if keys else per_row.agg(*per_corner_aggs)
    )
    if finished:
        # Plain aggregates first, then what is computed from them: an engine that
        # groups only plain aggregates (the local tier in Arrow) takes the grouping.
        kept = [c for c in grouped.columns if c not in intermediate]
        grouped = grouped.select(*kept, *(v.alias(n) for n, v in finished.items()))
    if user_columns:
        # Read the trace once: the driver collects the touched groups, and the rest of the
        # kernel runs on the collected rows with the functions' results.
        grouped = d.evaluate_user_aggregates(grouped, user_columns)
    return _changes_at_corners(d, grouped, keys, aggregations, out_schema, box)


def _changes_at_corners(
    d: Dialect,
    grouped: DataFrame,
    keys: Sequence[str],
    aggregations: dict[str, Aggregation],
    out_schema: Schema,
    box: list[tuple[int, Time]],
) -> DataFrame:
    """The output change from one row per group holding, per corner ``i``, whether the
    group is present (``__present{i}``, 1 or 0) and each aggregate's value
    (``{name}__{i}``): the present corners' rows, signed, consolidated."""
    F = d.F
    # One row per group and corner, from a single pass over ``grouped``: a union of one
    # select per corner would group the touched rows once per corner on an engine that
    # does not share common subplans (DuckDB).
    corner = F.col("__corner")
    corners = grouped.select(
        "*", F.explode(F.array(*[F.lit(i) for i in range(len(box))])).alias("__corner")
    )

    def at_corner(column_of: Callable[[int], Column]) -> Column:
        case = F.when(corner == 0, column_of(0))
        for i in range(1, len(box)):
            case = case.when(corner == i, column_of(i))
        return case

    values = [
        at_corner(lambda i, name=name: F.col(f"{name}__{i}"))
        .cast(d.column_type(out_schema.type_of(name)))
        .alias(name)
        for name in aggregations
    ]
    sign = at_corner(lambda i: F.lit(box[i][0])).cast("bigint").alias(WEIGHT)
    present = at_corner(lambda i: F.col(f"__present{i}")) == 1
    changed = corners.where(present).select(*[F.col(k) for k in keys], *values, sign)
    return consolidate(changed, out_schema.names)


def _grouped_over_positive(
    d: Dialect,
    rows: DataFrame,
    schema: Schema,
    keys: Sequence[str],
    aggregations: dict[str, Aggregation],
    out_schema: Schema,
    box: list[tuple[int, Time]],
) -> DataFrame:
    """``_changes_at_corners``'s input for built-in aggregates over a positive input.

    Every row of the input then has a net weight of zero or more at each corner, so a
    count, a sum or an average (and whether a group or a value is present: its weights
    sum to more than zero) is a plain sum of weighted values over the trace's rows as
    they are stored, with no need to consolidate each row first. Only ``min`` and
    ``max`` need a value's net weight: the rows are grouped by the group columns and
    those values, not by every column. Each corner's weight and each aggregated value
    is computed once per row, as a column."""
    F = d.F
    values = {
        name: d.compile_expr(a.expr, schema).alias(f"__v_{name}")
        for name, a in aggregations.items()
        if a.expr is not None
    }
    weights = [_weight_at(F, corner).cast("bigint") for _, corner in box]
    prepared = rows.select(
        *keys, *values.values(), *[w.alias(f"__w{i}") for i, w in enumerate(weights)]
    )
    extremes = [n for n, a in aggregations.items() if a.kind in ("min", "max")]
    by = [*keys, *dict.fromkeys(f"__v_{n}" for n in extremes)]
    first, types = _weighted_sums(d, aggregations, out_schema, len(box))
    per_value = prepared.groupBy(*by).agg(*first) if by else prepared.agg(*first)
    if not extremes:
        totals = per_value
    else:  # then per group
        sums = [
            (F.sum(c) if types[c] is None else F.sum(c).cast(types[c])).alias(c)
            for c in per_value.columns
            if c not in by
        ]
        for name in extremes:
            pick = F.min if aggregations[name].kind == "min" else F.max
            for i in range(len(box)):
                kept = F.when(F.col(f"__a{i}") > 0, F.col(f"__v_{name}"))
                sums.append(pick(kept).alias(f"{name}__{i}"))
        totals = per_value.groupBy(*keys).agg(*sums) if keys else per_value.agg(*sums)
    return totals.select(*keys, *_corner_values(d, aggregations, out_schema, len(box)))


def _weighted_sums(
    d: Dialect, aggregations: dict[str, Aggregation], out_schema: Schema, corners: int
) -> tuple[list[Column], dict[str, Any]]:
    """``_grouped_over_positive``'s plain sums per corner ``i``: the weight (``__a{i}``),
    and per aggregated value its weight where not NULL (``{name}__n{i}``) and, for a sum
    or an average, its weighted total (``{name}__t{i}``); with each column's type when
    summed again per group (None: as the sum gives it)."""
    F = d.F
    types: dict[str, Any] = {}
    first = []
    for i in range(corners):
        w = F.col(f"__w{i}")
        first.append(F.sum(w).cast("bigint").alias(f"__a{i}"))
        types[f"__a{i}"] = "bigint"
        for name, aggregation in aggregations.items():
            if aggregation.kind in ("min", "max") or aggregation.expr is None:
                continue  # extremes come from the grouped values; count() is __a
            value = F.col(f"__v_{name}")
            counted = F.when(value.isNotNull(), w).otherwise(F.lit(0))
            first.append(F.sum(counted).cast("bigint").alias(f"{name}__n{i}"))
            types[f"{name}__n{i}"] = "bigint"
            if aggregation.kind in ("sum", "avg"):
                total = F.sum(F.when(value.isNotNull(), value * w))
                types[f"{name}__t{i}"] = None
                if aggregation.kind == "sum":  # as the value is finally cast (an exact
                    # integer sum in Arrow is one cast to bigint)
                    types[f"{name}__t{i}"] = d.column_type(out_schema.type_of(name))
                    total = total.cast(types[f"{name}__t{i}"])
                first.append(total.alias(f"{name}__t{i}"))
    return first, types


def _corner_values(
    d: Dialect, aggregations: dict[str, Aggregation], out_schema: Schema, corners: int
) -> list[Column]:
    """Per corner, whether the group is present and each aggregate's value, from the
    sums of ``_weighted_sums`` (and the extremes) in the columns ``_changes_at_corners``
    reads."""
    F = d.F
    finished = []
    for i in range(corners):
        finished.append(
            F.when(F.col(f"__a{i}") > 0, F.lit(1)).otherwise(F.lit(0)).alias(f"__present{i}")
        )
        for name, aggregation in aggregations.items():
            out_type = d.column_type(out_schema.type_of(name))
            present = F.col(f"{name}__n{i}") > 0
            if aggregation.kind in ("min", "max"):
                value = F.col(f"{name}__{i}")
            elif aggregation.expr is None:  # count()
                value = F.col(f"__a{i}").cast(out_type)
            elif aggregation.kind == "count":
                value = F.col(f"{name}__n{i}").cast(out_type)
            elif aggregation.kind == "sum":
                value = F.when(present, F.col(f"{name}__t{i}").cast(out_type))
            elif aggregation.kind == "avg":
                total = F.col(f"{name}__t{i}").cast("double")
                value = F.when(present, total / F.col(f"{name}__n{i}").cast("double"))
            else:
                raise AssertionError(f"aggregate {aggregation.kind} has no native kernel")
            finished.append(value.alias(f"{name}__{i}"))
    return finished


def _user_aggregate(
    aggregation: Aggregation, schema: Schema, out_schema: Schema, name: str, corner: int
) -> user_aggregates.UserAggregateColumn:
    assert aggregation.function is not None and aggregation.expr is not None
    return user_aggregates.UserAggregateColumn(
        gathered=f"__udf_{name}__{corner}",
        output=f"{name}__{corner}",
        function=aggregation.function,
        value_type=output_type(infer_type(aggregation.expr, schema, f"aggregate {name}")),
        result_type=out_schema.type_of(name),
        name=name,
    )


def _aggregate_column(
    d: Dialect, aggregation: Aggregation, schema: Schema, acc: Column, out_type: Any, name: str
) -> tuple[dict[str, Column], Column | None]:
    """One corner's aggregate: the plain aggregates to group, by the names they take
    (``name`` itself, or ``name__...`` when the value is computed from several), and
    that computation, if any."""
    F = d.F
    if aggregation.expr is None:
        return {name: F.sum(acc).cast(out_type)}, None
    value = d.compile_expr(aggregation.expr, schema)
    counted = F.when(value.isNotNull(), acc).otherwise(F.lit(0))
    kind = aggregation.kind
    if kind == "count":
        return {name: F.sum(counted).cast(out_type)}, None
    if kind == "sum":
        # NULL when no value is present at this corner; the cast is the one every corner's
        # value gets, so casting the sum before picking it changes nothing.
        total = F.sum(F.when(value.isNotNull(), value * acc)).cast(out_type)
        present = F.sum(F.when(value.isNotNull() & (acc != 0), F.lit(1)).otherwise(F.lit(0)))
        parts = {f"{name}__total": total, f"{name}__present": present.cast("bigint")}
        return parts, F.when(F.col(f"{name}__present") > 0, F.col(f"{name}__total"))
    if kind == "avg":
        total = F.sum(F.when(value.isNotNull(), value * acc))
        present = F.sum(F.when(value.isNotNull() & (acc != 0), F.lit(1)).otherwise(F.lit(0))) > 0
        count = F.sum(counted)
        average = total.cast("double") / count.cast("double")
        return {name: F.when(present & (count != 0), average)}, None
    if kind == "min":
        return {name: F.min(F.when(acc > 0, value))}, None
    if kind == "max":
        return {name: F.max(F.when(acc > 0, value))}, None
    raise AssertionError(f"aggregate {kind} has no native Spark kernel")


# --- join ---------------------------------------------------------------------------------------
def _join_output(
    left: DataFrame,
    right: DataFrame,
    left_keys: Sequence[str],
    right_keys: Sequence[str],
    left_columns: Sequence[str],
    right_values: Sequence[str],
    weight: Column,
    extra: Sequence[str] = (),
) -> DataFrame:
    d = dialect_of(left)
    F = d.F
    lhs = left.select(*[F.col(c).alias(f"__l_{c}") for c in [*left_columns, WEIGHT, *extra]])
    rhs = right.select(
        *[
            F.col(c).alias(f"__r_{c}")
            for c in dict.fromkeys([*right_keys, *right_values, WEIGHT, *extra])
        ]
    )
    condition = reduce(
        lambda a, b: a & b,
        [
            F.col(f"__l_{lk}") == F.col(f"__r_{rk}")
            for lk, rk in zip(left_keys, right_keys, strict=True)
        ]
        + [F.col(f"__l_{e}") == F.col(f"__r_{e}") for e in extra],
    )
    joined = lhs.join(rhs, on=condition, how="inner")
    return joined.select(
        *[F.col(f"__l_{c}").alias(c) for c in left_columns],
        *[F.col(f"__r_{c}").alias(c) for c in right_values],
        weight.alias(WEIGHT),
        *[F.col(f"__l_{e}").alias(e) for e in extra],
    )


def join_delta_root(
    d_left: DataFrame,
    d_right: DataFrame,
    left_before: DataFrame,
    right_before: DataFrame,
    left_keys: Sequence[str],
    right_keys: Sequence[str],
    left_columns: Sequence[str],
    right_values: Sequence[str],
    out_columns: Sequence[str],
) -> DataFrame:
    """``dA ⋈ B_before + A_before ⋈ dB + dA ⋈ dB`` (root clock: times are totally ordered)."""
    d = dialect_of(d_left)
    F = d.F
    weight = (F.col(f"__l_{WEIGHT}") * F.col(f"__r_{WEIGHT}")).cast("bigint")
    args = (left_keys, right_keys, left_columns, right_values, weight)
    parts = [
        _join_output(d_left, right_before, *args),
        _join_output(left_before, d_right, *args),
        _join_output(d_left, d_right, *args),
    ]
    return consolidate(reduce(plus, parts), out_columns)


def join_delta_nested(
    left_trace: DataFrame,
    right_trace: DataFrame,
    left_keys: Sequence[str],
    right_keys: Sequence[str],
    left_columns: Sequence[str],
    right_columns: Sequence[str],
    right_values: Sequence[str],
    out_columns: Sequence[str],
    t: Time,
) -> DataFrame:
    """The corner formula for a join at a nested time: sum over corners of A_c ⋈ B_c."""
    d = dialect_of(left_trace)
    F = d.F
    box = box_corners(t)
    # A key is a candidate when its updates on EITHER side, together, lie on every
    # coordinate of t: one side may hold the epoch's change, the other the iteration's.
    names = time_columns(len(t))
    both = left_trace.select(*left_keys, *names).unionByName(
        right_trace.select(
            *[F.col(rk).alias(lk) for lk, rk in zip(left_keys, right_keys, strict=True)], *names
        )
    )
    keys = candidates(both, left_keys, t)

    def per_corner(
        trace: DataFrame, trace_keys: Sequence[str], columns: Sequence[str]
    ) -> DataFrame:
        key_frame = keys.select(
            *[F.col(lk).alias(k) for lk, k in zip(left_keys, trace_keys, strict=True)]
        )
        rows = d.semi_join(trace, key_frame, trace_keys)
        accumulated = rows.groupBy(*columns).agg(
            *[_accumulated(F, c).alias(f"__acc{i}") for i, (_, c) in enumerate(box)]
        )
        stacked = F.explode(
            F.array(
                *[
                    F.struct(F.lit(i).alias("__corner"), F.col(f"__acc{i}").alias(WEIGHT))
                    for i in range(len(box))
                ]
            )
        ).alias("__c")
        return (
            accumulated.select(*columns, stacked)
            .select(*columns, "__c.__corner", f"__c.{WEIGHT}")
            .where(F.col(WEIGHT) != 0)
        )

    signs = F.array(*[F.lit(sign) for sign, _ in box])
    left = per_corner(left_trace, left_keys, left_columns)
    right = per_corner(right_trace, right_keys, right_columns)
    weight = (
        F.col(f"__l_{WEIGHT}")
        * F.col(f"__r_{WEIGHT}")
        * F.element_at(signs, F.col("__l___corner") + 1)
    ).cast("bigint")
    joined = _join_output(
        left, right, left_keys, right_keys, left_columns, right_values, weight, extra=["__corner"]
    ).drop("__corner")
    return consolidate(joined, out_columns)


# --- upsert ingest -------------------------------------------------------------------------
# The rule is ``core/upsert.py``'s; only the batch's keys can change, so ``stored`` holds the
# state trace's rows of those keys alone (a key-pruned read).

#: What is wrong with a key of an upsert batch, by code (the smallest is reported first).
UPSERT_PROBLEMS = (
    "NULL in a key column",
    "a STRING watermark holding a time with a UTC offset other than zero",
    "two different rows with the same watermark in one batch",
    "a different row with the same watermark as the stored version",
)


def upsert_current(stored: DataFrame, state_columns: Sequence[str]) -> DataFrame:
    """Each key's current state row: the stored rows (time columns and unconsolidated
    weights) accumulated, kept where the total is one."""
    F = dialect_of(stored).F
    current = consolidate(stored, list(state_columns))
    return current.where(F.col(WEIGHT) == 1).drop(WEIGHT)


def upsert_problems(
    spec: UpsertSpec, batch: DataFrame, current: DataFrame, *, within_batch: bool = True
) -> DataFrame:
    """The keys of ``batch`` that make it bad input, each with a ``__problem`` code
    (``UPSERT_PROBLEMS``); no rows when the batch is good. ``within_batch=False`` says
    the batch's own NULL keys and ties were looked for already (a file batch, when its
    files were read): only the watermarks' forms and the clashes with the stored
    versions are looked for."""
    F = dialect_of(batch).F
    cols, keys, marks = list(spec.columns), list(spec.key), list(spec.watermark)
    null_keys = batch.where(reduce(lambda a, b: a | b, [F.col(k).isNull() for k in keys]))
    # A regex over NULL is NULL, which no ``where`` keeps.
    texts = [m for m in marks if spec.types[spec.columns.index(m)] == STRING]
    offset_marks = [
        F.col(m).rlike(f"^{OFFSET_TIME}\\z") & ~F.col(m).rlike(f"{ZERO_OFFSET}\\z") for m in texts
    ]
    ties = _ties(F, spec, batch)
    s = _prefixed(current)
    same_mark = reduce(lambda a, b: a & b, [F.col(m).eqNullSafe(F.col(f"__s_{m}")) for m in marks])
    same_row = reduce(lambda a, b: a & b, [F.col(c).eqNullSafe(F.col(f"__s_{c}")) for c in cols])
    clash = batch.join(s, _on_key(F, keys), "inner").where(same_mark & ~same_row)
    problems = clash.select(*keys, F.lit(3).alias("__problem"))
    if within_batch:
        problems = problems.unionByName(null_keys.select(*keys, F.lit(0).alias("__problem")))
        problems = problems.unionByName(ties.select(*keys, F.lit(2).alias("__problem")))
    if offset_marks:
        offsets = batch.where(reduce(lambda a, b: a | b, offset_marks))
        problems = problems.unionByName(offsets.select(*keys, F.lit(1).alias("__problem")))
    return problems.distinct()


def _ties(F: ModuleType, spec: UpsertSpec, rows: DataFrame, *within: str) -> DataFrame:
    """The keys (and ``within`` columns) of ``rows`` holding two different rows at an
    equal watermark: which row wins would be arbitrary."""
    keys, marks = list(spec.key), list(spec.watermark)
    groups = [*keys, *(m for m in marks if m not in keys), *within]
    return (
        rows.select(*spec.columns, *within)
        .distinct()
        .groupBy(*groups)
        .agg(F.count(F.lit(1)).alias("__n"))
        .where(F.col("__n") > 1)
        .select(*keys, *within)
    )


def upsert_log_conflicts(spec: UpsertSpec, log: DataFrame, epoch: str) -> DataFrame:
    """The keys and epochs where a source's log of upsert batches (``log``: every epoch's
    batch, its epoch in column ``epoch``) holds what ``upsert_problems`` rejects batch by
    batch: two different rows for one key at an equal watermark in one epoch, or a row
    whose watermark equals that of the version stored before its epoch (the greatest
    watermark of the earlier epochs) while the row differs from it. Full refresh checks
    the whole log with it at once (Spark only: a window over each key's epochs)."""
    d = dialect_of(log)
    F = d.F
    keys, names = list(spec.key), list(spec.columns)
    within = _ties(F, spec, log, epoch)
    distinct = log.select(*names, epoch).distinct().withColumn("__wm", _watermark_order(F, spec))
    earlier = (
        d.Window.partitionBy(*keys).orderBy(epoch).rangeBetween(d.Window.unboundedPreceding, -1)
    )
    row = F.struct(*names)
    stored = (
        distinct.withColumn("__stored_wm", F.max("__wm").over(earlier))
        .withColumn("__stored", F.max_by(row, "__wm").over(earlier))
        .where((F.col("__wm") == F.col("__stored_wm")) & ~row.eqNullSafe(F.col("__stored")))
        .select(*keys, epoch)
    )
    return within.unionByName(stored).distinct()


def _watermark_order(F: ModuleType, spec: UpsertSpec) -> Column:
    """The watermark as one sortable value (a struct of, per watermark column, whether
    it is present and its value): NULL below any value, compared left to right."""
    parts = []
    for index, name in enumerate(spec.watermark):
        parts.append(F.col(name).isNotNull().alias(f"p{index}"))
        parts.append(F.col(name).alias(f"v{index}"))
    return F.struct(*parts)


def upsert_winners(spec: UpsertSpec, rows: DataFrame, *tiebreak: Column) -> DataFrame:
    """Per key the freshest of ``rows``: the greatest watermark (compared left to right,
    NULL smallest), then the first by ``tiebreak`` (full refresh: the later epoch);
    with the tombstone flag in ``__tombstone``. Checked input leaves ties only between
    equal rows, so the choice among them never shows."""
    d = dialect_of(rows)
    F = d.F
    order = [F.col(m).desc_nulls_last() for m in spec.watermark]
    window = d.Window.partitionBy(*spec.key).orderBy(*order, *tiebreak)
    ranked = rows.withColumn("__rank", F.row_number().over(window))
    winners = ranked.where(F.col("__rank") == 1).drop("__rank")
    return winners.withColumn(TOMBSTONE, _tombstone_condition(F, spec))


def upsert_delta(
    spec: UpsertSpec, batch: DataFrame, current: DataFrame, state_columns: Sequence[str]
) -> DataFrame:
    """The state delta (``state_columns`` and ``__w``) of a good batch: per key the
    freshest row wins (NULL watermarks smallest); where it is fresher than the stored
    version (or there is none), ``-stored +winner`` with the winner's tombstone flag.

    Consolidated as built, with no grouping over every column (at a 1% W1 epoch that
    was 15% of the ingests' time): one insert and at most one retraction per key, and
    an insert differs from its key's retraction in a watermark column (it is strictly
    greater there; a spec has at least one watermark, never a key column)."""
    F = dialect_of(batch).F
    keys, marks = list(spec.key), list(spec.watermark)
    winners = upsert_winners(spec, batch)  # the state's columns: the user's, __tombstone
    joined = winners.join(_prefixed(current), _on_key(F, keys), "left")
    stored_missing = F.col(f"__s_{keys[0]}").isNull()
    fresher = _lexicographic_greater(F, marks, [f"__s_{m}" for m in marks])
    replace = joined.where(stored_missing | fresher)
    inserts = replace.select(
        *[F.col(c) for c in state_columns], F.lit(1).cast("bigint").alias(WEIGHT)
    )
    retracts = replace.where(~stored_missing).select(
        *[F.col(f"__s_{c}").alias(c) for c in state_columns],
        F.lit(-1).cast("bigint").alias(WEIGHT),
    )
    return inserts.unionByName(retracts)


def _prefixed(current: DataFrame) -> DataFrame:
    F = dialect_of(current).F
    return current.select(*[F.col(c).alias(f"__s_{c}") for c in current.columns])


def _on_key(F: ModuleType, keys: Sequence[str]) -> Column:
    return reduce(lambda a, b: a & b, [F.col(k) == F.col(f"__s_{k}") for k in keys])


def _tombstone_condition(F: ModuleType, spec: UpsertSpec) -> Column:
    """Whether a row is a tombstone (``core/upsert.py``: ``UpsertSpec.is_tombstone``)."""
    if spec.tombstone is None:
        return F.lit(False)
    column = F.col(spec.tombstone)
    kind = spec.types[spec.columns.index(spec.tombstone)]
    if kind == "boolean":
        return F.coalesce(column == F.lit(True), F.lit(False))
    if kind == "string":
        return F.coalesce(column == F.lit(spec.tombstone_value), F.lit(False))
    return column.isNotNull()


def _lexicographic_greater(F: ModuleType, left: Sequence[str], right: Sequence[str]) -> Column:
    """left > right for composite watermarks compared left to right, NULL smallest."""
    result = F.lit(False)
    for a, b in reversed(list(zip(left, right, strict=True))):
        ca, cb = F.col(a), F.col(b)
        greater = (ca.isNotNull() & cb.isNull()) | (ca.isNotNull() & cb.isNotNull() & (ca > cb))
        result = greater | (ca.eqNullSafe(cb) & result)
    return result
