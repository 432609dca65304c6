"""SQL view definitions compiled to a circuit of the builder.

``add_views(circuit, script)`` reads a script of ``CREATE [MATERIALIZED] VIEW name AS
query;`` statements (Spark SQL, parsed by sqlglot) over the circuit's sources and
declares each view on the circuit. The result is an ordinary circuit: the planner,
both engines, the DAG, full refresh and ``verify`` see operators, never SQL.

How a query becomes operators:

* every table reference is a ``select`` that renames the relation's columns to fresh
  internal names, so self-joins and equal column names on two sides never clash
  (the planner fuses these projections into the stage that reads them);
* ``WHERE`` terms over one relation are applied to it before it is joined; an
  equality between a column of the relations joined so far and one of the next
  relation becomes the join's key, from ``ON`` or, for ``FROM a, b``, from ``WHERE``;
  the terms left over filter the joined rows;
* ``GROUP BY`` is a ``select`` of the group keys and aggregate arguments, an
  ``aggregate``, then ``HAVING`` and the select list over its result. Each
  ``COUNT``, ``SUM``, ``AVG``, ``MIN`` or ``MAX(DISTINCT x)`` is that aggregate over the
  distinct ``(group, x)`` pairs, joined to the others on the group with NULL equal to
  NULL. Without
  ``GROUP BY`` the aggregate keeps its one row over no input: the result is
  ``aggregate + constant(default row) - (one default row per aggregate row)``,
  which is the aggregate when the input has rows and the default row when not;
* ``UNION ALL`` is ``plus``, ``UNION`` is ``plus`` then ``distinct``, ``DISTINCT``
  is ``distinct``;
* ``LEFT``, ``RIGHT`` and ``FULL OUTER JOIN`` are the builder's ``left_join`` and
  ``full_join``; their keys are copies, so each side's own columns stay and can be
  NULL. ``ON`` conditions on the padded side filter it before the join, those on a
  preserved side are one more key (the condition equal to TRUE), so a row failing them
  stays, padded; ``WHERE`` terms on a padded side are applied after it;
* ``[NOT] EXISTS`` and ``IN (subquery)`` in ``WHERE``, correlated by equalities, are
  ``semi_join`` and ``anti_join`` of the outer rows with the subquery's relation (an
  uncorrelated ``EXISTS`` joins on one constant key: all rows or none);
  ``NOT IN (subquery)`` is Spark's null-aware anti-join, built of those joins
  (``not_in``): a NULL in the subquery's matching rows drops every row, an empty
  subquery keeps them all;
* ``EXCEPT`` and ``INTERSECT`` (DISTINCT) are ``anti_join`` and ``semi_join`` of the
  left side's distinct rows with the right side on every column, NULL-safe; ``EXCEPT
  ALL`` counts each row of ``left - right`` and keeps the positive counts as copies,
  ``INTERSECT ALL`` is the left side minus that;
* ``WITH RECURSIVE r AS (base UNION step)`` is ``iterate``: the loop variable starts
  as the base, each iteration is ``distinct(base + step(r))``, and the loop ends when
  an iteration changes nothing (the least fixed point, as SQL defines it).

What is not compiled yet is refused, naming the view, the construct and its line and
column: ``/`` and ``%`` of decimals, ``INTERVAL`` arithmetic on columns, an outer
join's ``ON`` condition that reads both sides. So is what no view can mean:
window functions, ``ORDER BY`` and ``LIMIT``, joins without an equality,
non-deterministic functions.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import reduce
from typing import Any

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError

from dbspark.circuit import aggregations as aggs
from dbspark.circuit.builder import Circuit, CircuitError, Stream
from dbspark.circuit.expressions import (
    Column,
    Expr,
    ExpressionError,
    call,
    col,
    infer_type,
    lit,
    unify,
)
from dbspark.core.types import BIGINT, BOOLEAN, DOUBLE, STRING, Schema
from dbspark.sql.errors import SqlError, position, sql_text
from dbspark.sql.scalars import Field, Scalars, column_refs, conjuncts

#: A value per column type that stands in for NULL in a set operation's key (beside a
#: flag saying whether it was NULL, so it never equals a real value by accident).
_NULL_STAND_INS = {
    BIGINT: lit(0),
    DOUBLE: lit(0.0),
    STRING: lit(""),
    BOOLEAN: lit(False),
}
#: sqlglot aggregate nodes and the builder's aggregations.
_AGGREGATES = {exp.Count: "count", exp.Sum: "sum", exp.Min: "min", exp.Max: "max", exp.Avg: "avg"}
_BUILDERS = {
    "count": aggs.count,
    "sum": aggs.sum_,
    "min": aggs.min_,
    "max": aggs.max_,
    "avg": aggs.avg,
}


@dataclass
class Relation:
    """A query result: a stream whose columns are exactly ``names``, in order."""

    stream: Stream
    names: list[str]


@dataclass
class _KeyedSides:
    """Two sides of a join with their key columns (``redirect``: right key column ->
    the left key column equal to it, for the right keys a join drops)."""

    left: Stream
    right: Stream
    left_keys: list[str]
    right_keys: list[str]
    redirect: dict[str, str]


@dataclass
class _From:
    """A relation as a ``FROM`` item: its stream under internal names, its fields."""

    stream: Stream
    fields: list[Field]


#: A join key equal on every row of both sides: a join on it pairs all rows with all
#: rows (an uncorrelated subquery's rows with every outer row).
_CONSTANT_KEY = (exp.Literal.number(1), exp.Literal.number(1))


def _padded(side: str, done: set[int], index: int) -> set[int]:
    """The relations an outer join of relation ``index`` to ``done`` pads with NULLs, as
    far as its ``ON`` conditions go (a FULL join's conditions are all taken as keys)."""
    return {"LEFT": {index}, "RIGHT": done}.get(side, set())


def add_views(circuit: Circuit, script: str) -> list[str]:
    """Declare the views of ``script`` on ``circuit`` (whose sources they read) and
    return their names in order. Raises :class:`SqlError` for SQL that is refused."""
    return _Compiler(circuit).script(script)


def compile_circuit(name: str, sources: Mapping[str, Mapping[str, Any]], script: str) -> Circuit:
    """A circuit called ``name`` with ``sources`` (the conformance format, see
    ``declare_sources``) and the views of ``script``."""
    circuit = Circuit(name)
    declare_sources(circuit, sources)
    add_views(circuit, script)
    return circuit


#: What a source declaration may hold (the conformance README, "Circuits defined in SQL").
_SOURCE_FIELDS = ("columns", "key", "watermark", "tombstone", "tombstone_value")


def declare_sources(circuit: Circuit, sources: Mapping[str, Any]) -> None:
    """Declare ``sources`` on ``circuit``: per source ``columns`` as ``[name, type]``
    pairs and, for an upsert source, ``key``, ``watermark``, ``tombstone`` and
    ``tombstone_value``; without ``key``, a Z-set source. The declaration comes from a
    JSON file or a vector, so its shape is checked here: a malformed one is a
    ``CircuitError`` naming the source, not a ``KeyError`` from deep inside."""
    if not isinstance(sources, Mapping):
        raise CircuitError(f"sources must be an object of source declarations, got {sources!r}")
    for source, spec in sources.items():
        here = f"source {source!r}"
        if not isinstance(spec, Mapping):
            raise CircuitError(f"{here}: must be an object, got {spec!r}")
        unknown = sorted(set(spec) - set(_SOURCE_FIELDS))
        if unknown:
            raise CircuitError(f"{here}: unknown keys {unknown} (known: {list(_SOURCE_FIELDS)})")
        columns = spec.get("columns")
        if not isinstance(columns, list) or not all(
            isinstance(c, list) and len(c) == 2 and all(isinstance(x, str) for x in c)
            for c in columns
        ):
            raise CircuitError(f'{here}: "columns" must be a list of [name, type] pairs')
        for listed in ("key", "watermark"):
            value = spec.get(listed)
            if value is not None and not (
                isinstance(value, list) and all(isinstance(x, str) for x in value)
            ):
                raise CircuitError(f'{here}: "{listed}" must be a list of column names')
        for single in ("tombstone", "tombstone_value"):
            if spec.get(single) is not None and not isinstance(spec[single], str):
                raise CircuitError(f'{here}: "{single}" must be a string')
        schema = {column: kind for column, kind in columns}
        if "key" in spec:
            circuit.upsert_source(
                source,
                schema,
                key=spec["key"],
                watermark=spec.get("watermark") or (),
                tombstone=spec.get("tombstone"),
                tombstone_value=spec.get("tombstone_value"),
            )
        else:
            for upsert_only in ("watermark", "tombstone", "tombstone_value"):
                if spec.get(upsert_only) is not None:
                    raise CircuitError(f'{here}: "{upsert_only}" needs a "key" (an upsert source)')
            circuit.zset_source(source, schema)


class _Compiler:
    def __init__(self, circuit: Circuit) -> None:
        self.circuit = circuit
        self.tables: dict[str, Relation] = {}
        for name, node_id in circuit.sources.items():
            stream = _live_stream(circuit, name, node_id)
            self.tables[name.lower()] = Relation(stream, list(stream.columns))
        for name, node_id in circuit.views.items():
            stream = Stream(circuit, node_id)
            self.tables[name.lower()] = Relation(stream, list(stream.columns))
        self.ctes: list[dict[str, Relation]] = []
        self.view = ""
        self._serial = itertools.count()

    # --- the script -----------------------------------------------------------------
    def script(self, text: str) -> list[str]:
        try:
            statements = [s for s in sqlglot.parse(text, read="spark") if s is not None]
        except ParseError as error:
            first = error.errors[0] if error.errors else {}
            raise SqlError(
                f"cannot parse: {first.get('description', error)}",
                line=first.get("line"),
                column=first.get("col"),
            ) from None
        except TokenError as error:
            raise SqlError(f"cannot parse: {error}") from None
        if not statements:
            raise SqlError("the script defines no view (expected CREATE VIEW name AS query;)")
        declared = []
        for statement in statements:
            name, query = self._view_statement(statement)
            self.view = name
            if name.lower() in self.tables:
                raise self.error(f"{name!r} is already a source or view", statement)
            relation = self.query(query)
            try:
                self.circuit.view(name, relation.stream)
            except CircuitError as error:
                raise self.error(str(error), statement) from None
            self.tables[name.lower()] = relation
            declared.append(name)
        return declared

    def _view_statement(self, statement: exp.Expression) -> tuple[str, exp.Expression]:
        if not (isinstance(statement, exp.Create) and str(statement.kind).upper() == "VIEW"):
            line, column = position(statement)
            raise SqlError(
                f"only CREATE VIEW statements are accepted, got {sql_text(statement)}",
                line=line,
                column=column,
            )
        target = statement.this
        name = target.name if isinstance(target, exp.Table) else target.this.name
        query = statement.expression
        if isinstance(target, exp.Schema) or not isinstance(query, exp.Query):
            self.view = name
            raise self.error("expected CREATE VIEW name AS query", statement)
        return name, query

    def error(self, message: str, node: exp.Expression | None) -> SqlError:
        line, column = position(node)
        return SqlError(message, view=self.view, line=line, column=column)

    def fresh(self, hint: str) -> str:
        base = hint.lower().lstrip("_")
        if not base.isidentifier():
            base = "c"
        return f"{base}_{next(self._serial)}"

    # --- queries --------------------------------------------------------------------
    def query(self, node: exp.Expression) -> Relation:
        """A query's result, its columns named as the query names them."""
        if isinstance(node, exp.Subquery):
            return self.query(node.this)
        for clause in ("order", "limit", "offset"):
            if node.args.get(clause) is not None:
                raise self.error(
                    f"{clause.upper()} in a view is not supported: a view is an unordered "
                    "collection (order when reading it)",
                    node.args[clause],
                )
        with self.with_clause(node.args.get("with_")):
            if isinstance(node, exp.Union):
                return self.union(node)
            if isinstance(node, (exp.Except, exp.Intersect)):
                return self.except_intersect(node)
            if isinstance(node, exp.Select):
                return self.select(node)
        raise self.error(f"{type(node).__name__} is not a supported query", node)

    @contextmanager
    def with_clause(self, clause: exp.With | None) -> Iterator[None]:
        scope: dict[str, Relation] = {}
        self.ctes.append(scope)
        try:
            for cte in clause.expressions if clause is not None else []:
                name = cte.alias_or_name
                columns = (
                    [c.name for c in cte.args["alias"].columns] if cte.args.get("alias") else []
                )
                if clause.args.get("recursive") and _references(cte.this, name):
                    scope[name.lower()] = self.recursive(name, columns, cte.this)
                else:
                    scope[name.lower()] = self.renamed(self.query(cte.this), columns, cte)
            yield
        finally:
            self.ctes.pop()

    def renamed(self, relation: Relation, names: Sequence[str], node: exp.Expression) -> Relation:
        """``relation`` with its columns called ``names`` (all of them, by position)."""
        if not names or list(names) == relation.names:
            return relation
        if len(names) != len(relation.names):
            raise self.error(
                f"{len(names)} column names given for a query of {len(relation.names)} columns",
                node,
            )
        stream = self.build(
            lambda: relation.stream.select(
                **{new: col(old) for new, old in zip(names, relation.names, strict=True)}
            ),
            node,
        )
        return Relation(stream, list(names))

    def operands(self, node: exp.Expression, word: str) -> tuple[list[str], Stream, Stream]:
        """A set operation's two sides under the left side's names and common types."""
        left = self.query(node.this)
        right = self.query(node.expression)
        if len(left.names) != len(right.names):
            raise self.error(
                f"{word} of {len(left.names)} and {len(right.names)} columns", node.expression
            )
        return (left.names, *self.aligned(left, right, node))

    def union(self, node: exp.Union) -> Relation:
        names, left_stream, right_stream = self.operands(node, "UNION")
        stream = self.build(lambda: left_stream.plus(right_stream), node)
        if node.args.get("distinct"):
            stream = stream.distinct()
        return Relation(stream, names)

    def except_intersect(self, node: exp.Expression) -> Relation:
        """``EXCEPT`` and ``INTERSECT`` (both DISTINCT, as in Spark): the left side's
        distinct rows anti- or semi-joined with the right side on every column, NULL
        equal to NULL as set operations compare (each column is keyed by whether it is
        NULL and by its value with NULL replaced)."""
        word = node.key.upper()
        if not node.args.get("distinct"):
            return self.except_intersect_all(node, word)
        names, left_stream, right_stream = self.operands(node, word)
        keys = self.null_safe_keys(left_stream.schema, names, node)
        key_names = list(keys)
        keyed_left = self.build(lambda: left_stream.distinct().with_columns(**keys), node)
        keyed_right = self.build(lambda: right_stream.select(**keys), node)
        method = "anti_join" if isinstance(node, exp.Except) else "semi_join"
        kept = self.build(
            lambda: getattr(keyed_left, method)(keyed_right, left_on=key_names, right_on=key_names),
            node,
        )
        return Relation(kept.select(*names), names)

    def except_intersect_all(self, node: exp.Expression, word: str) -> Relation:
        """``EXCEPT ALL`` and ``INTERSECT ALL``, bag operations: a row the left side holds
        m times and the right n times is kept max(m - n, 0) times by ``EXCEPT ALL`` and
        min(m, n) times by ``INTERSECT ALL``, which is m minus the former. m - n is the
        row's weight in ``left - right``; counting it per row (a group of all the
        columns, where NULL equals NULL as set operations compare) and keeping the
        positive counts, each as that many copies, gives ``EXCEPT ALL``."""
        names, left_stream, right_stream = self.operands(node, f"{word} ALL")
        copies = self.fresh("copies")

        def build() -> Stream:
            counted = left_stream.minus(right_stream).aggregate(by=names, **{copies: aggs.count()})
            surplus = counted.filter(col(copies) > 0).explode(col(copies)).select(*names)
            return surplus if isinstance(node, exp.Except) else left_stream.minus(surplus)

        return Relation(self.build(build, node), names)

    def aligned(
        self, left: Relation, right: Relation, node: exp.Expression
    ) -> tuple[Stream, Stream]:
        """Both sides under the left's names, each column cast to the common type."""
        left_columns: dict[str, Expr] = {}
        right_columns: dict[str, Expr] = {}
        same = True  # the right side already has the left's names and types
        for name, other in zip(left.names, right.names, strict=True):
            a, b = left.stream.schema.type_of(name), right.stream.schema.type_of(other)
            common = unify(a, b)
            if common is None:
                raise self.error(f"column {name!r} is {a} on one side and {b} on the other", node)
            left_columns[name] = col(name) if a == common else col(name).cast(common)
            right_columns[name] = col(other) if b == common else col(other).cast(common)
            same = same and name == other and a == b
        if same:
            return left.stream, right.stream
        return (
            self.build(lambda: left.stream.select(**left_columns), node),
            self.build(lambda: right.stream.select(**right_columns), node),
        )

    def recursive(self, name: str, columns: Sequence[str], body: exp.Expression) -> Relation:
        """``WITH RECURSIVE name(columns) AS (base UNION step)`` as an ``iterate`` loop."""
        branches = _union_branches(body)
        if branches is None:
            raise self.error(
                f"recursive query {name!r} must be base UNION step (UNION ALL never reaches a "
                "fixed point on a cycle; UNION does)",
                body,
            )
        base = [b for b in branches if not _references(b, name)]
        steps = [b for b in branches if _references(b, name)]
        if not base:
            raise self.error(
                f"recursive query {name!r} has no base (a branch without {name})", body
            )
        start = reduce(self.union_all, [self.query(b) for b in base])
        start = self.renamed(start, columns, body)

        def iteration(variable: Stream) -> Stream:
            self.ctes.append({name.lower(): Relation(variable, start.names)})
            try:
                parts = [self.renamed(self.query(s), start.names, s) for s in steps]
            finally:
                self.ctes.pop()
            total = reduce(self.union_all, [start, *parts])
            return total.stream.distinct()

        loop = self.build(
            lambda: start.stream.distinct().iterate(iteration, name=f"{self.view}_{name}"), body
        )
        return Relation(loop, start.names)

    def union_all(self, left: Relation, right: Relation) -> Relation:
        a, b = self.aligned(left, right, None)  # type: ignore[arg-type]
        return Relation(a.plus(b), left.names)

    # --- one query block ---------------------------------------------------------------
    def select(self, node: exp.Select) -> Relation:
        items = list(node.expressions)
        relations = self.from_items(node)
        where = conjuncts(node.args.get("where").this) if node.args.get("where") else []
        subqueries = [t for t in where if _has_subquery(t)]
        joined = self.join_all(relations, node, [t for t in where if t not in subqueries])
        for term in subqueries:
            joined = self.subquery_condition(joined, term)
        scalars = Scalars(self.view, joined.fields)
        grouped = node.args.get("group") is not None or node.args.get("having") is not None
        grouped = grouped or any(_aggregate_calls(item) for item in items)
        if grouped:
            return self.aggregate(node, joined, scalars)
        columns = self.projection(items, scalars, joined.stream.schema)
        stream = self.build(lambda: joined.stream.select(**columns), node)
        if node.args.get("distinct"):
            stream = stream.distinct()
        return Relation(stream, list(columns))

    def subquery_condition(self, outer: _From, term: exp.Expression) -> _From:
        """``[NOT] EXISTS (subquery)`` or ``x IN (subquery)`` as a term of ``WHERE``: a
        semi-join (anti-join for ``NOT EXISTS``) of the outer rows with the subquery's
        relation, on the subquery's equalities with outer columns (and, for ``IN``, the
        tested value against the subquery's one column)."""
        negated, query, tested = self.subquery_parts(term)
        plain = isinstance(query, exp.Select) and not any(
            query.args.get(k) is not None for k in ("group", "having", "limit", "order", "with_")
        )
        if tested is not None and (
            not plain or any(_aggregate_calls(item) for item in query.expressions)
        ):
            return self.uncorrelated_in(outer, tested, query, term, negated=negated)
        if not plain:
            raise self.error(
                "a subquery in WHERE must be a plain SELECT ... FROM ... [WHERE ...]", query
            )
        if any(_aggregate_calls(item) for item in query.expressions):
            raise self.error("an aggregate in a WHERE subquery is not supported", query)
        items = self.from_items(query)
        local, pairs = self.correlation(outer, query, items)
        inner = self.join_all(items, query, local)
        if tested is not None:
            if len(query.expressions) != 1 or isinstance(query.expressions[0], exp.Star):
                raise self.error("IN (subquery) needs a subquery of one column", query)
            chosen = query.expressions[0]
            chosen = chosen.this if isinstance(chosen, exp.Alias) else chosen
            if negated:
                return self.not_in(outer, inner, pairs, (tested, chosen), term)
            pairs.append((tested, chosen))
        if not pairs:
            # Uncorrelated: every outer row is kept (EXISTS) or dropped (NOT EXISTS) by
            # whether the subquery has a row at all, a join on one constant key.
            pairs.append(_CONSTANT_KEY)
        return self.semi_or_anti(outer, inner, pairs, anti=negated, node=term)

    def subquery_parts(
        self, term: exp.Expression
    ) -> tuple[bool, exp.Expression, exp.Expression | None]:
        """Of ``[NOT] EXISTS (q)`` or ``x [NOT] IN (q)``: whether it is negated, the query
        ``q`` (parentheses removed) and the tested value ``x`` (None for EXISTS)."""
        negated = isinstance(term, exp.Not)
        inner_term = term.this if negated else term
        while isinstance(inner_term, exp.Paren):
            inner_term = inner_term.this
        if isinstance(inner_term, exp.Exists):
            query, tested = inner_term.this, None
        elif isinstance(inner_term, exp.In) and inner_term.args.get("query") is not None:
            query, tested = inner_term.args["query"], inner_term.this
        else:
            raise self.error(f"subquery in {sql_text(term)} is not supported here", term)
        while isinstance(query, exp.Subquery):
            query = query.this
        return negated, query, tested

    def correlation(
        self, outer: _From, query: exp.Expression, items: list[tuple[_From, exp.Join | None]]
    ) -> tuple[list[exp.Expression], list[tuple[exp.Expression, exp.Expression]]]:
        """A WHERE subquery's conditions split into those on its own rows alone and the
        equalities that correlate it, as (outer, inner) pairs; any other reference to
        an outer column is refused."""
        inner_fields = Scalars(self.view, [f for item, _ in items for f in item.fields])
        outer_fields = Scalars(self.view, outer.fields)

        def side(expression: exp.Expression) -> str:
            """ "inner", "outer" or "both"/"none", by where its columns resolve."""
            found = set()
            for reference in column_refs(expression):
                try:
                    inner_fields.resolve(reference)
                    found.add("inner")
                except SqlError:
                    outer_fields.resolve(reference)  # unknown in both: raises there
                    found.add("outer")
            return found.pop() if len(found) == 1 else ("both" if found else "none")

        local: list[exp.Expression] = []
        pairs: list[tuple[exp.Expression, exp.Expression]] = []
        where = query.args.get("where")
        for part in conjuncts(where.this) if where is not None else []:
            if _has_subquery(part):
                raise self.error("a subquery inside a WHERE subquery is not supported", part)
            if side(part) in ("inner", "none"):
                local.append(part)
                continue
            a, b = part.this, part.expression
            ends = (side(a), side(b)) if isinstance(part, exp.EQ) else None
            if ends == ("outer", "inner"):
                pairs.append((a, b))
            elif ends == ("inner", "outer"):
                pairs.append((b, a))
            else:
                raise self.error(
                    "a correlated subquery may compare outer columns only by equality "
                    f"(found {sql_text(part)})",
                    part,
                )
        return local, pairs

    def uncorrelated_in(
        self,
        outer: _From,
        tested: exp.Expression,
        query: exp.Expression,
        term: exp.Expression,
        *,
        negated: bool = False,
    ) -> _From:
        """``x [NOT] IN (query)`` where the query is a whole query of its own (grouped, a
        set operation, with a CTE): the query's one column, semi-joined on equality with x
        (``not_in`` for NOT IN). Such a query cannot read the outer row; one that tries
        names an unknown column."""
        relation = self.query(query)
        if len(relation.names) != 1:
            raise self.error(
                f"IN (subquery) needs a subquery of one column, not {len(relation.names)}", query
            )
        qualifier = f"__in_{next(self._serial)}"
        inner = self.as_from(relation, qualifier, query)
        column = exp.column(relation.names[0], table=qualifier)
        if negated:
            return self.not_in(outer, inner, [], (tested, column), term)
        return self.semi_or_anti(outer, inner, [(tested, column)], anti=False, node=term)

    def not_in(
        self,
        outer: _From,
        inner: _From,
        correlation: list[tuple[exp.Expression, exp.Expression]],
        tested: tuple[exp.Expression, exp.Expression],
        term: exp.Expression,
    ) -> _From:
        """``x NOT IN (subquery)`` with SQL's NULL rule, as Spark's null-aware anti-join.

        Per outer row, the subquery's rows that match its correlation (all of them when
        uncorrelated, keyed then by one constant) form a group G. The row is kept when G
        is empty; otherwise only when x is not NULL, no value of G equals x and none is
        NULL (``x <> NULL`` is NULL, which WHERE drops). So the result is the rows whose
        group is empty (an anti-join with the groups that have rows), plus the rows with
        x not NULL that have a group (semi-join), no equal value in it (anti-join on the
        correlation and x) and no NULL in it (anti-join with the groups holding a NULL).
        The two parts never share a row, and each is built of incremental joins: a
        change that empties or fills a group, or brings it a NULL, changes every outer
        row of the group, as the rule says it must."""
        pairs = [*(correlation or [_CONSTANT_KEY]), tested]
        sides = self.keyed_sides(outer, inner, pairs, term)
        left, right = sides.left, sides.right
        left_group, left_value = sides.left_keys[:-1], sides.left_keys[-1]
        right_group, right_value = sides.right_keys[:-1], sides.right_keys[-1]

        def build() -> Stream:
            groups = right.select(*right_group).distinct()
            with_null = right.filter(col(right_value).is_null()).select(*right_group).distinct()
            empty_group = left.anti_join(groups, left_on=left_group, right_on=right_group)
            checked = (
                left.filter(col(left_value).is_not_null())
                .anti_join(right, left_on=sides.left_keys, right_on=sides.right_keys)
                .semi_join(groups, left_on=left_group, right_on=right_group)
                .anti_join(with_null, left_on=left_group, right_on=right_group)
            )
            return empty_group.plus(checked)

        return self.outer_rows(self.build(build, term), outer)

    def semi_or_anti(
        self,
        outer: _From,
        inner: _From,
        pairs: list[tuple[exp.Expression, exp.Expression]],
        *,
        anti: bool,
        node: exp.Expression,
    ) -> _From:
        sides = self.keyed_sides(outer, inner, pairs, node)
        outer_stream, inner_stream = sides.left, sides.right
        outer_keys, inner_keys = sides.left_keys, sides.right_keys
        method = "anti_join" if anti else "semi_join"
        stream = self.build(
            lambda: getattr(outer_stream, method)(
                inner_stream, left_on=outer_keys, right_on=inner_keys
            ),
            node,
        )
        return self.outer_rows(stream, outer)

    def outer_rows(self, stream: Stream, outer: _From) -> _From:
        """The outer rows a subquery condition kept, without the key columns it added."""
        if len(stream.columns) != len(outer.stream.columns):
            stream = stream.select(*outer.stream.columns)
        return _From(stream, outer.fields)

    def projection(
        self, items: Sequence[exp.Expression], scalars: Scalars, schema: Schema
    ) -> dict[str, Expr]:
        """The select list as output name -> expression (``*`` and ``t.*`` expanded)."""
        columns: dict[str, Expr] = {}

        def add(name: str, expr: Expr, item: exp.Expression) -> None:
            if name in columns:
                raise self.error(f"column name {name!r} appears twice in the select list", item)
            self.type_of(schema, expr, item)
            columns[name] = expr

        for index, item in enumerate(items):
            if isinstance(item, exp.Star) or (
                isinstance(item, exp.Column) and isinstance(item.this, exp.Star)
            ):
                qualifier = item.table.lower() if isinstance(item, exp.Column) else None
                fields = [f for f in scalars.fields if qualifier in (None, f.qualifier)]
                if not fields:
                    raise self.error(f"{sql_text(item)} matches no relation", item)
                for field in fields:
                    add(field.name, col(field.column), item)
                continue
            if isinstance(item, exp.Alias):
                add(item.alias, scalars(item.this), item)
            elif isinstance(item, exp.Column):
                add(item.name, scalars(item), item)
            else:
                add(f"_c{index}", scalars(item), item)
        return columns

    # --- FROM and joins --------------------------------------------------------------------
    def from_items(self, node: exp.Select) -> list[tuple[_From, exp.Join | None]]:
        source = node.args.get("from_")
        if source is None:
            raise self.error("a query without FROM is not supported", node)
        items = [(self.from_item(source.this), None)]
        for join in node.args.get("joins") or []:
            kind = (join.kind or "").upper()
            if kind not in ("", "INNER", "CROSS", "OUTER"):
                raise self.error(f"{kind} JOIN is not supported", join)
            if join.args.get("using"):
                raise self.error("JOIN ... USING is not supported; write ON a = b", join)
            items.append((self.from_item(join.this), join))
        return items

    def from_item(self, node: exp.Expression) -> _From:
        if isinstance(node, exp.Table):
            relation = self.table(node)
            alias = node.alias_or_name
        elif isinstance(node, exp.Subquery):
            relation = self.query(node.this)
            alias = node.alias
            if node.args.get("alias") is not None and node.args["alias"].columns:
                relation = self.renamed(
                    relation, [c.name for c in node.args["alias"].columns], node
                )
        else:
            raise self.error(f"{sql_text(node)} is not supported in FROM", node)
        return self.as_from(relation, alias.lower() if alias else None, node)

    def as_from(self, relation: Relation, qualifier: str | None, node: exp.Expression) -> _From:
        """``relation`` as a FROM item: its columns under fresh internal names."""
        internal = {name: self.fresh(name) for name in relation.names}
        stream = self.build(
            lambda: relation.stream.select(**{internal[n]: col(n) for n in relation.names}), node
        )
        schema = relation.stream.schema
        return _From(
            stream,
            [Field(qualifier, n, internal[n], schema.type_of(n)) for n in relation.names],
        )

    def table(self, node: exp.Table) -> Relation:
        name = node.name.lower()
        if node.args.get("db") is not None:
            raise self.error(f"unknown table {sql_text(node)}", node)
        for scope in reversed(self.ctes):
            if name in scope:
                return scope[name]
        if name in self.tables:
            return self.tables[name]
        known = ", ".join(sorted({*self.tables, *(n for s in self.ctes for n in s)}))
        raise self.error(f"unknown table {node.name!r} (known: {known})", node)

    def join_all(
        self,
        items: list[tuple[_From, exp.Join | None]],
        node: exp.Select,
        where: list[exp.Expression],
    ) -> _From:
        """Join the ``FROM`` items left to right. ``where``'s terms are used up here:
        pushed to the one relation they read (unless an outer join may pad it with
        NULLs, which a filter below the join would not see), taken as join keys, or
        applied last."""
        everything = Scalars(self.view, [f for item, _ in items for f in item.fields])
        owner = {f: index for index, (item, _) in enumerate(items) for f in item.fields}

        def readers(term: exp.Expression) -> set[int]:
            return {owner[everything.resolve(c)] for c in column_refs(term)}

        padded: set[int] = set()  # relations an outer join may pad with NULLs
        for index, (_, join) in enumerate(items):
            side = _side(join)
            if side in ("LEFT", "FULL"):
                padded.add(index)
            if side in ("RIGHT", "FULL"):
                padded.update(range(index))
        pending = list(where)
        relations = []
        for index, (item, _) in enumerate(items):
            local = [t for t in pending if index not in padded and readers(t) == {index}]
            pending = [t for t in pending if t not in local]
            relations.append(self.filtered(item, local))
        joined = relations[0]
        for index in range(1, len(items)):
            join = items[index][1]
            assert join is not None
            side = _side(join)
            terms = conjuncts(join.args.get("on"))
            if join.args.get("on") is None:
                terms = pending  # FROM a, b / CROSS JOIN: the keys come from WHERE
            done = set(range(index))
            keys, rest = [], []
            for term in terms:
                pair = self.key_pair(term, readers, done, index)
                (keys if pair else rest).append(pair or term)
            if terms is pending:
                pending, rest = rest, []
            if not keys:
                raise self.error(
                    "a join needs an equality between its two sides (a cross join or a "
                    "non-equi join is not supported)",
                    join,
                )
            right = relations[index]
            if side:
                preserved, padded_rest = self.outer_conditions(side, rest, readers, done, index)
                keys.extend(preserved)
                if side == "LEFT":
                    right = self.filtered(right, padded_rest)
                elif side == "RIGHT":
                    joined = self.filtered(joined, padded_rest)
                rest = []
            joined = self.equi_join(joined, right, keys, join, side or "INNER")
            joined = self.filtered(joined, rest)
        return self.filtered(joined, pending)

    def outer_conditions(
        self,
        side: str,
        terms: list[exp.Expression],
        readers: Any,
        done: set[int],
        index: int,
    ) -> tuple[list[tuple[exp.Expression, exp.Expression]], list[exp.Expression]]:
        """The ``ON`` conditions of an outer join besides its equalities, as key pairs
        and the terms that filter the padded side. A condition on the side the join pads
        with NULLs filters that side before the join (the caller does it: a row it drops
        would only have been padded). A condition on a side the join preserves decides
        whether a row may match at all, not whether it stays: its rows that fail it
        stay, padded. That is one more key, the condition (FALSE when NULL) equal to
        TRUE, returned as ``(left, right)`` pairs. A condition that reads both sides, or
        neither, is refused."""
        padded = _padded(side, done, index)
        on_padded: list[exp.Expression] = []
        preserved: dict[str, list[exp.Expression]] = {"left": [], "right": []}
        for term in terms:
            read = readers(term)
            if read and read <= padded:
                on_padded.append(term)
                continue
            if read and read <= done:
                preserved["left"].append(term)
            elif read and read <= {index}:
                preserved["right"].append(term)
            else:
                raise self.error(
                    f"{side} OUTER JOIN ... ON may hold only equalities between the sides "
                    "and conditions on one side",
                    term,
                )
        pairs = []
        for which, held in preserved.items():
            if not held:
                continue
            condition = reduce(lambda a, b: exp.And(this=a, expression=b), held)
            flag = exp.Coalesce(this=exp.Paren(this=condition), expressions=[exp.false()])
            pairs.append((flag, exp.true()) if which == "left" else (exp.true(), flag))
        return pairs, on_padded

    def key_pair(
        self, term: exp.Expression, readers: Any, done: set[int], index: int
    ) -> tuple[exp.Expression, exp.Expression] | None:
        """``(left side, right side)`` when ``term`` equates an expression of the
        relations joined so far with one of relation ``index``."""
        if not isinstance(term, exp.EQ):
            return None
        a, b = term.this, term.expression
        left, right = readers(a), readers(b)
        if left and right and left <= done and right == {index}:
            return a, b
        if left and right and right <= done and left == {index}:
            return b, a
        return None

    def equi_join(
        self,
        left: _From,
        right: _From,
        keys: list[tuple[exp.Expression, exp.Expression]],
        node: exp.Expression | None,
        how: str = "INNER",
    ) -> _From:
        """``left`` joined with ``right`` on ``keys`` (an inner, ``LEFT``, ``RIGHT`` or
        ``FULL`` join). The builder's join drops the key columns of the side it looks
        keys up in; in an inner join those fields read the other side's key (equal by
        the join), in an outer join the keys are copies and the columns stay."""
        sides = self.keyed_sides(
            left, right, keys, node, copy_left=how == "RIGHT", copy_right=how != "INNER"
        )
        left_stream, right_stream = sides.left, sides.right
        left_keys, right_keys, redirect = sides.left_keys, sides.right_keys, sides.redirect
        if how == "RIGHT":
            stream = self.build(
                lambda: right_stream.left_join(left_stream, left_on=right_keys, right_on=left_keys),
                node,
            )
        else:
            method = {"INNER": "join", "LEFT": "left_join", "FULL": "full_join"}[how]
            stream = self.build(
                lambda: getattr(left_stream, method)(
                    right_stream, left_on=left_keys, right_on=right_keys
                ),
                node,
            )
        fields = [
            Field(f.qualifier, f.name, redirect.get(f.column, f.column), f.type)
            for f in [*left.fields, *right.fields]
        ]
        return _From(stream, fields)

    def keyed_sides(
        self,
        left: _From,
        right: _From,
        pairs: list[tuple[exp.Expression, exp.Expression]],
        node: exp.Expression | None,
        *,
        copy_left: bool = False,
        copy_right: bool = False,
    ) -> _KeyedSides:
        """Both sides with a column per key of ``pairs`` (``(left expression, right
        expression)``), cast to their common type; see ``key_column`` for ``copy_*``."""
        left_scalars = Scalars(self.view, left.fields)
        right_scalars = Scalars(self.view, right.fields)
        left_extra: dict[str, Expr] = {}
        right_extra: dict[str, Expr] = {}
        sides = _KeyedSides(left.stream, right.stream, [], [], {})
        for a, b in pairs:
            ea, eb = left_scalars(a), right_scalars(b)
            ta = self.type_of(left.stream.schema, ea, a)
            tb = self.type_of(right.stream.schema, eb, b)
            common = unify(ta, tb)
            if common is None:
                raise self.error(f"cannot compare {ta} with {tb} in {sql_text(a.parent)}", a)
            sides.left_keys.append(self.key_column(ea, ta, common, left_extra, copy=copy_left))
            right_key = self.key_column(eb, tb, common, right_extra, copy=copy_right)
            sides.right_keys.append(right_key)
            if right_key not in right_extra:  # a column a join drops: the left's has it
                sides.redirect[right_key] = sides.left_keys[-1]
        sides.left = self.with_extra(left.stream, left_extra, node)
        sides.right = self.with_extra(right.stream, right_extra, node)
        return sides

    def key_column(
        self, expr: Expr, kind: str, common: str, extra: dict[str, Expr], *, copy: bool = False
    ) -> str:
        """The column holding a join key: the column itself, or a computed one (always
        a computed one with ``copy``, so that the column itself stays in the output)."""
        if kind == common and isinstance(expr, Column) and not copy:
            return expr.name
        name = self.fresh("key")
        extra[name] = expr if kind == common else expr.cast(common)
        return name

    def with_extra(self, stream: Stream, extra: dict[str, Expr], node: Any) -> Stream:
        if not extra:
            return stream
        return self.build(lambda: stream.with_columns(**extra), node)

    def filtered(self, item: _From, terms: Sequence[exp.Expression]) -> _From:
        if not terms:
            return item
        scalars = Scalars(self.view, item.fields)
        translated = []
        for term in terms:
            translated.append(scalars(term))
            self.expect_boolean(item.stream.schema, translated[-1], term)
        predicate = reduce(lambda a, b: a & b, translated)
        return _From(self.build(lambda: item.stream.filter(predicate), terms[0]), item.fields)

    # --- GROUP BY and aggregates ------------------------------------------------------------
    def aggregate(self, node: exp.Select, joined: _From, scalars: Scalars) -> Relation:
        items = list(node.expressions)
        group = node.args.get("group")
        group_nodes = list(group.expressions) if group is not None else []
        group_nodes = [self.group_item(g, items) for g in group_nodes]
        having = node.args.get("having")
        calls: list[exp.Expression] = []
        for part in [*items, *([having.this] if having is not None else [])]:
            for found in _aggregate_calls(part):
                if not any(found == seen for seen in calls):
                    calls.append(found)
        before: dict[str, Expr] = {}
        keys: dict[str, str] = {}  # repr of the key expression -> its column
        for g in group_nodes:
            expr = scalars(g)
            if repr(expr) not in keys:
                name = self.fresh(g.name if isinstance(g, exp.Column) else "key")
                keys[repr(expr)] = name
                before[name] = expr
        results: list[tuple[exp.Expression, str]] = []
        specs = {}
        # result column -> (aggregate, argument column), for each AGG(DISTINCT x)
        distinct_aggs: dict[str, tuple[str, str]] = {}
        for found in calls:
            name = self.fresh(_AGGREGATES[type(found)])
            if isinstance(found.this, exp.Distinct):
                distinct_aggs[name] = self.distinct_argument(found, scalars, before)
            else:
                specs[name] = self.aggregation(found, scalars, before)
            results.append((found, name))
        group_columns = list(keys.values())
        if group is None and distinct_aggs:
            # The parts are joined on the group: a global aggregate gets a constant one.
            group_columns = [self.fresh("all")]
            before[group_columns[0]] = lit(1)
        if not before:
            before[self.fresh("one")] = lit(1)  # a global aggregate of count(*) only
        stream = self.build(lambda: joined.stream.select(**before), node)
        grouped = self.grouped(stream, group_columns, specs, distinct_aggs, node)
        if group is None:
            kinds = {name: spec.kind for name, spec in specs.items()}
            kinds.update({name: kind for name, (kind, _) in distinct_aggs.items()})
            if distinct_aggs:  # without the constant group column
                grouped = grouped.select(*[name for _, name in results])
            grouped = self.keep_empty_row(grouped, kinds, node)

        def hook(part: exp.Expression) -> Expr | None:
            for found, name in results:
                if part == found:
                    return col(name)
            if isinstance(part, (exp.Literal, exp.Boolean, exp.Null)):
                return None
            try:
                expr = scalars(part)
            except SqlError:
                if isinstance(part, exp.Column):
                    raise
                return None
            if repr(expr) in keys:
                return col(keys[repr(expr)])
            if isinstance(part, exp.Column):
                raise self.error(
                    f"column {sql_text(part)} must be in GROUP BY or inside an aggregate", part
                )
            return None

        after = Scalars(self.view, [], hook, grouped.schema)
        if having is not None:
            predicate = after(having.this)
            self.expect_boolean(grouped.schema, predicate, having.this)
            grouped = self.build(lambda: grouped.filter(predicate), having)
        columns = self.projection(items, after, grouped.schema)
        out = self.build(lambda: grouped.select(**columns), node)
        if node.args.get("distinct"):
            out = out.distinct()
        return Relation(out, list(columns))

    def group_item(self, item: exp.Expression, select: Sequence[exp.Expression]) -> exp.Expression:
        """A ``GROUP BY`` item: ``GROUP BY 1`` and a select alias mean that select item."""
        if isinstance(item, exp.Literal) and not item.is_string:
            position_ = int(item.this)
            if not 1 <= position_ <= len(select):
                raise self.error(
                    f"GROUP BY {position_}: the select list has {len(select)} items", item
                )
            chosen = select[position_ - 1]
            return chosen.this if isinstance(chosen, exp.Alias) else chosen
        if isinstance(item, exp.Column) and not item.table:
            for chosen in select:
                if isinstance(chosen, exp.Alias) and chosen.alias.lower() == item.name.lower():
                    return chosen.this
        return item

    def grouped(
        self,
        stream: Stream,
        group: list[str],
        specs: dict[str, aggs.Aggregation],
        distinct_aggs: Mapping[str, tuple[str, str]],
        node: exp.Expression,
    ) -> Stream:
        """The aggregate of ``stream`` by ``group``: ``specs``, and each ``AGG(DISTINCT
        argument)`` as that aggregate of the group's distinct arguments (an aggregate
        over the distinct ``(group, argument)`` pairs: ``COUNT`` counts the non-NULL
        ones, ``SUM`` and ``AVG`` see each value once). The parts are joined on the
        group, NULL equal to NULL (every part has every group)."""
        parts = []
        if specs or not distinct_aggs:
            parts.append(self.build(lambda: stream.aggregate(by=group, **specs), node))
        for name, (kind, argument) in distinct_aggs.items():
            pairs = self.build(lambda a=argument: stream.select(*group, a).distinct(), node)
            counted = _BUILDERS[kind](col(argument))
            parts.append(
                self.build(lambda p=pairs, n=name, c=counted: p.aggregate(by=group, **{n: c}), node)
            )
        result = parts[0]
        if len(parts) == 1:
            return result
        left_keys = self.null_safe_keys(result.schema, group, node)
        result = result.with_columns(**left_keys)
        for part in parts[1:]:
            right_keys = self.null_safe_keys(part.schema, group, node)
            values = [n for n in part.columns if n not in group]
            keyed = part.select(**right_keys, **{n: col(n) for n in values})
            result = self.build(
                lambda k=keyed, r=right_keys, so_far=result: so_far.join(
                    k, left_on=list(left_keys), right_on=list(r)
                ),
                node,
            )
        return result

    def null_safe_keys(
        self, schema: Schema, columns: Sequence[str], node: exp.Expression
    ) -> dict[str, Expr]:
        """Per column, a flag "is NULL" and the value with NULL replaced: equal keys mean
        equal columns, NULL equal to NULL (what GROUP BY and set operations compare)."""
        keys: dict[str, Expr] = {}
        for name in columns:
            kind = schema.type_of(name)
            if kind not in _NULL_STAND_INS:
                raise self.error(f"grouping or comparing a {kind} column is not supported", node)
            keys[self.fresh(f"{name}_null")] = col(name).is_null()
            keys[self.fresh(f"{name}_value")] = call("coalesce", col(name), _NULL_STAND_INS[kind])
        return keys

    def distinct_argument(
        self, call_: exp.Expression, scalars: Scalars, before: dict[str, Expr]
    ) -> tuple[str, str]:
        """``AGG(DISTINCT x)``'s aggregate and the column holding its ``x``."""
        kind = _AGGREGATES[type(call_)]
        arguments = call_.this.expressions
        if len(arguments) != 1:
            raise self.error(
                f"{kind.upper()}(DISTINCT ...) of several columns is not supported", call_
            )
        if _aggregate_calls(arguments[0]):
            raise self.error(f"an aggregate inside an aggregate: {sql_text(call_)}", call_)
        column = self.fresh("distinct")
        before[column] = scalars(arguments[0])
        return kind, column

    def aggregation(
        self, call: exp.Expression, scalars: Scalars, before: dict[str, Expr]
    ) -> aggs.Aggregation:
        kind = _AGGREGATES[type(call)]
        argument = call.this
        if kind == "count" and (argument is None or isinstance(argument, exp.Star)):
            return aggs.count()
        if _aggregate_calls(argument):
            raise self.error(f"an aggregate inside an aggregate: {sql_text(call)}", call)
        column = self.fresh("arg")
        before[column] = scalars(argument)
        return _BUILDERS[kind](col(column))

    def keep_empty_row(
        self, grouped: Stream, kinds: Mapping[str, str], node: exp.Expression
    ) -> Stream:
        """An aggregate without ``GROUP BY``: one row also over no input (``COUNT`` 0,
        the others NULL). ``kinds`` names each column's aggregate."""
        schema = grouped.schema
        defaults = {name: (0 if kinds[name] == "count" else None) for name in schema.names}
        marker = {
            name: lit(value) if value is not None else lit(None).cast(schema.type_of(name))
            for name, value in defaults.items()
        }
        default_row = tuple(defaults[name] for name in schema.names)
        constant = self.circuit.constant(dict(schema.fields), [(default_row, 1)])
        return self.build(lambda: grouped.plus(constant).minus(grouped.select(**marker)), node)

    # --- helpers ----------------------------------------------------------------------------
    def type_of(self, schema: Schema, expr: Expr, node: exp.Expression) -> str:
        """``expr``'s type; a type error is told in terms of the SQL at ``node``."""
        try:
            return infer_type(expr, schema, sql_text(node))
        except ExpressionError as error:
            # The message ends with the circuit expression, whose columns are internal.
            raise self.error(str(error).rsplit(" in ", 1)[0], node) from None

    def expect_boolean(self, schema: Schema, expr: Expr, node: exp.Expression) -> None:
        kind = self.type_of(schema, expr, node)
        if kind not in (BOOLEAN, "null"):
            raise self.error(f"{sql_text(node)} is a {kind}, not a condition", node)

    def build(self, make: Any, node: exp.Expression | None) -> Stream:
        """Run a builder call; its errors (types, names) become errors at ``node``."""
        try:
            return make()
        except SqlError:
            raise
        except CircuitError as error:
            raise self.error(str(error), node) from None


def _live_stream(circuit: Circuit, name: str, node_id: int) -> Stream:
    """A source as SQL sees it: an upsert source's live rows, a Z-set source itself."""
    if circuit.node(node_id).op == "upsert_source":
        for node in circuit.nodes:
            if node.op == "upsert_live" and node.inputs == (node_id,):
                return Stream(circuit, node.id)
        raise CircuitError(f"upsert source {name!r} has no live stream")
    return Stream(circuit, node_id)


def _side(join: exp.Join | None) -> str:
    """``LEFT``, ``RIGHT`` or ``FULL`` for an outer join, else the empty string."""
    return (join.side or "").upper() if join is not None else ""


def _references(node: exp.Expression, table: str) -> bool:
    return any(t.name.lower() == table.lower() for t in node.find_all(exp.Table))


def _union_branches(node: exp.Expression) -> list[exp.Expression] | None:
    """The branches of a chain of ``UNION`` (distinct); None if any is ``UNION ALL``."""
    if isinstance(node, exp.Subquery):
        return _union_branches(node.this)
    if isinstance(node, exp.Union):
        if not node.args.get("distinct"):
            return None
        left, right = _union_branches(node.this), _union_branches(node.expression)
        if left is None or right is None:
            return None
        return left + right
    return [node]


def _aggregate_calls(node: exp.Expression) -> list[exp.Expression]:
    """The outermost aggregate calls in ``node`` (window functions excluded)."""
    found: list[exp.Expression] = []

    def visit(part: exp.Expression) -> None:
        if isinstance(part, (exp.Window, exp.Select, exp.Subquery)):
            return
        if type(part) in _AGGREGATES:
            found.append(part)
            return
        for child in part.iter_expressions():
            visit(child)

    visit(node)
    return found


def _has_subquery(node: exp.Expression) -> bool:
    return any(True for _ in node.find_all(exp.Select))
