"""A DataFrame over DuckDB with the shape of the PySpark subset the kernels use.

The operator kernels (``engine/kernels.py``) are written once, against PySpark's
``DataFrame``/``Column``/``functions`` API. On the Spark tier they get real PySpark
objects; on the local tier they get these: a :class:`LocalFrame` is a SQL query text
plus its output column names, each method wraps it in one more ``SELECT``, and
nothing runs until an action (``toArrow``, ``collect``, ``count``) hands the query to
DuckDB in this process. DuckDB's optimiser flattens the nesting, so a fused chain of
linear operators is still one projection.

Only what the kernels need is here, with Spark's meaning:

* ``unionByName`` is ``UNION ALL BY NAME``; ``collect_list`` skips NULLs; ``explode``
  of an empty or NULL array yields no row; a join condition is any boolean column.
* Arrow tables (deltas handed over in Python, gathered keys) are registered with the
  connection just before a query that reads them runs, under names unique to the
  session, so frames can outlive one another in any order.

Sums of BIGINT are HUGEINT in DuckDB; kernels cast them back, and the tier casts every
written column to its declared type.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from dbspark.core.types import decimal_parts, is_decimal
from dbspark.engine.local import in_arrow

_TYPES = {
    "bigint": "BIGINT",
    "long": "BIGINT",
    "int": "INTEGER",
    "integer": "INTEGER",
    "double": "DOUBLE",
    "float": "DOUBLE",
    "string": "VARCHAR",
    "boolean": "BOOLEAN",
    "date": "DATE",
    # An instant: with the session's TimeZone at UTC (``LocalSession``) it reads and
    # writes Arrow's timestamp[us, UTC], as Spark's TimestampType does.
    "timestamp": "TIMESTAMPTZ",
    "null": "BIGINT",
}


def stored_type(duck: str) -> pa.DataType | None:
    """The Arrow type a column of the DuckDB type ``duck`` holds (None: one computed in
    Arrow nowhere, an array say)."""
    if duck in in_arrow.ARROW_TYPES:
        return in_arrow.ARROW_TYPES[duck]
    if duck == "DATE":
        return pa.date32()
    if duck == "TIMESTAMPTZ":
        return pa.timestamp("us", tz="UTC")
    return pa.decimal128(*decimal_parts(duck.lower())) if is_decimal(duck.lower()) else None


def duck_type(type_name: Any) -> str:
    """The DuckDB type of a dbspark/Spark type name (``array<x>`` becomes ``X[]``)."""
    name = type_name if isinstance(type_name, str) else type_name.simpleString()
    name = name.strip().lower()
    if name.startswith("array<") and name.endswith(">"):
        return duck_type(name[len("array<") : -1]) + "[]"
    if name.startswith("decimal("):
        return name.upper()
    if name not in _TYPES:
        raise TypeError(f"no DuckDB type for {type_name!r}")
    return _TYPES[name]


def quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def sql_literal(value: Any) -> str:
    """A Python value as a SQL literal with Spark's type for it (``lit``)."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int):
        return str(value) if -(2**31) <= value < 2**31 else f"CAST({value} AS BIGINT)"
    if isinstance(value, float):
        if math.isnan(value):
            return "CAST('nan' AS DOUBLE)"
        if math.isinf(value):
            return f"CAST('{'-' if value < 0 else ''}inf' AS DOUBLE)"
        return f"CAST('{value!r}' AS DOUBLE)"  # a bare -0.0 would read as DECIMAL, losing the sign
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    raise TypeError(f"no SQL literal for {value!r}")


