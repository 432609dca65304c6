"""``python -m dbspark.sql explain FILE.sql --sources SOURCES.json [--name NAME]``.

Prints the plan of the views in ``FILE.sql`` over the sources declared in
``SOURCES.json`` (the conformance format's ``sources`` object): per view its stages,
which operators keep traces and keyed by what, where loops are and which work is
linear (``explain.py``). Exit status 0 with the plan on stdout; 2 when a file is
missing or malformed or the SQL is refused, with one line on stderr naming the file
(and for SQL the view, line and column).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from dbspark.circuit.builder import CircuitError
from dbspark.sql.explain import explain
from dbspark.sql.files import compile_files

PROG = "python -m dbspark.sql"
EXIT_BAD_INPUT = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="Tools for views written in SQL.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    explain_ = commands.add_parser(
        "explain",
        help="print the compiled circuit: what an epoch will cost",
        description="Compile FILE.sql over the sources in SOURCES.json and print, per view, "
        "the stages an epoch runs, the traces stateful operators keep and their keys, the "
        "loops, and the linear work.",
    )
    explain_.add_argument("sql", metavar="FILE.sql", help="a script of CREATE VIEW statements")
    explain_.add_argument(
        "--sources",
        required=True,
        metavar="SOURCES.json",
        help='the sources, as in a conformance vector: {"name": {"columns": [["col", '
        '"BIGINT"], ...], "key": [...], "watermark": [...]}, ...}',
    )
    explain_.add_argument(
        "--name", help="the circuit's name (default: the script's file name without .sql)"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        text = explain(compile_files(args.sql, args.sources, args.name))
    except CircuitError as error:  # SqlError names the file; a plan error names the circuit
        one_line = " ".join(str(error).split())
        print(f"{PROG} explain: error: {one_line}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(text)
    return 0
