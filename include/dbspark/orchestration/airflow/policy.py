"""Timeouts and retries of a dbspark DAG's tasks, per task kind (issue 18, finding 17).

**Timeouts.** Every task has an ``execution_timeout``, so a hung unit (a lost Spark
Connect server, a stuck file system) fails and retries instead of holding the run
forever. Defaults per kind are below; ``build_dag(execution_timeouts=...)`` or, for every
DAG of a deployment, ``[dbspark] execution_timeouts`` in ``airflow.cfg`` (or
``AIRFLOW__DBSPARK__EXECUTION_TIMEOUTS``) override some of them, as
``"ingest=2h, stage=90m, converged=300"`` (a number of seconds, or one with ``s``, ``m``,
``h`` or ``d``). They are read when the DAG file is parsed: a timeout is part of the task.

**Retries.** Failures that a retry cannot fix fail at once (:func:`retry_policy`, Airflow
3.3's ``ExceptionRetryPolicy``): bad input (``InputError``: the same input is read
again), units that never committed (``UncommittedUnits``: someone must run them), a loop
that reached its bound, a circuit whose definition changed (``CircuitDefinitionChanged``)
and a SQLite catalog refused on a shared file system (``UnsafeCatalog``). Everything else
retries with exponential backoff from ``retry_delay``: with the defaults (3 retries, 30 s
doubling, at most 10 min apart) the retries come at least 30 s, 60 s and 120 s after each
failure, so an outage of the catalog database of three and a half minutes, a restart or
a failover, costs a delay, not the run (:func:`retry_window`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from dbspark.orchestration.airflow.hook import dbspark_setting

#: The task kinds of a dbspark DAG and each one's default ``execution_timeout``. Tasks
#: that only read the catalog get minutes; units of data work get hours (a first epoch
#: loads a whole history); rebuild and verify recompute every view from scratch.
DEFAULT_TIMEOUTS: dict[str, timedelta] = {
    "open": timedelta(minutes=10),
    "ingest": timedelta(hours=2),
    "stage": timedelta(hours=2),
    "iterate": timedelta(hours=2),
    "converged": timedelta(minutes=10),
    "publish": timedelta(hours=2),
    "close": timedelta(hours=2),
    "rebuild": timedelta(hours=6),
    "verify": timedelta(hours=6),
    "serve": timedelta(hours=2),
    "maintain": timedelta(hours=2),
}

#: ``build_dag``'s defaults: retries, the first retry's delay, its growth, its bound.
RETRIES = 3
RETRY_DELAY = timedelta(seconds=30)
RETRY_BACKOFF = 2.0
MAX_RETRY_DELAY = timedelta(minutes=10)

_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_timeouts(text: str, where: str) -> dict[str, timedelta]:
    """``"ingest=2h, stage=90m"`` as timeouts by kind; anything else is a ``ValueError``
    that names ``where`` the text came from, the entry and the kinds."""
    timeouts = {}
    for entry in filter(None, (part.strip() for part in text.split(","))):
        kind, equals, value = entry.partition("=")
        kind = kind.strip()
        if not equals or kind not in DEFAULT_TIMEOUTS:
            raise ValueError(
                f"{where}: {entry!r} is not <kind>=<duration> with a kind among "
                f"{', '.join(DEFAULT_TIMEOUTS)}"
            )
        timeouts[kind] = parse_duration(value, f"{where}, {kind}")
    return timeouts


def parse_duration(value: Any, where: str) -> timedelta:
    """A positive duration: a ``timedelta``, a number of seconds, or text such as
    ``90``, ``90s``, ``30m``, ``2h``, ``1d``."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        match = _DURATION.fullmatch(str(value))
        if match is None:
            raise ValueError(f"{where}: {value!r} is not a duration (e.g. 90, 90s, 30m, 2h, 1d)")
        seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if seconds <= 0:
        raise ValueError(f"{where}: a timeout must be positive, got {value!r}")
    return timedelta(seconds=seconds)


def configured_timeouts() -> dict[str, timedelta]:
    """``[dbspark] execution_timeouts`` from ``airflow.cfg`` (or its environment
    variable), parsed; empty when unset."""
    text = dbspark_setting("execution_timeouts")
    if not text:
        return {}
    return parse_timeouts(text, "[dbspark] execution_timeouts in airflow.cfg")


def task_timeouts(given: Mapping[str, Any] | None = None) -> dict[str, timedelta]:
    """Each task kind's ``execution_timeout``: ``given`` (``build_dag``'s argument) over
    ``[dbspark] execution_timeouts`` over :data:`DEFAULT_TIMEOUTS`."""
    timeouts = {**DEFAULT_TIMEOUTS, **configured_timeouts()}
    for kind, value in (given or {}).items():
        if kind not in DEFAULT_TIMEOUTS:
            raise ValueError(
                f"build_dag(execution_timeouts=...): {kind!r} is not a task kind "
                f"({', '.join(DEFAULT_TIMEOUTS)})"
            )
        timeouts[kind] = parse_duration(value, f"build_dag(execution_timeouts=...), {kind}")
    return timeouts


def retry_policy() -> Any:
    """The retry policy of every dbspark task: fail at once where a retry would fail the
    same way, else Airflow's retries (``retries``, ``retry_delay``, backoff)."""
    from airflow.sdk.definitions.retry_policy import (
        ExceptionRetryPolicy,
        RetryAction,
        RetryRule,
    )

    return ExceptionRetryPolicy(
        rules=[
            RetryRule(
                exception="dbspark.core.errors.InputError",
                action=RetryAction.FAIL,
                reason="bad input: a retry reads the same input; fix it, then clear the task",
            ),
            RetryRule(
                exception="dbspark.storage.catalog.UncommittedUnits",
                action=RetryAction.FAIL,
                reason="units it needs never committed: run them (clear their tasks)",
            ),
            RetryRule(
                exception="dbspark.storage.catalog.CircuitDefinitionChanged",
                action=RetryAction.FAIL,
                reason="the circuit's definition changed: a retry finds the same one; "
                "rename the circuit, use a new warehouse or rebuild",
            ),
            RetryRule(
                exception="dbspark.storage.catalog.UnsafeCatalog",
                action=RetryAction.FAIL,
                reason="the SQLite catalog is refused on a shared file system: "
                "change the deployment (PostgreSQL), then clear the task",
            ),
            RetryRule(
                exception="dbspark.engine.api.LoopDidNotConverge",
                action=RetryAction.FAIL,
                reason="the loop reached its bound: a retry iterates the same way",
            ),
        ]
    )


def retry_window(retries: int, delay: timedelta, backoff: float, cap: timedelta | None) -> float:
    """The least time, in seconds, between a task's first failure and its last try, as
    Airflow spaces retries (each delay at least ``delay * backoff**(try - 1)``, at most
    ``cap``): how long an outage the retries outlast."""
    total = 0.0
    for attempt in range(retries):
        wait = delay.total_seconds() * (backoff**attempt if backoff > 0 else 1.0)
        total += min(wait, cap.total_seconds()) if cap else wait
    return total
