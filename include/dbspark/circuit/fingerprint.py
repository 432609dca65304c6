"""A circuit's fingerprint: a stable hash of its definition, Python code included.

The catalog stores each circuit's fingerprint and refuses to run a circuit whose
definition changed over state kept for the old one (``Catalog.register_circuit``). Most
of a definition is data (operators, schemas, expressions), hashed by its ``repr``. The
rest is Python code: a user-defined aggregate's function, an ``inspect`` callback. A
callable is hashed by what it computes, not by its name, so changed code is a changed
definition like any other (:func:`callable_fingerprint`):

- a function by its code object: bytecode, constants (nested code objects, such as a
  lambda or ``def`` inside it, recursively), the names it reads, argument counts and
  flags; its default and keyword-default values; the values of its closure's cells; and
  the global values its code names (functions recursively, data by value, modules and
  classes by name);
- a builtin, class or module by its qualified name (their code is not the user's);
- ``functools.partial``, bound methods and callable objects by the function and the
  values bound to it.

Not hashed: the function's own name, module, file, line numbers and local variable
names, which do not change what it computes (renaming or moving it keeps the
fingerprint). Bytecode is specific to a Python minor version: a circuit holding Python
code gets a new fingerprint under another minor version (its drivers and workers must
share one anyway: ARCHITECTURE.md, "Deployment").
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import re
import types
from typing import Any

from dbspark.circuit.builder import Circuit

#: ``repr`` of an object without a ``__repr__`` of its own names its address, which
#: differs between processes.
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_SIMPLE = (type(None), bool, int, float, complex, str, bytes)


def circuit_fingerprint(circuit: Circuit) -> str:
    """A stable hash of ``circuit``'s definition: operators, schemas, scopes, parameters
    (callables by their code, :func:`callable_fingerprint`) and views. The same
    definition gives the same fingerprint in every process."""
    payload = [
        (n.op, list(n.inputs), str(n.schema), n.scope, _normal(n.params)) for n in circuit.nodes
    ]
    payload.append(sorted(circuit.views.items()))
    text = json.dumps(payload, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def callable_fingerprint(function: Any) -> str:
    """A hash of what ``function`` computes: its code and the values it is bound to (see
    the module docstring); equal for the same code in any process, under any name."""
    text = json.dumps(_describe(function, set()), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def _normal(value: Any) -> Any:
    """A node parameter as the fingerprint's JSON payload. Data keeps the ``repr`` it
    always had, so circuits without Python code keep their stored fingerprints."""
    if callable(value) and not isinstance(value, type):
        return f"callable:{callable_fingerprint(value)}"
    if isinstance(value, dict):
        return {str(k): _normal(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (list, tuple)):
        return [_normal(v) for v in value]
    if _holds_callable(value):
        # A user-defined aggregate: its repr names the function's address.
        return {
            "dataclass": _qualified(type(value)),
            "fields": {f.name: _normal(getattr(value, f.name)) for f in dataclasses.fields(value)},
        }
    return repr(value)


def _holds_callable(value: Any) -> bool:
    if not dataclasses.is_dataclass(value) or isinstance(value, type):
        return False
    return any(
        callable(getattr(value, f.name)) and not isinstance(getattr(value, f.name), type)
        for f in dataclasses.fields(value)
    )


def _qualified(obj: Any) -> str:
    return f"{getattr(obj, '__module__', None)}.{getattr(obj, '__qualname__', repr(obj))}"


def _describe(value: Any, active: set[int]) -> Any:
    """``value`` as JSON-able data that is equal for equal code and values in any
    process. ``active`` holds the functions being described (recursion ends there)."""
    if isinstance(value, _SIMPLE):
        return [type(value).__name__, repr(value)]
    if isinstance(value, (list, tuple)):
        return [type(value).__name__, [_describe(v, active) for v in value]]
    if isinstance(value, (set, frozenset)):
        items = sorted(json.dumps(_describe(v, active), sort_keys=True) for v in value)
        return [type(value).__name__, items]
    if isinstance(value, dict):
        items = sorted(
            (json.dumps(_describe(k, active), sort_keys=True), _describe(v, active))
            for k, v in value.items()
        )
        return ["dict", items]
    if isinstance(value, types.ModuleType):
        return ["module", value.__name__]
    if isinstance(value, type):
        return ["class", _qualified(value)]
    if isinstance(value, types.CodeType):
        return _code(value, active)
    if isinstance(value, types.FunctionType):
        return _function(value, active)
    if isinstance(value, (types.BuiltinFunctionType, types.BuiltinMethodType)):
        owner = getattr(value, "__self__", None)
        if owner is None or isinstance(owner, types.ModuleType):
            return ["builtin", _qualified(value)]
        return ["builtin method", _qualified(value), _describe(owner, active)]
    if isinstance(value, types.MethodType):
        return ["method", _describe(value.__func__, active), _describe(value.__self__, active)]
    if isinstance(value, functools.partial):
        return [
            "partial",
            _describe(value.func, active),
            _describe(value.args, active),
            _describe(value.keywords, active),
        ]
    if dataclasses.is_dataclass(value):
        fields = {
            f.name: _describe(getattr(value, f.name), active) for f in dataclasses.fields(value)
        }
        return ["dataclass", _qualified(type(value)), fields]
    if callable(value):  # an object with __call__: its class's code and its state
        state = _describe(vars(value), active) if hasattr(value, "__dict__") else None
        return ["callable object", _describe(type(value).__call__, active), state]
    return ["object", _qualified(type(value)), _ADDRESS.sub("", repr(value))]


def _function(function: types.FunctionType, active: set[int]) -> Any:
    if id(function) in active:
        return ["recursion"]  # a function that calls itself: its code is being described
    active.add(id(function))
    try:
        code = function.__code__
        names = sorted(_global_names(code))
        scope = function.__globals__
        builtins = scope.get("__builtins__", {})
        builtins = vars(builtins) if isinstance(builtins, types.ModuleType) else builtins
        return [
            "function",
            _code(code, active),
            _describe(function.__defaults__, active),
            _describe(function.__kwdefaults__, active),
            [_describe(_cell(cell), active) for cell in function.__closure__ or ()],
            # What the code reads by name: its own module's values, else the builtins.
            [
                [name, _global(scope[name], active)]
                if name in scope
                else [name, "builtin", name in builtins]
                for name in names
            ],
        ]
    finally:
        active.discard(id(function))


def _global(value: Any, active: set[int]) -> Any:
    """A global value the code names: data and code in full, any other object (a logger,
    a client) by its class only, since its state is not what the code computes and may
    differ between processes."""
    described = _describe(value, active)
    return described[:2] if described[0] == "object" else described


def _code(code: types.CodeType, active: set[int]) -> Any:
    return [
        "code",
        code.co_code.hex(),
        [_describe(c, active) for c in code.co_consts],
        list(code.co_names),
        [code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount, code.co_flags],
        list(code.co_freevars),
        list(code.co_cellvars),
    ]


def _global_names(code: types.CodeType) -> set[str]:
    """Every name ``code`` and the code nested in it read (globals and attributes alike:
    an attribute's name that is also a global is hashed too, which costs nothing)."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


def _cell(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # a cell not yet filled
        return ["empty cell"]
