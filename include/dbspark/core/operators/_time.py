"""Time helpers shared by the operators (private).

``MIN_TIME`` is the empty tuple. Operators read a time with fewer coordinates
than another as if padded with zeros on the right, which is how an outer time
enters a nested scope (``timestamps.enter``). Under that reading ``()`` is the
least time at every depth: joining it with any time ``t`` gives ``t``. It
serves two purposes:

* a logic function of the general linear operator emits ``MIN_TIME`` when its
  output holds "from the beginning" (map, filter, flat_map, explode), without
  having to know how deeply the input is nested;
* untimed traces (the state of an operator that sums over all of history)
  record their batches at ``MIN_TIME``.
"""

from __future__ import annotations

from dbspark.core.timestamps import Time

MIN_TIME: Time = ()


def pad(t: Time, depth: int) -> Time:
    """``t`` with zeros appended up to ``depth`` coordinates."""
    if len(t) > depth:
        raise ValueError(f"time {t} is deeper than {depth} coordinates")
    return (*t, *(0,) * (depth - len(t)))


def join_padded(a: Time, b: Time) -> Time:
    """Least upper bound of two times after padding the shorter with zeros."""
    depth = max(len(a), len(b))
    return tuple(max(x, y) for x, y in zip(pad(a, depth), pad(b, depth), strict=True))
