"""``python -m dbspark.devtools.engine_demo``: the example circuits, run for several
epochs, explained.

For each named circuit this runs a small scenario and prints, per epoch, what
came in, what each view holds (and what changed), and what every recursive
loop did: how many iterations, the size of the result's delta at each, and why
it stopped. The first epochs of each scenario are scripted to show one idea
each (a late row, an update, a tombstone, deleting an edge inside a cycle,
retractions); with ``--epochs`` beyond the script, more epochs are generated
from a fixed seed, so the output is always the same.

By default the circuits run on the incremental Spark engine (local Spark) with
their traces and SQLite catalog in a warehouse that persists between runs: a
second run of the same epochs does nothing, and ``--epochs`` beyond what is
committed continues from there. ``--engine reference`` runs the in-memory
pure-Python oracle instead.

Every epoch run is checked against full refresh: the reference engine's
from-scratch evaluation of the accumulated inputs (pure Python, independent of
Spark), and the engine's own ``verify`` (a full refresh over the raw input log stored in
the warehouse: for a log this small, by the reference engine in this process). A
difference makes the demo exit 1.

    python -m dbspark.devtools.engine_demo [--epochs N] [--circuit NAME ...]
        [--engine spark|reference] [--warehouse DIR] [--fresh]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dbspark.circuit.builder import Circuit
from dbspark.conformance.engines import get_engine
from dbspark.core.types import Schema
from dbspark.core.zset import ZSet
from dbspark.engine.api import LoopReport
from dbspark.examples.circuits import NAMED_CIRCUITS

Inputs = dict[str, list[Any]]
FullRefresh = Callable[[Circuit, list[Inputs], int], dict[str, ZSet]]

DEFAULT_EPOCHS = 5
DEFAULT_WAREHOUSE = "var/demo-warehouse"


# --- scenarios ---------------------------------------------------------------------


@dataclass
class Scenario:
    """Scripted epochs (what each shows, its inputs) and a generator for any further ones.

    Z-set inputs are ``[(row_tuple, weight), ...]``; upsert inputs are dicts by
    column name (missing columns are NULL), turned into tuples before they run.
    """

    circuit: str
    summary: str
    script: list[tuple[str, Inputs]]
    generate: Callable[[random.Random, int], tuple[str, Inputs]]

    def epochs(self, count: int) -> list[tuple[str, Inputs]]:
        rng = random.Random(f"dbspark-demo-{self.circuit}")
        result = list(self.script[:count])
        for index in range(len(result), count):
            result.append(self.generate(rng, index))
        return result


def _orders_scenario() -> Scenario:
    def customer(cust_id: int, region: str, ts: int, deleted: bool = False) -> dict[str, Any]:
        return {"cust_id": cust_id, "region": region, "ts": ts, "deleted": deleted}

    def order(order_id: int, cust_id: int, amount: int | None, ts: int) -> dict[str, Any]:
        return {"order_id": order_id, "cust_id": cust_id, "amount": amount, "ts": ts}

    script: list[tuple[str, Inputs]] = [
        (
            "two customers and three orders (order 3 has a NULL amount)",
            {
                "customers": [customer(7, "EU", 1), customer(8, "US", 1)],
                "orders": [order(1, 7, 50, 10), order(2, 8, 20, 10), order(3, 7, None, 10)],
            },
        ),
        (
            "update order 1 (ts 20); a late row for order 2 (ts 5 < 10) changes nothing",
            {"orders": [order(1, 7, 70, 20), order(2, 8, 999, 5), order(4, 8, 30, 20)]},
        ),
        (
            "customer 7 moves to US; order 2 gets a tombstone (deleted_at, ts 30)",
            {
                "customers": [customer(7, "US", 2)],
                "orders": [{"order_id": 2, "cust_id": 8, "ts": 30, "deleted_at": 30}],
            },
        ),
        (
            "a late row for order 2 (ts 25) is older than its tombstone: still deleted; "
            "customer 8 is deleted",
            {
                "orders": [order(2, 8, 25, 25)],
                "customers": [customer(8, "US", 3, deleted=True)],
            },
        ),
        (
            "customer 8 comes back in EU (ts 4 > tombstone's 3); order 2 comes back (ts 40)",
            {"customers": [customer(8, "EU", 4)], "orders": [order(2, 8, 15, 40)]},
        ),
    ]

    def generate(rng: random.Random, index: int) -> tuple[str, Inputs]:
        ts = 100 * index  # fresher than anything scripted: no ties
        orders = []
        for order_id in rng.sample(range(1, 8), 3):
            if rng.random() < 0.25:
                orders.append({"order_id": order_id, "ts": ts, "deleted_at": ts})
            else:
                orders.append(order(order_id, rng.choice((7, 8, 9)), rng.randint(1, 99), ts))
        customers = [customer(rng.choice((7, 8, 9)), rng.choice(("EU", "US", "APAC")), ts)]
        return "generated: random order upserts and a customer move", {
            "orders": orders,
            "customers": customers,
        }

    return Scenario("orders", "upserts: updates, late rows, tombstones", script, generate)


def _accounts_scenario() -> Scenario:
    def account(id_: int, status: str, balance: int | None, major: int, minor: int) -> dict:
        return {
            "id": id_,
            "status": status,
            "balance": balance,
            "wm_major": major,
            "wm_minor": minor,
        }

    script: list[tuple[str, Inputs]] = [
        ("open account 1", {"accounts": [account(1, "open", 10, 1, 0)]}),
        (
            "update at watermark (1, 5); a late (0, 9) row loses: (1, 5) > (0, 9)",
            {"accounts": [account(1, "open", 20, 1, 5), account(1, "open", 99, 0, 9)]},
        ),
        (
            "delete: status 'DELETED' is the tombstone",
            {"accounts": [account(1, "DELETED", None, 2, 0)]},
        ),
        ("re-open at (3, 0)", {"accounts": [account(1, "open", 30, 3, 0)]}),
        ("resend the same row: a no-op", {"accounts": [account(1, "open", 30, 3, 0)]}),
    ]

    def generate(rng: random.Random, index: int) -> tuple[str, Inputs]:
        rows = []
        for id_ in rng.sample(range(1, 5), 2):
            status = "DELETED" if rng.random() < 0.3 else rng.choice(("open", "frozen"))
            rows.append(account(id_, status, rng.randint(0, 500), 10 + index, rng.randint(0, 3)))
        return "generated: random account upserts", {"accounts": rows}

    return Scenario("accounts", "upserts with a composite watermark", script, generate)


def _graph_generator(
    source: str, nodes: Sequence[Any], scenario_state: dict[str, Any]
) -> Callable[[random.Random, int], tuple[str, Inputs]]:
    def generate(rng: random.Random, index: int) -> tuple[str, Inputs]:
        present: set[tuple] = scenario_state.setdefault("edges", set())
        changes = []
        for _ in range(2):
            if present and rng.random() < 0.4:
                edge = rng.choice(sorted(present, key=repr))
                present.discard(edge)
                changes.append((edge, -1))
            else:
                edge = (rng.choice(nodes), rng.choice(nodes))
                if edge in present or edge[0] == edge[1]:
                    continue
                present.add(edge)
                changes.append((edge, 1))
        return "generated: random edge insertions and deletions", {source: changes}

    return generate


def _track_edges(state: dict[str, Any], script: list[tuple[str, Inputs]], source: str) -> None:
    edges: set[tuple] = set()
    for _, inputs in script:
        for edge, weight in inputs.get(source, []):
            if weight > 0:
                edges.add(edge)
            else:
                edges.discard(edge)
    state["edges"] = edges


def _reachability_scenario() -> Scenario:
    script: list[tuple[str, Inputs]] = [
        (
            "a cycle a->b->c->a with a tail c->d; root a",
            {
                "edges": [(("a", "b"), 1), (("b", "c"), 1), (("c", "a"), 1), (("c", "d"), 1)],
                "roots": [(("a",), 1)],
            },
        ),
        ("a second cycle c->d->e->c", {"edges": [(("d", "e"), 1), (("e", "c"), 1)]}),
        (
            "delete a->b: the cycle c->d->e->c must not keep itself reachable",
            {"edges": [(("a", "b"), -1)]},
        ),
        ("make c a root", {"roots": [(("c",), 1)]}),
        ("put a->b back, drop e->c", {"edges": [(("a", "b"), 1), (("e", "c"), -1)]}),
    ]
    state: dict[str, Any] = {}
    _track_edges(state, script, "edges")
    generate = _graph_generator("edges", "abcdefg", state)
    return Scenario("reachability", "recursion: deleting an edge in a cycle", script, generate)


def _transitive_closure_scenario() -> Scenario:
    script: list[tuple[str, Inputs]] = [
        ("a path 1->2->3", {"edges": [((1, 2), 1), ((2, 3), 1)]}),
        ("close a cycle 3->1", {"edges": [((3, 1), 1)]}),
        ("add 1->2 a second time: distinct(edges) does not change", {"edges": [((1, 2), 1)]}),
        ("remove one copy of 1->2: still there", {"edges": [((1, 2), -1)]}),
        ("remove 2->3: the cycle breaks", {"edges": [((2, 3), -1)]}),
    ]
    state: dict[str, Any] = {}
    _track_edges(state, script[:2] + script[4:], "edges")
    generate = _graph_generator("edges", range(1, 7), state)
    return Scenario("transitive_closure", "recursion: a cycle made and broken", script, generate)


def _geometric_scenario() -> Scenario:
    script: list[tuple[str, Inputs]] = [
        ("insert 1: 1, 2, 4, ..., 32", {"numbers": [((1,), 1)]}),
        ("insert 16 and 3", {"numbers": [((16,), 1), ((3,), 1)]}),
        ("retract 3: 3, 6, 12, 24, 48 go", {"numbers": [((3,), -1)]}),
        ("insert 5", {"numbers": [((5,), 1)]}),
        ("retract 1: 16 and 32 stay (16 is an input)", {"numbers": [((1,), -1)]}),
    ]

    def generate(rng: random.Random, index: int) -> tuple[str, Inputs]:
        return "generated: insert a random number", {"numbers": [((rng.randint(1, 50),), 1)]}

    return Scenario("geometric", "recursion: the doubling series", script, generate)


def _word_count_scenario() -> Scenario:
    def words(text: str, weight: int = 1) -> list[tuple[tuple, int]]:
        return [((w,), weight) for w in text.split()]

    script: list[tuple[str, Inputs]] = [
        ("'the cat sat on the mat'", {"words": words("the cat sat on the mat")}),
        ("add 'the dog', retract 'cat'", {"words": words("the dog") + words("cat", -1)}),
        ("retract all three 'the'", {"words": [(("the",), -3)]}),
        (
            "retract and re-add 'dog' in one batch: nothing changes",
            {"words": words("dog", -1) + words("dog")},
        ),
        ("'the end'", {"words": words("the end")}),
    ]
    vocabulary = ("the", "cat", "dog", "sat", "mat", "on", "end")
    present: dict[str, int] = {}
    for _, inputs in script:
        for (word,), weight in inputs["words"]:
            present[word] = present.get(word, 0) + weight

    def generate(rng: random.Random, index: int) -> tuple[str, Inputs]:
        batch = []
        for _ in range(3):
            word = rng.choice(vocabulary)
            # retract only copies that are there, so counts stay meaningful
            weight = -1 if present.get(word, 0) > 0 and rng.random() < 0.4 else rng.randint(1, 2)
            present[word] = present.get(word, 0) + weight
            batch.append(((word,), weight))
        return "generated: random words (and retractions)", {"words": batch}

    return Scenario("word_count", "aggregate and distinct with retractions", script, generate)


def _join_scenario() -> Scenario:
    script: list[tuple[str, Inputs]] = [
        ("both sides at once", {"left": [((1, "x"), 1), ((2, "y"), 2)], "right": [((1, "p"), 1)]}),
        (
            "retract left (1, x); right changes on key 2",
            {"left": [((1, "x"), -1)], "right": [((2, "q"), 1), ((2, "r"), -1)]},
        ),
        (
            "new key 3 on both sides",
            {"left": [((3, "z"), 1)], "right": [((3, "s"), 1), ((2, "r"), 1)]},
        ),
        ("retract right (3, s)", {"right": [((3, "s"), -1)]}),
        ("nothing happens", {}),
    ]

    def generate(rng: random.Random, index: int) -> tuple[str, Inputs]:
        side = rng.choice(("left", "right"))
        value = rng.choice("abc") if side == "left" else rng.choice("pqr")
        return "generated: a random row on one side", {
            side: [((rng.randint(1, 3), value), rng.choice((1, -1)))]
        }

    return Scenario("join", "bilinear join: weights multiply", script, generate)


SCENARIOS: dict[str, Callable[[], Scenario]] = {
    "orders": _orders_scenario,
    "reachability": _reachability_scenario,
    "word_count": _word_count_scenario,
    "geometric": _geometric_scenario,
    "transitive_closure": _transitive_closure_scenario,
    "join": _join_scenario,
    "accounts": _accounts_scenario,
}


# --- formatting ----------------------------------------------------------------------


def _cell(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (tuple, list)):
        return json.dumps(list(value))
    return str(value)


def _sort_key(row: Any) -> str:
    return json.dumps([list(v) if isinstance(v, tuple) else v for v in row])


def format_table(schema: Schema, zset: ZSet, indent: str = "    ") -> list[str]:
    """A readable table of a Z-set: the schema's columns and the weight."""
    header = [*schema.names, "weight"]
    rows = [
        [*(_cell(v) for v in row), str(weight)]
        for row, weight in sorted(zset.items(), key=lambda item: _sort_key(item[0]))
    ]
    if not rows:
        return [f"{indent}(empty)"]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        parts = [c.ljust(w) for c, w in zip(cells[:-1], widths[:-1], strict=True)]
        parts.append(cells[-1].rjust(widths[-1]))
        return (indent + " | ".join(parts)).rstrip()

    rule = indent + "-+-".join("-" * w for w in widths)
    return [line(header), rule, *(line(r) for r in rows)]


