"""Durable traces: log-structured collections of timed updates, kept by compaction.

A trace is stored as batches (see ``warehouse``) of rows with the user's columns, the
time columns ``__epoch`` (BIGINT), ``__iter``, ``__iter_2``, ... (INT, one per nested
loop) and the weight ``__w`` (BIGINT). Appending adds a small batch per time;
:meth:`TraceStore.compact` advances the times of the batches below a frontier to that
frontier (``Antichain.advance``), consolidates, and replaces them by one batch in one
catalog commit. So the number of live batches and their rows track the size of the
collection, not the number of epochs.

Invariant used by readers: every row of a batch is at the batch's time or later in the
product order (a stage writes at its own time or, for general-linear operators, later;
a compaction's batch time is the meet of its rows' advanced times). A read up to
``max_time`` therefore skips batches whose time is not at or below ``max_time``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dbspark.core import timestamps
from dbspark.core.antichain import Antichain
from dbspark.core.columns import WEIGHT, time_columns
from dbspark.core.settings import int_setting
from dbspark.storage.catalog import BatchRecord, Catalog, CatalogError, encode_time
from dbspark.storage.warehouse import BUCKET_COLUMN, DEFAULT_BUCKETS, KeySet, Warehouse, bucketed

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType


def advance_columns(
    frontier: Antichain, columns: Sequence[str], functions: Any = None
) -> list[tuple[str, Column]]:
    """Column expressions advancing each time column by ``frontier`` (Spark's, or those of
    the ``functions`` module given: the local tier's frame functions).

    ``Antichain.advance``: the meet over frontier elements ``f`` of ``join(t, f)``,
    coordinate-wise ``min_f max(t_i, f_i)``.
    """
    if functions is None:
        from pyspark.sql import functions as F
    else:
        F = functions

    out = []
    for i, c in enumerate(columns):
        joins = [F.greatest(F.col(c), F.lit(int(f[i]))) for f in frontier.elements]
        expr = joins[0] if len(joins) == 1 else F.least(*joins)
        out.append((c, expr))
    return out


@dataclass(frozen=True)
class Compaction:
    """What :meth:`TraceStore.compact` did."""

    collection: str
    frontier: tuple[tuple[int, ...], ...]
    inputs: tuple[int, ...]
    input_rows: int
    output: BatchRecord | None
    committed: bool


@dataclass(frozen=True)
class CompactionPlanInput:
    """What one compaction pass over several traces needs of the catalog, read in three
    queries instead of three per trace (:meth:`TraceStore.planning_input`): each
    collection's live trace batches, the stored frontiers, and the units committed at
    the pass's epoch. Valid while the pass compacts each collection once."""

    live: dict[str, list[BatchRecord]]
    frontiers: dict[str, list[tuple[int, ...]]]
    committed: frozenset[tuple[str, tuple[int, ...]]]


class TraceStore:
    """The traces of one circuit: append, read (optionally by key), compact."""

    def __init__(
        self,
        spark: SparkSession | Callable[[], SparkSession],
        warehouse: Warehouse,
        catalog: Catalog,
        circuit: str,
        *,
        buckets: int = DEFAULT_BUCKETS,
    ) -> None:
        # A callable is asked for the session on first use (an engine starts Spark lazily).
        self._spark = spark
        self.warehouse = warehouse
        self.catalog = catalog
        self.circuit = circuit
        self.buckets = buckets

    @property
    def spark(self) -> SparkSession:
        if callable(self._spark):  # a session object is not callable; its opener is
            self._spark = self._spark()
        return self._spark  # type: ignore[return-value]

    # --- appending ---------------------------------------------------------------------
    def write(
        self,
        collection: str,
        df: DataFrame,
        time: Sequence[int],
        bucket_by: Sequence[str] | None = None,
        *,
        kind: str = "trace",
        driver_rows: int = 0,
    ) -> BatchRecord | None:
        """Write a batch at ``time`` WITHOUT committing it (for stages that commit several
        outputs at once). Time columns missing from ``df`` are set to ``time``.
        ``driver_rows``: see ``Warehouse.write``."""
        df = with_time_columns(df, time)
        return self.warehouse.write(
            df,
            self.circuit,
            collection,
            kind,
            time,
            bucket_by=bucket_by,
            buckets=self.buckets,
            driver_rows=driver_rows,
        )

    def append(
        self,
        collection: str,
        df: DataFrame,
        time: Sequence[int],
        bucket_by: Sequence[str] | None = None,
        *,
        stage: str | None = None,
    ) -> bool:
        """Append ``df`` as the change at ``time`` and commit it as its own stage run
        (``stage`` defaults to ``append:<collection>``). Returns False, writing nothing,
        when that stage run already committed."""
        stage = stage or f"append:{collection}"
        if self.catalog.stage_done(self.circuit, stage, time):
            return False
        record = self.write(collection, df, time, bucket_by)
        return self._commit_or_discard(record, stage, time)

    # --- reading -----------------------------------------------------------------------
    def batches(self, collection: str, max_time: Sequence[int] | None = None) -> list[BatchRecord]:
        """Live batches of ``collection`` that can hold rows at or before ``max_time``."""
        if max_time is None:
            return self.catalog.batches(self.circuit, collection)
        t = tuple(int(x) for x in max_time)
        return [
            b
            for b in self.catalog.batches(self.circuit, collection, max_epoch=t[0])
            if len(b.time) == len(t) and timestamps.less_equal(b.time, t)
        ]

    def read(
        self,
        collection: str,
        schema: StructType,
        keys: DataFrame | KeySet | None = None,
        bucket_by: Sequence[str] | None = None,
        max_time: Sequence[int] | None = None,
    ) -> DataFrame:
        """The trace's updates (all, or those at or before ``max_time``), optionally only
        for ``keys``. Updates are not consolidated across batches."""
        records = self.batches(collection, max_time)
        df = self.warehouse.read(self.spark, records, schema, keys=keys, bucket_by=bucket_by)
        if max_time is not None:
            from pyspark.sql import functions as F

            cols = time_columns(len(max_time))
            for c, t in zip(cols, max_time, strict=True):
                df = df.where(F.col(c) <= F.lit(int(t)))
        return df

    # --- compaction --------------------------------------------------------------------
    def planning_input(self, collections: Iterable[str], epoch: int) -> CompactionPlanInput:
        """The catalog's answers a compaction pass at ``epoch`` over ``collections`` needs,
        read at once (see :class:`CompactionPlanInput`)."""
        wanted = list(dict.fromkeys(collections))
        live: dict[str, list[BatchRecord]] = {c: [] for c in wanted}
        for record in self.catalog.live_batches(self.circuit, wanted, kind="trace"):
            live[record.collection].append(record)
        committed = frozenset(
            (stage, tuple(time))
            for stage, time in self.catalog.stage_runs(self.circuit, epoch=epoch)
        )
        return CompactionPlanInput(live, self.catalog.frontiers(self.circuit), committed)

    def compact(
        self,
        collection: str,
        frontier: Antichain | Iterable[Sequence[int]],
        schema: StructType,
        key_columns: Sequence[str],
        time_columns: Sequence[str],
        *,
        tiered: bool = False,
        local: Callable[[list[BatchRecord], Antichain, tuple[int, ...]], BatchRecord | None]
        | None = None,
        local_rows: int = 0,
        known: CompactionPlanInput | None = None,
    ) -> Compaction | None:
        """Advance the live batches not beyond ``frontier`` to it and merge them into one.

        Reads those batches, advances their time columns by the frontier, consolidates
        (sums ``__w`` per distinct row and time, drops zeros), writes one batch bucketed
        by ``key_columns``, and in one catalog commit registers it, supersedes the inputs
        and records the collection's frontier. Accumulations at times beyond the frontier
        are unchanged. Idempotent: compacting again at the same frontier does nothing.

        ``tiered=True`` merges like a counter in base ``compaction_fanout()`` (Differential
        Dataflow's spine is base 2): batches of one size class, with the smaller ones,
        carried upwards (``_tiered_choice``), so an old big batch is rewritten only when
        the recent ones have grown to its size class (O(log n) rewrites per update instead
        of one per compaction, and O(log n) live batches).

        ``local(chosen, frontier, out_time)``, when given, rewrites a merge of at most
        ``local_rows`` rows instead of Spark (the same batch, written without a Spark job).

        ``known``, read once for a pass over several traces, answers the catalog reads
        (without it, they are read for this collection alone).

        Returns None when there is nothing to merge (or it was done already).
        """
        if not isinstance(frontier, Antichain):
            frontier = Antichain(tuple(int(x) for x in f) for f in frontier)
        if known is None:
            known = self.planning_input([collection], min((f[0] for f in frontier), default=0))
        frontier = self._checked_frontier(
            frontier, schema, key_columns, time_columns, collection, known.frontiers
        )
        time_cols = list(time_columns)
        meet = frontier.elements[0]
        for f in frontier.elements[1:]:
            meet = timestamps.meet(meet, f)
        stage = f"compact:{collection}"
        if len(frontier) > 1:
            stage += "@" + ";".join(encode_time(f) for f in frontier)
        if (stage, meet) in known.committed:
            return None
        live = known.live.get(collection, [])
        chosen = self._to_merge(frontier, meet, len(time_cols), live, tiered=tiered)
        if not chosen:
            return None
        out_time = frontier.advance(chosen[0].time)
        for b in chosen[1:]:
            out_time = timestamps.meet(out_time, frontier.advance(b.time))
        if local is not None and sum(b.rows for b in chosen) <= local_rows:
            record = local(chosen, frontier, out_time)
        else:
            self.catalog.flush()  # a commit group must not hold the write lock over a job
            record = self._merge_on_spark(
                collection, chosen, frontier, schema, key_columns, time_cols, out_time
            )
        return self.commit_merge(collection, frontier, stage, meet, chosen, record)

    def _checked_frontier(
        self,
        frontier: Antichain,
        schema: StructType,
        key_columns: Sequence[str],
        time_columns: Sequence[str],
        collection: str,
        stored_frontiers: dict[str, list[tuple[int, ...]]],
    ) -> Antichain:
        """``frontier``, refused when it is empty, does not match the time columns, or
        would move the collection's stored frontier (of ``stored_frontiers``) backwards."""
        if frontier.is_empty():
            raise ValueError("cannot compact to an empty frontier")
        time_cols = list(time_columns)
        if any(len(f) != len(time_cols) for f in frontier):
            raise ValueError(f"frontier {frontier} does not match time columns {time_cols}")
        names = schema.fieldNames()
        missing = [c for c in [*time_cols, WEIGHT, *key_columns] if c not in names]
        if missing:
            raise ValueError(f"columns {missing} are not in the trace schema {names}")
        stored = stored_frontiers.get(collection)
        if stored is not None and not Antichain(stored).dominates(frontier):
            raise ValueError(
                f"frontier of {self.circuit}/{collection} would move backwards: "
                f"{frontier} is not beyond the stored {stored}"
            )
        return frontier

    def _to_merge(
        self,
        frontier: Antichain,
        meet: tuple[int, ...],
        depth: int,
        live: list[BatchRecord],
        *,
        tiered: bool,
    ) -> list[BatchRecord]:
        """Of ``live`` (the collection's live trace batches), those one compaction merges
        (empty: nothing worth merging)."""
        live = [b for b in live if len(b.time) == depth]
        eligible = [b for b in live if not frontier.less_equal(b.time)]
        chosen = _tiered_choice(eligible, compaction_fanout()) if tiered else eligible
        # Inside a loop an epoch writes a batch per iteration, each larger than all before
        # it, so the binary counter never merges them and every read would open them all.
        # They are merged here, at the epoch's close, as they are: their rows keep their
        # iteration (advancing by the frontier leaves a time at or beyond it unchanged),
        # and every reader selects rows by their own times.
        # (The older batches join them only when the binary counter merges them anyway.)
        this_epoch = [
            b for b in live if depth > 1 and b.time[0] == meet[0] and frontier.less_equal(b.time)
        ]
        if len(this_epoch) > 1:
            older = chosen if len(chosen) > 1 or not tiered else []
            chosen = [*older, *this_epoch]
        if tiered and len(chosen) < 2:
            return []
        return chosen

    def _merge_on_spark(
        self,
        collection: str,
        chosen: list[BatchRecord],
        frontier: Antichain,
        schema: StructType,
        key_columns: Sequence[str],
        time_cols: list[str],
        out_time: tuple[int, ...],
    ) -> BatchRecord | None:
        """The chosen batches advanced to ``frontier``, consolidated and written as one
        bucketed batch at ``out_time`` (not yet committed)."""
        from pyspark.sql import functions as F

        names = schema.fieldNames()
        df = self.warehouse.read(self.spark, chosen, schema)
        for c, expr in advance_columns(frontier, time_cols):
            df = df.withColumn(c, expr.cast(schema[c].dataType))
        group = [c for c in names if c != WEIGHT]
        if key_columns:
            # Partition by bucket first: the aggregation (its keys include the bucket)
            # then needs no shuffle of its own, and the write none either.
            df = bucketed(df, key_columns, self.buckets)
            group.append(BUCKET_COLUMN)
        consolidated = (
            df.groupBy(*group)
            .agg(F.sum(WEIGHT).cast("long").alias(WEIGHT))
            .where(F.col(WEIGHT) != 0)
            .select(*names, *([BUCKET_COLUMN] if key_columns else []))
        )
        return self.warehouse.write(
            consolidated,
            self.circuit,
            collection,
            "trace",
            out_time,
            bucket_by=list(key_columns) or None,
            buckets=self.buckets,
            prebucketed=bool(key_columns),
        )

    def commit_merge(
        self,
        collection: str,
        frontier: Antichain,
        stage: str,
        meet: tuple[int, ...],
        chosen: list[BatchRecord],
        record: BatchRecord | None,
    ) -> Compaction:
        """Commit ``record`` (None: the merge came to nothing) as ``stage`` at ``meet``, in
        place of ``chosen``, with ``frontier`` as the collection's; a merge that another
        attempt committed first, or that the catalog refused, has its files deleted."""
        try:
            committed = self._commit_or_discard(
                record,
                stage,
                meet,
                supersede=[b.id for b in chosen if b.id is not None],
                frontiers={collection: frontier.elements},
                # A circuit evolved meanwhile may have renamed the collection.
                supersede_in=collection,
            )
        except CatalogError:
            if not self._superseded_meanwhile(collection, chosen):
                raise
            # Another compaction (a worker's in the background, another process's) merged
            # some of these first: its merge holds the same rows; this one's files are gone.
            committed = False
        return Compaction(
            collection=collection,
            frontier=frontier.elements,
            inputs=tuple(b.id for b in chosen if b.id is not None),
            input_rows=sum(b.rows for b in chosen),
            output=record if committed else None,
            committed=committed,
        )

    def _superseded_meanwhile(self, collection: str, chosen: list[BatchRecord]) -> bool:
        live = {b.id for b in self.catalog.live_batches(self.circuit, [collection])}
        return any(b.id is not None and b.id not in live for b in chosen)

    def _commit_or_discard(
        self, record: BatchRecord | None, stage: str, time: Sequence[int], **kwargs: Any
    ) -> bool:
        """Commit ``record`` as ``stage``'s output; if that surely did not happen (already
        committed by another attempt, or refused and rolled back), delete its files right
        away. Other errors (e.g. a lost connection: did it commit?) leave them to GC."""
        try:
            committed = self.catalog.commit(
                self.circuit, stage, time, [record] if record is not None else [], **kwargs
            )
        except CatalogError:
            if record is not None:
                self.warehouse.delete(record)
            raise
        if not committed and record is not None:
            self.warehouse.delete(record)
        return committed


def with_time_columns(df: DataFrame, time: Sequence[int]) -> DataFrame:
    """``df`` with every time column it lacks set to ``time``'s coordinate."""
    from pyspark.sql import functions as F

    for i, c in enumerate(time_columns(len(time))):
        if c not in df.columns:
            df = df.withColumn(c, F.lit(int(time[i])).cast("long" if i == 0 else "int"))
    return df


#: How many batches of one size class a tiered compaction waits for before it merges
#: them (``_tiered_choice``). Base 4 rewrites each row about half as often as base 2 (a
#: batch climbs two size classes at a time) but keeps up to 3 live batches a class
#: instead of 1, which every read of the trace opens; measured, its epochs are faster
#: whether the traces are resident or not: ARCHITECTURE.md, "Compaction".
DEFAULT_COMPACTION_FANOUT = 4


def compaction_fanout() -> int:
    """``DBSPARK_COMPACTION_FANOUT`` (an integer of at least 2), else 4."""
    return int_setting("DBSPARK_COMPACTION_FANOUT", DEFAULT_COMPACTION_FANOUT, minimum=2)


def _level(rows: int) -> int:
    """A batch's size class: batches of 2**k to 2**(k+1) - 1 rows are level k."""
    return max(rows, 1).bit_length() - 1


def _tiered_choice(batches: list[BatchRecord], fanout: int = 2) -> list[BatchRecord]:
    """The batches to merge, as a counter in base ``fanout`` carries (Differential
    Dataflow's spine is base 2): the lowest size class that holds ``fanout`` batches,
    with every smaller batch; then, while the merged size falls in a class that the
    merged batch would fill to ``fanout``, that class's batches too. Empty when no class
    holds ``fanout``. Each class then keeps fewer than ``fanout`` batches, so the live
    batches stay logarithmic in the rows, and a row is rewritten once per class it
    climbs, over ``log2(fanout)`` classes at a time. (Taking the smallest batches while
    each next was no larger than all taken so far left a small first epoch alone and
    every later batch, a little larger, out: nothing ever merged, one live batch per
    epoch, which the soak benchmark found.)"""
    counts: dict[int, int] = {}
    for b in batches:
        counts[_level(b.rows)] = counts.get(_level(b.rows), 0) + 1
    crowded = [level for level, n in counts.items() if n >= fanout]
    if not crowded:
        return []
    lowest = min(crowded)
    chosen = [b for b in batches if _level(b.rows) <= lowest]
    total = sum(b.rows for b in chosen)
    while True:
        carry = [b for b in batches if b not in chosen and _level(b.rows) <= _level(total)]
        if len(carry) + 1 < fanout:
            break
        chosen += carry
        total += sum(b.rows for b in carry)
    return sorted(chosen, key=lambda b: (b.rows, b.id or 0))


def log_merge_runs(batches: Sequence[BatchRecord]) -> list[list[BatchRecord]]:
    """Of a raw input log's batches, the runs to merge: each run is neighbours in epoch
    order, and only runs of two or more are returned, oldest batch first.

    A log's merge must keep the epochs in order, unlike a trace's: merged rows move to
    the run's last epoch, and an upsert source's replay compares each epoch's rows with
    the winners of the epochs before it, so a run with an unmerged batch inside it would
    replay that batch against the wrong winners. The runs are kept as Timsort keeps its
    own: walking the batches oldest first, the two newest runs merge while the older is
    not larger than the newer, or the third newest is not larger than the two newest
    together. Run sizes then grow at least as fast as Fibonacci numbers from the newest
    to the oldest, so the live batches are logarithmic in the rows and a row is
    rewritten a logarithmic number of times. Merged upsert runs shrink to their winners,
    which only makes the next plan merge sooner."""
    runs: list[list[BatchRecord]] = []
    sizes: list[int] = []
    for batch in sorted(batches, key=lambda b: (tuple(b.time), b.id or 0)):
        runs.append([batch])
        sizes.append(max(batch.rows, 1))
        while len(runs) >= 2 and (
            sizes[-2] <= sizes[-1] or (len(runs) >= 3 and sizes[-3] <= sizes[-2] + sizes[-1])
        ):
            newer, size = runs.pop(), sizes.pop()
            runs[-1] += newer
            sizes[-1] += size
    return [run for run in runs if len(run) > 1]
