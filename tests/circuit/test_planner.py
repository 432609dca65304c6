"""The planner: chains of linear operators fuse into one stage behind their anchor; loop
stages are grouped per loop; every stage knows what it reads and what others read of it."""

from __future__ import annotations

from dbspark.circuit.aggregations import count, max_
from dbspark.circuit.builder import Circuit, Stream
from dbspark.circuit.expressions import col, sequence
from dbspark.circuit.planner import Plan, aggregate_columns, plan
from dbspark.examples.circuits import NAMED_CIRCUITS


def ops(p: Plan) -> list[list[str]]:
    return [[p.circuit.node(n).op for n in stage.nodes] for stage in p.stages]


def test_a_linear_chain_is_one_stage() -> None:
    c = Circuit("t")
    s = c.zset_source("s", {"a": "bigint", "b": "string"})
    out = s.select("a", "b").filter(col("a") > 1).select(y=col("a"))
    c.view("v", out)
    p = plan(c)
    assert ops(p) == [["zset_source", "select", "filter", "select"]]
    (stage,) = p.stages
    assert stage.inputs == ()
    assert stage.outputs == (out.node_id,)  # only the published end leaves the stage
    assert stage.anchor == s.node_id
    assert stage.name == "ingest_s"


def test_every_fusable_linear_op_fuses() -> None:
    c = Circuit("t")
    s = c.zset_source("s", {"a": "bigint"})
    out = (
        s.flat_map("i", sequence(1, col("a")))
        .negate()
        .index_by("a")
        .inspect(lambda t, z: None)
        .consolidate()
        .explode(col("i"))
    )
    c.view("v", out)
    assert ops(plan(c)) == [
        ["zset_source", "flat_map", "negate", "index_by", "inspect", "consolidate", "join_function"]
    ]


def test_a_join_followed_by_select_is_one_stage() -> None:
    c = Circuit("t")
    left = c.zset_source("l", {"k": "bigint", "a": "string"})
    right = c.zset_source("r", {"k": "bigint", "b": "string"})
    out = left.join(right, on="k").select("a", "b").filter(col("a") != col("b"))
    c.view("v", out)
    p = plan(c)
    assert ops(p) == [["zset_source"], ["zset_source"], ["join", "select", "filter"]]
    join_stage = p.stages[2]
    assert join_stage.inputs == (left.node_id, right.node_id)
    assert join_stage.outputs == (out.node_id,)
    assert join_stage.name.startswith("join_")


def test_a_node_with_two_consumers_ends_its_stage() -> None:
    c = Circuit("t")
    s = c.zset_source("s", {"a": "bigint"})
    shared = s.select("a")
    big = shared.filter(col("a") > 10).select(b=col("a"))
    small = shared.filter(col("a") < 0)
    c.view("big", big)
    c.view("small", small)
    p = plan(c)
    assert ops(p) == [["zset_source", "select"], ["filter", "select"], ["filter"]]
    first, second, third = p.stages
    assert first.outputs == (shared.node_id,)
    assert second.inputs == (shared.node_id,) and second.outputs == (big.node_id,)
    assert third.inputs == (shared.node_id,) and third.outputs == (small.node_id,)
    assert p.stage_of(big.node_id) is second


def test_a_published_node_inside_a_chain_is_an_output_too() -> None:
    c = Circuit("t")
    s = c.zset_source("s", {"a": "bigint"})
    middle = s.select("a")
    end = middle.filter(col("a") > 0)
    c.view("middle", middle)
    c.view("end", end)
    p = plan(c)
    assert ops(p) == [["zset_source", "select", "filter"]]
    assert p.stages[0].outputs == (middle.node_id, end.node_id)


def test_plus_and_minus_anchor_their_own_stage() -> None:
    c = Circuit("t")
    a = c.zset_source("a", {"x": "bigint"})
    b = c.zset_source("b", {"x": "bigint"})
    summed = a.plus(b).select("x")
    diff = summed.minus(b.filter(col("x") > 0))
    c.view("v", diff)
    p = plan(c)
    assert ops(p) == [["zset_source"], ["zset_source"], ["plus", "select"], ["filter"], ["minus"]]
    plus_stage = p.stage_of(summed.node_id)
    assert plus_stage.inputs == (a.node_id, b.node_id)
    assert p.stage_of(diff.node_id).inputs == (summed.node_id, p.stages[3].nodes[0])


def test_a_plus_with_one_stream_twice_still_anchors() -> None:
    c = Circuit("t")
    s = c.zset_source("s", {"x": "bigint"})
    c.view("v", s.plus(s))
    assert ops(plan(c)) == [["zset_source"], ["plus"]]


def test_stateful_operators_anchor() -> None:
    c = Circuit("t")
    s = c.zset_source("s", {"w": "string"})
    c.view("n", s.aggregate(by="w", n=count()).select("w"))
    c.view("d", s.distinct())
    assert ops(plan(c)) == [["zset_source"], ["aggregate", "select"], ["distinct"]]


