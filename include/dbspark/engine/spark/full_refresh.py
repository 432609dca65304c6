"""Full refresh in Spark: every view computed from scratch over the accumulated inputs.

This is the second way to get every answer (ARCHITECTURE.md,
"Two ways to every answer"). Where the
incremental engine follows deltas through traces, full refresh evaluates each
operator once over whole collections, with weights in ``__w``.

``REFRESHERS`` maps each operator of the builder (``node.op``) to one function that
takes the :class:`Refresh` (source frames and the values computed so far, memoized by
``(node, time)``), the node and its time (the epoch, then one iteration counter per
enclosing loop) and returns the node's whole collection at that time; the function's
docstring states the operator's full-refresh rule. Input the incremental engine would
have rejected is rejected here too, before any operator runs: the batch checks of
``engine/batches.py`` and ``core/upsert.py`` in :func:`source_frames`, and the upsert
conflicts of :func:`find_upsert_conflicts` in :func:`evaluate`
(:class:`UpsertConflict`). The upsert rule itself, its checks and its winners, is the
one the incremental engine applies (``kernels.upsert_*``), over the whole log at once.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import Any

from pyspark.sql import Column, DataFrame, Observation, Row, SparkSession
from pyspark.sql import functions as F

from dbspark.circuit.aggregations import Aggregation
from dbspark.circuit.builder import Circuit, Node, Scope
from dbspark.core.columns import EPOCH, EPOCH_TYPE, TOMBSTONE, WEIGHT, WEIGHT_TYPE
from dbspark.core.types import Schema
from dbspark.core.upsert import UpsertConflict, conform_rows, format_key
from dbspark.engine.api import LoopDidNotConverge, require_sources
from dbspark.engine.batches import upsert_batch, upsert_spec, zset_batch
from dbspark.engine.kernels import consolidate, upsert_log_conflicts, upsert_winners
from dbspark.engine.spark import user_aggregates
from dbspark.engine.spark.compile import (
    compile_predicate,
    compile_projection,
    compile_typed,
    spark_type,
    struct_type,
)
from dbspark.engine.spark.frames import empty_frame, from_spark_value, to_spark_value
from dbspark.engine.spark.session import is_connect

log = logging.getLogger(__name__)

Time = tuple[int, ...]
_OBSERVATIONS = itertools.count()
_MAX_LISTED = 20


# --- public API --------------------------------------------------------------------------


def full_refresh(
    spark: SparkSession,
    circuit: Circuit,
    history: Sequence[Mapping[str, Any]],
    epoch: int | None = None,
    *,
    checkpoint: bool = True,
) -> dict[str, DataFrame]:
    """Every view of ``circuit`` at ``epoch`` (default: the last epoch of ``history``).

    ``history[n]`` maps source names to epoch ``n``'s batch, in the reference
    engine's input format (Z-set sources: ``[(row, weight), ...]`` or a ``ZSet``;
    upsert sources: rows as tuples or mappings). Returns view name -> consolidated
    DataFrame of the view's columns plus ``__w``.
    """
    frames = source_frames(spark, circuit, history)
    if epoch is None:
        epoch = len(history) - 1
    return evaluate(spark, circuit, frames, epoch, checkpoint=checkpoint)


class SourceFrames(dict[str, DataFrame]):
    """Source name -> input frame (as ``source_frames`` makes them), remembering the upsert
    conflicts found in them so that evaluating many epochs checks the history once."""

    def __init__(self, frames: Mapping[str, DataFrame]) -> None:
        super().__init__(frames)
        self.conflicts: dict[str, list[Row]] = {}


def source_frames(
    spark: SparkSession, circuit: Circuit, history: Sequence[Mapping[str, Any]]
) -> SourceFrames:
    """Every source's input over ``history`` as one DataFrame with an ``__epoch`` column.

    Z-set sources: user columns, ``__w``, ``__epoch``. Upsert sources: user columns,
    ``__epoch`` (one row per upsert row received). Batches are checked as the
    reference engine checks them (``engine/batches.py``, ``core/upsert.py``).
    """
    rows: dict[str, list[tuple]] = {name: [] for name in circuit.sources}
    for index, inputs in enumerate(history):
        require_sources(circuit.name, circuit.sources, inputs, epoch=index)
        for name, batch in inputs.items():
            node = circuit.node(circuit.sources[name])
            if node.op == "zset_source":
                types = node.schema.types
                for row, weight in zset_batch(name, node.schema, batch).items():
                    values = tuple(to_spark_value(v, t) for v, t in zip(row, types, strict=True))
                    rows[name].append((*values, weight, index))
            else:
                spec = upsert_spec(node)
                user = node.params["user_schema"]
                checked = conform_rows(spec, upsert_batch(name, user, batch))
                types = user.types
                for row in checked:
                    values = tuple(to_spark_value(v, t) for v, t in zip(row, types, strict=True))
                    rows[name].append((*values, index))
    frames = {}
    for name, data in rows.items():
        node = circuit.node(circuit.sources[name])
        if node.op == "zset_source":
            schema = struct_type(node.schema, [(WEIGHT, WEIGHT_TYPE), (EPOCH, EPOCH_TYPE)])
        else:
            schema = struct_type(node.params["user_schema"], [(EPOCH, EPOCH_TYPE)])
        frames[name] = spark.createDataFrame(data, schema)
    return SourceFrames(frames)


def evaluate(
    spark: SparkSession,
    circuit: Circuit,
    sources: Mapping[str, DataFrame],
    epoch: int,
    *,
    checkpoint: bool = True,
) -> dict[str, DataFrame]:
    """Every view at ``epoch`` from source frames shaped as ``source_frames`` makes them.

    Upsert sources are checked for conflicts over epochs ``0..epoch`` first (once per
    ``SourceFrames`` for its whole history, then filtered by epoch).
    """
    circuit.validate()
    missing = set(circuit.sources) - set(sources)
    if missing:
        raise KeyError(f"no input frame for sources {sorted(missing)}")
    refresh = Refresh(spark, circuit, sources, checkpoint=checkpoint)
    for name, node_id in circuit.sources.items():
        node = circuit.node(node_id)
        if node.op != "upsert_source":
            continue
        if isinstance(sources, SourceFrames):
            if name not in sources.conflicts:
                sources.conflicts[name] = find_upsert_conflicts(node, sources[name])
            found = [r for r in sources.conflicts[name] if r[EPOCH] <= epoch]
        else:
            found = find_upsert_conflicts(node, sources[name].where(F.col(EPOCH) <= epoch))
        if found:
            raise_upsert_conflict(node, found)
    return {
        name: consolidate(refresh.value(node_id, (epoch,)), circuit.node(node_id).schema.names)
        for name, node_id in circuit.views.items()
    }


def verify(
    expected: DataFrame, actual: DataFrame, columns: Sequence[str] | None = None
) -> DataFrame:
    """The rows on which two collections differ: ``columns`` (default: the non-reserved
    columns of ``expected``) and ``__w`` = weight in ``expected`` minus weight in
    ``actual``. Empty when they agree."""
    names = list(columns) if columns is not None else _user_columns(expected)
    left = expected.select(*names, F.col(WEIGHT).cast(WEIGHT_TYPE).alias(WEIGHT))
    right = actual.select(*names, (-F.col(WEIGHT)).cast(WEIGHT_TYPE).alias(WEIGHT))
    return consolidate(left.unionByName(right), names)


# --- upsert sources ----------------------------------------------------------------------


def find_upsert_conflicts(node: Node, rows: DataFrame) -> list[Row]:
    """The first conflicts, by epoch, where the incremental reader would have rejected
    input (rows of the key columns and ``__epoch``; at most 21): ``rows`` holds the
    source's upsert rows with ``__epoch``, checked by ``kernels.upsert_log_conflicts``."""
    keys = list(node.params["key"])
    conflicts = upsert_log_conflicts(upsert_spec(node), rows, EPOCH)
    return conflicts.orderBy(EPOCH, *keys).limit(_MAX_LISTED + 1).collect()


