"""A circuit's fingerprint hashes its Python code by what it computes (issue 18, finding 8):
a user-defined aggregate or callback whose code changed under the same name is a changed
definition, which the catalog refuses over the old state; the same code gives the same
fingerprint in every process."""

from __future__ import annotations

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
