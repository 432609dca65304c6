"""What a refused SQL script is told: which view, which construct, and where in the text."""

from __future__ import annotations

from sqlglot import exp

from dbspark.circuit.builder import CircuitError


class SqlError(CircuitError):
    """SQL, or a source declaration, that dbspark does not compile, found before anything
    runs.

    ``view`` is the view being defined (None for the script as a whole), ``line`` and
    ``column`` are 1-based positions in the script (None when the parser gave none),
    ``file`` the file the script or the declaration was read from (None for text given
    directly). A DAG's import error and the ``explain`` command show the message alone,
    so it names all of them.
    """

    def __init__(
        self,
        message: str,
        *,
        view: str | None = None,
        line: int | None = None,
        column: int | None = None,
        file: str | None = None,
    ) -> None:
        self.view = view
        self.line = line
        self.column = column
        self.file = file
        self.detail = message
        where = [f"view {view!r}"] if view else [] if file else ["SQL script"]
        if line is not None:
            where.append(f"line {line}" + (f", column {column}" if column is not None else ""))
        text = f"{', '.join(where)}: {message}" if where else message
        super().__init__(f"{file}: {text}" if file else text)

    def in_file(self, file: str) -> SqlError:
        """The same error, said of ``file`` (the script was read from it)."""
        return SqlError(self.detail, view=self.view, line=self.line, column=self.column, file=file)


def position(node: exp.Expression | None) -> tuple[int | None, int | None]:
    """The line and column of ``node`` in the script: its own, or that of the first
    token under it that the parser placed (keywords carry none)."""
    if node is None:
        return None, None
    for part in node.walk(bfs=False):
        meta = part.meta
        if "line" in meta:
            # sqlglot's "col" is where the token ends; a reader wants where it starts.
            width = meta.get("end", 0) - meta.get("start", 0)
            return meta["line"], meta["col"] - width if "col" in meta else None
    return None, None


def sql_text(node: exp.Expression, limit: int = 60) -> str:
    """``node`` as Spark SQL, shortened for an error message."""
    text = node.sql(dialect="spark")
    return text if len(text) <= limit else text[: limit - 3] + "..."