def _format_input(circuit: Circuit, source: str, batch: list[Any]) -> str:
    node = circuit.node(circuit.sources[source])
    if node.op == "upsert_source":
        names = node.params["user_schema"].names
        shown = [
            "{" + ", ".join(f"{n}={_cell(v)}" for n, v in zip(names, row, strict=True)) + "}"
            for row in batch
        ]
        return f"  in  {source} (upserts): " + ("; ".join(shown) or "(none)")
    shown = [f"{'+' if w > 0 else ''}{w} ({', '.join(_cell(v) for v in row)})" for row, w in batch]
    return f"  in  {source}: " + (", ".join(shown) or "(none)")


def _format_loop(report: LoopReport) -> str:
    sizes = ", ".join(str(s) for s in report.delta_sizes)
    return (
        f"  loop {report.loop} at time {list(report.time)}: {report.iterations} iteration(s), "
        f"result delta size per iteration [{sizes}]; {report.stop_reason}"
    )


def _brief(zset: ZSet) -> str:
    if not zset:
        return "nothing"
    items = sorted(zset.items(), key=lambda item: _sort_key(item[0]))
    return ", ".join(f"({', '.join(_cell(v) for v in row)}) x{w}" for row, w in items)


def _rows_word(n: int) -> str:
    return f"{n} row" if n == 1 else f"{n} rows"


