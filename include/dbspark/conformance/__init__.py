"""Conformance: replay a recorded update stream through a named circuit.

``python -m dbspark.conformance VECTOR.json [--engine spark|reference] [--warehouse DIR]``
prints ``{"epochs": [{VIEW: ROWS, ...}, ...]}``; see the shared conformance README
for the format. Engines are picked by name from a small registry (:mod:`.engines`);
:func:`run_epochs` runs a parsed vector through any of them.
"""

from dbspark.conformance.engines import (
    Engine,
    EngineSpec,
    EngineUnavailable,
    engine_names,
    get_engine,
    register_engine,
)
from dbspark.conformance.runner import compare, run_epochs, zset_to_rows
from dbspark.conformance.vector import Vector, VectorError, parse_vector

__all__ = [
    "Engine",
    "EngineSpec",
    "EngineUnavailable",
    "Vector",
    "VectorError",
    "compare",
    "engine_names",
    "get_engine",
    "parse_vector",
    "register_engine",
    "run_epochs",
    "zset_to_rows",
]
