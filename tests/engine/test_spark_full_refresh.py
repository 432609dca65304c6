"""Full refresh in Spark: the conformance vectors and the cases that are easy to get wrong.

Every view is computed from scratch in Spark at each epoch and compared with the
vectors' expected rows, or with the reference engine run incrementally over the
same inputs (for a cycle with a deletion, aggregates over NULLs, a temporal
filter, upserts and delays). Data is tiny; one Spark session serves the module.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pytest

from dbspark.circuit.aggregations import avg, count, max_, min_, sum_, udf
from dbspark.circuit.builder import Circuit, emit
from dbspark.circuit.expressions import col, lit, sequence, split
from dbspark.core.upsert import BadUpsertRow, UpsertConflict
from dbspark.core.zset import ZSet
from dbspark.engine.api import LoopDidNotConverge
from dbspark.engine.reference.engine import ReferenceEngine
from dbspark.engine.spark.frames import collect_zsets, frame_to_zset, zset_to_frame
from dbspark.engine.spark.full_refresh import evaluate, full_refresh, source_frames, verify
from dbspark.engine.spark.session import session_conf, spark_session
from dbspark.examples.circuits import transitive_closure

TINY_DATA_CONF = {"spark.sql.shuffle.partitions": "1", "spark.sql.adaptive.enabled": "false"}


@pytest.fixture(scope="module", autouse=True)
def tiny_data(spark: Any) -> Iterator[None]:
    """Tiny data: one shuffle partition and no adaptive re-planning keep each of the many
    small Spark jobs short (the session's settings are restored afterwards)."""
    before = {key: spark.conf.get(key) for key in TINY_DATA_CONF}
    for key, value in TINY_DATA_CONF.items():
        spark.conf.set(key, value)
    yield
    for key, value in before.items():
        spark.conf.set(key, value)


def views_as_zsets(circuit: Circuit, frames: Mapping[str, Any]) -> dict[str, ZSet]:
    """Every view collected in one Spark job."""
    return collect_zsets(
        {name: (frame, circuit.node(circuit.views[name]).schema) for name, frame in frames.items()}
    )


def against_reference(
    spark: Any, circuit: Circuit, history: Sequence[Mapping[str, Any]]
) -> dict[str, ZSet]:
    """Spark's full refresh equals the incremental reference engine at every epoch; returns
    the views at the last epoch."""
    frames = source_frames(spark, circuit, history)
    engine = ReferenceEngine(circuit)
    got: dict[str, ZSet] = {}
    for epoch, inputs in enumerate(history):
        want = engine.step(inputs).views
        got = views_as_zsets(circuit, evaluate(spark, circuit, frames, epoch))
        assert got == dict(want), f"epoch {epoch}"
    return got


# --- recursion ------------------------------------------------------------------------------


def test_transitive_closure_with_a_cycle_and_a_deletion(spark: Any) -> None:
    circuit = transitive_closure()
    history = [
        {"edges": [((1, 2), 1), ((2, 3), 1), ((3, 1), 1)]},
        # delete an edge of the cycle; a duplicate edge counts once (distinct(edges))
        {"edges": [((2, 3), -1), ((3, 4), 1), ((1, 2), 1)]},
    ]
    frames = source_frames(spark, circuit, history)
    cycle = ZSet(((a, b), 1) for a in (1, 2, 3) for b in (1, 2, 3))
    assert views_as_zsets(circuit, evaluate(spark, circuit, frames, 0)) == {"tc": cycle}
    after = ZSet(((a, b), 1) for a, b in [(1, 2), (3, 1), (3, 2), (3, 4)])
    assert views_as_zsets(circuit, evaluate(spark, circuit, frames, 1)) == {"tc": after}


def test_a_delay_in_a_loop_is_loop_state_not_a_fixed_point(spark: Any) -> None:
    """X = distinct(filter(n < 30, numbers + delay(X) + 7)) iterates {1}, {1}, {1, 8},
    {1, 8}, {1, 8, 15}, ...: a repeated iterate is a pause while the delayed value is
    still on its way. Stopping there gave {1, 8} (found by the Spark property tests)."""
    c = Circuit("delayed_steps")
    numbers = c.zset_source("numbers", {"n": "bigint"})
    stepping = numbers.iterate(
        lambda x: numbers.plus(x.delay().select(n=col("n") + 7)).filter(col("n") < 30).distinct(),
        name="delayed_steps",
    )
    c.view("stepping", stepping)
    history = [{}, {"numbers": [((1,), 2)]}]
    expected = {"stepping": ZSet(((n,), 1) for n in (1, 8, 15, 22, 29))}
    assert views_as_zsets(c, full_refresh(spark, c, history)) == expected
    reference = ReferenceEngine(c)
    assert [reference.step(inputs).views for inputs in history][-1] == expected


def test_a_loop_that_does_not_converge_in_time_fails_loudly(spark: Any) -> None:
    c = Circuit("chain")
    edges = c.zset_source("edges", {"src": "bigint", "dst": "bigint"})
    roots = c.zset_source("roots", {"node": "bigint"})
    reach = roots.iterate(
        lambda r: (
            r.join(edges, left_on="node", right_on="src")
            .select(node=col("dst"))
            .plus(roots)
            .distinct()
        ),
        max_iterations=2,
    )
    c.view("reach", reach)
    history = [{"edges": [((n, n + 1), 1) for n in range(5)], "roots": [((0,), 1)]}]
    with pytest.raises(LoopDidNotConverge, match="did not converge"):
        full_refresh(spark, c, history)


# --- aggregates, linear operators, time ----------------------------------------------------


def test_aggregates_with_nulls_and_retractions(spark: Any) -> None:
    c = Circuit("aggs")
    rows = c.zset_source("rows", {"g": "string", "x": "bigint", "y": "double"})
    c.view(
        "by_group",
        rows.aggregate(
            by="g",
            n=count(),
            nx=count(col("x")),
            sx=sum_(col("x")),
            ay=avg(col("y")),
            lo=min_(col("x")),
            hi=max_(col("y")),
            xs=udf(lambda values: ",".join(map(str, values)), col("x"), "string"),
        ),
    )
    c.view("overall", rows.aggregate(n=count(), sy=sum_(col("y")), lo=min_(col("g"))))
    other = c.zset_source("other", {"g": "string", "x": "bigint", "y": "double"})
    c.view(
        "cancelling",
        other.aggregate(by="g", n=count(), sx=sum_(col("x")), ay=avg(col("y")), lo=min_(col("x"))),
    )
    history = [
        {
            "rows": [
                (("a", 1, 0.5), 1),
                (("a", None, 1.5), 2),
                (("a", 3, None), 1),
                (("b", None, None), 1),
                ((None, 4, 2.0), 1),
            ]
        },
        {"rows": [(("a", 1, 0.5), -1), (("b", None, None), -1), (("c", 5, 0.25), 3)]},
        {"rows": [(("c", 5, 0.25), -3), (("a", None, 1.5), -2), (("a", 3, None), -1)]},
        {"rows": [((None, 4, 2.0), -1)]},  # everything gone: no groups, no global row
        # weights cancel within a group: present, count 0, avg NULL, min over positive rows
        {"other": [(("d", 2, 1.0), 1), (("d", 7, 3.0), -1)], "rows": [(("e", 1, 1.0), 1)]},
    ]
    last = against_reference(spark, c, history)
    assert last["cancelling"] == ZSet([(("d", 0, -5, None, 2), 1)])
    assert last["overall"] == ZSet([((1, 1.0, "e"), 1)])
    with pytest.raises(ValueError, match="negative multiplicity"):
        full_refresh(spark, c, [{"rows": [(("a", 1, 0.5), -1)]}])


def test_linear_operators_and_a_temporal_filter(spark: Any) -> None:
    c = Circuit("linear")
    events = c.zset_source("events", {"k": "bigint", "text": "string", "until": "bigint"})
    words = events.flat_map("word", split(col("text"), " ")).select("k", "word")
    ticks = events.flat_map("n", sequence(lit(1), col("k")))
    c.view("words", words.filter(col("word") != "").consolidate())
    c.view("ticks", ticks.select("k", "n").minus(ticks.select("k", "n").filter(col("n") > 1)))
    # visible from epoch `until` on, with weight k, only while k is odd
    c.view(
        "later",
        events.join_function(
            emit({"k": col("k")}, weight=col("k"), epoch=col("until"), when=col("k") % 2 == 1),
            emit({"k": col("k") * 10}, epoch=col("until") + 1),
        ),
    )
    c.view("previous", events.select("k").delay())
    c.view("twice", events.select("k").plus(events.select("k")).negate().index_by("k"))
    history = [
        {"events": [((1, "a b", 2), 1), ((3, "c  d", 0), 1), ((2, "", None), 1)]},
        {"events": [((5, "e", 1), 2)]},
        {},
        {"events": [((3, "c  d", 0), -1)]},
    ]
    against_reference(spark, c, history)


def test_join_never_matches_null_keys(spark: Any) -> None:
    c = Circuit("nulljoin")
    left = c.zset_source("left", {"k": "bigint", "a": "string"})
    right = c.zset_source("right", {"k": "bigint", "b": "string"})
    c.view("joined", left.join(right, on="k"))
    c.view("self", left.join(left.select(k2=col("k"), a2=col("a")), left_on="k", right_on="k2"))
    history = [
        {
            "left": [((None, "x"), 1), ((1, "y"), 2)],
            "right": [((None, "p"), 1), ((1, "q"), -1)],
        }
    ]
    against_reference(spark, c, history)


# --- upsert sources ------------------------------------------------------------------------


def _accounts() -> Circuit:
    c = Circuit("acct")
    live = c.upsert_source(
        "acct",
        {"id": "bigint", "v": "string", "wm": "bigint", "gone": "boolean"},
        key="id",
        watermark="wm",
        tombstone="gone",
    )
    c.view("live", live)
    return c


def test_upserts_freshest_wins_and_tombstones_are_remembered(spark: Any) -> None:
    history = [
        [(1, "a", 1, None), (2, "b", None, None), (2, "c", 0, False)],
        [(1, "late", 0, None), (1, None, 5, True), (2, "c", 0, False)],  # resend: a no-op
        [{"id": 1, "v": "older than the tombstone", "wm": 4}, {"id": 3, "v": "x", "wm": 1}],
        [(1, "back", 6, False), (1, "stale", 1, False)],  # a superseded watermark: stale
    ]
    against_reference(spark, _accounts(), [{"acct": batch} for batch in history])


def test_upsert_conflicts_are_rejected_naming_source_and_key(spark: Any) -> None:
    circuit = _accounts()
    within = [{"acct": [(7, "a", 1, None), (7, "b", 1, None)]}]
    with pytest.raises(UpsertConflict, match=r"'acct'.*id=7.*epoch 0"):
        full_refresh(spark, circuit, within)
    against_stored = [{"acct": [(8, "a", 2, None)]}, {"acct": [(8, "b", 2, None)]}]
    assert views_as_zsets(circuit, full_refresh(spark, circuit, against_stored, 0)) == {
        "live": ZSet([((8, "a", 2, None), 1)])
    }
    with pytest.raises(UpsertConflict, match=r"id=8.*epoch 1"):
        full_refresh(spark, circuit, against_stored)
    with pytest.raises(BadUpsertRow, match="NULL in key"):
        full_refresh(spark, circuit, [{"acct": [(None, "a", 1, None)]}])


# --- helpers -----------------------------------------------------------------------------


def test_verify_reports_the_rows_that_differ(spark: Any) -> None:
    from dbspark.core.types import Schema

    schema = Schema.of({"k": "bigint", "s": "string"}, what="t")
    a = zset_to_frame(spark, ZSet([((1, "x"), 1), ((2, None), 2)]), schema)
    b = zset_to_frame(spark, ZSet([((1, "x"), 1), ((2, None), 1), ((3, "z"), 1)]), schema)
    assert frame_to_zset(verify(a, b), schema) == ZSet([((2, None), 1), ((3, "z"), -1)])
    assert verify(a, a).isEmpty()


def test_frames_round_trip_times_and_doubles(spark: Any) -> None:
    from dbspark.core.types import Schema

    schema = Schema.of({"x": "double", "xs": "array<bigint>"}, what="t")
    frame = zset_to_frame(spark, [((1, (1, 2)), 3), ((0.5, ()), -1)], schema, time=(4, 2))
    assert frame.columns == ["x", "xs", "__w", "__epoch", "__iter"]
    want = ZSet([((1.0, (1, 2)), 3), ((0.5, ()), -1)])
    assert frame_to_zset(frame, schema) == want
    other = Schema.of({"s": "string", "b": "boolean", "n": "bigint"}, what="t")
    strings = zset_to_frame(spark, [(('"q"', None, 2**62), 1), (("ü", True, None), 2)], other)
    both = collect_zsets({"a": (frame, schema), "b": (strings, other)})
    assert both == {"a": want, "b": frame_to_zset(strings, other)}


def test_session_builder_reuses_the_active_session(spark: Any, monkeypatch: Any) -> None:
    assert spark_session() is spark
    monkeypatch.setenv("DBSPARK_SHUFFLE_PARTITIONS", "7")
    monkeypatch.delenv("DBSPARK_SPARK_UI", raising=False)
    conf = session_conf()
    assert conf["spark.sql.shuffle.partitions"] == "7"
    assert conf["spark.ui.enabled"] == "false"
    assert conf["spark.driver.host"] == "127.0.0.1"
    assert conf["spark.sql.session.timeZone"] == "UTC"
    assert "spark.driver.host" not in session_conf(remote="sc://localhost:15002")
    with pytest.raises(ValueError):
        spark_session("local[1]", remote="sc://localhost:15002")
