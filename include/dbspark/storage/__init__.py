"""The trace store: immutable Parquet batches in a warehouse directory + a SQL catalog.

- ``catalog``: circuits, epochs (and the DAG runs that worked on them), batches, stage
  runs (the commit protocol), frontiers and loop iterations, over SQLAlchemy (SQLite by
  default, PostgreSQL when deployed).
- ``warehouse``: where batches live and how Spark writes and reads them (hash buckets
  by key, so a read for a few keys opens only their buckets' files).
- ``traces``: traces as log-structured batches: append, read by key, compact.

Spark is imported lazily: the catalog works without it.
"""

from dbspark.core.columns import time_columns
from dbspark.storage.catalog import (
    BatchRecord,
    Catalog,
    CatalogError,
    CollectionSize,
    EpochRecord,
    EpochRun,
    GCReport,
    LoopIteration,
    StageOutput,
    garbage_collect,
)
from dbspark.storage.traces import Compaction, TraceStore
from dbspark.storage.warehouse import Warehouse

__all__ = [
    "BatchRecord",
    "Catalog",
    "CatalogError",
    "CollectionSize",
    "Compaction",
    "EpochRecord",
    "EpochRun",
    "GCReport",
    "LoopIteration",
    "StageOutput",
    "TraceStore",
    "Warehouse",
    "garbage_collect",
    "time_columns",
]