# --- running -----------------------------------------------------------------------------


def engine_inputs(circuit: Circuit, inputs: Inputs) -> Inputs:
    """Upsert dicts become tuples in schema order (missing = NULL); Z-set batches stay."""
    result: Inputs = {}
    for source, batch in inputs.items():
        node = circuit.node(circuit.sources[source])
        if node.op == "upsert_source":
            names = node.params["user_schema"].names
            result[source] = [tuple(row.get(n) for n in names) for row in batch]
        else:
            result[source] = [(tuple(row), weight) for row, weight in batch]
    return result


def verify_views(
    full_refresh: FullRefresh,
    circuit: Circuit,
    history: list[Inputs],
    epoch: int,
    views: dict[str, ZSet],
) -> list[str]:
    """Problems found comparing the incremental views with the reference engine's full
    refresh over the same inputs (empty: they agree). Pure Python: independent of Spark."""
    try:
        expected = full_refresh(circuit, history, epoch)
    except Exception as exc:  # the oracle failing is a failed verification, said plainly
        return [f"full refresh raised {type(exc).__name__}: {exc}"]
    problems = []
    for name in circuit.views:
        got = views[name]
        want = expected.get(name)
        if want is None:
            problems.append(f"full refresh returned no view {name!r}")
        elif got != want:
            problems.append(f"view {name!r}: {_difference(got, want)}")
    return problems