class LocalColumn:
    """A SQL expression, with the name it takes in a ``select``.

    ``arrow``, when set, computes the same column from an Arrow table without a query
    (or returns None when it cannot be sure: ``in_arrow.py`` says when). ``aggregate``
    is set for an aggregate function that Arrow can group by. A frame over an Arrow table
    whose step is all such columns is derived in Arrow (``LocalFrame._derive``).
    """

    __slots__ = (
        "aggregate",
        "arrow",
        "descending",
        "elements",
        "name",
        "ordered",
        "pairs",
        "reference",
        "sql",
    )

    def __init__(
        self,
        sql: str,
        name: str | None = None,
        arrow: in_arrow.ArrowColumn | None = None,
        aggregate: in_arrow.Aggregate | None = None,
        *,
        reference: str | None = None,
        pairs: in_arrow.KeyPairs | None = None,
    ) -> None:
        self.sql = sql
        self.name = name
        self.arrow = arrow
        self.aggregate = aggregate
        self.reference = reference  # a plain column reference: its name, maybe qualified
        self.pairs = pairs  # a conjunction of column equalities: a join's keys
        self.elements: tuple[LocalColumn, ...] | None = None  # of an array(...), or exploded
        self.ordered: LocalColumn | None = None  # the column a sort order is of
        self.descending = False

    def __repr__(self) -> str:
        return f"LocalColumn({self.sql!r} AS {self.name!r})"

    # naming and types ------------------------------------------------------------------
    def alias(self, name: str) -> LocalColumn:
        aliased = LocalColumn(self.sql, name, self.arrow, self.aggregate)
        aliased.elements = self.elements
        return aliased

    def cast(self, type_name: Any) -> LocalColumn:
        target = duck_type(type_name)
        arrow_target = in_arrow.ARROW_TYPES.get(target)
        stored = stored_type(target)
        if isinstance(self, _Literal):
            arrow = in_arrow.typed_literal(self.value, arrow_target) if arrow_target else None
        else:
            # A DATE, TIMESTAMP or DECIMAL column cast to the type it has is itself.
            arrow = in_arrow.cast(self.arrow, stored)
        aggregate = self.aggregate.cast(stored) if self.aggregate else None
        return LocalColumn(f"CAST({self.sql} AS {target})", self.name, arrow, aggregate)

    # predicates --------------------------------------------------------------------------
    def isNull(self) -> LocalColumn:
        return LocalColumn(f"({self.sql} IS NULL)", arrow=in_arrow.is_null(self.arrow))

    def isNotNull(self) -> LocalColumn:
        return LocalColumn(f"({self.sql} IS NOT NULL)", arrow=in_arrow.is_valid(self.arrow))

    def eqNullSafe(self, other: Any) -> LocalColumn:
        other = lit(other)
        return LocalColumn(
            f"({self.sql} IS NOT DISTINCT FROM {other.sql})",
            arrow=in_arrow.null_safe_equal(self.arrow, other.arrow),
            pairs=_equality(self, other, null_safe=True),
        )

    def rlike(self, pattern: str) -> LocalColumn:
        """Whether a regular expression (RE2, as DuckDB and Arrow read it) matches some
        part of the string; NULL over NULL, as Spark's ``rlike``."""
        return LocalColumn(
            f"regexp_matches({self.sql}, {sql_literal(pattern)})",
            arrow=in_arrow.unary(
                lambda values: pc.match_substring_regex(values, pattern),
                self.arrow,
                kind=pa.types.is_string,
            ),
        )

    # operators ---------------------------------------------------------------------------
    def _binary(self, op: str, other: Any, reverse: bool = False) -> LocalColumn:
        other = lit(other)
        a, b = (other, self) if reverse else (self, other)
        pairs = None
        if op == "=":
            pairs = _equality(a, b, null_safe=False)
        elif op == "AND" and a.pairs and b.pairs:
            pairs = a.pairs + b.pairs
        return LocalColumn(
            f"({a.sql} {op} {b.sql})", arrow=in_arrow.binary(op, a.arrow, b.arrow), pairs=pairs
        )

    def __add__(self, other: Any) -> LocalColumn:
        return self._binary("+", other)

    def __radd__(self, other: Any) -> LocalColumn:
        return self._binary("+", other, True)

    def __sub__(self, other: Any) -> LocalColumn:
        return self._binary("-", other)

    def __rsub__(self, other: Any) -> LocalColumn:
        return self._binary("-", other, True)

    def __mul__(self, other: Any) -> LocalColumn:
        return self._binary("*", other)

    def __rmul__(self, other: Any) -> LocalColumn:
        return self._binary("*", other, True)

    def __truediv__(self, other: Any) -> LocalColumn:
        return LocalColumn(f"(CAST({self.sql} AS DOUBLE) / CAST({_sql(other)} AS DOUBLE))")

    def __neg__(self) -> LocalColumn:
        return LocalColumn(f"(- {self.sql})", arrow=in_arrow.negate(self.arrow))

    def __eq__(self, other: Any) -> LocalColumn:  # type: ignore[override]
        return self._binary("=", other)

    def __ne__(self, other: Any) -> LocalColumn:  # type: ignore[override]
        return self._binary("<>", other)

    def __lt__(self, other: Any) -> LocalColumn:
        return self._binary("<", other)

    def __le__(self, other: Any) -> LocalColumn:
        return self._binary("<=", other)

    def __gt__(self, other: Any) -> LocalColumn:
        return self._binary(">", other)

    def __ge__(self, other: Any) -> LocalColumn:
        return self._binary(">=", other)

    def __and__(self, other: Any) -> LocalColumn:
        return self._binary("AND", other)

    def __or__(self, other: Any) -> LocalColumn:
        return self._binary("OR", other)

    def __invert__(self) -> LocalColumn:
        return LocalColumn(f"(NOT {self.sql})", arrow=in_arrow.invert(self.arrow))

    def desc_nulls_last(self) -> LocalColumn:
        order = LocalColumn(f"{self.sql} DESC NULLS LAST")
        order.ordered, order.descending = self, True
        return order

    def over(self, window: LocalWindow) -> LocalColumn:
        arrow = None
        if self.sql == "row_number()":
            arrow = in_arrow.row_number(
                [c.arrow for c in window.partition_columns],
                [
                    (c.ordered.arrow, c.descending) if c.ordered is not None else (c.arrow, False)
                    for c in window.order_columns
                ],
            )
        return LocalColumn(f"{self.sql} OVER ({window.sql()})", arrow=arrow)

    def __bool__(self) -> bool:
        raise TypeError("a column has no truth value; use & | ~ instead of and/or/not")

    __hash__ = object.__hash__


