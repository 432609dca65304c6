"""``explain``: what an epoch of a circuit will cost, read from the planner's own plan.

A user who wrote views in SQL sees operators only through their cost, so this prints
the plan (``circuit.planner.plan``) as the engines run it: per view, the stages it needs
in the order an epoch runs them, each operator of a stage with what it keeps. An
operator that keeps *state* appends its input to traces (``planner.trace_keys``) and
reads them back for the keys its change touches, so the trace keys say what a change
costs; *linear* work reads nothing but the change itself. Loops (``WITH RECURSIVE``)
are shown as blocks of the stages one iteration runs.

Columns are named where they come from (``orders.o_custkey``, an aggregate over them,
or a loop's ``reach_r.node``), not by the internal names the SQL compiler gives every
column so that self-joins cannot clash. Any circuit can be explained, SQL or Python.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable, Sequence
from datetime import date, datetime
from decimal import Decimal
from typing import Any

from dbspark.circuit.builder import LOOP_OPS, SOURCE_OPS, STATEFUL_OPS, Circuit, Node
from dbspark.circuit.expressions import BinaryOp, Call, Cast, Column, Expr, Literal, UnaryOp
from dbspark.circuit.planner import Plan, Stage, plan, trace_keys

#: How wide a line may be; how long a condition may print before it is cut.
_LINE = 100
_WIDTH = 160
_SQL_OPS = {"==": "=", "and": "AND", "or": "OR"}


def explain(circuit: Circuit) -> str:
    """The plan of ``circuit`` as text: sources, then each view's stages, operators,
    traces (keyed by which columns), loops and linear work. Raises ``CircuitError`` if
    the circuit does not plan."""
    return "\n".join(_Explainer(circuit).lines())


class _Explainer:
    def __init__(self, circuit: Circuit) -> None:
        self.circuit = circuit
        self.plan: Plan = plan(circuit)
        self.origins = _Origins(circuit)
        self.needs = {
            view: self._upstream(self.plan.node_stage[node_id])
            for view, node_id in circuit.views.items()
        }

    def lines(self) -> list[str]:
        circuit, the_plan = self.circuit, self.plan
        traces = sum(len(trace_keys(circuit, n)) for n in circuit.nodes if n.op in STATEFUL_OPS)
        states = sum(1 for n in circuit.nodes if n.op == "upsert_source")
        counts = [
            _count(len(circuit.sources), "source"),
            _count(len(circuit.views), "view"),
            _count(len(the_plan.stages), "stage"),
            *([_count(len(the_plan.loops), "loop")] if the_plan.loops else []),
            _count(traces, "trace"),
            _count(states, "upsert state"),
        ]
        out = [
            f"circuit {circuit.name}: {', '.join(counts)}",
            "Each epoch runs every stage once, by number (a loop's once per iteration); outside",
            "loops a stage is one Airflow task named as here (a source's is ingest.<source>).",
            "state: the operator appends its input to traces and reads them back for the keys",
            "the change touches. linear: it reads the change and nothing else.",
            "",
            "sources",
        ]
        shown: dict[int, str] = {}  # stage id -> the view it was shown under
        for stage in the_plan.stages:
            if self.circuit.node(stage.anchor).op in SOURCE_OPS:
                readers = [v for v, needed in self.needs.items() if stage.id in needed]
                read_by = f"read by {', '.join(readers)}" if readers else "read by no view"
                out.extend(self._stage(stage, "  ", note=read_by))
                shown[stage.id] = "sources"
        for view, needed in self.needs.items():
            own = [s for s in sorted(needed) if s not in shown]
            earlier: dict[str, list[str]] = {}
            for s in sorted(needed):
                if shown.get(s) not in (None, "sources"):
                    earlier.setdefault(shown[s], []).append(str(s))
            out.append("")
            out.append(f"view {view}: {self._summary(own)}")
            if earlier:
                shared = "; ".join(f"{', '.join(ids)} of view {v}" for v, ids in earlier.items())
                out.append(f"  also reads stages {shared}")
            result = self.plan.node_stage[circuit.views[view]]
            if result not in own:
                under = "sources" if shown[result] == "sources" else f"view {shown[result]}"
                out.append(f"  computed in stage {result}, shown under {under}")
            out.extend(self._block(own, 0, "  "))
            shown.update(dict.fromkeys(own, view))
        return out

    # --- what a view needs -------------------------------------------------------------
    def _upstream(self, stage_id: int) -> set[int]:
        """``stage_id`` and every stage it reads, directly or not (loop feedback too)."""
        seen: set[int] = set()
        todo = [stage_id]
        while todo:
            current = todo.pop()
            if current not in seen:
                seen.add(current)
                todo.extend(self.plan.node_stage[n] for n in self.plan.stages[current].inputs)
        return seen

    def _summary(self, stage_ids: Sequence[int]) -> str:
        if not stage_ids:
            return "no stage of its own"
        stateful = [s for s in stage_ids if self._keeps_state(self.plan.stages[s])]
        traces = sum(
            len(trace_keys(self.circuit, self.circuit.node(n)))
            for s in stateful
            for n in self.plan.stages[s].nodes
        )
        loops = {self.plan.stages[s].scope for s in stage_ids} - {0}
        text = (
            f"{_count(len(stage_ids), 'stage')}, {len(stateful)} keeping state "
            f"({_count(traces, 'trace')}), {len(stage_ids) - len(stateful)} linear"
        )
        return text + (f", {_count(len(loops), 'loop')}" if loops else "")

    def _keeps_state(self, stage: Stage) -> bool:
        return any(_kind(self.circuit.node(n)) == "state" for n in stage.nodes)

    # --- printing ------------------------------------------------------------------------
    def _block(self, stage_ids: Sequence[int], scope: int, indent: str) -> list[str]:
        """The stages of ``stage_ids`` in ``scope``, in plan order; those inside a loop
        nested in ``scope`` as that loop's block, where its first stage would be."""
        out: list[str] = []
        opened: set[int] = set()
        for stage_id in stage_ids:
            stage = self.plan.stages[stage_id]
            loop = self._child_loop(stage.scope, scope)
            if loop is None:
                out.extend(self._stage(stage, indent))
            elif loop not in opened:
                opened.add(loop)
                inside = [s for s in stage_ids if self._within(self.plan.stages[s].scope, loop)]
                out.extend(self._loop_header(loop, inside, indent))
                out.extend(self._block(inside, loop, indent + "  "))
        return out

    def _child_loop(self, stage_scope: int, scope: int) -> int | None:
        """The loop directly inside ``scope`` that holds ``stage_scope`` (None: it is
        ``scope`` itself)."""
        while stage_scope != scope:
            parent = self.circuit.scope(stage_scope).parent
            if parent == scope:
                return stage_scope
            assert parent is not None, "a stage outside the scope being printed"
            stage_scope = parent
        return None

    def _within(self, stage_scope: int | None, loop: int) -> bool:
        while stage_scope is not None:
            if stage_scope == loop:
                return True
            stage_scope = self.circuit.scope(stage_scope).parent
        return False

    def _loop_header(self, scope_id: int, inside: Sequence[int], indent: str) -> list[str]:
        loop = self.plan.loops[scope_id]
        where = (
            f"in Airflow, loop_{loop.name}.iterate runs one iteration per task"
            if self.circuit.scope(scope_id).parent == 0
            else "within each iteration of the loop around it"
        )
        text = (
            f"loop {loop.name}: each iteration runs stages {', '.join(map(str, inside))} "
            f"until one changes nothing (at most {loop.max_iterations}); {where}. Its traces "
            "keep a time per iteration: an epoch iterates at least as deep as earlier epochs did "
            "for the keys it touches."
        )
        return textwrap.wrap(
            text, width=_LINE, initial_indent=indent, subsequent_indent=indent + "    "
        )

    def _stage(self, stage: Stage, indent: str, note: str = "") -> list[str]:
        head = f"{indent}stage {stage.id} {stage.name}"
        if stage.inputs:
            reads = sorted({self.plan.node_stage[n] for n in stage.inputs})
            head += f" <- {', '.join(map(str, reads))}"
        out = [f"{head}  ({note})" if note else head]
        for node_id in stage.nodes:
            node = self.circuit.node(node_id)
            lead = f"{indent}  {_kind(node):<7}{node.op:<14}"
            detail = self._detail(node)
            views = [v for v, n in self.circuit.views.items() if n == node_id]
            if views:
                published = f"published as view {', '.join(views)}"
                detail = f"{detail}; {published}" if detail else published
            detail = textwrap.wrap(
                detail,
                width=max(_LINE - len(lead), 40),
                break_long_words=False,
                break_on_hyphens=False,
            )
            out.append((lead + (detail[0] if detail else "")).rstrip())
            out.extend(" " * len(lead) + more for more in detail[1:])
        return out

    def _detail(self, node: Node) -> str:
        """What ``node`` does, and for state, which traces it keeps and by what."""
        circuit, op, params = self.circuit, node.op, node.params
        origins = self.origins
        if op == "upsert_source":
            (key,) = trace_keys(circuit, node)
            latest = ", ".join(params["watermark"])
            return f"state by ({', '.join(key)}): per key the row with the greatest {latest}"
        if op == "zset_source":
            return "its batch of weighted rows is its change"
        if op == "join":
            left, right = (
                self._columns(input_id, keys)
                for input_id, keys in zip(node.inputs, trace_keys(circuit, node), strict=True)
            )
            return f"2 traces: left by ({left}), right by ({right})"
        if op == "distinct":
            (keys,) = trace_keys(circuit, node)
            columns = self._columns(node.inputs[0], keys)
            return f"1 trace by all {_count(len(keys), 'column')} ({columns})"
        if op == "aggregate":
            (keys,) = trace_keys(circuit, node)
            kinds = ", ".join(agg.kind for agg in params["aggregations"].values())
            if params["keys"]:
                return f"{kinds}; 1 trace by group ({self._columns(node.inputs[0], keys)})"
            return f"{kinds} without a group; 1 trace by all {_count(len(keys), 'input column')}"
        if op == "select":
            columns = params["columns"]
            computed = sum(1 for e in columns.values() if not isinstance(e, Column))
            return _count(len(columns), "column") + (f", {computed} computed" if computed else "")
        if op == "filter":
            return _cut(origins.expr(node.inputs[0], params["predicate"]))
        if op == "upsert_live":
            return "the live rows (no tombstones)"
        if op == "constant":
            return f"{len(params['rows'])} row(s), arriving at epoch 0 only"
        if op in ("plus", "minus"):
            return "of two changes"
        if op == "enter":
            return "rows from outside the loop"
        if op == "variable":
            return "the loop's rows at the previous iteration"
        if op == "leave":
            return "the loop's result: what its iterations added up to"
        if op == "delay":
            return "the previous epoch's change (kept for one epoch)"
        if op == "join_function" and any(e["epoch"] is not None for e in params["emits"]):
            return "holds output due at later epochs"
        return ""

    def _columns(self, node_id: int, names: Iterable[str]) -> str:
        return ", ".join(self.origins.column(node_id, n) for n in names)


