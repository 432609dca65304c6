"""Benchmark data: generated or shipped tables, landed as Parquet one folder per epoch.

Every generator writes ``<landing>/<source>/epoch=<e>/part-0.parquet``: dbspark ingests
one such folder per epoch, and Spark Declarative Pipelines reads the whole
``<landing>/<source>`` folder on every run, so both see the same rows.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


def epoch_folder(landing: Path, source: str, epoch: int) -> Path:
    return landing / source / f"epoch={epoch}"


def land(landing: Path, source: str, epoch: int, table: pa.Table) -> Path:
    """Write ``table`` as ``source``'s batch of ``epoch``; the folder it went to."""
    folder = epoch_folder(landing, source, epoch)
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, folder / "part-0.parquet")
    return folder
