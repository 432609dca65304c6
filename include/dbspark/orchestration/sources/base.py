"""The source connector interface: where one source's batch for one data interval comes from.

A DAG run ingests one :class:`~dbspark.orchestration.intervals.Interval` per epoch. Each
source's ingest task asks that source's :class:`SourceConnector` for the batch of the
interval and hands it to ``SparkEngine.check_batch`` / ``ingest``. A connector returns
what the engine already accepts:

* a :class:`~dbspark.engine.file_batches.FileBatch` (files the engine reads and checks
  itself, naming the file and line of any bad row): :class:`LandingDirectory`;
* a list of Python rows in the source's schema order (``[row, weight]`` pairs for a
  Z-set source): :class:`SqlTable`;
* ``None``: nothing arrived for this interval. Omit the source from ``run_epoch``'s
  inputs (``check_batch`` does not take ``None``), or pass it to ``ingest``, which ingests
  an empty batch.

Connectors are given the source's declared column names (:func:`source_columns` reads
them off the circuit) because only the circuit knows them: files are matched by name by
the engine, but a table pull must select the right columns in the right order.

An epoch's input must never change once it is committed (a retried ingest would
otherwise silently fork history): the engine records a fingerprint of what each ingest
consumed and refuses a different batch for it on a re-run. Input that arrives for an
interval after it was ingested is never read; a connector that can see it says so
through :meth:`SourceConnector.record` and :meth:`SourceConnector.changes`, which each
ingest asks about the earlier intervals (``late_window`` of them) and answers by its
``late_files`` policy: ``"warn"`` in the task log, or ``"fail"``.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dbspark.circuit.builder import Circuit
from dbspark.core.types import Schema
from dbspark.engine.api import require_sources
from dbspark.orchestration.intervals import Interval

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["SourceConnector", "source_columns", "source_schema"]


class SourceConnector(abc.ABC):
    """Where one source's batch for one interval comes from."""

    @abc.abstractmethod
    def batch(
        self,
        source: str,
        interval: Interval,
        *,
        columns: Sequence[str],
        spark: SparkSession | None = None,
        scratch: Path | None = None,
        schema: Schema | None = None,
    ) -> Any:
        """The batch of ``source`` for ``interval``: a ``FileBatch``, a list of rows in
        ``columns`` order, or ``None`` when nothing arrived.

        ``columns`` are the source's declared column names in schema order
        (:func:`source_columns`); ``spark`` is there for connectors that read with Spark.
        ``scratch`` is a private folder the connector may write the batch's files into
        (the task removes it after the ingest), and ``schema`` the source's declared
        schema (:func:`source_schema`), for a connector that writes them.
        """

    @abc.abstractmethod
    def describe(self, source: str, interval: Interval) -> str:
        """One line for the task log: where the batch of ``source`` for ``interval`` is read."""

    #: What an ingest does when :meth:`changes` finds something: "warn" or "fail".
    late_files: str = "warn"
    #: How many earlier intervals each ingest asks :meth:`changes` about.
    late_window: int = 0

    def record(self, source: str, interval: Interval, batch: Any) -> dict[str, Any] | None:
        """What to remember of ``batch`` (as JSON) to tell later whether the interval's
        input changed after it was ingested; None when the connector cannot tell."""
        return None

    def changes(self, source: str, interval: Interval, recorded: Mapping[str, Any]) -> list[str]:
        """What arrived or changed in ``interval`` since the ingest that ``recorded``
        (:meth:`record`) describes, one line each; empty when nothing did."""
        return []

    def dataset(self, source: str) -> tuple[str, str] | None:
        """Where ``source`` is read from, as an OpenLineage dataset's (namespace, name),
        following its naming spec; None when the connector cannot name it."""
        return None


def source_columns(circuit: Circuit, source: str) -> tuple[str, ...]:
    """The declared column names of ``source`` in schema order (an upsert source's user
    columns, not its internal state columns)."""
    return tuple(source_schema(circuit, source).names)


def source_schema(circuit: Circuit, source: str) -> Schema:
    """The declared schema of ``source`` (an upsert source's user columns, not its
    internal state columns)."""
    require_sources(circuit.name, circuit.sources, [source])
    node = circuit.node(circuit.sources[source])
    return node.schema if node.op == "zset_source" else node.params["user_schema"]
