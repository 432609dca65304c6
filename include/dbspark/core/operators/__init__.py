"""The semantics of dbspark's operators, in pure Python.

One module per family, each stating its incremental rule:

* ``linear``: map, filter, flat_map, negate, plus, minus, index_with, inspect, consolidate;
* ``general_linear``: ``join_function(logic)`` and the logics (map, filter, flat_map,
  explode, temporal filter) with ``followed_by`` for fusion;
* ``bilinear``: the join (stream against stream, delta against trace, incremental);
* ``nonlinear``: distinct and aggregate, incremental over one clock and nested clocks;
* ``temporal``: the delay ``z^-1`` and trace appends.

The reference engine (``engine/reference/engine.py``) and the reference full refresh
evaluate the circuit's operators through these functions, so each rule is stated once;
the Spark engine and the local tier are tested against those two. They favour clarity
over speed.
"""

from dbspark.core.operators._time import MIN_TIME
from dbspark.core.operators.bilinear import incremental_join, join_stream, join_trace
from dbspark.core.operators.general_linear import (
    Logic,
    explode_logic,
    filter_logic,
    flat_map_logic,
    followed_by,
    join_function,
    map_logic,
    temporal_filter_logic,
)
from dbspark.core.operators.linear import (
    consolidate,
    filter_,
    flat_map,
    index_with,
    inspect,
    map_,
    minus,
    negate,
    plus,
)
from dbspark.core.operators.nonlinear import (
    aggregate,
    aggregate_incremental,
    difference_at,
    distinct,
    distinct_at,
    distinct_incremental,
    distinct_trace,
)
from dbspark.core.operators.temporal import (
    Delay,
    DelayTrace,
    delay,
    delay_trace,
    snapshot,
    trace_append,
    untimed_trace_append,
)

__all__ = [
    "MIN_TIME",
    "Delay",
    "DelayTrace",
    "Logic",
    "aggregate",
    "aggregate_incremental",
    "consolidate",
    "delay",
    "delay_trace",
    "difference_at",
    "distinct",
    "distinct_at",
    "distinct_incremental",
    "distinct_trace",
    "explode_logic",
    "filter_",
    "filter_logic",
    "flat_map",
    "flat_map_logic",
    "followed_by",
    "incremental_join",
    "index_with",
    "inspect",
    "join_function",
    "join_stream",
    "join_trace",
    "map_",
    "map_logic",
    "minus",
    "negate",
    "plus",
    "snapshot",
    "temporal_filter_logic",
    "trace_append",
    "untimed_trace_append",
]
