"""Views in SQL: ``CREATE VIEW`` scripts compiled to circuits of the builder.

``add_views(circuit, script)`` declares a script's views on a circuit whose sources
are already declared; ``compile_circuit(name, sources, script)`` builds the whole
circuit from the conformance format. See ``compiler.py`` for what each construct
becomes and what is refused.
"""

from dbspark.sql.compiler import add_views, compile_circuit
from dbspark.sql.errors import SqlError

__all__ = ["SqlError", "add_views", "compile_circuit"]