def raise_upsert_conflict(node: Node, found: Sequence[Row]) -> None:
    """Raise :class:`UpsertConflict` naming the source, the keys and their epochs."""
    user: Schema = node.params["user_schema"]
    keys = list(node.params["key"])
    key_types = [user.type_of(k) for k in keys]
    offending = [
        tuple(from_spark_value(r[k], t) for k, t in zip(keys, key_types, strict=True))
        for r in found
    ]
    where = ", ".join(
        f"{format_key(key, keys)} in epoch {r[EPOCH]}"
        for key, r in zip(offending, found[:_MAX_LISTED], strict=False)
    )
    detail = (
        "different rows for one key at an equal watermark (within an epoch's batch, or "
        f"against the version stored before it): {where}"
    )
    raise UpsertConflict(node.label, None, offending, detail, (), keys)


# --- the refresh and its rules -----------------------------------------------------------


class Refresh:
    """One full refresh: values of nodes at times, memoized. ``value(node, time)`` is the
    node's accumulated collection at ``time`` (user columns plus ``__w``, not necessarily
    consolidated), computed by its operator's rule in ``REFRESHERS``."""

    def __init__(
        self,
        spark: SparkSession,
        circuit: Circuit,
        sources: Mapping[str, DataFrame],
        *,
        checkpoint: bool,
    ) -> None:
        self.spark = spark
        self.circuit = circuit
        self.sources = sources
        self.checkpoint = checkpoint
        self.memo: dict[tuple[int, Time], DataFrame] = {}
        # A value read by several operators is computed once: otherwise every view's
        # plan repeats it, and Spark analyses, optimises and runs it once per reader (a
        # SQL circuit of 45 views: verify 60 -> 40 s). Inside a loop, the loop's own
        # checkpoints already cut the plans.
        self.shared = {n for n, readers in circuit.consumers().items() if len(readers) > 1}

    def value(self, node_id: int, time: Time) -> DataFrame:
        key = (node_id, time)
        cached = self.memo.get(key)
        if cached is None:
            node = self.circuit.node(node_id)
            cached = refresher(node)(self, node, time)
            if len(time) == 1 and node_id in self.shared:  # at the root clock
                cached = self.materialize(cached)
            self.memo[key] = cached
        return cached

    def input(self, node: Node, time: Time, port: int = 0) -> DataFrame:
        """Input ``port`` of ``node`` at ``time``."""
        return self.value(node.inputs[port], time)

    def input_schema(self, node: Node, port: int = 0) -> Schema:
        return self.circuit.node(node.inputs[port]).schema

    def empty(self, schema: Schema) -> DataFrame:
        return empty_frame(self.spark, schema)

    def materialize(self, frame: DataFrame) -> DataFrame:
        """``frame`` checkpointed (when checkpointing), so that later plans start from it."""
        return frame.localCheckpoint(eager=True) if self.checkpoint else frame

    def forget_iterations(self, prefix: Time, keep_from: int) -> None:
        """Drop memoized values of iterations below ``keep_from`` under ``prefix``."""
        depth = len(prefix)
        stale = [
            key
            for key in self.memo
            if len(key[1]) > depth and key[1][:depth] == prefix and key[1][depth] < keep_from
        ]
        for key in stale:
            del self.memo[key]