def _kind(node: Node) -> str:
    if node.op in STATEFUL_OPS or node.op == "upsert_source":
        return "state"
    if node.op in LOOP_OPS:
        return "loop"
    if node.op in SOURCE_OPS:
        return "source"
    if node.op == "constant":
        return "const"
    return "linear"


def _count(n: int, thing: str) -> str:
    return f"{n} {thing}" + ("" if n == 1 else "s")


def _cut(text: str, width: int = _WIDTH) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


class _Origins:
    """Where a column of a node comes from: ``source.column`` through renames, joins,
    filters and group keys; an aggregate or expression over such columns; at a loop
    variable, ``loop.column``; otherwise the column's own name."""

    def __init__(self, circuit: Circuit) -> None:
        self.circuit = circuit
        self.memo: dict[tuple[int, str], str] = {}

    def column(self, node_id: int, name: str) -> str:
        key = (node_id, name)
        if key not in self.memo:
            self.memo[key] = name  # a cycle (none is expected) stops at the name
            self.memo[key] = self._trace(self.circuit.node(node_id), name)
        return self.memo[key]

    def _trace(self, node: Node, name: str) -> str:
        op, inputs = node.op, node.inputs
        if op in SOURCE_OPS:
            return f"{node.label}.{name}"
        if op == "select":
            return self.expr(inputs[0], node.params["columns"][name])
        if op == "join":
            left = self.circuit.node(inputs[0])
            return self.column(inputs[0] if name in left.schema.names else inputs[1], name)
        if op == "aggregate":
            if name in node.params["keys"]:
                return self.column(inputs[0], name)
            agg = node.params["aggregations"][name]
            argument = "*" if agg.expr is None else self.expr(inputs[0], agg.expr)
            return f"{agg.kind}({argument})"
        if op in ("plus", "minus"):
            found = {self.column(i, name) for i in inputs}
            return found.pop() if len(found) == 1 else name
        if op == "variable":
            return f"{self.circuit.scope(node.scope).name}.{name}"
        if op == "flat_map" and name == node.params["name"]:
            return name
        if op in ("join_function", "constant") or not inputs:
            return name
        return self.column(inputs[0], name)  # filter, distinct, enter, leave, ...

    def expr(self, node_id: int, expr: Expr) -> str:
        """``expr``, read at the input ``node_id``, as SQL-like text over origins."""
        if isinstance(expr, Column):
            return self.column(node_id, expr.name)
        if isinstance(expr, Literal):
            return _literal(expr.value)
        if isinstance(expr, BinaryOp):
            left, right = self.expr(node_id, expr.left), self.expr(node_id, expr.right)
            return f"({left} {_SQL_OPS.get(expr.op, expr.op)} {right})"
        if isinstance(expr, UnaryOp):
            operand = self.expr(node_id, expr.operand)
            forms = {
                "neg": f"-{operand}",
                "not": f"NOT {operand}",
                "is_null": f"{operand} IS NULL",
                "is_not_null": f"{operand} IS NOT NULL",
            }
            return forms.get(expr.op, f"{expr.op}({operand})")
        if isinstance(expr, Cast):
            return f"CAST({self.expr(node_id, expr.operand)} AS {expr.to})"
        if isinstance(expr, Call):
            return f"{expr.function}({', '.join(self.expr(node_id, a) for a in expr.args)})"
        return repr(expr)


def _literal(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return str(value).upper()
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, datetime):
        return f"TIMESTAMP '{value.isoformat()}'"
    if isinstance(value, date):
        return f"DATE '{value.isoformat()}'"
    if isinstance(value, Decimal):
        return str(value)
    return repr(value)
