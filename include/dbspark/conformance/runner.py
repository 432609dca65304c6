"""Running a vector's epochs through an engine and rendering the views as JSON rows.

:func:`run_epochs` is shared by every engine: it holds an ``engine.api.Engine``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dbspark.circuit.builder import Circuit
from dbspark.conformance.vector import VectorError
from dbspark.core.zset import ZSet
from dbspark.engine.api import Engine, InputError

JsonRows = list[list[Any]]


def to_json_value(value: Any) -> Any:
    """A column value as JSON data (arrays become lists)."""
    if isinstance(value, (tuple, list)):
        return [to_json_value(v) for v in value]
    return value


def row_sort_key(row: Any) -> str:
    """Rows sort by their JSON text with default separators (the README's order)."""
    return json.dumps(row)


def zset_to_rows(zset: ZSet) -> JsonRows:
    """``[[row, weight], ...]``: consolidated (no zero weights), sorted by the row's JSON text."""
    rows = [[to_json_value(row), weight] for row, weight in zset.items() if weight != 0]
    rows.sort(key=lambda item: row_sort_key(item[0]))
    return rows


def run_epochs(
    engine: Engine,
    circuit: Circuit,
    epochs: Sequence[Mapping[str, Any]],
    *,
    on_epoch: Callable[[int, Any], None] | None = None,
) -> list[dict[str, JsonRows]]:
    """Step ``engine`` through ``epochs``; per epoch, every view's contents as JSON rows.

    Bad input the engine detects while stepping (a row that does not fit, an
    upsert conflict) becomes a :class:`VectorError` naming the epoch.
    """
    outputs = []
    for index, inputs in enumerate(epochs):
        try:
            result = engine.step(inputs)
        except InputError as exc:
            raise VectorError(f"epoch {index}: {exc}") from exc
        if on_epoch is not None:
            on_epoch(index, result)
        missing = [name for name in circuit.views if name not in result.views]
        if missing:
            raise RuntimeError(f"epoch {index}: the engine returned no contents for {missing}")
        outputs.append({name: zset_to_rows(result.views[name]) for name in circuit.views})
    return outputs


def compare(actual: list[dict[str, JsonRows]], expected: Any) -> str | None:
    """None when ``actual`` matches ``expected``; otherwise where the first difference is."""
    if not isinstance(expected, list):
        return '"expected" must be a list with one object per epoch'
    if len(expected) != len(actual):
        return f"{len(actual)} epochs produced, {len(expected)} expected"
    for index, (got, want) in enumerate(zip(actual, expected, strict=True)):
        if not isinstance(want, dict):
            return f"epoch {index}: expected entry is not an object"
        for view in sorted(set(got) | set(want)):
            if view not in want:
                return f"epoch {index}: view {view!r} is not in expected"
            if view not in got:
                return f"epoch {index}: expected view {view!r} does not exist"
            got_rows = _canonical(got[view])
            want_rows = _canonical(want[view])
            if got_rows != want_rows:
                extra = [r for r in got_rows if r not in want_rows]
                lacking = [r for r in want_rows if r not in got_rows]
                return (
                    f"epoch {index}: view {view!r} differs: unexpected {json.dumps(extra)}, "
                    f"missing {json.dumps(lacking)}"
                )
    return None


def _canonical(rows: Any) -> list[str]:
    if not isinstance(rows, list):
        return [json.dumps(rows)]
    return sorted(json.dumps(r) for r in rows)
