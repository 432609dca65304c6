"""The Spark tier's dialect: PySpark's functions and ``engine/spark/compile.py``."""

from __future__ import annotations

from pyspark.sql import Window, functions

from dbspark.engine.dialect import Dialect
from dbspark.engine.spark import user_aggregates
from dbspark.engine.spark.compile import (
    compile_expr,
    compile_predicate,
    compile_projection,
    spark_type,
)
from dbspark.storage.warehouse import semi_join

SPARK = Dialect(
    name="spark",
    F=functions,
    Window=Window,
    compile_expr=compile_expr,
    compile_predicate=compile_predicate,
    compile_projection=compile_projection,
    column_type=spark_type,
    semi_join=semi_join,
    evaluate_user_aggregates=user_aggregates.evaluate_collected,
)
