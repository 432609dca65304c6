"""Where a circuit's views go after each epoch, for readers outside dbspark.

``tables`` keeps each view as a Delta table under the outputs root, one version per
epoch (the view as of any epoch); ``files`` writes each epoch's change feed (and, only
when asked, a whole-view snapshot) as Parquet directories with completion markers and
reads them back; ``serving`` keeps a SQL serving table per view in step; ``export`` does
all of them for one epoch
(:func:`~dbspark.orchestration.sinks.export.export_epoch`, the publish task's call).
"""