#: A node's collection at a time, given the refresh it belongs to.
Refresher = Callable[[Refresh, Node, Time], DataFrame]
#: Operator name (``node.op``) -> its full-refresh rule.
REFRESHERS: dict[str, Refresher] = {}


def refreshes(*ops: str) -> Callable[[Refresher], Refresher]:
    """Register the decorated function as the full-refresh rule of the operators ``ops``."""

    def register(function: Refresher) -> Refresher:
        for op in ops:
            REFRESHERS[op] = function
        return function

    return register


def refresher(node: Node) -> Refresher:
    """The full-refresh rule of ``node``'s operator."""
    rule = REFRESHERS.get(node.op)
    if rule is None:
        raise AssertionError(f"full refresh has no rule for operator {node.op!r} ({node!r})")
    return rule


# --- sources -----------------------------------------------------------------------------


@refreshes("constant")
def _constant(r: Refresh, node: Node, time: Time) -> DataFrame:
    """A constant holds its rows at every time."""
    rows = [(*values, weight) for values, weight in node.params["rows"]]
    return r.spark.createDataFrame(rows, struct_type(node.schema, [(WEIGHT, WEIGHT_TYPE)]))


@refreshes("zset_source")
def _zset_source(r: Refresh, node: Node, time: Time) -> DataFrame:
    """A Z-set source at epoch ``e`` is the sum of its batches of epochs ``0..e``."""
    frame = r.sources[node.label].where(F.col(EPOCH) <= time[0])
    return consolidate(frame.drop(EPOCH), node.schema.names)