class LocalCase(LocalColumn):
    """``F.when(...).when(...).otherwise(...)``: a SQL ``CASE``."""

    __slots__ = ("branches", "default")

    def __init__(
        self,
        branches: tuple[tuple[LocalColumn, LocalColumn], ...],
        default: LocalColumn | None = None,
    ) -> None:
        self.branches = branches
        self.default = default
        whens = " ".join(f"WHEN {c.sql} THEN {v.sql}" for c, v in branches)
        otherwise = f" ELSE {default.sql}" if default is not None else ""
        arrow = in_arrow.case(
            [(c.arrow, v.arrow) for c, v in branches],
            default.arrow if default is not None else None,
            has_default=default is not None,
        )
        super().__init__(f"(CASE {whens}{otherwise} END)", arrow=arrow)

    def when(self, condition: Any, value: Any) -> LocalCase:
        return LocalCase((*self.branches, (lit(condition), lit(value))), self.default)

    def otherwise(self, value: Any) -> LocalColumn:
        return LocalCase(self.branches, lit(value))


def _sql(value: Any) -> str:
    return value.sql if isinstance(value, LocalColumn) else sql_literal(value)


def _equality(a: LocalColumn, b: LocalColumn, *, null_safe: bool) -> in_arrow.KeyPairs | None:
    if a.reference is None or b.reference is None:
        return None
    return ((a.reference, b.reference, null_safe),)


