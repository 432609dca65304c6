"""The Spark tier: a planned circuit run as Spark plans over the warehouse.

* ``executor``: ``SparkEngine``, the epoch API both tiers run behind, and the stage
  loop; it hands each unit to the local or the Spark tier. Its other parts, one module
  each: ``unit`` (a unit's writes, reads of its own batches, one commit), ``ingest``,
  ``evaluate`` (one evaluation function per operator), ``loops``, ``views``,
  ``maintenance``; ``storage/collection_names`` names what they store.
* ``tier``: the Spark tier's frames, reads and writes; ``dialect``: the functions the
  shared kernels (``engine/kernels.py``) call, in PySpark.
* ``compile``: expressions -> ``pyspark.sql.Column`` with the reference engine's semantics.
* ``frames``: Z-set <-> DataFrame conversions.
* ``files``: landing files read strictly; ``upserts``: an upsert batch's state delta
  on Spark, decided on the driver when the batch is small, else by Spark jobs.
* ``user_aggregates``: user-defined aggregates over collected groups.
* ``full_refresh``: a circuit evaluated from scratch over its accumulated inputs.
* ``session``: ``spark_session()`` (local classic by default, Spark Connect on request);
  ``gateway``: the JVM class lookups a classic session remembers (fewer Py4J round
  trips); ``class_archive``: the JVM class-data archive every Spark launch maps.

Importing this package does not import pyspark; the submodules do.
"""