def test_upsert_source_fuses_with_its_live_rows() -> None:
    p = plan(NAMED_CIRCUITS["orders"]())
    assert ops(p) == [
        ["upsert_source", "upsert_live", "select"],
        ["upsert_source", "upsert_live", "select"],
        ["join"],
        ["aggregate"],
    ]
    assert [s.name for s in p.stages[:2]] == ["ingest_customers", "ingest_orders"]


def test_loop_stages_are_grouped_in_a_loop_plan() -> None:
    c = NAMED_CIRCUITS["reachability"]()
    p = plan(c)
    (loop,) = p.loops.values()
    scope = c.scopes[1]
    assert (loop.scope, loop.name, loop.depth) == (scope.id, "reach", 2)
    assert (loop.variable, loop.result, loop.output) == (scope.variable, scope.result, scope.output)
    assert loop.nested == ()
    assert list(loop.stages) == [s.id for s in p.stages_in_scope(scope.id)]
    assert [ops(p)[i] for i in loop.stages] == [
        ["enter"],
        ["variable"],
        ["enter"],
        ["join", "select"],
        ["plus"],
        ["distinct"],
    ]
    # Root stages: the two sources and the loop's leave.
    assert [s.nodes for s in p.stages_in_scope(0)] == [(0,), (1,), (scope.output,)]


def test_the_variable_stage_reads_the_feedback() -> None:
    c = NAMED_CIRCUITS["reachability"]()
    p = plan(c)
    scope = c.scopes[1]
    variable_stage = p.stage_of(scope.variable)
    initial = c.node(scope.variable).inputs[0]
    assert variable_stage.inputs == tuple(sorted((initial, scope.result)))
    result_stage = p.stage_of(scope.result)
    assert scope.result in result_stage.outputs  # feedback leaves its stage
    assert p.stage_of(scope.output).inputs == (scope.result,)


def test_nothing_fuses_onto_the_feedback_or_across_scopes() -> None:
    c = Circuit("t")
    s = c.zset_source("s", {"n": "bigint"})
    looped = s.iterate(lambda x: x.plus(s).distinct())
    after = looped.select("n")  # fuses onto the leave (same scope, single reader)
    c.view("v", after.filter(col("n") > 0))
    p = plan(c)
    by_scope = {scope: [ops(p)[st.id] for st in p.stages_in_scope(scope)] for scope in (0, 1)}
    assert by_scope[0] == [["zset_source"], ["leave", "select", "filter"]]
    assert by_scope[1] == [["enter"], ["variable"], ["plus"], ["distinct"]]


def test_the_loop_result_is_an_output_of_its_stage() -> None:
    c = Circuit("t")
    s = c.zset_source("s", {"n": "bigint"})
    inner: list[Stream] = []

    def body(x: Stream) -> Stream:
        result = x.plus(s).select("n").distinct().select("n")  # the select fuses on distinct
        inner.append(result)
        return result

    c.view("v", s.iterate(body))
    p = plan(c)
    result_stage = p.stage_of(inner[0].node_id)
    assert ops(p)[result_stage.id] == ["distinct", "select"]
    assert result_stage.outputs == (inner[0].node_id,)  # read by the variable and the leave


def test_nested_loop_plans() -> None:
    c = Circuit("nested")
    numbers = c.zset_source("numbers", {"n": "bigint"})

    def outer(x: Stream) -> Stream:
        inner = x.iterate(
            lambda y: y.plus(y.select(n=col("n") * 2)).filter(col("n") <= 50).distinct(),
            name="inner",
        )
        return numbers.plus(inner).distinct()

    c.view("v", numbers.iterate(outer, name="outer"))
    p = plan(c)
    outer_plan, inner_plan = p.loops[1], p.loops[2]
    assert (outer_plan.name, outer_plan.nested) == ("outer", (2,))
    assert (inner_plan.name, inner_plan.depth, inner_plan.nested) == ("inner", 3, ())
    # the outer loop's stages do not include the inner loop's, only its leave
    assert not set(outer_plan.stages) & set(inner_plan.stages)
    assert p.stage_of(inner_plan.output).id in outer_plan.stages
    assert ops(p)[p.stage_of(inner_plan.variable).id] == ["variable"]
    assert ["plus", "filter"] in [ops(p)[i] for i in inner_plan.stages]


def test_every_node_is_in_exactly_one_stage() -> None:
    for name, build in NAMED_CIRCUITS.items():
        c = build()
        p = plan(c)
        placed = [n for stage in p.stages for n in stage.nodes]
        assert sorted(placed) == [n.id for n in c.nodes], name
        for stage in p.stages:
            assert all(p.node_stage[n] == stage.id for n in stage.nodes)
            assert all(c.node(n).scope == stage.scope for n in stage.nodes)
            for view in c.views.values():
                if view in stage.nodes:
                    assert view in stage.outputs