class _Literal(LocalColumn):
    """A literal value (``lit``): its SQL text and the value itself."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        super().__init__(sql_literal(value), arrow=in_arrow.literal(value))
        self.value = value


def _column(value: str | LocalColumn) -> LocalColumn:
    return col(value) if isinstance(value, str) else value


# --- functions (the ``F`` of the local tier) ------------------------------------------------


def col(name: str) -> LocalColumn:
    """A column; ``a.b`` is field ``b`` of struct column ``a``, named ``b``."""
    if name == "*":
        return LocalColumn("*", "*")
    parts = name.split(".")
    if len(parts) == 2:  # a struct's field (or a column of an aliased frame, in a join)
        arrow = in_arrow.struct_field(lambda table: _column_of(table, parts[0]), parts[1])
        return LocalColumn(".".join(quote(p) for p in parts), parts[-1], arrow, reference=name)
    if len(parts) > 2:
        return LocalColumn(".".join(quote(p) for p in parts), parts[-1], reference=name)
    arrow = lambda table: _column_of(table, name)  # noqa: E731
    return LocalColumn(quote(name), name, arrow, reference=name)


def _column_of(table: pa.Table, name: str) -> pa.ChunkedArray | None:
    # -1 when the name is missing or not unique (a join's two sides), without building
    # the list of names (a small epoch asks this about 900 times).
    index = table.schema.get_field_index(name)
    return None if index < 0 else table.column(index)


def lit(value: Any) -> LocalColumn:
    return value if isinstance(value, LocalColumn) else _Literal(value)


def when(condition: Any, value: Any) -> LocalCase:
    return LocalCase(((lit(condition), lit(value)),))


def _function(name: str, *args: Any) -> LocalColumn:
    return LocalColumn(f"{name}({', '.join(_sql(_column(a)) for a in args)})")


def _aggregate(name: str, column: Any) -> LocalColumn:
    argument = _column(column) if isinstance(column, str) else lit(column)
    return LocalColumn(
        f"{name}({argument.sql})", aggregate=in_arrow.Aggregate(name, argument.arrow)
    )


def sum(column: Any) -> LocalColumn:
    return _aggregate("sum", column)


def max(column: Any) -> LocalColumn:
    return _aggregate("max", column)


def min(column: Any) -> LocalColumn:
    return _aggregate("min", column)


def count(column: Any) -> LocalColumn:
    return _aggregate("count", column)


def coalesce(*columns: Any) -> LocalColumn:
    found = _function("coalesce", *columns)
    found.arrow = in_arrow.coalesce([_column(c).arrow for c in columns])
    return found


def row_number() -> LocalColumn:
    return LocalColumn("row_number()")


class LocalWindow:
    """A window specification (``Window.partitionBy(...).orderBy(...)``)."""

    def __init__(
        self, partition: tuple[LocalColumn, ...] = (), order: tuple[LocalColumn, ...] = ()
    ) -> None:
        self.partition_columns = partition
        self.order_columns = order

    def partitionBy(self, *columns: Any) -> LocalWindow:
        return LocalWindow(tuple(_column(c) for c in columns), self.order_columns)

    def orderBy(self, *columns: Any) -> LocalWindow:
        return LocalWindow(self.partition_columns, tuple(_column(c) for c in columns))

    def sql(self) -> str:
        parts = []
        if self.partition_columns:
            parts.append("PARTITION BY " + ", ".join(c.sql for c in self.partition_columns))
        if self.order_columns:
            parts.append("ORDER BY " + ", ".join(c.sql for c in self.order_columns))
        return " ".join(parts)


#: PySpark's ``Window`` entry point, for the kernels (``dialect.Window``).
Window = LocalWindow()


def greatest(*columns: Any) -> LocalColumn:
    return _function("greatest", *columns)


def least(*columns: Any) -> LocalColumn:
    return _function("least", *columns)


def collect_list(column: Any) -> LocalColumn:
    c = _column(column)
    return LocalColumn(f"coalesce(list({c.sql}) FILTER (WHERE {c.sql} IS NOT NULL), [])")


def array(*columns: Any) -> LocalColumn:
    items = tuple(lit(_column(c) if isinstance(c, str) else c) for c in columns)
    array = LocalColumn(f"[{', '.join(c.sql for c in items)}]")
    array.elements = items
    return array


def struct(*columns: Any) -> LocalColumn:
    fields = []
    for c in columns:
        column = _column(c)
        if not column.name:
            raise ValueError(f"a struct field needs a name: {column!r}")
        fields.append(column)
    sql = ", ".join(f"{quote(c.name)} := {c.sql}" for c in fields)  # type: ignore[arg-type]
    arrow = in_arrow.struct([(c.name, c.arrow) for c in fields])  # type: ignore[misc]
    return LocalColumn(f"struct_pack({sql})", arrow=arrow)


def element_at(column: Any, index: Any) -> LocalColumn:
    array, position = _column(column), lit(index)
    arrow = None
    if array.elements is not None and all(isinstance(e, _Literal) for e in array.elements):
        values = [e.value for e in array.elements]  # type: ignore[attr-defined]
        arrow = in_arrow.pick(values, position.arrow)
    return LocalColumn(f"list_extract({array.sql}, {position.sql})", arrow=arrow)


def explode(column: Any) -> LocalColumn:
    array = _column(column)
    exploded = LocalColumn(f"unnest({array.sql})")
    exploded.elements = array.elements  # a row per element, derived in Arrow from these
    return exploded


# --- rows -----------------------------------------------------------------------------------


class LocalRow(tuple):
    """A collected row: a tuple whose fields can also be read by name (as PySpark's Row)."""

    _names: tuple[str, ...] = ()

    def __new__(cls, values: Iterable[Any], names: Sequence[str]) -> LocalRow:
        row = super().__new__(cls, values)
        row._names = tuple(names)
        return row

    def __getitem__(self, key: Any) -> Any:  # type: ignore[override]
        if isinstance(key, str):
            return super().__getitem__(self._names.index(key))
        return super().__getitem__(key)


# --- frames ---------------------------------------------------------------------------------


class LocalSession:
    """One DuckDB connection and the Arrow tables its frames have handed to it."""

    def __init__(self) -> None:
        from dbspark.engine.local.compile import register

        self.connection = duckdb.connect(":memory:")
        self.connection.execute("SET TimeZone = 'UTC'")
        register(self.connection)
        self._names = itertools.count()
        self._registered: set[str] = set()

    def prepare(self) -> None:
        """Run one small query over an Arrow table now: a connection's first query
        costs tens of milliseconds more than the ones after (DuckDB sets up its Arrow
        scan and executor once), which a worker's start should pay, not its first
        epoch."""
        sample = pa.table({"k": pa.array([1, 2], pa.int64()), "v": pa.array(["a", None])})
        frame = self.frame(sample)
        frame.where(f"{quote('k')} > 1").groupBy("v").agg(count("k")).toArrow()
        # Arrow's own engine (Acero), which the steps done in Arrow use, starts its
        # executor on its first plan (about 20 ms); so does Parquet's first write.
        sample.group_by("v").aggregate([("k", "sum")])
        sample.join(sample, "k")
        pq.write_table(sample, pa.BufferOutputStream())

    def settled(self, lazy: LocalFrame, rows: pa.Table | None) -> LocalFrame:
        """``lazy``; or, when its rows were derived in Arrow, a frame over those rows, so
        that a later step's query reads them instead of recomputing the steps before."""
        return lazy if rows is None else self.frame(rows)

    def table_name(self) -> str:
        return f"__dbspark_t{next(self._names)}"

    def frame(self, table: pa.Table) -> LocalFrame:
        """A frame over an Arrow table (registered when a query needs it)."""
        name = self.table_name()
        frame = LocalFrame(self, quote(name), list(table.column_names), {name: table})
        frame.table = table
        return frame

    def sql(self, query: str, columns: Sequence[str]) -> LocalFrame:
        return LocalFrame(self, f"({query})", list(columns), {})

    def run(self, frame: LocalFrame) -> pa.Table:
        """Execute ``frame`` and return its rows as Arrow."""
        for name, table in frame.tables.items():
            if name not in self._registered:
                self.connection.register(name, table)
                self._registered.add(name)
        try:
            return self.connection.sql(frame.query()).to_arrow_table()
        finally:
            self.release(frame.tables)

    def release(self, names: Iterable[str]) -> None:
        for name in names:
            if name in self._registered:
                self.connection.unregister(name)
                self._registered.discard(name)

    def close(self) -> None:
        self.connection.close()


class LocalFrame:
    """A lazy SQL query over DuckDB with PySpark ``DataFrame`` methods."""

    def __init__(
        self,
        session: LocalSession,
        source: str,
        columns: list[str],
        tables: dict[str, pa.Table],
        alias_name: str | None = None,
    ) -> None:
        self.session = session
        self.source = source  # a table name or a parenthesised query
        self.columns = columns
        self.tables = tables
        self.alias_name = alias_name
        # Set for a frame that is an Arrow table as it stands: its rows need no query.
        self.table: pa.Table | None = None

    def __repr__(self) -> str:
        return f"LocalFrame({self.columns})"

    # internals -------------------------------------------------------------------------
    def query(self) -> str:
        return f"SELECT * FROM {self.source}"

    def _derive(
        self, select: Sequence[LocalColumn], tail: str = "", tables: dict | None = None
    ) -> LocalFrame:
        names = []
        parts = []
        for index, column in enumerate(select):
            if column.sql == "*":
                parts.append("*")
                names.extend(self.columns)
                continue
            name = column.name or f"_c{index}"
            parts.append(f"{column.sql} AS {quote(name)}")
            names.append(name)
        alias = quote(self.alias_name or "__f")
        query = f"(SELECT {', '.join(parts)} FROM {self.source} AS {alias}{tail})"
        derived = LocalFrame(self.session, query, names, {**self.tables, **(tables or {})})
        if self.table is not None and not tail:
            # Columns of an Arrow table picked, renamed, cast to their own type or set to
            # a literal (a key set under the other side's names, the time columns of a
            # written batch) need no query: Arrow does it, mostly without copying.
            return self.session.settled(derived, self._select_in_arrow(select, names))
        return derived

    def _select_in_arrow(self, select: Sequence[LocalColumn], names: list[str]) -> pa.Table | None:
        """The selection over ``self.table`` in Arrow; None when a column is not exact
        there. An ``explode(array(...))`` gives each row once per element."""
        table = self.table
        assert table is not None
        exploding = [i for i, c in enumerate(select) if c.sql.startswith("unnest(")]
        if len(exploding) > 1 or (exploding and select[exploding[0]].elements is None):
            return None
        arrays: list[Any] = []
        at = -1  # where the exploded column is among the arrays
        for index, column in enumerate(select):
            if column.sql == "*":
                arrays.extend(table.columns)
            elif index in exploding:
                at = len(arrays)
                arrays.append(None)  # filled per element below
            else:
                arrays.append(column.arrow(table) if column.arrow else None)
        if any(a is None for i, a in enumerate(arrays) if i != at):
            return None
        if not exploding:
            return pa.Table.from_arrays(arrays, names=names)
        copies = []
        for element in select[exploding[0]].elements or ():
            values = element.arrow(table) if element.arrow else None
            if values is None:
                return None
            copy = list(arrays)
            copy[at] = values
            copies.append(pa.Table.from_arrays(copy, names=names))
        if not copies or len({c.schema for c in copies}) > 1:
            return None  # elements of different types: DuckDB unifies them
        return pa.concat_tables(copies)

    def __getitem__(self, name: str) -> LocalColumn:
        if name not in self.columns:
            raise KeyError(f"no column {name!r} in {self.columns}")
        return col(name)

    # transformations -------------------------------------------------------------------
    def select(self, *columns: str | LocalColumn) -> LocalFrame:
        flat: list[str | LocalColumn] = []
        for c in columns:
            flat.extend(c if isinstance(c, (list, tuple)) else [c])
        return self._derive([_column(c) for c in flat])

    def where(self, condition: LocalColumn | str) -> LocalFrame:
        text = condition if isinstance(condition, str) else condition.sql
        derived = self._derive([col(c) for c in self.columns], f" WHERE {text}")
        arrow = None if isinstance(condition, str) else condition.arrow
        if self.table is not None and arrow is not None:
            mask = arrow(self.table)
            if mask is not None and pa.types.is_boolean(mask.type):
                # a NULL condition drops the row
                return self.session.settled(derived, self.table.filter(mask))
        return derived

    def withColumn(self, name: str, column: Any) -> LocalFrame:
        column = lit(column)
        if name in self.columns:
            return self._derive([column.alias(c) if c == name else col(c) for c in self.columns])
        return self._derive([*(col(c) for c in self.columns), column.alias(name)])

    def drop(self, *names: str) -> LocalFrame:
        dropped = set(names)
        return self._derive([col(c) for c in self.columns if c not in dropped])

    def alias(self, name: str) -> LocalFrame:
        aliased = LocalFrame(self.session, self.source, self.columns, self.tables, name)
        aliased.table = self.table
        return aliased

    def distinct(self) -> LocalFrame:
        query = f"(SELECT DISTINCT * FROM {self.source})"
        distinct = LocalFrame(self.session, query, self.columns, self.tables)
        if self.table is not None:
            return self.session.settled(distinct, in_arrow.distinct(self.table))
        return distinct

    def groupBy(self, *keys: str | LocalColumn) -> LocalGrouped:
        return LocalGrouped(self, [_column(k) for k in keys])

    def agg(self, *aggregates: LocalColumn) -> LocalFrame:
        return LocalGrouped(self, []).agg(*aggregates)

    def join(self, other: LocalFrame, on: LocalColumn, how: str = "inner") -> LocalFrame:
        """An inner or left outer join (both sides' columns) or a ``left_semi`` join (this
        side's), on a condition: the joins the kernels make."""
        kinds = {"inner": "JOIN", "left": "LEFT JOIN", "left_semi": "SEMI JOIN"}
        if how not in kinds:
            raise ValueError(f"the local tier has no {how!r} join")
        left = quote(self.alias_name or "__l")
        right = quote(other.alias_name or "__r")
        query = (
            f"(SELECT * FROM {self.source} AS {left} {kinds[how]} {other.source} AS {right} "
            f"ON {on.sql})"
        )
        columns = list(self.columns) if how == "left_semi" else [*self.columns, *other.columns]
        joined = LocalFrame(self.session, query, columns, {**self.tables, **other.tables})
        if (
            on.pairs
            and self.table is not None
            and other.table is not None
            and self.table.column_names == self.columns
            and other.table.column_names == other.columns
        ):
            aliases = (self.alias_name or "__l", other.alias_name or "__r")
            found = in_arrow.join(self.table, other.table, aliases, on.pairs, how)
            return self.session.settled(joined, found)
        return joined

    def unionByName(self, other: LocalFrame) -> LocalFrame:
        if sorted(self.columns) != sorted(other.columns):
            raise ValueError(f"unionByName of {self.columns} and {other.columns}")
        right = other.select(*self.columns)
        query = f"(SELECT * FROM {self.source} UNION ALL SELECT * FROM {right.source})"
        union = LocalFrame(self.session, query, list(self.columns), {**self.tables, **right.tables})
        tables = (self.table, right.table)
        # Tables of different types are left to DuckDB, which unifies them.
        if tables[0] is not None and tables[1] is not None and tables[0].schema == tables[1].schema:
            return self.session.settled(union, pa.concat_tables(tables))
        return union

    def localCheckpoint(self) -> LocalFrame:
        """The rows computed once and kept as an Arrow table (as Spark's checkpoint)."""
        return self.session.frame(self.toArrow())

    # actions ---------------------------------------------------------------------------
    def toArrow(self) -> pa.Table:
        return self.table if self.table is not None else self.session.run(self)

    def collect(self) -> list[LocalRow]:
        table = self.toArrow()
        columns = [table.column(i).to_pylist() for i in range(table.num_columns)]
        return [LocalRow(values, self.columns) for values in zip(*columns, strict=True)]


class LocalGrouped:
    def __init__(self, frame: LocalFrame, keys: list[LocalColumn]) -> None:
        self.frame = frame
        self.keys = keys

    def agg(self, *aggregates: LocalColumn) -> LocalFrame:
        group = f" GROUP BY {', '.join(k.sql for k in self.keys)}" if self.keys else ""
        derived = self.frame._derive([*self.keys, *aggregates], group)
        table = self.frame.table
        if table is not None:
            names = derived.columns
            keys = [(n, k.arrow) for n, k in zip(names, self.keys, strict=False)]
            found = [(n, a.aggregate) for n, a in zip(names[len(keys) :], aggregates, strict=True)]
            return self.frame.session.settled(derived, in_arrow.aggregate(table, keys, found))
        return derived
