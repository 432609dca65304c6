"""What a tier gives the operator kernels: its column functions and expression compiler.

``engine/kernels.py`` states every operator's incremental rule once, as DataFrame code in
PySpark's vocabulary. A *dialect* is what makes that code run on a tier: the ``F``
functions module and ``Window``, the compiler from circuit expressions to that tier's
columns, the column type names, the NULL-safe key semi-join, and how a group's
user-defined aggregates are applied on the driver. ``dialect_of`` picks it from the
frame a kernel is handed, so the kernels never name a tier:

* Spark: PySpark itself and ``engine/spark/compile.py``;
* local: ``engine/local/frame.py`` (DuckDB in this process) and
  ``engine/local/compile.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any


@dataclass(frozen=True)
class Dialect:
    name: str
    F: ModuleType
    #: PySpark's ``Window`` (window specifications for ``F.row_number().over``).
    Window: Any
    compile_expr: Callable[..., Any]
    compile_predicate: Callable[..., Any]
    compile_projection: Callable[..., Any]
    column_type: Callable[[str], Any]
    semi_join: Callable[..., Any]
    #: ``(grouped, columns) -> frame``: each gathered list of a group replaced by the
    #: user's function applied to it on the driver (``engine/user_aggregates.py``).
    evaluate_user_aggregates: Callable[[Any, Sequence[Any]], Any]


def dialect_of(frame: Any) -> Dialect:
    """The dialect of ``frame``: local for a ``LocalFrame``, else Spark (classic or Connect)."""
    from dbspark.engine.local.frame import LocalFrame

    if isinstance(frame, LocalFrame):
        from dbspark.engine.local.dialect import LOCAL

        return LOCAL
    from dbspark.engine.spark.dialect import SPARK

    return SPARK
