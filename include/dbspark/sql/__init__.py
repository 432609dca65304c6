"""Views in SQL: ``CREATE VIEW`` scripts compiled to circuits of the builder.

``add_views(circuit, script)`` declares a script's views on a circuit whose sources
are already declared; ``compile_circuit(name, sources, script)`` builds the whole
circuit from the conformance format; ``compile_files(sql, sources)`` does so from a
``.sql`` file and a JSON file of source declarations, with errors naming the file.
``explain(circuit)`` prints what an epoch of it will cost (``python -m dbspark.sql
explain``). See ``compiler.py`` for what each construct becomes and what is refused.
"""

from dbspark.sql.compiler import add_views, compile_circuit, declare_sources
from dbspark.sql.errors import SqlError
from dbspark.sql.explain import explain
from dbspark.sql.files import compile_files

__all__ = [
    "SqlError",
    "add_views",
    "compile_circuit",
    "compile_files",
    "declare_sources",
    "explain",
]
