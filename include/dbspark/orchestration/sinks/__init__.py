"""Where a circuit's views go after each epoch, for readers outside dbspark.

``files`` writes each view's snapshot and change feed as Parquet directories under the
outputs root (with completion markers) and reads them back; ``serving`` keeps a SQL
serving table per view in step; ``export`` does both for one epoch
(:func:`~dbspark.orchestration.sinks.export.export_epoch`, the publish task's call).
"""