@refreshes("upsert_source")
def _upsert_source(r: Refresh, node: Node, time: Time) -> DataFrame:
    """The reader semantics (ARCHITECTURE.md, "Upsert sources") over every row received
    in epochs ``0..e``: per key the row with the greatest watermark (composite, left to
    right, NULL smallest, NaN largest) wins, the later epoch on a tie (conflict checking
    leaves ties only between equal rows). The collection is the winners at weight one,
    tombstones included and flagged in ``__tombstone`` (``upsert_live`` drops them)."""
    rows = r.sources[node.label].where(F.col(EPOCH) <= time[0])
    winners = upsert_winners(upsert_spec(node), rows, F.col(EPOCH).desc())
    return winners.select(*node.schema.names, F.lit(1).cast(WEIGHT_TYPE).alias(WEIGHT))


@refreshes("upsert_live")
def _upsert_live(r: Refresh, node: Node, time: Time) -> DataFrame:
    """The upsert state's rows that are not tombstones: a winning tombstone deletes its key."""
    state = r.input(node, time)
    return state.where(~F.col(TOMBSTONE)).select(*node.schema.names, WEIGHT)


# --- linear: the operator applied to the whole collection --------------------------------


@refreshes("select")
def _select(r: Refresh, node: Node, time: Time) -> DataFrame:
    """Each row projected, its weight kept."""
    columns = compile_projection(node.params["columns"], r.input_schema(node))
    return r.input(node, time).select(*columns, WEIGHT)


@refreshes("filter")
def _filter(r: Refresh, node: Node, time: Time) -> DataFrame:
    """The rows for which the predicate is true (not false, not NULL)."""
    keep = compile_predicate(node.params["predicate"], r.input_schema(node))
    return r.input(node, time).where(keep)


@refreshes("flat_map")
def _flat_map(r: Refresh, node: Node, time: Time) -> DataFrame:
    """Each row once per element of its array, with the element as the new column and the
    row's weight."""
    schema = r.input_schema(node)
    array, _ = compile_typed(node.params["array"], schema)
    # compile_typed casts the array to the declared element type already.
    return r.input(node, time).select(
        *schema.names, F.explode(array).alias(node.params["name"]), WEIGHT
    )


@refreshes("join_function")
def _join_function(r: Refresh, node: Node, time: Time) -> DataFrame:
    """Each input row contributes each emit whose ``when`` is true, at the row's weight times
    the emit's ``weight`` (a NULL or zero factor emits nothing). An emit with an ``epoch``
    expression is visible at epoch ``e`` iff its value is at most ``e`` (a NULL epoch never
    arrives)."""
    schema = r.input_schema(node)
    source = r.input(node, time)
    parts = []
    for item in node.params["emits"]:
        columns = []
        for (name, expr), (_, target) in zip(
            item["columns"].items(), node.schema.fields, strict=True
        ):
            column, _ = compile_typed(expr, schema)
            columns.append(column.cast(spark_type(target)).alias(name))
        factor, _ = compile_typed(item["weight"], schema)
        frame = source
        if item["when"] is not None:
            frame = frame.where(compile_predicate(item["when"], schema))
        if item["epoch"] is not None:
            emitted, _ = compile_typed(item["epoch"], schema)
            frame = frame.where(emitted.isNotNull() & (emitted <= F.lit(time[0])))
        frame = frame.withColumn("__factor", factor).where(
            F.col("__factor").isNotNull() & (F.col("__factor") != 0)
        )
        parts.append(frame.select(*columns, (F.col(WEIGHT) * F.col("__factor")).alias(WEIGHT)))
    result = parts[0]
    for part in parts[1:]:
        result = result.unionByName(part)
    return result