def _difference(got: ZSet, want: ZSet) -> str:
    diff = got - want
    extra = ZSet((row, w) for row, w in diff.items() if w > 0)
    lacking = ZSet((row, -w) for row, w in diff.items() if w < 0)
    return f"the incremental result has extra {_brief(extra)} and lacks {_brief(lacking)}"


# --- running -----------------------------------------------------------------------------


def run_scenario(
    name: str,
    epochs: int,
    full_refresh: FullRefresh,
    out: Any = sys.stdout,
    warehouse: Path | None = None,
) -> bool:
    """Run one circuit's scenario and print it; True when every epoch verified.

    With ``warehouse`` the Spark engine runs and keeps its state there; without, the
    reference engine runs in memory.
    """
    circuit = NAMED_CIRCUITS[name]()
    scenario = SCENARIOS[name]()
    engine_name = "reference" if warehouse is None else "spark"
    engine = get_engine(engine_name).create(circuit, warehouse=warehouse)
    ok = True

    def say(text: str = "") -> None:
        print(text, file=out, flush=True)

    say("=" * 78)
    say(f"circuit {name}: {scenario.summary}")
    for line in _describe_circuit(circuit):
        say(line)
    say("  " + engine.plan.describe().replace("\n", "\n  "))
    say(f"  state: {engine.location}")

    committed = engine.last_committed_epoch()
    history: list[Inputs] = []
    previous: dict[str, ZSet] = {}
    for index, (what, raw_inputs) in enumerate(scenario.epochs(epochs)):
        inputs = engine_inputs(circuit, raw_inputs)
        history.append(inputs)
        if index <= committed:
            continue
        if index == committed + 1 and committed >= 0:
            say()
            say(
                f"--- {name}, epochs 0..{committed}: already committed in this warehouse, "
                "not run again (state continues from there)"
            )
            previous = engine.views()
        say()
        say(f"--- {name}, epoch {index}: {what}")
        for source in circuit.sources:
            if source in inputs:
                say(_format_input(circuit, source, inputs[source]))
        outcome = engine.step(inputs)
        for loop in outcome.loops:
            say(_format_loop(loop))
        for line in _describe_views(circuit, outcome.views, previous):
            say(line)
        previous = outcome.views
        problems = [
            f"view {view!r} differs from the {engine_name} engine's own full refresh in "
            f"{_rows_word(len(rows))} (row + weight difference): {rows[:5]}"
            for view, rows in engine.verify().items()
            if rows
        ]
        problems += verify_views(full_refresh, circuit, history, index, outcome.views)
        if problems:
            ok = False
            for problem in problems:
                say(f"  MISMATCH: {problem}")
        elif warehouse is None:
            say("  verified against full refresh")
        else:
            say("  verified against full refresh (Spark, from the stored input log; and reference)")
    if committed >= epochs - 1:
        say()
        say(
            f"--- {name}: epochs 0..{committed} are already committed in this warehouse; "
            f"nothing to do (ask for more with --epochs {committed + 2})"
        )
        for line in _describe_views(circuit, engine.views(), None):
            say(line)
    say()
    return ok


