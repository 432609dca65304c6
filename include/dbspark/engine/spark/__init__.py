"""The Spark backend: circuit expressions as native Columns, Z-sets as DataFrames.

* ``session``: ``spark_session()`` (local classic by default, Spark Connect on request).
* ``compile``: expressions -> ``pyspark.sql.Column`` with the reference engine's semantics.
* ``frames``: reserved columns (``__w``, ``__epoch``, ``__iter``...), Z-set <-> DataFrame.
* ``full_refresh``: a circuit evaluated from scratch over accumulated inputs.

Importing this package does not import pyspark; the submodules do.
"""