@refreshes("negate")
def _negate(r: Refresh, node: Node, time: Time) -> DataFrame:
    """Every weight negated."""
    frame = r.input(node, time)
    return frame.select(*node.schema.names, (-F.col(WEIGHT)).alias(WEIGHT))


@refreshes("plus")
def _plus(r: Refresh, node: Node, time: Time) -> DataFrame:
    """Both inputs' rows (weights add up when consolidated)."""
    names = node.schema.names
    left = r.input(node, time, 0).select(*names, WEIGHT)
    right = r.input(node, time, 1).select(*names, WEIGHT)
    return left.unionByName(right)


@refreshes("minus")
def _minus(r: Refresh, node: Node, time: Time) -> DataFrame:
    """The left input's rows and the right input's rows with negated weights."""
    names = node.schema.names
    left = r.input(node, time, 0).select(*names, WEIGHT)
    right = r.input(node, time, 1).select(*names, (-F.col(WEIGHT)).alias(WEIGHT))
    return left.unionByName(right)


@refreshes("index_by", "inspect")
def _pass_through(r: Refresh, node: Node, time: Time) -> DataFrame:
    """The input unchanged. ``inspect``'s callback receives deltas in the incremental
    engines, and full refresh has none."""
    return r.input(node, time)


@refreshes("consolidate")
def _consolidate(r: Refresh, node: Node, time: Time) -> DataFrame:
    """The input with one row per distinct row and no zero weights."""
    return consolidate(r.input(node, time), node.schema.names)


# --- stateful: a function of the consolidated inputs -------------------------------------


@refreshes("distinct")
def _distinct(r: Refresh, node: Node, time: Time) -> DataFrame:
    """The rows of positive weight, at weight one."""
    names = node.schema.names
    whole = consolidate(r.input(node, time), names)
    return whole.where(F.col(WEIGHT) > 0).select(*names, F.lit(1).cast(WEIGHT_TYPE).alias(WEIGHT))


@refreshes("join")
def _join(r: Refresh, node: Node, time: Time) -> DataFrame:
    """Every pair of rows with equal keys, at the product of their weights; as in SQL, a key
    with a NULL in it matches nothing."""
    left_schema, right_schema = r.input_schema(node, 0), r.input_schema(node, 1)
    left = consolidate(r.input(node, time, 0), left_schema.names)
    right = consolidate(r.input(node, time, 1), right_schema.names)
    renamed = {name: f"__r{index}" for index, name in enumerate(right_schema.names)}
    right = right.select(
        *(F.col(n).alias(renamed[n]) for n in right_schema.names),
        F.col(WEIGHT).alias("__rw"),
    )
    # SQL equality: a NULL key matches nothing. Every column name is unique after the
    # renaming, so plain names resolve even in a self-join.
    condition = None
    for lk, rk in zip(node.params["left_keys"], node.params["right_keys"], strict=True):
        term = F.col(lk) == F.col(renamed[rk])
        condition = term if condition is None else condition & term
    joined = left.join(right, on=condition, how="inner")
    return joined.select(
        *left_schema.names,
        *(F.col(renamed[n]).alias(n) for n in node.params["right_values"]),
        (F.col(WEIGHT) * F.col("__rw")).alias(WEIGHT),
    )


@refreshes("aggregate")
def _aggregate(r: Refresh, node: Node, time: Time) -> DataFrame:
    """One row per group that has a row of non-zero weight, at weight one: values count
    with their weights (``min`` and ``max`` over rows of positive weight). User-defined
    aggregates are the one place Python runs: each group's values are collected to the
    driver and the function applied there (off the hot path: full refresh is for
    rebuilding and verifying)."""
    schema = r.input_schema(node)
    keys = list(node.params["keys"])
    aggregations: dict[str, Aggregation] = node.params["aggregations"]
    whole = consolidate(r.input(node, time), schema.names)
    values = []
    for index, aggregation in enumerate(aggregations.values()):
        if aggregation.expr is None:
            values.append(F.lit(1).cast("bigint").alias(f"__v{index}"))
        else:
            values.append(compile_typed(aggregation.expr, schema)[0].alias(f"__v{index}"))
    prepared = whole.select(*keys, *values, WEIGHT)
    native = []
    udfs = []
    for index, (name, aggregation) in enumerate(aggregations.items()):
        target = spark_type(node.schema.type_of(name))
        if aggregation.kind == "udf":
            udfs.append((index, name, aggregation))
            continue
        native.append(_native_aggregate(aggregation, f"__v{index}").cast(target).alias(name))
    grouped = prepared.groupBy(*keys).agg(F.count(F.lit(1)).alias("__rows"), *native)
    if not keys:
        grouped = grouped.where(F.col("__rows") > 0)
    if udfs:
        grouped = _join_udfs(r, node, prepared, grouped, keys, udfs)
    return grouped.select(*node.schema.names, F.lit(1).cast(WEIGHT_TYPE).alias(WEIGHT))


