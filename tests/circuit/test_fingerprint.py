"""A circuit's fingerprint hashes its Python code by what it computes (issue 18, finding 8):
a user-defined aggregate or callback whose code changed under the same name is a changed
definition, which the catalog refuses over the old state; the same code gives the same
fingerprint in every process."""

from __future__ import annotations

import functools
import importlib.util
import operator
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from dbspark.circuit.aggregations import count, udf
from dbspark.circuit.builder import Circuit
from dbspark.circuit.expressions import col
from dbspark.circuit.fingerprint import callable_fingerprint, circuit_fingerprint
from dbspark.examples.circuits import orders, reachability, word_count
from dbspark.storage.catalog import CatalogError


def defined(source: str, name: str = "spread", **scope: Any) -> Any:
    """The function ``name`` defined by ``source`` in a fresh module namespace (so two
    versions can share one name, as an edited DAG file's function does)."""
    namespace: dict[str, Any] = {"__name__": "user_dags", **scope}
    exec(textwrap.dedent(source), namespace)
    return namespace[name]


SPREAD = """
    def spread(values):
        return max(values) - min(values)
"""


def circuit_with(function: Any, *, callback: Any = None) -> Circuit:
    c = Circuit("udas")
    items = c.zset_source("items", {"g": "string", "v": "bigint"})
    out = items.aggregate(by="g", spread=udf(function, col("v"), "bigint"), n=count())
    c.view("spreads", out.inspect(callback) if callback else out)
    return c