def test_describe() -> None:
    text = plan(NAMED_CIRCUITS["word_count"]()).describe()
    assert text.splitlines() == [
        "plan for circuit word_count: 3 stages",
        "  stage 0 ingest_words: zset_source",
        "  stage 1 aggregate_1: aggregate",
        "  stage 2 distinct_2: distinct",
    ]


def test_trace_keys_arrange_each_stateful_input_by_its_keys() -> None:
    """``trace_keys`` is the one rule both explain and the engines (which bucket, read
    and keep resident their traces by it) use: a join's sides by their join keys, an
    aggregate's input by its group or every column, a distinct's by every column, an
    upsert state by its primary key, and nothing for linear operators."""
    from dbspark.circuit.planner import trace_keys
    from dbspark.examples.circuits import orders_sql
    from dbspark.examples.tpch import tpch
    from dbspark.sql import compile_circuit

    total = compile_circuit(
        "total", {"t": {"columns": [["a", "BIGINT"]]}}, "CREATE VIEW n AS SELECT SUM(a) FROM t;"
    )
    circuits = [make() for make in NAMED_CIRCUITS.values()] + [orders_sql(), tpch(), total]
    kinds = set()
    for c in circuits:
        for node in c.nodes:
            keys = trace_keys(c, node)
            inputs = [c.node(i).schema.names for i in node.inputs]
            if node.op == "join":
                assert keys == (tuple(node.params["left_keys"]), tuple(node.params["right_keys"]))
                kinds.add("join")
            elif node.op == "aggregate":
                assert keys == (tuple(node.params["keys"] or inputs[0]),), (c.name, node)
                kinds.add("aggregate" if node.params["keys"] else "global")
            elif node.op == "distinct":
                assert keys == (tuple(inputs[0]),), (c.name, node)
                kinds.add("distinct")
            elif node.op == "upsert_source":
                assert keys == (tuple(node.params["key"]),)
                kinds.add(node.op)
            else:
                assert keys == (), (c.name, node)
    assert kinds == {"join", "distinct", "aggregate", "global", "upsert_source"}


# --- positivity, and the columns an aggregate reads --------------------------------------
def _upserts(c: Circuit) -> Stream:
    return c.upsert_source(
        "u", {"k": "bigint", "g": "string", "v": "bigint", "ts": "bigint"}, key="k", watermark="ts"
    )


def test_positive_collections_are_told_from_their_operators() -> None:
    c = Circuit("t")
    live = _upserts(c)
    z = c.zset_source("z", {"k": "bigint", "g": "string", "v": "bigint"})
    picked = live.select("k", "g", "v").filter(col("v") > 0)
    joined = picked.join(picked.select("k", w=col("v")), on="k")
    signed = z.select("k", "g", "v")
    folded = signed.distinct()
    cancelled = picked.minus(picked)
    exploded = picked.explode(col("v"))
    constant = c.constant({"k": "bigint", "g": "string", "v": "bigint"}, [((1, "a", 2), 1)])
    negative = c.constant({"k": "bigint", "g": "string", "v": "bigint"}, [((1, "a", 2), -1)])
    for name, stream in {"a": joined, "b": folded, "c": cancelled, "d": exploded}.items():
        c.view(name, stream)
    c.view("e", picked.plus(constant))
    c.view("f", picked.plus(negative))
    positive = plan(c).positive
    assert {picked.node_id, joined.node_id, folded.node_id, constant.node_id} <= positive
    assert c.views["e"] in positive
    not_positive = {z.node_id, signed.node_id, cancelled.node_id, exploded.node_id}
    assert not_positive.isdisjoint(positive)
    assert negative.node_id not in positive and c.views["f"] not in positive


def test_a_loop_variable_is_positive_only_when_its_body_keeps_it_so() -> None:
    c = Circuit("t")
    edges = _upserts(c).select(src=col("k"), dst=col("v"))
    kept = edges.iterate(lambda x: x.plus(edges).distinct(), name="kept")
    flipped = edges.iterate(lambda x: edges.minus(x.distinct()), name="flipped", max_iterations=5)
    c.view("kept", kept)
    c.view("flipped", flipped)
    p = plan(c)
    assert p.loops[1].variable in p.positive and kept.node_id in p.positive
    assert p.loops[2].variable not in p.positive and flipped.node_id not in p.positive


def test_an_aggregate_over_a_positive_input_reads_only_its_group_and_value_columns() -> None:
    c = Circuit("t")
    live = _upserts(c).select("k", "g", "v")
    z = c.zset_source("z", {"k": "bigint", "g": "string", "v": "bigint"})
    over_live = live.aggregate(by=("g",), n=count(), top=max_(col("v")))
    over_z = z.aggregate(by=("g",), n=count(), top=max_(col("v")))
    c.view("live", over_live)
    c.view("z", over_z)
    p = plan(c)
    assert aggregate_columns(c, over_live.node, p.positive) == ("g", "v")
    # A Z-set source's rows may cancel each other: each stays a row of its own.
    assert aggregate_columns(c, over_z.node, p.positive) == ("k", "g", "v")
