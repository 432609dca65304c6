"""Fewer Py4J round trips on classic Spark: remember the JVM classes PySpark looks up.

On a classic session every ``pyspark.sql.functions`` call, and every list PySpark hands
the JVM, first resolves a class by name (``sc._jvm.functions``, ``sc._jvm.PythonUtils``)
and then a static method on it, each a reflection round trip to the JVM, before the one
call that does the work. Py4J remembers neither answer. Building one unit's DataFrames
makes thousands of such calls (``F.col`` alone: three round trips where one would do),
and at about half a millisecond each they cost as much as the plan's Spark jobs.

``remember_jvm_lookups`` keeps the answers for the classes below on the session's
``JVMView``: a class once resolved is stored as an attribute of the view (Python finds
it there before asking the JVM again), and its static methods are stored on the class
object the first time they are called. A class and its static methods do not change
while the JVM lives, and a new gateway comes with a new view, so nothing goes stale.
Fields are not remembered (their values may change). Spark Connect sessions have no
gateway and are left alone.

The other half of PySpark's overhead per column, the DataFrame debugging context
(two calls to the JVM and a Python stack walk around each ``Column`` method), is
turned off by ``spark.python.sql.dataFrameDebugging.enabled=false`` in the sessions
dbspark starts (``session.py``).
"""

from __future__ import annotations

from typing import Any

from py4j.java_gateway import JavaClass, JavaMember

#: The names PySpark resolves through ``sc._jvm`` on every column or sequence it builds.
REMEMBERED_CLASSES = (
    "org.apache.spark.sql.functions",
    "functions",
    "PythonUtils",
    "org.apache.spark.sql.classic.SparkSession",
)


class _RememberingClass(JavaClass):
    """A ``JavaClass`` that keeps each static method the first time it is looked up."""

    def __getattr__(self, name: str) -> Any:
        found = super().__getattr__(name)
        if isinstance(found, JavaMember):
            # Stored on the instance, so the next lookup never reaches __getattr__.
            object.__setattr__(self, name, found)
        return found


def remember_jvm_lookups(spark: Any) -> None:
    """Remember the classes of ``REMEMBERED_CLASSES`` on the session's JVM view (classic
    sessions only; idempotent)."""
    jvm = getattr(getattr(spark, "sparkContext", None), "_jvm", None) if _classic(spark) else None
    if jvm is None:
        return
    for name in REMEMBERED_CLASSES:
        if isinstance(jvm.__dict__.get(name), _RememberingClass):
            continue
        resolved = getattr(jvm, name)  # one reflection call, now and never again
        if isinstance(resolved, JavaClass):
            jvm.__dict__[name] = _RememberingClass(resolved._fqn, resolved._gateway_client)


def _classic(spark: Any) -> bool:
    from dbspark.engine.spark.session import is_connect

    return not is_connect(spark)
