"""TPC-H queries as written, as incremental views.

Q1, Q3, Q4, Q5, Q10, Q12, Q13 and Q18 are the specification's text (``q*.sql``) with
only the final ``ORDER BY``/``LIMIT`` dropped, over the tables declared in
``sources.json`` as upsert sources: the specification's columns and types (DECIMAL
prices, DATE dates) plus a watermark ``ts`` and a tombstone ``deleted``, keyed by each
table's primary key.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from importlib import resources
from typing import Any

from dbspark.circuit.builder import Circuit
from dbspark.sql import compile_circuit

QUERIES = ("q1", "q3", "q4", "q5", "q10", "q12", "q13", "q18")


def sources() -> dict[str, Any]:
    """The source declarations, in the conformance format (``columns``, ``key``, ...)."""
    return json.loads(resources.files(__package__).joinpath("sources.json").read_text())


def query_text(query: str) -> str:
    """The ``CREATE VIEW`` statement of one query (``"q3"``)."""
    if query not in QUERIES:
        raise ValueError(f"unknown TPC-H query {query!r}; known: {', '.join(QUERIES)}")
    return resources.files(__package__).joinpath(f"{query}.sql").read_text()


def tpch(queries: Sequence[str] = QUERIES, name: str = "tpch") -> Circuit:
    """A circuit of the TPC-H sources with a view per query in ``queries``."""
    return compile_circuit(name, sources(), "\n".join(query_text(q) for q in queries))