def _native_aggregate(aggregation: Aggregation, value: str) -> Column:
    v, w = F.col(value), F.col(WEIGHT)
    kind = aggregation.kind
    if aggregation.expr is None:  # count(): the total weight
        return F.sum(w)
    present = v.isNotNull()
    if kind == "count":
        return F.coalesce(F.sum(F.when(present, w)), F.lit(0))
    if kind == "sum":
        return F.sum(F.when(present, v * w))
    if kind == "avg":
        return F.try_divide(F.sum(F.when(present, v * w)).cast("double"), F.sum(F.when(present, w)))
    if kind == "min":
        return F.min(F.when(present & (w > 0), v))
    if kind == "max":
        return F.max(F.when(present & (w > 0), v))
    raise AssertionError(kind)


def _join_udfs(
    r: Refresh,
    node: Node,
    prepared: DataFrame,
    grouped: DataFrame,
    keys: list[str],
    udfs: list[tuple[int, str, Aggregation]],
) -> DataFrame:
    """User-defined aggregates: each group's values go to the driver (off the hot path)."""
    schema = r.input_schema(node)
    columns = []
    for index, name, aggregation in udfs:
        assert aggregation.function is not None
        columns.append(
            user_aggregates.UserAggregateColumn(
                gathered=f"__l{index}",
                output=name,
                function=aggregation.function,
                value_type=_udf_value_type(aggregation, schema),
                result_type=node.schema.type_of(name),
                name=name,
            )
        )
    lists = prepared.groupBy(*keys).agg(
        *(
            user_aggregates.gather(F.col(f"__v{i}"), F.col(WEIGHT)).alias(f"__l{i}")
            for i, _, _ in udfs
        )
    )
    computed = user_aggregates.evaluate(lists, keys, schema, columns)
    return user_aggregates.attach(grouped, computed, keys)


def _udf_value_type(aggregation: Aggregation, schema: Schema) -> str:
    from dbspark.circuit.expressions import infer_type, output_type

    assert aggregation.expr is not None
    return output_type(infer_type(aggregation.expr, schema, "aggregate"))


# --- time and loops ----------------------------------------------------------------------


@refreshes("delay")
def _delay(r: Refresh, node: Node, time: Time) -> DataFrame:
    """The input one tick earlier on the innermost clock: at the root the input as of the
    previous epoch, inside a loop at the previous iteration; empty at tick 0."""
    if time[-1] == 0:
        return r.empty(node.schema)
    return r.input(node, (*time[:-1], time[-1] - 1))


@refreshes("enter")
def _enter(r: Refresh, node: Node, time: Time) -> DataFrame:
    """The outer collection, at every iteration."""
    return r.input(node, time[:-1])


@refreshes("variable")
def _variable(r: Refresh, node: Node, time: Time) -> DataFrame:
    """The initial collection at iteration 0, then what the body fed back at the previous
    iteration."""
    if time[-1] == 0:
        return r.input(node, time)
    return r.value(node.params["feedback"], (*time[:-1], time[-1] - 1))


@refreshes("leave")
def _leave(r: Refresh, node: Node, time: Time) -> DataFrame:
    """Naive iteration: ``X0 = initial``, ``X(i+1) = body(X(i))``, until an iteration changes
    nothing (compared with a consolidated difference) and every ``delay`` in the loop
    repeats too; the result is that fixed point (:func:`iterate`)."""
    iterates = iterate(r, r.circuit.scope(node.params["loop"]), time)
    while True:
        try:
            next(iterates)
        except StopIteration as done:
            return done.value


