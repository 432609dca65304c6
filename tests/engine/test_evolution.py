"""What changed between two definitions of a circuit (``circuit/evolution.py``), and the
refusal that says so when a warehouse kept for one is given the other
(``engine/circuits.py``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from dbspark.circuit.aggregations import count, sum_
from dbspark.circuit.builder import Circuit, Stream
from dbspark.circuit.evolution import compare, node_fingerprints, signature
from dbspark.circuit.expressions import col
from dbspark.engine.circuits import CircuitChangedError, signature_path
from dbspark.engine.spark.executor import SparkEngine
from dbspark.examples.circuits import NAMED_CIRCUITS
from dbspark.storage.catalog import Catalog, CatalogError


def orders(
    *,
    key: tuple[str, ...] = ("order_id",),
    total: str = "amount",
    extra_first: bool = False,
    extra: bool = False,
    without_totals: bool = False,
) -> Circuit:
    """A small orders circuit, with a definition's variations as options."""
    c = Circuit("shop")
    customers = c.upsert_source(
        "customers",
        {"cust_id": "bigint", "region": "string", "ts": "bigint"},
        key="cust_id",
        watermark="ts",
    )
    order_rows = c.upsert_source(
        "orders",
        {"order_id": "bigint", "cust_id": "bigint", "amount": "bigint", "ts": "bigint"},
        key=list(key),
        watermark="ts",
    )

    def big(stream: Stream) -> None:
        c.view("big_orders", stream.filter(col("amount") > 100).select("order_id", "amount"))

    if extra_first:
        big(order_rows)
    current = order_rows.select("order_id", "cust_id", "amount")
    c.view("customers_current", customers.select("cust_id", "region"))
    c.view("orders_current", current)
    if not without_totals:
        totals = current.join(customers.select("cust_id", "region"), on="cust_id").aggregate(
            by="region", orders=count(), total=sum_(col(total))
        )
        c.view("region_totals", totals)
    if extra:
        big(order_rows)
    return c


def no_spark() -> None:
    raise AssertionError("registering a circuit needs no Spark")


def test_the_same_definition_has_the_same_fingerprints_in_any_build() -> None:
    for name, factory in NAMED_CIRCUITS.items():
        assert signature(factory()) == signature(factory()), name
        assert compare(signature(factory()), factory()).empty, name


def test_views_are_fingerprinted_by_what_they_compute_not_where_they_are() -> None:
    """Adding a view, even before the others (which shifts every node id), leaves the
    others' fingerprints; changing an aggregate changes its view and nothing else; a
    changed source key changes every view that reads the source."""
    base = signature(orders())["views"]
    for variant in (orders(extra=True), orders(extra_first=True)):
        views = signature(variant)["views"]
        assert {k: v for k, v in views.items() if k != "big_orders"} == base
    assert (
        signature(orders(extra=True))["views"]["big_orders"]
        == (signature(orders(extra_first=True))["views"]["big_orders"])
    )
    changed = signature(orders(total="order_id"))["views"]
    assert [k for k in base if base[k] != changed[k]] == ["region_totals"]
    rekeyed = signature(orders(key=("order_id", "cust_id")))["views"]
    assert [k for k in base if base[k] != rekeyed[k]] == ["orders_current", "region_totals"]
    # Distinct nodes of one circuit get distinct fingerprints where they compute
    # different things (the two selects of customers are the same computation).
    prints = node_fingerprints(orders())
    assert len(set(prints.values())) == len(prints) - 1


def test_compare_names_each_kind_of_change() -> None:
    kept = signature(orders())
    evolution = compare(kept, orders(extra=True, total="order_id", without_totals=False))
    assert (evolution.added, evolution.changed, evolution.removed) == (
        ["big_orders"],
        ["region_totals"],
        [],
    )
    assert evolution.unchanged == ["customers_current", "orders_current"]
    assert not evolution.sources and not evolution.source_semantics_changed
    removed = compare(kept, orders(without_totals=True))
    assert removed.removed == ["region_totals"] and not removed.changed
    rekeyed = compare(kept, orders(key=("order_id", "cust_id")))
    assert rekeyed.sources == {"orders": ["key ['order_id'] -> ['order_id', 'cust_id']"]}
    assert rekeyed.source_semantics_changed == ["orders"]
    assert rekeyed.changed == ["orders_current", "region_totals"]
    with pytest.raises(ValueError, match="signature of format 7; this version reads formats 1, 2"):
        compare({**kept, "format": 7}, orders())


@pytest.mark.parametrize(
    ("variant", "says"),
    [
        (
            lambda: orders(extra=True),
            [
                "views added: big_orders\n",
                "views unchanged: customers_current, orders_current, region_totals",
                "It can evolve in place (views added or changed rebuilt",
            ],
        ),
        (
            lambda: orders(without_totals=True),
            ["views removed: region_totals\n", "open the engine with evolve=True"],
        ),
        (
            lambda: orders(key=("order_id", "cust_id")),
            [
                "views changed (their own definition or something they read): "
                "orders_current, region_totals",
                "source 'orders': key ['order_id'] -> ['order_id', 'cust_id']",
                "source 'orders' cannot continue from its state: rebuild from the raw "
                "input under the new definition, as a new circuit name or on a new warehouse",
            ],
        ),
    ],
)
def test_a_changed_definition_is_refused_saying_what_changed(
    tmp_path: Path, variant: Callable[[], Circuit], says: list[str]
) -> None:
    SparkEngine(orders(), tmp_path, spark=no_spark).catalog.close()
    kept = json.loads(signature_path(tmp_path, "shop").read_text())
    assert kept["signature"] == signature(orders())
    with pytest.raises(CircuitChangedError) as refused:
        SparkEngine(variant(), tmp_path, spark=no_spark)
    message = str(refused.value)
    assert message.startswith("the definition of circuit 'shop' changed since its warehouse")
    for text in says:
        assert text in message, message
    # The old definition still runs; the signature kept is still the old one's.
    SparkEngine(orders(), tmp_path, spark=no_spark).catalog.close()
    assert json.loads(signature_path(tmp_path, "shop").read_text()) == kept


def test_without_a_kept_signature_the_catalog_refuses_as_before(tmp_path: Path) -> None:
    """A warehouse older than the signature file, or whose file is of another
    definition than the catalog's, gets the catalog's own refusal."""
    SparkEngine(orders(), tmp_path, spark=no_spark).catalog.close()
    path = signature_path(tmp_path, "shop")
    path.unlink()
    with pytest.raises(CatalogError, match=r"changed \(fingerprint") as refused:
        SparkEngine(orders(extra=True), tmp_path, spark=no_spark)
    assert not isinstance(refused.value, CircuitChangedError)
    path.write_text(json.dumps({"fingerprint": "other", "signature": signature(orders())}))
    with pytest.raises(CatalogError) as refused:
        SparkEngine(orders(extra=True), tmp_path, spark=no_spark)
    assert not isinstance(refused.value, CircuitChangedError)
    # Registering the old definition again writes its signature back.
    SparkEngine(orders(), tmp_path, spark=no_spark).catalog.close()
    catalog = Catalog.for_warehouse(tmp_path)
    assert json.loads(path.read_text())["fingerprint"] == catalog.circuit_fingerprint("shop")
    catalog.close()
