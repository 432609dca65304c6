"""The circuit builder: mistakes are reported where they are made, with a message that
names the operator and says what is wrong; well-formed circuits build the expected graph."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from dbspark.circuit.aggregations import count, sum_
from dbspark.circuit.builder import Circuit, CircuitError, Stream
from dbspark.circuit.expressions import col, lit, sequence
from dbspark.circuit.planner import plan
from dbspark.core.columns import TOMBSTONE
from dbspark.examples.circuits import NAMED_CIRCUITS


def circuit_with_source() -> tuple[Circuit, Stream]:
    c = Circuit("t")
    return c, c.zset_source("s", {"a": "bigint", "b": "string"})


def fails(fn: Callable[[], object], *fragments: str) -> str:
    """``fn`` raises CircuitError whose message contains every fragment."""
    with pytest.raises(CircuitError) as info:
        fn()
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    return message


# --- columns and expressions --------------------------------------------------------------


def test_select_unknown_column() -> None:
    _, s = circuit_with_source()
    fails(lambda: s.select("zz"), "select on s", "unknown column 'zz'", "columns: a, b")


def test_select_expression_with_unknown_column() -> None:
    _, s = circuit_with_source()
    fails(lambda: s.select(x=col("zz") + 1), "select on s", "unknown column 'zz'")


def test_select_same_column_twice() -> None:
    _, s = circuit_with_source()
    fails(lambda: s.select("a", a=col("b")), "column 'a' given twice")


def test_select_reserved_output_name() -> None:
    _, s = circuit_with_source()
    fails(lambda: s.select(__x=col("a")), "'__x'", "not a valid column name")


def test_select_needs_a_column() -> None:
    _, s = circuit_with_source()
    fails(lambda: s.select(), "at least one column")


def test_filter_unknown_column() -> None:
    _, s = circuit_with_source()
    fails(lambda: s.filter(col("zz") > 1), "filter on s", "unknown column 'zz'")


def test_filter_must_be_boolean() -> None:
    _, s = circuit_with_source()
    fails(lambda: s.filter(col("a") + 1), "filter on s", "expected a boolean", "got bigint")
    fails(lambda: s.filter(col("b")), "expected a boolean", "got string")


def test_filter_accepts_null_and_boolean_logic() -> None:
    _, s = circuit_with_source()
    assert s.filter(lit(None)).schema == s.schema
    assert s.filter((col("a") > 1) & col("b").is_not_null()).schema == s.schema


def test_flat_map_needs_an_array_and_a_new_column() -> None:
    _, s = circuit_with_source()
    fails(lambda: s.flat_map("x", col("a")), "flat_map on s", "not an array")
    fails(lambda: s.flat_map("a", sequence(1, col("a"))), "column 'a' already exists")
    assert str(s.flat_map("i", sequence(1, col("a"))).schema) == "(a BIGINT, b STRING, i BIGINT)"


# --- plus, join, aggregate ---------------------------------------------------------------------


def test_plus_of_different_schemas() -> None:
    c, s = circuit_with_source()
    other = c.zset_source("o", {"a": "bigint"})
    fails(lambda: s.plus(other), "plus of s and o", "schemas differ", "(a BIGINT)")
    fails(lambda: s.minus(other), "minus", "schemas differ")


def test_plus_with_a_stream_of_another_circuit() -> None:
    _, s = circuit_with_source()
    _, foreign = circuit_with_source()
    fails(lambda: s.plus(foreign), "same circuit")


def test_join_key_type_mismatch() -> None:
    c, s = circuit_with_source()
    other = c.zset_source("o", {"k": "string", "v": "bigint"})
    fails(
        lambda: s.join(other, left_on="a", right_on="k"),
        "join of s with o",
        "key 'a' is bigint but 'k' is string",
    )


def test_join_column_clash() -> None:
    c, s = circuit_with_source()
    other = c.zset_source("o", {"a": "bigint", "b": "string"})
    fails(lambda: s.join(other, on="a"), "columns ['b'] exist on both sides", "select()")


def test_join_key_problems() -> None:
    c, s = circuit_with_source()
    other = c.zset_source("o", {"k": "bigint"})
    fails(lambda: s.join(other), "give on=")
    fails(lambda: s.join(other, on="zz"), "unknown left key 'zz'")
    fails(lambda: s.join(other, left_on="a", right_on="zz"), "unknown right key 'zz'")
    fails(lambda: s.join(other, left_on=("a", "b"), right_on="k"), "differ in number")


def test_join_output_schema_and_index_by_keys() -> None:
    c, s = circuit_with_source()
    other = c.zset_source("o", {"k": "bigint", "v": "double"})
    joined = s.index_by("a").join(other.index_by("k"))
    assert str(joined.schema) == "(a BIGINT, b STRING, v DOUBLE)"
    assert joined.node.params["left_keys"] == ("a",)
    assert joined.node.params["right_keys"] == ("k",)


def test_aggregate_checks() -> None:
    _, s = circuit_with_source()
    fails(lambda: s.aggregate(by="zz", n=count()), "unknown group column 'zz'")
    fails(lambda: s.aggregate(by="a"), "at least one aggregation")
    fails(lambda: s.aggregate(by="a", total=sum_(col("b"))), "sum needs a number")
    fails(lambda: s.aggregate(by="a", a=count()), "already a group column")
    fails(lambda: s.aggregate(by="a", n=3), "count()")  # type: ignore[arg-type]
    agg = s.aggregate(by="b", n=count(), total=sum_(col("a")))
    assert str(agg.schema) == "(b STRING, n BIGINT, total BIGINT)"


# --- names ----------------------------------------------------------------------------------


def test_duplicate_source() -> None:
    c, _ = circuit_with_source()
    fails(lambda: c.zset_source("s", {"x": "bigint"}), "source 's' is declared twice")
    fails(
        lambda: c.upsert_source("s", {"k": "bigint", "ts": "bigint"}, key="k", watermark="ts"),
        "declared twice",
    )


def test_duplicate_view() -> None:
    c, s = circuit_with_source()
    c.view("v", s)
    fails(lambda: c.view("v", s.select("a")), "view 'v' is declared twice")


@pytest.mark.parametrize("name", ["__s", "__"])
def test_reserved_source_name(name: str) -> None:
    fails(lambda: Circuit("t").zset_source(name, {"a": "bigint"}), repr(name), "'__'")


def test_reserved_view_name() -> None:
    c, s = circuit_with_source()
    fails(lambda: c.view("__v", s), "'__v'", "'__'")


def test_reserved_column_name_is_rejected() -> None:
    with pytest.raises(ValueError, match=r"'__w'.*reserved"):
        Circuit("t").zset_source("s", {"__w": "bigint"})


@pytest.mark.parametrize(
    "schema", [{"__w": "bigint"}, {"a": "money"}, {}], ids=["reserved", "unknown-type", "empty"]
)
def test_bad_source_schema_is_a_circuit_error(schema: dict[str, str]) -> None:
    fails(lambda: Circuit("t").zset_source("s", schema), "source 's'")


def test_bad_circuit_name() -> None:
    fails(lambda: Circuit("a b"), "circuit name 'a b'")


# --- views -----------------------------------------------------------------------------------


def test_view_of_something_that_is_not_a_stream() -> None:
    c, _ = circuit_with_source()
    fails(lambda: c.view("v", "s"), "view 'v'", "expected a stream of circuit 't'")  # type: ignore[arg-type]


def test_view_of_a_stream_of_another_circuit() -> None:
    c, _ = circuit_with_source()
    _, foreign = circuit_with_source()
    fails(lambda: c.view("v", foreign), "expected a stream of circuit 't'")


def test_view_of_a_stream_inside_a_loop() -> None:
    c, s = circuit_with_source()
    inside: list[Stream] = []

    def body(x: Stream) -> Stream:
        inside.append(x.select("a", "b"))
        return inside[-1].distinct()

    s.iterate(body)
    fails(lambda: c.view("v", inside[0]), "view 'v'", "outside every loop")


def test_view_declared_inside_the_body() -> None:
    c, s = circuit_with_source()

    def body(x: Stream) -> Stream:
        c.view("v", x)
        return x.distinct()

    fails(lambda: s.iterate(body), "outside every loop")


def test_validate_needs_sources_and_views() -> None:
    fails(lambda: Circuit("empty").validate(), "has no sources")
    c, _ = circuit_with_source()
    fails(c.validate, "declares no views")


def test_stream_by_name() -> None:
    c, s = circuit_with_source()
    v = s.select("a")
    c.view("v", v)
    assert c.stream("v").node_id == v.node_id
    assert c.stream("s").node_id == s.node_id
    fails(lambda: c.stream("nope"), "no view or source 'nope'")


# --- loops ------------------------------------------------------------------------------------


def test_loop_returning_the_variable_needs_distinct() -> None:
    c, s = circuit_with_source()
    c.view("v", s.iterate(lambda x: x, name="spin"))
    fails(c.validate, "loop 'spin'", "distinct")
    fails(lambda: plan(c), "distinct")


def test_loop_with_a_path_around_distinct() -> None:
    c, s = circuit_with_source()
    c.view("v", s.iterate(lambda x: x.distinct().plus(x), name="leaky"))
    message = fails(c.validate, "loop 'leaky'", "distinct")
    assert "variable -> plus" in message  # the offending path


def test_loop_through_aggregate_converges() -> None:
    c = Circuit("t")
    s = c.zset_source("s", {"k": "bigint", "n": "bigint"})
    looped = s.iterate(lambda x: x.aggregate(by="k", n=count()).plus(s).distinct())
    c.view("v", looped)
    c.validate()


def test_loop_body_checks() -> None:
    _, s = circuit_with_source()
    fails(lambda: s.iterate(lambda x: 3), "must return a stream")  # type: ignore[arg-type,return-value]
    fails(lambda: s.iterate(lambda x: x.select("a").distinct()), "the body returns (a BIGINT)")
    fails(lambda: s.iterate(lambda x: x.distinct(), max_iterations=0), "max_iterations")


def test_source_inside_a_loop() -> None:
    c, s = circuit_with_source()

    def body(x: Stream) -> Stream:
        c.zset_source("z", {"a": "bigint"})
        return x.distinct()

    fails(lambda: s.iterate(body), "source 'z'", "outside loops")


def test_stream_from_a_closed_loop_used_outside() -> None:
    _, s = circuit_with_source()
    inside: list[Stream] = []

    def body(x: Stream) -> Stream:
        inside.append(x.select("a", "b"))
        return inside[-1].distinct()

    s.iterate(body, name="first")
    fails(lambda: inside[0].select("a"), "inside loop 'first'", "after the loop closed")
    fails(lambda: s.plus(inside[0]), "inside loop 'first'")


def test_streams_of_two_different_loops_do_not_mix() -> None:
    _, s = circuit_with_source()
    first: list[Stream] = []

    def body1(x: Stream) -> Stream:
        first.append(x)
        return x.distinct()

    s.iterate(body1, name="one")
    fails(
        lambda: s.iterate(lambda y: y.plus(first[0]).distinct(), name="two"),
        "mixes streams of two different loops",
        "'one'",
        "'two'",
    )


def test_outer_streams_enter_a_loop_automatically_once() -> None:
    c = Circuit("t")
    edges = c.zset_source("edges", {"src": "string", "dst": "string"})
    roots = c.zset_source("roots", {"node": "string"})
    reach = roots.iterate(
        lambda r: (
            r.join(edges, left_on="node", right_on="src")
            .select(node=col("dst"))
            .plus(roots)
            .plus(r.join(edges, left_on="node", right_on="src").select("node"))
            .distinct()
        ),
        name="reach",
    )
    c.view("reach", reach)
    enters = [n for n in c.nodes if n.op == "enter"]
    # roots enters once for the initial value; edges once although used twice
    assert sorted(c.node(n.inputs[0]).label for n in enters) == ["edges", "roots"]
    loop_scope = c.scopes[1]
    assert all(n.scope == loop_scope.id for n in enters)
    assert loop_scope.closed and loop_scope.name == "reach"
    variable = c.node(loop_scope.variable)
    assert variable.op == "variable" and variable.params["feedback"] == loop_scope.result
    assert c.node(loop_scope.result).op == "distinct"
    leave = c.node(reach.node_id)
    assert leave.op == "leave" and leave.scope == 0 and leave.inputs == (loop_scope.result,)


def test_nested_loops_build() -> None:
    c = Circuit("nested")
    numbers = c.zset_source("numbers", {"n": "bigint"})

    def outer(x: Stream) -> Stream:
        inner = x.iterate(
            lambda y: y.plus(y.select(n=col("n") * 2)).filter(col("n") <= 50).distinct(),
            name="inner",
        )
        return numbers.plus(inner).distinct()

    c.view("v", numbers.iterate(outer, name="outer"))
    c.validate()
    outer_scope, inner_scope = c.scopes[1], c.scopes[2]
    assert (outer_scope.name, outer_scope.depth, outer_scope.parent) == ("outer", 2, 0)
    assert (inner_scope.name, inner_scope.depth, inner_scope.parent) == ("inner", 3, 1)
    # numbers enters the outer loop (depth 2); x enters the inner loop (depth 3)
    enters = {(c.node(n.inputs[0]).op, n.scope) for n in c.nodes if n.op == "enter"}
    assert enters == {("zset_source", 1), ("variable", 2)}
    p = plan(c)
    assert p.loops[1].nested == (2,)
    assert p.loops[2].depth == 3


def test_nested_loop_using_an_outer_source_enters_twice() -> None:
    c = Circuit("nested")
    numbers = c.zset_source("numbers", {"n": "bigint"})

    def outer(x: Stream) -> Stream:
        return x.iterate(lambda y: y.plus(numbers).distinct(), name="inner").distinct()

    c.view("v", numbers.iterate(outer, name="outer"))
    chain = []
    node = next(n for n in c.nodes if n.op == "plus")
    entered = c.node(node.inputs[1])
    while entered.op == "enter":
        chain.append(entered.scope)
        entered = c.node(entered.inputs[0])
    assert entered.label == "numbers" and chain == [2, 1]


# --- upsert sources ---------------------------------------------------------------------------

UPSERT = {"k": "bigint", "v": "string", "ts": "bigint", "gone": "boolean", "st": "string"}


@pytest.mark.parametrize(
    ("kwargs", "fragments"),
    [
        ({"key": [], "watermark": "ts"}, ["needs a primary key"]),
        ({"key": "k", "watermark": []}, ["at least one watermark"]),
        ({"key": "zz", "watermark": "ts"}, ["unknown column 'zz'"]),
        ({"key": "k", "watermark": "zz"}, ["unknown column 'zz'"]),
        ({"key": "k", "watermark": "ts", "tombstone": "zz"}, ["unknown column 'zz'"]),
        ({"key": "k", "watermark": "k"}, ["both key and watermark"]),
        ({"key": "k", "watermark": "ts", "tombstone": "k"}, ["cannot be part of the key"]),
        (
            {"key": "k", "watermark": "ts", "tombstone": "st"},
            ["string tombstone", "tombstone_value"],
        ),
        (
            {"key": "k", "watermark": "ts", "tombstone": "gone", "tombstone_value": "x"},
            ["only applies to a string column"],
        ),
        ({"key": "k", "watermark": "ts", "tombstone_value": "x"}, ["without a tombstone column"]),
    ],
    ids=[
        "no-key",
        "no-watermark",
        "unknown-key",
        "unknown-watermark",
        "unknown-tombstone",
        "key-is-watermark",
        "tombstone-in-key",
        "string-tombstone-without-value",
        "value-for-boolean-tombstone",
        "value-without-tombstone",
    ],
)
def test_upsert_source_checks(kwargs: dict, fragments: list[str]) -> None:
    fails(
        lambda: Circuit("t").upsert_source("u", UPSERT, **kwargs), "upsert source 'u'", *fragments
    )


def test_upsert_source_builds_state_and_live_rows() -> None:
    c = Circuit("t")
    live = c.upsert_source(
        "u", UPSERT, key="k", watermark=("ts", "v"), tombstone="st", tombstone_value="DEL"
    )
    state = c.node(c.sources["u"])
    assert state.op == "upsert_source"
    assert state.schema.names == (*UPSERT, TOMBSTONE)
    assert state.params["key"] == ("k",) and state.params["watermark"] == ("ts", "v")
    assert live.node.op == "upsert_live" and live.node.inputs == (state.id,)
    assert live.schema.names == tuple(UPSERT)


# --- describe and the named circuits ------------------------------------------------------------


def test_describe() -> None:
    c = NAMED_CIRCUITS["reachability"]()
    text = c.describe()
    lines = text.splitlines()
    assert lines[0] == "circuit reachability"
    assert "  #0 zset_source edges (src STRING, dst STRING) <- ()" in lines
    assert any(line.startswith("    #") and "variable" in line for line in lines)  # indented
    assert lines[-1] == f"  view reach = #{c.views['reach']}"


@pytest.mark.parametrize("name", sorted(NAMED_CIRCUITS))
def test_named_circuits_validate_and_plan(name: str) -> None:
    c = NAMED_CIRCUITS[name]()
    c.validate()
    assert plan(c).stages


def test_constant_checks_its_rows_against_its_schema() -> None:
    c = Circuit("constants")
    c.zset_source("s", {"x": "bigint"})
    with pytest.raises(CircuitError, match="does not have 2 values"):
        c.constant({"a": "bigint", "b": "string"}, [((1,), 1)])
    with pytest.raises(CircuitError, match="column 'b' is string, got 2"):
        c.constant({"a": "bigint", "b": "string"}, [((1, 2), 1)])
    with pytest.raises(CircuitError, match="weight 'one'"):
        c.constant({"a": "bigint"}, [((1,), "one")])
    stream = c.constant({"a": "bigint", "b": "string"}, [((1, None), 2), ((3, "x"), 0)])
    assert stream.node.op == "constant" and stream.node.scope == 0
    assert stream.node.params["rows"] == (((1, None), 2),)  # zero weights dropped


def test_a_constant_arrives_once_and_is_held_by_every_engine_after() -> None:
    """Its delta is its rows at epoch 0 and nothing later; used inside a loop, it is
    entered like any outer stream."""
    from dbspark.engine.reference.engine import ReferenceEngine
    from dbspark.engine.reference.full_refresh import full_refresh

    c = Circuit("constant_use")
    edges = c.zset_source("edges", {"src": "bigint", "dst": "bigint"})
    start = c.constant({"node": "bigint"}, [((1,), 1)])
    reach = start.iterate(
        lambda r: (
            r.join(edges, left_on="node", right_on="src")
            .select(node=col("dst"))
            .plus(start)
            .distinct()
        )
    )
    c.view("reach", reach)
    engine = ReferenceEngine(c)
    first = engine.step({"edges": []})
    assert dict(first.views["reach"].items()) == {(1,): 1}
    second = engine.step({"edges": [((1, 2), 1), ((2, 3), 1)]})
    assert dict(second.views["reach"].items()) == {(1,): 1, (2,): 1, (3,): 1}
    history = [{"edges": []}, {"edges": [((1, 2), 1), ((2, 3), 1)]}]
    assert full_refresh(c, history)["reach"] == second.views["reach"]


def test_semi_anti_left_and_full_joins_with_null_keys_and_retractions() -> None:
    """The composed joins on the reference engine: NULL keys match nothing, bag weights
    are kept, and retracting the last match moves a row between semi and anti."""
    from dbspark.engine.reference.engine import ReferenceEngine

    c = Circuit("composed_joins")
    a = c.zset_source("a", {"k": "bigint", "x": "string"})
    b = c.zset_source("b", {"k2": "bigint", "y": "string"})
    c.view("semi", a.semi_join(b, left_on="k", right_on="k2"))
    c.view("anti", a.anti_join(b, left_on="k", right_on="k2"))
    c.view("left", a.left_join(b, left_on="k", right_on="k2"))
    c.view("full", a.full_join(b, left_on="k", right_on="k2"))
    engine = ReferenceEngine(c)
    first = engine.step(
        {
            "a": [((1, "a"), 1), ((2, "b"), 2), ((None, "n"), 1)],
            "b": [((1, "p"), 1), ((1, "q"), 1), ((3, "z"), 1), ((None, "m"), 1)],
        }
    )
    views = {name: dict(z.items()) for name, z in first.views.items()}
    assert views["semi"] == {(1, "a"): 1}
    assert views["anti"] == {(2, "b"): 2, (None, "n"): 1}
    assert views["left"] == {
        (1, "a", "p"): 1,
        (1, "a", "q"): 1,
        (2, "b", None): 2,
        (None, "n", None): 1,
    }
    assert views["full"] == {**views["left"], (None, None, "z"): 1, (None, None, "m"): 1}
    second = engine.step({"b": [((1, "p"), -1), ((1, "q"), -1), ((2, "w"), 1)]})
    views = {name: dict(z.items()) for name, z in second.views.items()}
    assert views["semi"] == {(2, "b"): 2}
    assert views["anti"] == {(1, "a"): 1, (None, "n"): 1}
    assert views["left"] == {(1, "a", None): 1, (2, "b", "w"): 2, (None, "n", None): 1}
    assert engine.verify() == {name: [] for name in c.views}
