"""Engines the conformance command can run, picked by name.

Every engine keeps the contract of ``dbspark.engine.api.Engine``: ``step(inputs)``
runs one epoch and returns every view's contents, and bad input raises
``InputError`` before the epoch commits anything. The registry only picks one by name.

Backends register a factory under a name. An engine that cannot run in some
setup can be registered as *unavailable*, so asking for it fails loudly
instead of quietly running something else.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dbspark.circuit.builder import Circuit
from dbspark.engine.api import Engine

EngineFactory = Callable[..., Engine]
"""``factory(circuit, *, warehouse: Path | None) -> Engine``."""


class EngineUnavailable(RuntimeError):
    """The engine is known by name but cannot run in this version or setup."""


@dataclass(frozen=True)
class EngineSpec:
    name: str
    factory: EngineFactory | None
    uses_warehouse: bool = False
    unavailable: str | None = None  # why it cannot run; None when it can
    description: str = ""

    def create(self, circuit: Circuit, *, warehouse: Path | None = None) -> Engine:
        if self.unavailable is not None or self.factory is None:
            raise EngineUnavailable(self.unavailable or f"engine {self.name!r} has no factory")
        return self.factory(circuit, warehouse=warehouse)


_REGISTRY: dict[str, EngineSpec] = {}


def register_engine(
    name: str,
    factory: EngineFactory | None,
    *,
    uses_warehouse: bool = False,
    unavailable: str | None = None,
    description: str = "",
    replace: bool = False,
) -> EngineSpec:
    """Make an engine selectable by ``name`` (``replace=True`` to override an entry)."""
    if name in _REGISTRY and not replace:
        raise ValueError(f"engine {name!r} is already registered")
    spec = EngineSpec(name, factory, uses_warehouse, unavailable, description)
    _REGISTRY[name] = spec
    return spec


def engine_names() -> list[str]:
    return sorted(_REGISTRY)


def get_engine(name: str) -> EngineSpec:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown engine {name!r} (known: {', '.join(engine_names())})") from None


def _reference_engine(circuit: Circuit, *, warehouse: Path | None = None) -> Engine:
    from dbspark.engine.reference.engine import ReferenceEngine

    del warehouse  # the reference engine keeps everything in memory
    return ReferenceEngine(circuit)


register_engine(
    "reference",
    _reference_engine,
    description="the pure-Python reference engine (in memory; --warehouse is not used)",
)


def _spark_engine(circuit: Circuit, *, warehouse: Path | None = None) -> Engine:
    from dbspark.engine.spark.executor import SparkEngine

    if warehouse is None:
        raise EngineUnavailable("the Spark engine needs a warehouse directory")
    return SparkEngine(circuit, warehouse)


register_engine(
    "spark",
    _spark_engine,
    uses_warehouse=True,
    description="Spark operators over traces in a warehouse, with a SQLite catalog in it",
)
