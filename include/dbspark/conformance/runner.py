"""Running a vector's epochs through an engine and rendering the views as JSON rows.

:func:`run_epochs` is shared by every engine: it holds an ``engine.api.Engine``.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from typing import Any

from dbspark.circuit.builder import Circuit
from dbspark.conformance.vector import VectorError
from dbspark.core.types import at_scale, element_type, is_array, is_decimal
from dbspark.core.zset import ZSet
from dbspark.engine.api import Engine, InputError

JsonRows = list[list[Any]]


def to_json_value(value: Any, type_name: str | None = None) -> Any:
    """A column value as JSON data: arrays become lists; a DATE, TIMESTAMP or DECIMAL a
    string (``YYYY-MM-DD``, ISO 8601 in UTC ending in ``Z``, the decimal's digits at the
    scale of ``type_name`` when it is given)."""
    if isinstance(value, (tuple, list)):
        inner = element_type(type_name) if type_name and is_array(type_name) else None
        return [to_json_value(v, inner) for v in value]
    if isinstance(value, Decimal):
        if type_name is not None and is_decimal(type_name):
            value = at_scale(value, type_name)
        return format(value, "f")
    if isinstance(value, dt.datetime):
        moment = value.astimezone(dt.UTC)
        fraction = f".{moment.microsecond:06d}" if moment.microsecond else ""
        return moment.strftime("%Y-%m-%dT%H:%M:%S") + fraction + "Z"
    if isinstance(value, dt.date):
        return value.isoformat()
    return value


def row_sort_key(row: Any) -> str:
    """Rows sort by their JSON text with default separators (the README's order)."""
    return json.dumps(row)


def zset_to_rows(zset: ZSet, types: Sequence[str] | None = None) -> JsonRows:
    """``[[row, weight], ...]``: consolidated (no zero weights), sorted by the row's JSON text;
    ``types`` (the columns' types) writes each decimal at its column's scale."""
    rows = [
        [[to_json_value(v, types[i] if types else None) for i, v in enumerate(row)], weight]
        for row, weight in zset.items()
        if weight != 0
    ]
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
        outputs.append(
            {
                name: zset_to_rows(result.views[name], circuit.stream(name).schema.types)
                for name in circuit.views
            }
        )
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