def iterate(r: Refresh, scope: Scope, time: Time) -> Generator[int, None, DataFrame]:
    """Run loop ``scope`` at ``time`` to its fixed point, yielding each iteration ``i``
    when the variable's iterate at ``(*time, i)`` is known, so that any node of the loop
    can be asked its value at ``(*time, i)`` then (values two iterations back are
    forgotten); returns the fixed point. At most ``max_iterations`` bodies, else
    :class:`LoopDidNotConverge`. Each iterate is checkpointed (``localCheckpoint``) so
    that query plans do not grow with the number of iterations."""
    assert scope.variable is not None and scope.result is not None
    names = r.circuit.node(scope.result).schema.names
    # The initial collection is cheap to recompute (its plan does not grow with the
    # iterations), so it is not worth a Spark job of its own.
    current = consolidate(r.value(scope.variable, (*time, 0)), names)
    r.memo[(scope.variable, (*time, 0))] = current
    iteration = 0
    while True:
        if iteration >= scope.max_iterations:
            raise LoopDidNotConverge(
                f"loop {scope.name!r} did not converge at time {time} within "
                f"{scope.max_iterations} iterations (full refresh)"
            )
        yield iteration
        produced = r.value(scope.result, (*time, iteration))
        following, changed = _step(r, current, produced, names)
        if not changed and _delays_settled(r, scope, time, iteration):
            log.info(
                "full refresh: loop %s converged at time %s after %d iteration(s)",
                scope.name,
                time,
                iteration + 1,
            )
            r.forget_iterations(time, keep_from=iteration + 1)
            return following
        iteration += 1
        r.memo[(scope.variable, (*time, iteration))] = following
        r.forget_iterations(time, keep_from=iteration - 1)
        current = following


def _delays_settled(r: Refresh, scope: Scope, prefix: Time, iteration: int) -> bool:
    """A ``delay`` in the loop holds its input's previous iterate, which is loop state
    too: X_{i+1} = X_i is only a pause while some delay's input still changes (the
    delayed value arrives an iteration later). Settled when each one repeats as well."""
    for node in r.circuit.nodes:
        if node.scope != scope.id or node.op != "delay":
            continue
        now = r.value(node.inputs[0], (*prefix, iteration))
        held = r.value(node.id, (*prefix, iteration))  # the input one iteration back
        difference = consolidate(
            now.unionByName(held.withColumn(WEIGHT, -F.col(WEIGHT))), node.schema.names
        )
        if not difference.isEmpty():
            return False
    return True


def _step(
    r: Refresh, current: DataFrame, produced: DataFrame, names: Sequence[str]
) -> tuple[DataFrame, bool]:
    """The next iterate (consolidated ``produced``) and whether it differs from
    ``current``: one shuffle that lines both up by row, checkpointed, then a scan."""
    both = (
        produced.select(*names, F.col(WEIGHT), F.lit(0).cast(WEIGHT_TYPE).alias("__old"))
        .unionByName(
            current.select(
                *names, F.lit(0).cast(WEIGHT_TYPE).alias(WEIGHT), F.col(WEIGHT).alias("__old")
            )
        )
        .groupBy(*names)
        .agg(F.sum(WEIGHT).alias(WEIGHT), F.sum("__old").alias("__old"))
        .where((F.col(WEIGHT) != 0) | (F.col("__old") != 0))
    )
    differs = F.col(WEIGHT) != F.col("__old")
    if r.checkpoint and not is_connect(r.spark):
        # Count the changed rows while checkpointing: one Spark job per iteration.
        observation = Observation(f"dbspark_iterate_{next(_OBSERVATIONS)}")
        counted = both.observe(observation, F.sum(F.when(differs, 1).otherwise(0)).alias("changed"))
        lined_up = r.materialize(counted)
        changed = (observation.get.get("changed") or 0) > 0
    else:
        lined_up = r.materialize(both)
        changed = not lined_up.where(differs).isEmpty()
    following = lined_up.where(F.col(WEIGHT) != 0).select(*names, WEIGHT)
    return following, changed


def _user_columns(frame: DataFrame) -> list[str]:
    return [c for c in frame.columns if not c.startswith("__")]
