"""Collection names read back as what made them."""

from __future__ import annotations

import pytest

from dbspark.storage import collection_names as coll
from dbspark.storage.collection_names import CollectionName


@pytest.mark.parametrize(
    ("name", "parsed"),
    [
        (coll.delta(7), CollectionName("delta", 7)),
        (coll.arranged(7, 1), CollectionName("arranged", 7, port=1)),
        (coll.state(3), CollectionName("state", 3)),
        (coll.input_log(3), CollectionName("input", 3)),
        (coll.scheduled(12), CollectionName("scheduled", 12)),
        (coll.view("orders.by_region"), CollectionName("view", view="orders.by_region")),
    ],
)
def test_every_name_parses_back(name: str, parsed: CollectionName) -> None:
    assert coll.parse(name) == parsed


@pytest.mark.parametrize("name", ["", "n", "nx", "n3.in", "n3.trace", "3", "views.x"])
def test_other_text_is_no_collection(name: str) -> None:
    assert coll.parse(name) is None


def test_the_predicates_and_like_patterns_agree_with_the_names() -> None:
    assert coll.view_name(coll.view("v")) == "v"
    assert coll.view_name(coll.delta(1)) is None
    assert coll.is_input_log(coll.input_log(2))
    assert not coll.is_input_log(coll.view("x.input"))
    assert coll.view("v").startswith(coll.VIEW_LIKE.removesuffix("%"))
    assert coll.input_log(2).endswith(coll.INPUT_LOG_LIKE.removeprefix("%"))