def _describe_circuit(circuit: Circuit) -> list[str]:
    """The circuit's sources (with their upsert declarations) and views, a line each."""
    lines = []
    for source, node_id in circuit.sources.items():
        node = circuit.node(node_id)
        if node.op == "upsert_source":
            p = node.params
            extra = f" key {', '.join(p['key'])}; watermark {', '.join(p['watermark'])}"
            if p["tombstone"]:
                extra += f"; tombstone {p['tombstone']}"
                if p["tombstone_value"] is not None:
                    extra += f" = {p['tombstone_value']!r}"
            lines.append(f"  source {source} {p['user_schema']}: upserts,{extra}")
        else:
            lines.append(f"  source {source} {node.schema}: Z-set")
    for view, node_id in circuit.views.items():
        lines.append(f"  view   {view} {circuit.node(node_id).schema}")
    return lines


def _describe_views(
    circuit: Circuit, views: dict[str, ZSet], previous: dict[str, ZSet] | None
) -> list[str]:
    """Every view's rows as a table; with ``previous``, also its change since then."""
    lines = []
    for view, node_id in circuit.views.items():
        schema = circuit.node(node_id).schema
        contents = views[view]
        if previous is None:
            lines.append(f"  view {view}: {_rows_word(len(contents))}")
            lines += format_table(schema, contents)
            continue
        delta = contents - previous.get(view, ZSet())
        changes = "no change" if not delta else f"delta {_rows_word(len(delta))}"
        lines.append(f"  view {view}: {_rows_word(len(contents))} ({changes})")
        lines += format_table(schema, contents)
        if delta:
            lines.append("    delta:")
            lines += format_table(schema, delta, indent="      ")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dbspark.devtools.engine_demo",
        description=(
            "Run the example circuits for several epochs: on Spark with a persisted warehouse "
            "(the default), or on the in-memory reference engine."
        ),
    )
    parser.add_argument(
        "--epochs",
        type=int,
        default=DEFAULT_EPOCHS,
        help=f"epochs per circuit (default {DEFAULT_EPOCHS}; beyond the script, generated)",
    )
    parser.add_argument(
        "--circuit",
        action="append",
        choices=list(SCENARIOS),
        help="run only this circuit (repeatable; default: all)",
    )
    parser.add_argument(
        "--engine",
        choices=["spark", "reference"],
        default="spark",
        help="spark (default): local Spark, traces and a SQLite catalog in --warehouse; "
        "reference: the pure-Python oracle, in memory",
    )
    parser.add_argument(
        "--warehouse",
        type=Path,
        default=Path(DEFAULT_WAREHOUSE),
        help=f"where the Spark engine keeps its state between runs (default {DEFAULT_WAREHOUSE})",
    )
    parser.add_argument(
        "--fresh",
        action="store_true",
        help="delete the warehouse first and start every circuit again from epoch 0",
    )
    args = parser.parse_args(argv)
    if args.epochs < 1:
        parser.error("--epochs must be at least 1")
    names = args.circuit or list(SCENARIOS)
    warehouse = None
    if args.engine == "spark":
        warehouse = args.warehouse.resolve()
        if args.fresh and warehouse.exists():
            shutil.rmtree(warehouse)
        warehouse.mkdir(parents=True, exist_ok=True)
        _quiet_spark_logs()
    from dbspark.engine.reference.full_refresh import full_refresh

    failed = [
        name
        for name in names
        if not run_scenario(name, args.epochs, full_refresh, sys.stdout, warehouse)
    ]
    if failed:
        print(f"full refresh disagrees with the incremental result for: {', '.join(failed)}")
        return 1
    print(f"{len(names)} circuit(s): every epoch run here agrees with full refresh")
    if warehouse is not None:
        print(f"state kept in {warehouse}: run again to continue, or pass --fresh to start over")
    return 0


def _quiet_spark_logs() -> None:
    """The demo's output is the point: keep dbspark's own per-unit log lines off stdout."""
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")


if __name__ == "__main__":
    raise SystemExit(main())