def test_the_same_code_has_the_same_fingerprint_in_another_process(tmp_path: Path):
    here = circuit_fingerprint(circuit_with(defined(SPREAD)))
    script = tmp_path / "other.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import sys
            sys.path.insert(0, {str(Path(__file__).parent)!r})
            from test_fingerprint import SPREAD, circuit_with, defined
            from dbspark.circuit.fingerprint import circuit_fingerprint
            print(circuit_fingerprint(circuit_with(defined(SPREAD))))
            """
        )
    )
    other = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert other == here


def test_changed_aggregate_code_under_the_same_name_is_a_changed_circuit(tmp_path: Path):
    from dbspark.engine.spark.executor import SparkEngine

    warehouse = tmp_path / "warehouse"
    SparkEngine(circuit_with(defined(SPREAD)), warehouse).catalog.close()
    # The same code again (another function object, as a new task process makes): accepted.
    SparkEngine(circuit_with(defined(SPREAD)), warehouse).catalog.close()
    changed = defined(
        """
        def spread(values):
            return max(values) - min(values) + 1
        """
    )
    with pytest.raises(CatalogError, match="the definition of circuit 'udas' changed"):
        SparkEngine(circuit_with(changed), warehouse)


def test_a_changed_callback_under_the_same_name_changes_the_fingerprint():
    show = defined("def show(t, delta):\n    print(t)\n", "show")
    other = defined("def show(t, delta):\n    print(t, delta)\n", "show")
    assert show.__qualname__ == other.__qualname__ and show.__module__ == other.__module__
    spread = defined(SPREAD)
    assert circuit_fingerprint(circuit_with(spread, callback=show)) != circuit_fingerprint(
        circuit_with(spread, callback=other)
    )


@pytest.mark.parametrize(
    "first, second, scope",
    [
        pytest.param(  # a constant in the code
            "def f(vs):\n    return sum(vs) * 2\n",
            "def f(vs):\n    return sum(vs) * 3\n",
            {},
            id="constant",
        ),
        pytest.param(  # the code of a nested lambda
            "def f(vs):\n    return sorted(vs, key=lambda v: v)[0]\n",
            "def f(vs):\n    return sorted(vs, key=lambda v: -v)[0]\n",
            {},
            id="nested code",
        ),
        pytest.param(  # a default value
            "def f(vs, k=1):\n    return vs[k]\n",
            "def f(vs, k=2):\n    return vs[k]\n",
            {},
            id="default",
        ),
        pytest.param(  # a value the closure holds
            "def make(k):\n    def f(vs):\n        return vs[k]\n    return f\nf = make(1)\n",
            "def make(k):\n    def f(vs):\n        return vs[k]\n    return f\nf = make(2)\n",
            {},
            id="closure",
        ),
        pytest.param(  # a module-level constant it reads
            "LIMIT = 10\ndef f(vs):\n    return min(vs + [LIMIT])\n",
            "LIMIT = 11\ndef f(vs):\n    return min(vs + [LIMIT])\n",
            {},
            id="global value",
        ),
        pytest.param(  # a helper function it calls
            "def helper(v):\n    return v + 1\ndef f(vs):\n    return helper(vs[0])\n",
            "def helper(v):\n    return v - 1\ndef f(vs):\n    return helper(vs[0])\n",
            {},
            id="helper",
        ),
        pytest.param(  # a builtin it calls
            "def f(vs):\n    return min(vs)\n",
            "def f(vs):\n    return max(vs)\n",
            {},
            id="builtin",
        ),
    ],
)
def test_what_a_function_computes_is_in_its_fingerprint(first: str, second: str, scope: Any):
    before, after = defined(first, "f", **scope), defined(second, "f", **scope)
    assert callable_fingerprint(before) != callable_fingerprint(after)
    assert callable_fingerprint(before) == callable_fingerprint(defined(first, "f", **scope))


def test_names_lines_and_local_names_do_not_change_a_fingerprint():
    first = defined("def f(vs):\n    total = sum(vs)\n    return total\n", "f")
    moved = defined("\n\n\ndef g(values):\n    s = sum(values)\n    return s\n", "g")
    assert callable_fingerprint(first) == callable_fingerprint(moved)


def test_recursive_functions_and_builtins_are_fingerprinted():
    fact = defined("def fact(n):\n    return 1 if n < 2 else n * fact(n - 1)\n", "fact")
    assert len(callable_fingerprint(fact)) == 64
    assert callable_fingerprint(min) != callable_fingerprint(max)


def test_circuits_without_python_code_keep_their_stored_fingerprints():
    # As computed before callables were hashed by their code: a catalog written then
    # must still accept these circuits.
    assert circuit_fingerprint(word_count()) == "9ebff8d032462353"
    assert circuit_fingerprint(orders()) == "e2c0d4d813226b64"
    assert circuit_fingerprint(reachability()) == "8e8be8c2a0747e66"


# ------------------------------------------------ the user's code the callable reaches
# A user-defined aggregate in a DAG file that calls helpers of the user's own modules:
# a function read as a module's attribute, a class's methods (its own, its base's, and
# a module function they call) and an object of such a class held by the module.
USER_CODE = {
    "more.py": """
        def offset():
            return 0
        """,
    "helpers.py": """
        import dataclasses
        import enum

        import more

        SCALE = 2


        class Mode(enum.Enum):
            ROUND = 1


        @dataclasses.dataclass(frozen=True)
        class Options:
            digits: int = 0
            mode: Mode = Mode.ROUND


        def widen(v):
            return v * SCALE + more.offset()


        def _digits(rounder):
            return rounder.digits


        class Base:
            def clamp(self, v):
                return max(v, 0)


        class Rounder(Base):
            def __init__(self, digits):
                self.digits = digits

            def apply(self, v):
                return round(self.clamp(v), _digits(self))


        class Shift:
            def by(self, v):
                return v + 0


        SHIFT = Shift()
        """,
    "udas.py": """
        import helpers
        from helpers import Rounder


        def spread(values):
            width = helpers.widen(max(values) - min(values))
            return helpers.SHIFT.by(Rounder(helpers.Options().digits).apply(width))
        """,
}


def user_code_fingerprint(tmp_path: Path, changes: dict[str, tuple[str, str]]) -> str:
    """The fingerprint of a circuit with ``udas.spread``, with the user's modules of
    :data:`USER_CODE` (``changes``: file -> text replaced by another) written to a folder
    of their own and imported by a new interpreter."""
    folder = tmp_path / f"version{len(list(tmp_path.iterdir()))}"
    folder.mkdir()
    for name, source in USER_CODE.items():
        source = textwrap.dedent(source)
        if name in changes:
            old, new = changes[name]
            assert old in source, (name, old)
            source = source.replace(old, new)
        (folder / name).write_text(source)
    script = f"""
