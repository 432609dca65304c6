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
- a builtin, class or module by its qualified name;
- ``functools.partial``, bound methods and callable objects by the function and the
  values bound to it;
- and the user's own code the callable reaches through classes and modules
  (:func:`_user_code`): every class defined in the user's code that it reaches (named
  by its code, held in a closure or default, the class of an object it holds, a base
  of such a class) by its bases and its members (methods by their code, as functions
  are, class attributes by value), and every module of the user's code that it reaches
  by those of its attributes that the reaching code names (``helpers.f`` hashes
  ``helpers``'s ``f``), until nothing new is reached. Each such class or module is
  hashed once, so cycles end. "The user's code" is any module outside the standard
  library, ``site-packages`` and dbspark itself (DAG files, helper modules beside them,
  code defined in ``__main__`` or in no importable module); classes and modules of the
  others are hashed by name only, so an upgrade of a library does not change a circuit.
  A callable that reaches no class or module of the user's code keeps the fingerprint
  it had before these were hashed.

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
import os
import re
import site
import sys
import sysconfig
import types
from dataclasses import dataclass, field
from typing import Any

from dbspark.circuit.builder import Circuit

#: ``repr`` of an object without a ``__repr__`` of its own names its address, which
#: differs between processes.
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_SIMPLE = (type(None), bool, int, float, complex, str, bytes)
#: Callables in C: by their qualified name (and the object a method is bound to).
_BUILTIN_CALLABLES = (
    types.BuiltinFunctionType,
    types.BuiltinMethodType,
    types.WrapperDescriptorType,
    types.MethodWrapperType,
    types.MethodDescriptorType,
    types.ClassMethodDescriptorType,
)


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
    """A hash of what ``function`` computes: its code, the values it is bound to and the
    user's code it reaches (see the module docstring); equal for the same code in any
    process, under any name."""
    walk = _Walk()
    description = _describe(function, walk)
    reached = _user_code(walk)
    # Without user classes or modules the payload is what it always was.
    payload = [description, ["user code", reached]] if reached else description
    text = json.dumps(payload, sort_keys=True)
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


@dataclass
class _Walk:
    """The state of one :func:`callable_fingerprint`: ``active`` holds the functions
    being described (recursion ends there), ``names`` what the code being described
    reads by name; ``classes`` and ``modules`` collect the user's classes and modules
    reached (keyed by identity only to find them again: what is hashed is their code)."""

    active: set[int] = field(default_factory=set)
    names: frozenset[str] = frozenset()
    classes: dict[int, type] = field(default_factory=dict)
    modules: dict[int, tuple[types.ModuleType, set[str]]] = field(default_factory=dict)

    def reach(self, value: type | types.ModuleType) -> None:
        if isinstance(value, type):
            module = getattr(value, "__module__", None)
            if id(value) not in self.classes and _is_user_code(module):
                self.classes[id(value)] = value
        elif _is_user_code(value.__name__, value):
            self.modules.setdefault(id(value), (value, set()))[1].update(self.names)


def _describe(value: Any, walk: _Walk) -> Any:
    """``value`` as JSON-able data that is equal for equal code and values in any
    process; the user's classes and modules it reaches are noted in ``walk``."""
    if isinstance(value, _SIMPLE):
        return [type(value).__name__, repr(value)]
    if isinstance(value, (list, tuple)):
        return [type(value).__name__, [_describe(v, walk) for v in value]]
    if isinstance(value, (set, frozenset)):
        items = sorted(json.dumps(_describe(v, walk), sort_keys=True) for v in value)
        return [type(value).__name__, items]
    if isinstance(value, dict):
        items = sorted(
            (json.dumps(_describe(k, walk), sort_keys=True), _describe(v, walk))
            for k, v in value.items()
        )
        return ["dict", items]
    if isinstance(value, types.ModuleType):
        walk.reach(value)
        return ["module", value.__name__]
    if isinstance(value, type):
        walk.reach(value)
        return ["class", _qualified(value)]
    if isinstance(value, types.CodeType):
        return _code(value, walk)
    if isinstance(value, types.FunctionType):
        return _function(value, walk)
    if isinstance(value, _BUILTIN_CALLABLES):
        owner = getattr(value, "__self__", None)
        if owner is None or isinstance(owner, types.ModuleType):
            return ["builtin", _qualified(value)]
        return ["builtin method", _qualified(value), _describe(owner, walk)]
    if isinstance(value, types.MethodType):
        return ["method", _describe(value.__func__, walk), _describe(value.__self__, walk)]
    if isinstance(value, functools.partial):
        return [
            "partial",
            _describe(value.func, walk),
            _describe(value.args, walk),
            _describe(value.keywords, walk),
        ]
    walk.reach(type(value))  # an object: its class's methods are code it may run
    if dataclasses.is_dataclass(value):
        fields = {
            f.name: _describe(getattr(value, f.name), walk) for f in dataclasses.fields(value)
        }
        return ["dataclass", _qualified(type(value)), fields]
    if callable(value) and isinstance(type(value).__call__, types.FunctionType):
        # An object with a __call__ of Python code: its class's code and its state.
        state = _describe(vars(value), walk) if hasattr(value, "__dict__") else None
        return ["callable object", _describe(type(value).__call__, walk), state]
    if callable(value) and isinstance(getattr(value, "__wrapped__", None), types.FunctionType):
        # A wrapper in C around a function (functools.cache): the function.
        return ["wrapped", _qualified(type(value)), _describe(value.__wrapped__, walk)]
    return ["object", _qualified(type(value)), _ADDRESS.sub("", repr(value))]


def _function(function: types.FunctionType, walk: _Walk) -> Any:
    if id(function) in walk.active:
        return ["recursion"]  # a function that calls itself: its code is being described
    walk.active.add(id(function))
    outer = walk.names
    try:
        code = function.__code__
        walk.names = frozenset(_global_names(code))
        names = sorted(walk.names)
        scope = function.__globals__
        builtins = scope.get("__builtins__", {})
        builtins = vars(builtins) if isinstance(builtins, types.ModuleType) else builtins
        return [
            "function",
            _code(code, walk),
            _describe(function.__defaults__, walk),
            _describe(function.__kwdefaults__, walk),
            [_describe(_cell(cell), walk) for cell in function.__closure__ or ()],
            # What the code reads by name: its own module's values, else the builtins.
            [
                [name, _global(scope[name], walk)]
                if name in scope
                else [name, "builtin", name in builtins]
                for name in names
            ],
        ]
    finally:
        walk.names = outer
        walk.active.discard(id(function))


def _global(value: Any, walk: _Walk) -> Any:
    """A global value the code names: data and code in full, any other object (a logger,
    a client) by its class only, since its state is not what the code computes and may
    differ between processes."""
    described = _describe(value, walk)
    return described[:2] if described[0] == "object" else described


def _code(code: types.CodeType, walk: _Walk) -> Any:
    return [
        "code",
        code.co_code.hex(),
        [_describe(c, walk) for c in code.co_consts],
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


# ============================================================ the user's classes and modules
#: Class attributes that are not what its code computes: bookkeeping, documentation and
#: annotations (Python fills some of these in differently from version to version).
_CLASS_NOISE = frozenset(
    {
        "__module__",
        "__qualname__",
        "__doc__",
        "__dict__",
        "__weakref__",
        "__annotations__",
        "__annotate__",
        "__annotate_func__",
        "__annotations_cache__",
        "__firstlineno__",
        "__static_attributes__",
        "__dataclass_fields__",
        "__dataclass_params__",
        "_abc_impl",
    }
)


def _user_code(walk: _Walk) -> list[Any]:
    """The user's classes and modules the walk reached, each described once (describing
    one may reach more: repeated until nothing new is reached), sorted by name.

    A class is described by its bases and its own members; a module by those of its
    attributes that the code reaching it names (the union over every such code, so the
    result does not depend on the order things were reached in). Each is described
    with nothing active, so it comes out the same wherever it was reached from."""
    classes: dict[int, Any] = {}
    modules: dict[int, tuple[frozenset[str], Any]] = {}
    while True:
        pending_classes = [c for key, c in walk.classes.items() if key not in classes]
        pending_modules = [
            (module, frozenset(names))
            for key, (module, names) in walk.modules.items()
            if key not in modules or modules[key][0] != names
        ]
        if not pending_classes and not pending_modules:
            break
        for cls in pending_classes:
            classes[id(cls)] = [f"class {_qualified(cls)}", _class_body(cls, walk)]
        for module, names in pending_modules:
            modules[id(module)] = (
                names,
                [f"module {module.__name__}", _module(module, names, walk)],
            )
    described = [*classes.values(), *(entry for _, entry in modules.values())]
    return sorted(described, key=lambda entry: json.dumps(entry, sort_keys=True))


def _class_body(cls: type, walk: _Walk) -> Any:
    members = {k: v for k, v in vars(cls).items() if k not in _CLASS_NOISE}
    names: set[str] = set()
    for value in members.values():
        for function in _functions_of(value):
            names |= _global_names(function.__code__)
    inner = _Walk(names=frozenset(names), classes=walk.classes, modules=walk.modules)
    return [
        "class body",
        [_describe(base, inner) for base in cls.__bases__],
        [[name, _member(members[name], inner)] for name in sorted(members)],
    ]


def _functions_of(member: Any) -> list[types.FunctionType]:
    if isinstance(member, (staticmethod, classmethod)):
        member = member.__func__
    if isinstance(member, property):
        return [
            f for f in (member.fget, member.fset, member.fdel) if isinstance(f, types.FunctionType)
        ]
    if isinstance(member, functools.cached_property):
        member = member.func
    return [member] if isinstance(member, types.FunctionType) else []


def _member(member: Any, walk: _Walk) -> Any:
    """A class's member: its methods' code (static, class, property and cached-property
    ones too), any other value as a global is (objects by their class)."""
    if isinstance(member, (staticmethod, classmethod)):
        return [type(member).__name__, _describe(member.__func__, walk)]
    if isinstance(member, property):
        return ["property", [_describe(f, walk) for f in (member.fget, member.fset, member.fdel)]]
    if isinstance(member, functools.cached_property):
        return ["cached_property", _describe(member.func, walk)]
    return _global(member, walk)


def _module(module: types.ModuleType, names: frozenset[str], walk: _Walk) -> Any:
    scope = vars(module)
    inner = _Walk(names=names, classes=walk.classes, modules=walk.modules)
    return [[name, _global(scope[name], inner)] for name in sorted(names) if name in scope]


def _is_user_code(module_name: str | None, module: types.ModuleType | None = None) -> bool:
    """Whether the module named ``module_name`` is the user's code: neither dbspark, nor
    built in, nor a file of the standard library or ``site-packages``. Code in a module
    no one can import (``exec`` in a namespace of its own, ``__main__`` of ``python -c``)
    is the user's."""
    if not isinstance(module_name, str) or module_name in sys.builtin_module_names:
        return False
    if module_name == "dbspark" or module_name.startswith("dbspark."):
        return False
    if module is None:
        module = sys.modules.get(module_name)
        if module is None:
            return True
    spec = getattr(module, "__spec__", None)
    if spec is not None and spec.origin in ("built-in", "frozen"):
        return False
    file = getattr(module, "__file__", None)
    paths = [file] if file else list(getattr(module, "__path__", None) or ())
    return not paths or not all(_in_library(path) for path in paths)


@functools.cache
def _library_roots() -> tuple[str, ...]:
    """Where the standard library and installed packages live."""
    found = {sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    found.update(site.getsitepackages() if hasattr(site, "getsitepackages") else ())
    found.add(site.getusersitepackages())
    return tuple(sorted(os.path.realpath(p) for p in found if p))


def _in_library(path: str) -> bool:
    real = os.path.realpath(path)
    return any(real == root or real.startswith(root + os.sep) for root in _library_roots())
