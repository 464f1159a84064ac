"""State lives on objects, not in module globals.

Every module of ``kvckpt_web`` is read with ``ast`` (not imported). What a module binds at its top level must be
a constant, named in UPPER_CASE, or a type alias, named in CapWords; a lowercase name there is state. A
constant holds a value: literals, tuples and frozensets, compiled patterns and structs, frozen layouts, what a
function of its own module computes once; a dict, list or set is a constant table only if nothing in the package
ever changes it. No function rebinds a module's name (``global``). Objects that hold state at module level are
refused, each exception below says why it is right.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "kvckpt_web"

#: Module-level state that is right, by "path:name", and why. Nothing else may hold state at module level.
EXCEPTIONS = {
    "durable/pipeline.py:HASH_POOL": "the hashing threads are the process's: every save and restore shares them, "
                                     "so two at once share the CPUs; the pool holds no save's or store's state",
    "stores/file.py:_io_pool": "the file I/O threads are the process's, shared by every FileStore, started on "
                               "first use (rebound once, under `global`); they hold no store's state",
    "kv/pool.py:_next_uid": "Sequence uids must differ across every cache of the process (a ledger compares a "
                            "saved state's uid with a sequence's), so the counter is the process's",
    "stores/js.py:_helpers": "the JS helper functions, evaluated once per realm: a value, no object's state",
    "web/runtime.py:REALM": "JavaScript calls module functions (pyimport(...).create_cache), and Pyodide imports a "
                            "module once per realm: the realm's one Runtime, which holds its state, is kept here",
}

UPPER = re.compile(r"_?[A-Z][A-Z0-9_]*")
CAPWORDS = re.compile(r"_?[A-Z][A-Za-z0-9]*[a-z][A-Za-z0-9]*")
#: Classes whose instances are values (immutable), and ContextVar, whose value is each task's own.
VALUE_TYPES = {"Struct", "TypeVar", "Path", "Decimal", "KVLayout", "CacheLimits", "EngineConfig", "GGMLType",
               "DeviceForm", "Architecture", "ContextVar", "AnyNode", "ObjectNode", "ArrayNode", "StringNode",
               "NumberNode", "LiteralNode"}
#: Functions that return values.
VALUE_FUNCTIONS = {"compile", "frozenset", "tuple", "max", "min", "bytes", "getattr", "object", "range", "chr",
                   "int", "calcsize", "cpu_count", "enumerate"}
CONTAINERS = (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)
MUTATORS = {"append", "extend", "insert", "remove", "pop", "popitem", "clear", "update", "setdefault", "add",
            "discard", "difference_update", "intersection_update", "symmetric_difference_update", "sort",
            "reverse", "move_to_end", "__setitem__", "__delitem__"}
MODULES = {str(p.relative_to(PACKAGE)): ast.parse(p.read_text(encoding="utf-8")) for p in sorted(PACKAGE.rglob("*.py"))}


def top_level_bindings(tree: ast.Module) -> list[tuple[str, ast.expr]]:
    """(name, value) of every name a module binds by assignment outside functions and classes."""
    found = []
    todo = list(tree.body)
    while todo:
        node = todo.pop(0)
        if isinstance(node, (ast.If, ast.Try, ast.With)):
            todo += [*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", []),
                     *[s for h in getattr(node, "handlers", []) for s in h.body]]
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        found.append((name.id, node.value))
    return found


def callee(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def objects_made(value: ast.expr, own_functions: set[str]) -> list[str]:
    """The calls in ``value`` that may make an object holding state: calls of a class or function that is not
    known to give a value. A method of a value (``MANIFESTS.rstrip("/")``, ``Path(...).resolve()``) gives a
    value; what it is called on is judged on its own."""
    made = []
    for node in ast.walk(value):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and not (isinstance(func.value, ast.Name) and func.value.id.islower()):
            continue  # a method of a value, not a module's function
        name = callee(node)
        if name not in VALUE_TYPES | VALUE_FUNCTIONS | own_functions:
            made.append(name)
    return made


def is_type_alias(value: ast.expr) -> bool:
    """Whether ``value`` is a type expression (``dict[str, int]``, ``A | B``, ``Callable[[int], None]``)."""
    return all(isinstance(n, (ast.Subscript, ast.Name, ast.Attribute, ast.BinOp, ast.BitOr, ast.Tuple, ast.List,
                              ast.Constant, ast.Load)) for n in ast.walk(value))


def findings() -> list[str]:
    found = []
    for path, tree in MODULES.items():
        own_functions = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        for name, value in top_level_bindings(tree):
            where = f"{path}:{name}"
            if name.startswith("__") and name.endswith("__"):
                continue
            if UPPER.fullmatch(name):
                made = objects_made(value, own_functions)
                if made:
                    found.append(f"{where}: a constant holding an object ({', '.join(made)})")
            elif CAPWORDS.fullmatch(name):
                if not is_type_alias(value):
                    found.append(f"{where}: a type alias that is no type expression")
            else:
                found.append(f"{where}: a lowercase module-level name (state)")
        for node in ast.walk(tree):
            if isinstance(node, ast.Global):
                found += [f"{path}:{name}: rebound by `global`" for name in node.names]
    return found


def container_constants() -> dict[str, set[str]]:
    """Per module, its UPPER_CASE names bound to a dict, list or set display, and those it imports from others."""
    defined = {path: {name for name, value in top_level_bindings(tree)
                      if UPPER.fullmatch(name) and isinstance(value, CONTAINERS)}
               for path, tree in MODULES.items()}
    by_module = {path.removesuffix(".py").replace("/", ".").removesuffix(".__init__"): names
                 for path, names in defined.items()}
    seen = {}
    for path, tree in MODULES.items():
        names = set(defined[path])
        package = path.removesuffix(".py").replace("/", ".").rsplit(".", 1)[0] if "/" in path else ""
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
                source = ".".join([*base, *(node.module or "").split(".")]).strip(".")
                source = source.removeprefix("kvckpt_web.")
                names |= {alias.asname or alias.name for alias in node.names
                          if alias.name in by_module.get(source, set())}
        seen[path] = names
    return seen


def mutations(tree: ast.Module, names: set[str]) -> list[str]:
    found = []
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, (ast.Assign, ast.Delete)):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for target in targets:
            if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name) and target.value.id in names:
                found.append(f"{target.value.id}[...] assigned or deleted (line {node.lineno})")
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS
                and isinstance(node.func.value, ast.Name) and node.func.value.id in names):
            found.append(f"{node.func.value.id}.{node.func.attr}() (line {node.lineno})")
    return found


def test_modules_hold_no_state_but_the_justified_exceptions():
    found = [f for f in findings() if f.split(": ", 1)[0] not in EXCEPTIONS]
    assert found == []


def test_every_exception_is_still_needed():
    needed = {f.split(": ", 1)[0] for f in findings()}
    assert sorted(set(EXCEPTIONS) - needed) == []


def test_no_constant_table_is_ever_changed():
    tables = container_constants()
    changed = {path: mutations(tree, tables[path]) for path, tree in MODULES.items()}
    assert {path: found for path, found in changed.items() if found} == {}


def test_the_rules_find_state_where_there_is_some():
    tree = ast.parse("import weakref\n_MEMORY = weakref.WeakKeyDictionary()\n_cache = {}\nHandlers = {}\n"
                     "TABLE = {1: 2}\ndef f():\n    global _cache\n    TABLE[3] = 4\n")
    MODULES["example.py"] = tree
    try:
        assert sorted(f for f in findings() if f.startswith("example.py")) == [
            "example.py:Handlers: a type alias that is no type expression",
            "example.py:_MEMORY: a constant holding an object (WeakKeyDictionary)",
            "example.py:_cache: a lowercase module-level name (state)",
            "example.py:_cache: rebound by `global`"]
        assert mutations(tree, container_constants()["example.py"]) == ["TABLE[...] assigned or deleted (line 8)"]
    finally:
        del MODULES["example.py"]