import sys
sys.path[:0] = [{str(folder)!r}, {str(Path(__file__).parent)!r}]
from test_fingerprint import circuit_with
from dbspark.circuit.fingerprint import circuit_fingerprint
import udas
print(circuit_fingerprint(circuit_with(udas.spread)))
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=folder
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({"helpers.py": ("return v * SCALE", "return v * SCALE + 1")}, id="module"),
        pytest.param({"helpers.py": ("SCALE = 2", "SCALE = 3")}, id="module's constant"),
        pytest.param({"more.py": ("return 0", "return 1")}, id="module of a module"),
        pytest.param({"helpers.py": ("_digits(self))", "_digits(self) + 1)")}, id="method"),
        pytest.param({"helpers.py": ("max(v, 0)", "max(v, 1)")}, id="base class's method"),
        pytest.param({"helpers.py": ("return rounder.digits", "return 1")}, id="method's helper"),
        pytest.param({"helpers.py": ("return v + 0", "return v + 1")}, id="object's class"),
        pytest.param({"helpers.py": ("digits: int = 0", "digits: int = 1")}, id="dataclass"),
    ],
)
def test_a_changed_helper_in_the_users_modules_changes_the_fingerprint(
    tmp_path: Path, changes: dict[str, tuple[str, str]]
):
    """Only a helper the aggregate reaches changed, in another module than the
    aggregate's: the circuit's fingerprint changes. The same files give the same
    fingerprint in two processes, and changed line numbers none."""
    before = user_code_fingerprint(tmp_path, {})
    assert user_code_fingerprint(tmp_path, {}) == before
    moved = {"helpers.py": ("import more\n", "import more\n\n\n\n")}
    assert user_code_fingerprint(tmp_path, moved) == before
    assert user_code_fingerprint(tmp_path, changes) != before


def test_classes_and_modules_that_reach_themselves_are_hashed_once(tmp_path, monkeypatch):
    """Cycles end: a module that imports itself, classes that name each other, methods
    and functions that call each other. Two copies of the module (other objects, the
    same code) give one fingerprint, and a change inside the cycle another."""
    source = """
        import cycle as me


        def ping(n):
            return 0 if n <= 0 else me.Pong().pong(n - 1)


        class Ping:
            other = None

            def ping(self, n):
                return Pong().pong(n) + me.ping(n) + {k}


        class Pong:
            def pong(self, n):
                return 0 if n <= 0 else Ping().ping(n - 1)


        Ping.other = Pong
        Pong.other = Ping
        """

    def fingerprint(copy: str, k: int) -> str:
        path = tmp_path / copy / "cycle.py"
        path.parent.mkdir()
        path.write_text(textwrap.dedent(source.format(k=k)))
        spec = importlib.util.spec_from_file_location("cycle", path)
        module = importlib.util.module_from_spec(spec)
        monkeypatch.setitem(sys.modules, "cycle", module)
        spec.loader.exec_module(module)
        function = defined("def spread(vs):\n    return helpers.Ping().ping(len(vs))\n")
        function.__globals__["helpers"] = module
        found = callable_fingerprint(function)
        assert callable_fingerprint(function) == found
        return found

    first = fingerprint("first", 1)
    assert fingerprint("again", 1) == first
    assert fingerprint("changed", 2) != first


def test_code_reaching_no_user_class_or_module_keeps_its_stored_fingerprint():
    # As computed before the user's classes and modules were hashed: a catalog written
    # then must still accept these circuits (functions alone, the standard library's
    # modules and classes by name).
    assert circuit_fingerprint(circuit_with(defined(SPREAD))) == "327e10a23ce27108"
    stdlib = """
        import statistics, collections
        def spread(values):
            return statistics.median(values) + collections.Counter(values).most_common(1)[0][1]
        """
    assert circuit_fingerprint(circuit_with(defined(stdlib))) == "4e853dd63365f551"


def test_callables_in_c_are_fingerprinted_by_name_and_state():
    # Their class's __call__ is no Python code: once an endless recursion.
    assert callable_fingerprint(operator.itemgetter(1)) != callable_fingerprint(
        operator.itemgetter(2)
    )
    assert callable_fingerprint(str.upper) != callable_fingerprint(str.lower)
    assert callable_fingerprint((1).__add__) != callable_fingerprint((2).__add__)
    cached = functools.cache(defined(SPREAD))
    changed = functools.cache(defined("def spread(values):\n    return max(values)\n"))
    assert callable_fingerprint(cached) != callable_fingerprint(changed)
    assert callable_fingerprint(cached) == callable_fingerprint(functools.cache(defined(SPREAD)))
