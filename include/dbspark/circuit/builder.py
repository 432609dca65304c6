"""The circuit builder: how a user describes sources, operators and views.

A circuit is built like a DataFrame query, one operator at a time::

    c = Circuit("reachability")
    edges = c.zset_source("edges", {"src": "string", "dst": "string"})
    roots = c.zset_source("roots", {"node": "string"})
    reach = roots.iterate(
        lambda reach: reach.join(edges, left_on="node", right_on="src")
        .select(node=col("dst"))
        .plus(roots)
        .distinct()
    )
    c.view("reach", reach)

Every method checks its arguments against the input schema at once, so a
mistake is reported where it is made, naming the operator. The result is a
graph of ``Node`` objects that engines and the planner read; nothing here
knows which engine will run it.

Recursion follows Differential Dataflow's ``iterate``: the loop variable starts
as the stream ``iterate`` is called on, and each iteration replaces it with
``body(variable)`` until nothing changes. Streams from outside the loop may be
used freely inside the body; they are brought in ("entered") automatically.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dbspark.circuit.aggregations import Aggregation
from dbspark.circuit.expressions import (
    Expr,
    ExpressionError,
    array_element,
    infer_type,
    output_type,
    unify,
    wrap,
)
from dbspark.core.columns import TOMBSTONE, is_reserved
from dbspark.core.types import BIGINT, BOOLEAN, STRING, Schema, is_array, python_value_fits

SOURCE_OPS = frozenset({"zset_source", "upsert_source"})
#: A collection fixed when the circuit is built: its rows arrive at epoch 0, once.
CONSTANT_OP = "constant"
#: Operators that act on each update independently: they run on the delta alone.
LINEAR_OPS = frozenset(
    {
        "select",
        "filter",
        "flat_map",
        "join_function",
        "negate",
        "plus",
        "minus",
        "index_by",
        "inspect",
        "consolidate",
        "upsert_live",
        "delay",
    }
)
#: Operators that need the history of their inputs (traces).
STATEFUL_OPS = frozenset({"join", "distinct", "aggregate"})
#: Operators that bound every weight, which is what a loop needs to converge.
CONSOLIDATING_OPS = frozenset({"distinct", "aggregate"})
LOOP_OPS = frozenset({"enter", "variable", "leave"})


class CircuitError(ValueError):
    """The circuit is not well formed; the message says which operator and why."""


@dataclass
class Node:
    """One operator in the circuit graph."""

    id: int
    op: str
    inputs: tuple[int, ...]
    schema: Schema
    scope: int
    label: str
    params: dict[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:
        return f"Node({self.id}, {self.op}, {self.label!r}, inputs={self.inputs})"


@dataclass
class Scope:
    """The root clock (depth 1) or a fixed-point loop nested inside another scope."""

    id: int
    parent: int | None
    depth: int
    name: str
    variable: int | None = None
    result: int | None = None
    output: int | None = None
    max_iterations: int = 1000
    closed: bool = False


@dataclass(frozen=True, eq=False)
class Emit:
    """One output of a general linear operator: for every input row, emit a row.

    ``weight`` multiplies the input weight (``explode``); ``epoch`` delays the
    output to a later epoch (the lattice join of the input time with it, as in
    a temporal filter); ``when`` drops the output where it is not true.
    """

    columns: Mapping[str, Any]
    weight: Any = 1
    epoch: Any = None
    when: Any = None


def emit(
    columns: Mapping[str, Any], *, weight: Any = 1, epoch: Any = None, when: Any = None
) -> Emit:
    return Emit(dict(columns), weight, epoch, when)


class Circuit:
    """A named graph of sources, operators and views."""

    def __init__(self, name: str) -> None:
        if not name or not name.replace("_", "").replace("-", "").isalnum():
            raise CircuitError(f"circuit name {name!r} must be letters, digits, '_' or '-'")
        self.name = name
        self.nodes: list[Node] = []
        self.scopes: list[Scope] = [Scope(0, None, 1, "root")]
        self.sources: dict[str, int] = {}
        self.views: dict[str, int] = {}
        self._entered: dict[tuple[int, int], int] = {}
        self._open_scopes: list[int] = [0]

    # --- sources ---------------------------------------------------------------
    def zset_source(self, name: str, schema: Mapping[str, str]) -> Stream:
        """A source whose batches are Z-sets: rows with explicit weights."""
        self._check_source_name(name)
        node = self._add("zset_source", (), _source_schema(schema, f"source {name!r}"), 0, name)
        self.sources[name] = node.id
        return Stream(self, node.id)

    def upsert_source(
        self,
        name: str,
        schema: Mapping[str, str],
        *,
        key: str | Sequence[str],
        watermark: str | Sequence[str],
        tombstone: str | None = None,
        tombstone_value: str | None = None,
    ) -> Stream:
        """A source of upserts: per key the row with the greatest watermark wins.

        ``watermark`` may name several columns (compared left to right, NULL
        smallest). A row is a tombstone when its ``tombstone`` column is true
        (boolean), equals ``tombstone_value`` (string) or is not NULL (other
        types); a winning tombstone deletes the key. The returned stream is the
        live rows; the source also keeps the arranged state it consults.
        """
        self._check_source_name(name)
        what = f"upsert source {name!r}"
        user_schema = _source_schema(schema, what)
        keys = _as_names(key)
        watermarks = _as_names(watermark)
        if not keys:
            raise CircuitError(f"{what}: needs a primary key")
        if not watermarks:
            raise CircuitError(f"{what}: needs at least one watermark column")
        for column in (*keys, *watermarks, *([tombstone] if tombstone else [])):
            if column not in user_schema:
                raise CircuitError(f"{what}: unknown column {column!r}")
        if set(keys) & set(watermarks):
            raise CircuitError(f"{what}: a column cannot be both key and watermark")
        if tombstone is not None:
            if tombstone in keys:
                raise CircuitError(f"{what}: the tombstone column cannot be part of the key")
            tombstone_type = user_schema.type_of(tombstone)
            if tombstone_type == STRING and tombstone_value is None:
                raise CircuitError(f"{what}: a string tombstone column needs tombstone_value")
            if tombstone_type != STRING and tombstone_value is not None:
                raise CircuitError(f"{what}: tombstone_value only applies to a string column")
        elif tombstone_value is not None:
            raise CircuitError(f"{what}: tombstone_value given without a tombstone column")
        state_schema = Schema((*user_schema.fields, (TOMBSTONE, BOOLEAN)))
        params = {
            "key": keys,
            "watermark": watermarks,
            "tombstone": tombstone,
            "tombstone_value": tombstone_value,
            "user_schema": user_schema,
        }
        state = self._add("upsert_source", (), state_schema, 0, name, params)
        self.sources[name] = state.id
        live = self._add("upsert_live", (state.id,), user_schema, 0, f"{name}.live")
        return Stream(self, live.id)

    # --- constants -------------------------------------------------------------
    def constant(
        self, schema: Mapping[str, str], rows: Iterable[tuple[Sequence[Any], int]]
    ) -> Stream:
        """A collection that never changes: ``rows`` (``(values, weight)`` pairs) with
        ``schema``'s columns. Its delta is ``rows`` at epoch 0 and empty at every other
        time, so its integral is ``rows`` from the first epoch on (DBSP's constant
        stream, integrated). SQL's aggregate without ``GROUP BY`` uses it for the row it
        returns over no input."""
        where = f"constant #{len(self.nodes)}"
        typed = _source_schema(schema, where)
        checked: list[tuple[tuple[Any, ...], int]] = []
        for values, weight in rows:
            values = tuple(values)
            if len(values) != len(typed):
                raise CircuitError(f"{where}: row {values!r} does not have {len(typed)} values")
            if not isinstance(weight, int) or isinstance(weight, bool):
                raise CircuitError(f"{where}: weight {weight!r} of {values!r} is not an integer")
            for value, (name, kind) in zip(values, typed.fields, strict=True):
                # Scalars only: SQL's default rows need no array values.
                if value is not None and (is_array(kind) or not python_value_fits(value, kind)):
                    raise CircuitError(f"{where}: column {name!r} is {kind}, got {value!r}")
            if weight:
                checked.append((values, weight))
        node = self._add(CONSTANT_OP, (), typed, 0, where, {"rows": tuple(checked)})
        return Stream(self, node.id)

    # --- views -----------------------------------------------------------------
    def view(self, name: str, stream: Stream) -> Stream:
        """Materialize ``stream`` as a view called ``name``."""
        if not isinstance(stream, Stream) or stream.circuit is not self:
            raise CircuitError(f"view {name!r}: expected a stream of circuit {self.name!r}")
        if not name.isidentifier() or is_reserved(name):
            raise CircuitError(f"view name {name!r} must be an identifier not starting with '__'")
        if name in self.views:
            raise CircuitError(f"view {name!r} is declared twice")
        if self.node(stream.node_id).scope != 0:
            raise CircuitError(f"view {name!r}: a view must be outside every loop")
        self.views[name] = stream.node_id
        return stream

    # --- reading the graph ------------------------------------------------------
    def node(self, node_id: int) -> Node:
        return self.nodes[node_id]

    def scope(self, scope_id: int) -> Scope:
        return self.scopes[scope_id]

    def stream(self, name: str) -> Stream:
        """The stream a view or source is built from, by name."""
        if name in self.views:
            return Stream(self, self.views[name])
        if name in self.sources:
            return Stream(self, self.sources[name])
        raise CircuitError(f"circuit {self.name!r} has no view or source {name!r}")

    def consumers(self) -> dict[int, list[int]]:
        """node id -> the nodes that read it (feedback edges excluded)."""
        readers: dict[int, list[int]] = {n.id: [] for n in self.nodes}
        for node in self.nodes:
            for input_id in node.inputs:
                readers[input_id].append(node.id)
        return readers

    def nodes_within(self, scope_id: int) -> list[int]:
        """The nodes of a scope and of every loop nested inside it."""
        scopes = {scope_id}
        for scope in self.scopes:  # parents are created before their children
            if scope.parent in scopes:
                scopes.add(scope.id)
        return [n.id for n in self.nodes if n.scope in scopes]

    def validate(self) -> None:
        """Whole-circuit checks: views exist, every loop converges through a consolidating op."""
        if not self.sources:
            raise CircuitError(f"circuit {self.name!r} has no sources")
        if not self.views:
            raise CircuitError(f"circuit {self.name!r} declares no views")
        for scope in self.scopes[1:]:
            if not scope.closed:
                raise CircuitError(f"loop {scope.name!r} was never closed")
            self._check_loop_consolidates(scope)

    def describe(self) -> str:
        lines = [f"circuit {self.name}"]
        for node in self.nodes:
            indent = "  " * self.scope(node.scope).depth
            lines.append(
                f"{indent}#{node.id} {node.op} {node.label} {node.schema} <- {node.inputs}"
            )
        for name, node_id in self.views.items():
            lines.append(f"  view {name} = #{node_id}")
        return "\n".join(lines)

    # --- internals ----------------------------------------------------------------
    def _check_source_name(self, name: str) -> None:
        if len(self._open_scopes) > 1:
            raise CircuitError(f"source {name!r}: sources must be declared outside loops")
        if not isinstance(name, str) or not name.isidentifier() or is_reserved(name):
            raise CircuitError(f"source name {name!r} must be an identifier not starting with '__'")
        if name in self.sources:
            raise CircuitError(f"source {name!r} is declared twice")

    def _add(
        self,
        op: str,
        inputs: tuple[int, ...],
        schema: Schema,
        scope: int,
        label: str,
        params: dict[str, Any] | None = None,
    ) -> Node:
        node = Node(len(self.nodes), op, inputs, schema, scope, label, params or {})
        self.nodes.append(node)
        return node

    def _scope_chain(self, scope_id: int) -> list[int]:
        chain = [scope_id]
        while (parent := self.scopes[chain[-1]].parent) is not None:
            chain.append(parent)
        return chain

    def _common_scope(self, node_ids: Iterable[int], where: str) -> int:
        """The scope an operator over these inputs lives in: the deepest one."""
        scopes = {self.node(i).scope for i in node_ids}
        deepest = max(scopes, key=lambda s: self.scopes[s].depth)
        chain = self._scope_chain(deepest)
        for s in scopes:
            if s not in chain:
                raise CircuitError(
                    f"{where}: mixes streams of two different loops "
                    f"({self.scopes[s].name!r} and {self.scopes[deepest].name!r})"
                )
        if self.scopes[deepest].closed:
            raise CircuitError(
                f"{where}: uses a stream from inside loop {self.scopes[deepest].name!r} "
                "after the loop closed; use the stream that iterate() returned"
            )
        return deepest

    def _bring_into(self, node_id: int, scope_id: int) -> int:
        """Enter an outer stream into a nested scope, one level at a time (cached)."""
        node = self.node(node_id)
        if node.scope == scope_id:
            return node_id
        target_chain = self._scope_chain(scope_id)
        path = target_chain[: target_chain.index(node.scope)]
        current = node_id
        for inner in reversed(path):
            cached = self._entered.get((current, inner))
            if cached is None:
                source = self.node(current)
                entered = self._add(
                    "enter", (current,), source.schema, inner, f"enter {source.label}"
                )
                cached = self._entered[(current, inner)] = entered.id
            current = cached
        return current

    def _operator(
        self,
        op: str,
        inputs: Sequence[Stream],
        schema: Schema,
        label: str,
        params: dict[str, Any] | None = None,
    ) -> Stream:
        ids = [s.node_id for s in inputs]
        scope = self._common_scope(ids, label)
        entered = tuple(self._bring_into(i, scope) for i in ids)
        return Stream(self, self._add(op, entered, schema, scope, label, params).id)

    def _check_loop_consolidates(self, scope: Scope) -> None:
        assert scope.variable is not None and scope.result is not None
        readers = self.consumers()
        stack: list[tuple[int, tuple[int, ...]]] = [(scope.variable, (scope.variable,))]
        seen: set[int] = set()
        while stack:
            node_id, path = stack.pop()
            if node_id == scope.result:
                names = " -> ".join(f"{self.node(i).op}" for i in path)
                raise CircuitError(
                    f"loop {scope.name!r}: the path {names} feeds the loop back without a "
                    "distinct or aggregate, so weights could grow forever; add .distinct()"
                )
            if node_id in seen:
                continue
            seen.add(node_id)
            for reader in readers[node_id]:
                if self.node(reader).op not in CONSOLIDATING_OPS:
                    stack.append((reader, (*path, reader)))


class Stream:
    """A changing collection in a circuit: the output of one operator."""

    def __init__(self, circuit: Circuit, node_id: int) -> None:
        self.circuit = circuit
        self.node_id = node_id

    @property
    def node(self) -> Node:
        return self.circuit.node(self.node_id)

    @property
    def schema(self) -> Schema:
        return self.node.schema

    @property
    def columns(self) -> tuple[str, ...]:
        return self.schema.names

    def __repr__(self) -> str:
        return f"Stream({self.node.label} {self.schema})"

    # --- linear operators ----------------------------------------------------------
    def select(self, *names: str, **exprs: Any) -> Stream:
        """Project: keep the named columns and/or compute new ones (``map``)."""
        where = f"select on {self.node.label}"
        columns: dict[str, Expr] = {}
        for name in names:
            columns[name] = wrap_column(name)
        for name, expr in exprs.items():
            if name in columns:
                raise CircuitError(f"{where}: column {name!r} given twice")
            columns[name] = wrap(expr)
        if not columns:
            raise CircuitError(f"{where}: select needs at least one column")
        schema = self._typed_columns(columns, where)
        return self.circuit._operator("select", [self], schema, where, {"columns": columns})

    def map(self, **exprs: Any) -> Stream:
        """Alias of ``select`` with computed columns only."""
        return self.select(**exprs)

    def with_columns(self, **exprs: Any) -> Stream:
        """Keep every column and add (or replace) the given ones."""
        columns: dict[str, Any] = {name: wrap_column(name) for name in self.columns}
        columns.update(exprs)
        return self.select(**columns)

    def filter(self, predicate: Any) -> Stream:
        """Keep the rows where ``predicate`` is true (NULL counts as false)."""
        where = f"filter on {self.node.label}"
        expr = wrap(predicate)
        self._expect_type(expr, BOOLEAN, where)
        return self.circuit._operator("filter", [self], self.schema, where, {"predicate": expr})

    def flat_map(self, name: str, array: Any) -> Stream:
        """For each row, one output row per element of ``array``, in a new column ``name``."""
        where = f"flat_map on {self.node.label}"
        expr = wrap(array)
        array_type = infer_type(expr, self.schema, where)
        if not is_array(array_type):
            raise CircuitError(f"{where}: {expr!r} is a {array_type}, not an array")
        if name in self.schema:
            raise CircuitError(f"{where}: column {name!r} already exists")
        schema = Schema((*self.schema.fields, (name, array_element(array_type))))
        params = {"name": name, "array": expr}
        return self.circuit._operator("flat_map", [self], schema, where, params)

    def join_function(self, *emits: Emit) -> Stream:
        """The general linear operator: each input row yields rows with weights and times.

        ``explode`` (weights from data) and temporal filters (times from data)
        are instances; see ``Emit``.
        """
        where = f"join_function on {self.node.label}"
        if not emits:
            raise CircuitError(f"{where}: needs at least one emit(...)")
        schema: Schema | None = None
        compiled = []
        for index, item in enumerate(emits):
            columns = {name: wrap(e) for name, e in item.columns.items()}
            emit_schema = self._typed_columns(columns, f"{where} emit #{index}")
            if schema is None:
                schema = emit_schema
            elif emit_schema.names != schema.names:
                raise CircuitError(f"{where}: every emit must produce columns {schema.names}")
            else:
                merged = []
                for (name, a), (_, b) in zip(schema.fields, emit_schema.fields, strict=True):
                    common = unify(a, b)
                    if common is None:
                        raise CircuitError(
                            f"{where}: column {name!r} is {a} in one emit, {b} in another"
                        )
                    merged.append((name, common))
                schema = Schema(tuple(merged))
            weight = wrap(item.weight)
            self._expect_type(weight, BIGINT, f"{where} weight")
            epoch = None if item.epoch is None else wrap(item.epoch)
            if epoch is not None:
                self._expect_type(epoch, BIGINT, f"{where} epoch")
            when = None if item.when is None else wrap(item.when)
            if when is not None:
                self._expect_type(when, BOOLEAN, f"{where} when")
            compiled.append({"columns": columns, "weight": weight, "epoch": epoch, "when": when})
        assert schema is not None
        return self.circuit._operator("join_function", [self], schema, where, {"emits": compiled})

    def explode(self, weight: Any) -> Stream:
        """Multiply each row's weight by ``weight`` (which may be negative or zero)."""
        return self.join_function(
            emit({name: wrap_column(name) for name in self.columns}, weight=weight)
        )

    def negate(self) -> Stream:
        return self.circuit._operator("negate", [self], self.schema, f"negate {self.node.label}")

    def plus(self, other: Stream) -> Stream:
        """The sum of two collections of the same schema (``UNION ALL``)."""
        self._same_schema(other, "plus")
        return self.circuit._operator("plus", [self, other], self.schema, f"plus {self.node.label}")

    def minus(self, other: Stream) -> Stream:
        self._same_schema(other, "minus")
        return self.circuit._operator(
            "minus", [self, other], self.schema, f"minus {self.node.label}"
        )

    def index_by(self, *keys: str) -> Stream:
        """Declare key columns; a later ``join`` without ``on`` uses them."""
        where = f"index_by on {self.node.label}"
        for key in keys:
            if key not in self.schema:
                raise CircuitError(f"{where}: unknown column {key!r}")
        if not keys:
            raise CircuitError(f"{where}: needs at least one key column")
        return self.circuit._operator("index_by", [self], self.schema, where, {"keys": tuple(keys)})

    def inspect(
        self, callback: Callable[[tuple[int, ...], Any], None] | None = None, label: str = ""
    ) -> Stream:
        """Pass the stream through unchanged, showing each delta (logged, or to ``callback``)."""
        where = f"inspect {label or self.node.label}"
        params = {"callback": callback, "label": label or self.node.label}
        return self.circuit._operator("inspect", [self], self.schema, where, params)

    def consolidate(self) -> Stream:
        """Merge updates to the same row (every engine consolidates deltas anyway)."""
        return self.circuit._operator(
            "consolidate", [self], self.schema, f"consolidate {self.node.label}"
        )

    def delay(self) -> Stream:
        """The stream one tick late on its innermost clock (``z^-1``)."""
        return self.circuit._operator("delay", [self], self.schema, f"delay {self.node.label}")

    # --- stateful operators ------------------------------------------------------------
    def join(
        self,
        other: Stream,
        on: str | Sequence[str] | None = None,
        *,
        left_on: str | Sequence[str] | None = None,
        right_on: str | Sequence[str] | None = None,
    ) -> Stream:
        """Inner equi-join; weights multiply. Output: left columns, then right non-key columns."""
        where = f"join of {self.node.label} with {other.node.label}"
        left_keys, right_keys = self._join_keys(other, on, left_on, right_on)
        declared = on is None and left_on is None and right_on is None
        if declared and (not left_keys or not right_keys):
            raise CircuitError(f"{where}: give on=... (or index_by both sides)")
        if len(left_keys) != len(right_keys) or not left_keys:
            raise CircuitError(f"{where}: left and right keys differ in number")
        for lk, rk in zip(left_keys, right_keys, strict=True):
            if lk not in self.schema:
                raise CircuitError(f"{where}: unknown left key {lk!r}")
            if rk not in other.schema:
                raise CircuitError(f"{where}: unknown right key {rk!r}")
            if self.schema.type_of(lk) != other.schema.type_of(rk):
                raise CircuitError(
                    f"{where}: key {lk!r} is {self.schema.type_of(lk)} but {rk!r} is "
                    f"{other.schema.type_of(rk)}"
                )
        right_values = tuple(n for n in other.schema.names if n not in right_keys)
        clash = set(right_values) & set(self.schema.names)
        if clash:
            raise CircuitError(
                f"{where}: columns {sorted(clash)} exist on both sides; "
                "rename one side with select()"
            )
        schema = Schema(
            (*self.schema.fields, *((n, other.schema.type_of(n)) for n in right_values))
        )
        params = {"left_keys": left_keys, "right_keys": right_keys, "right_values": right_values}
        return self.circuit._operator("join", [self, other], schema, where, params)

    def semi_join(
        self,
        other: Stream,
        on: str | Sequence[str] | None = None,
        *,
        left_on: str | Sequence[str] | None = None,
        right_on: str | Sequence[str] | None = None,
    ) -> Stream:
        """The rows of this stream whose key matches some row of ``other`` (SQL's
        ``EXISTS`` and ``IN (subquery)``), each with its own weight; NULL keys match
        nothing. It is the join with ``other``'s distinct keys, so its incremental rule
        is theirs: ``distinct`` turns ``other``'s changes into key appearances and
        disappearances, and the join pairs them with this stream's trace (and this
        stream's changes with the distinct keys' trace)."""
        left_keys, right_keys = self._join_keys(other, on, left_on, right_on)
        distinct_keys = other.select(*dict.fromkeys(right_keys)).distinct()
        return self.join(distinct_keys, left_on=left_keys, right_on=right_keys)

    def anti_join(
        self,
        other: Stream,
        on: str | Sequence[str] | None = None,
        *,
        left_on: str | Sequence[str] | None = None,
        right_on: str | Sequence[str] | None = None,
    ) -> Stream:
        """The rows of this stream whose key matches no row of ``other`` (SQL's ``NOT
        EXISTS``); a row with a NULL key is kept. It is this stream minus its
        ``semi_join``, and ``minus`` is linear, so it is incremental as the semi-join is."""
        return self.minus(self.semi_join(other, on, left_on=left_on, right_on=right_on))

    def left_join(
        self,
        other: Stream,
        on: str | Sequence[str] | None = None,
        *,
        left_on: str | Sequence[str] | None = None,
        right_on: str | Sequence[str] | None = None,
    ) -> Stream:
        """``join``, plus every row of this stream that matches nothing, with NULL in
        ``other``'s columns (SQL's ``LEFT OUTER JOIN``). Columns as ``join``'s. The rule:
        the inner join plus the padded ``anti_join``, each incremental."""
        left_keys, right_keys = self._join_keys(other, on, left_on, right_on)
        inner = self.join(other, left_on=left_keys, right_on=right_keys)
        unmatched = self.anti_join(other, left_on=left_keys, right_on=right_keys)
        return inner.plus(unmatched._padded_into(inner))

    def full_join(
        self,
        other: Stream,
        on: str | Sequence[str] | None = None,
        *,
        left_on: str | Sequence[str] | None = None,
        right_on: str | Sequence[str] | None = None,
    ) -> Stream:
        """``left_join``, plus every row of ``other`` that matches nothing, with NULL in
        this stream's columns (SQL's ``FULL OUTER JOIN``). As in ``join``, ``other``'s
        key columns are not in the output: in a row only ``other`` has, the key is
        NULL, so copy it to a value column first where it is needed."""
        left_keys, right_keys = self._join_keys(other, on, left_on, right_on)
        left = self.left_join(other, left_on=left_keys, right_on=right_keys)
        unmatched = other.anti_join(self, left_on=right_keys, right_on=left_keys)
        return left.plus(unmatched._padded_into(left))

    def _join_keys(
        self,
        other: Stream,
        on: str | Sequence[str] | None,
        left_on: str | Sequence[str] | None,
        right_on: str | Sequence[str] | None,
    ) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The key columns of each side: ``on``, ``left_on``/``right_on``, or the ones
        ``index_by`` declared."""
        if on is not None:
            return _as_names(on), _as_names(on)
        if left_on is not None or right_on is not None:
            return _as_names(left_on), _as_names(right_on)
        return self._declared_keys(), other._declared_keys()

    def _padded_into(self, shape: Stream) -> Stream:
        """This stream's rows in ``shape``'s columns: its own where the names match, NULL
        (of the column's type) elsewhere."""
        columns = {
            name: wrap_column(name) if name in self.schema else lit_null(kind)
            for name, kind in shape.schema.fields
        }
        return self.select(**columns)

    def distinct(self) -> Stream:
        """Set semantics: every row with positive weight, at weight one."""
        return self.circuit._operator(
            "distinct", [self], self.schema, f"distinct {self.node.label}"
        )

    def aggregate(self, by: str | Sequence[str] = (), **aggregations: Aggregation) -> Stream:
        """Group by ``by`` and compute named aggregations; one row per non-empty group, weight 1."""
        where = f"aggregate on {self.node.label}"
        keys = _as_names(by)
        for key in keys:
            if key not in self.schema:
                raise CircuitError(f"{where}: unknown group column {key!r}")
        if not aggregations:
            raise CircuitError(f"{where}: name at least one aggregation, e.g. n=count()")
        fields = [(k, self.schema.type_of(k)) for k in keys]
        for name, agg in aggregations.items():
            if not isinstance(agg, Aggregation):
                raise CircuitError(f"{where}: {name}= must be count(), sum_(...), min_(...), ...")
            if name in keys:
                raise CircuitError(f"{where}: {name!r} is already a group column")
            try:
                fields.append((name, agg.result_type(self.schema, where)))
            except (TypeError, ExpressionError) as exc:
                raise CircuitError(str(exc)) from None
        params = {"keys": keys, "aggregations": dict(aggregations)}
        return self.circuit._operator("aggregate", [self], Schema(tuple(fields)), where, params)

    # --- recursion ------------------------------------------------------------------
    def iterate(
        self,
        body: Callable[[Stream], Stream],
        *,
        max_iterations: int = 1000,
        name: str | None = None,
    ) -> Stream:
        """The fixed point of ``body``, starting from this stream.

        Iteration ``0`` holds this stream; iteration ``i + 1`` holds
        ``body(iteration i)``. The result is the collection once an iteration
        changes nothing. Every path from the variable back to the result must
        pass a ``distinct`` or ``aggregate``.
        """
        circuit = self.circuit
        outer = circuit._common_scope([self.node_id], "iterate")
        scope = Scope(
            id=len(circuit.scopes),
            parent=outer,
            depth=circuit.scopes[outer].depth + 1,
            name=name or f"loop{len(circuit.scopes)}",
            max_iterations=max_iterations,
        )
        if max_iterations < 1:
            raise CircuitError(f"loop {scope.name!r}: max_iterations must be positive")
        circuit.scopes.append(scope)
        circuit._open_scopes.append(scope.id)
        try:
            initial = circuit._bring_into(self.node_id, scope.id)
            variable = circuit._add(
                "variable", (initial,), self.schema, scope.id, f"{scope.name}.variable"
            )
            scope.variable = variable.id
            result = body(Stream(circuit, variable.id))
            if not isinstance(result, Stream) or result.circuit is not circuit:
                raise CircuitError(f"loop {scope.name!r}: the body must return a stream")
            result_id = circuit._bring_into(result.node_id, scope.id)
            if circuit.node(result_id).scope != scope.id:
                raise CircuitError(
                    f"loop {scope.name!r}: the body returned a stream of another loop"
                )
            if result.schema != self.schema:
                raise CircuitError(
                    f"loop {scope.name!r}: the body returns {result.schema} but the loop "
                    f"variable is {self.schema}"
                )
        finally:
            circuit._open_scopes.pop()
        scope.result = result_id
        variable.params["feedback"] = result_id
        scope.closed = True
        leave = circuit._add(
            "leave", (result_id,), self.schema, outer, f"{scope.name}.result", {"loop": scope.id}
        )
        scope.output = leave.id
        return Stream(circuit, leave.id)

    # --- helpers -------------------------------------------------------------------
    def _declared_keys(self) -> tuple[str, ...]:
        node = self.node
        while node.op in ("inspect", "consolidate", "filter", "enter"):
            node = self.circuit.node(node.inputs[0])
        return tuple(node.params.get("keys", ())) if node.op == "index_by" else ()

    def _typed_columns(self, columns: Mapping[str, Expr], where: str) -> Schema:
        fields = []
        for name, expr in columns.items():
            if not name.isidentifier() or is_reserved(name):
                raise CircuitError(f"{where}: {name!r} is not a valid column name")
            try:
                fields.append((name, output_type(infer_type(expr, self.schema, where))))
            except ExpressionError as exc:
                raise CircuitError(str(exc)) from None
        return Schema(tuple(fields))

    def _expect_type(self, expr: Expr, expected: str, where: str) -> None:
        try:
            actual = infer_type(expr, self.schema, where)
        except ExpressionError as exc:
            raise CircuitError(str(exc)) from None
        if actual not in (expected, "null"):
            raise CircuitError(f"{where}: expected a {expected} expression, got {actual}: {expr!r}")

    def _same_schema(self, other: Stream, op: str) -> None:
        if not isinstance(other, Stream) or other.circuit is not self.circuit:
            raise CircuitError(f"{op} on {self.node.label}: expected a stream of the same circuit")
        if self.schema != other.schema:
            raise CircuitError(
                f"{op} of {self.node.label} and {other.node.label}: schemas differ, "
                f"{self.schema} vs {other.schema}"
            )


def wrap_column(name: str) -> Expr:
    from dbspark.circuit.expressions import col

    return col(name)


def lit_null(kind: str) -> Expr:
    """A NULL of column type ``kind``."""
    from dbspark.circuit.expressions import lit

    return lit(None).cast(kind)


def _source_schema(schema: Mapping[str, str], what: str) -> Schema:
    try:
        return Schema.of(schema, what=what)
    except (TypeError, ValueError) as exc:
        raise CircuitError(str(exc)) from None


def _as_names(value: str | Sequence[str] | None) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    return tuple(value)
