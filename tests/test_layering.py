"""The package's imports flow one way: down the layers, never in a cycle.

Every module of ``kvckpt_web`` is read with ``ast`` (not imported), and every import in it -- at the top,
inside functions, under ``if TYPE_CHECKING``; relative or absolute -- is an edge of the import graph.
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path


PACKAGE = Path(__file__).resolve().parents[1] / "kvckpt_web"
ROOT = "kvckpt_web"

#: Each layer and its rank: a module may import its own layer and any layer of a lower rank. Layers of
#: one rank are siblings and do not import each other (gpu, tvm and stores know only the foundation; a model
#: runs without knowing of checkpoints, and durable/ knows no model).
LAYERS = {
    "foundation": 0,  # kvckpt_web/errors.py, checks.py, jsontext.py, threads.py
    "gpu": 1,  # WebGPU: device interface, backends, WGSL loader, device tensors
    "tvm": 1,  # TVM's contract: layout, limits, layout hash, metadata
    "stores": 1,  # key-value stores
    "kv": 2,  # the paged KV cache (needs gpu and tvm)
    "durable": 3,  # checkpoints in a store (needs kv, stores, tvm, gpu)
    "model": 3,  # a model's runner on the cache (needs kv, tvm, gpu; never the store)
    "generation": 4,  # one reply's durable life: a model's run saved in a store and resumed (needs durable, model)
    "engine": 5,  # the chat engine: conversations over a model, its cache and a store
    "web": 6,  # the browser runtime (Pyodide)
    "server": 6,  # the desktop HTTP server (``kvckpt serve``); serves web's files by path, never imports it
    "bench": 7,  # the benchmarks (``kvckpt bench``, ``make bench-peers``, ``make bench-browser``)
    "cli": 8,  # the command line: parses arguments, runs the server, the benchmarks and the rest
}
#: Per optional extra (desktop-only), its modules and the layers that alone may import them.
EXTRAS = {"serve": {"starlette": {"server"}, "uvicorn": {"server"}}, "remote": {"obstore": {"stores"}}}
#: Third-party modules only some layers may import.
ONLY_IN = {module: layers for modules in EXTRAS.values() for module, layers in modules.items()}
FOUNDATION = {"kvckpt_web.errors", "kvckpt_web.checks", "kvckpt_web.jsontext", "kvckpt_web.threads"}

def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer_of(module: str) -> str | None:
    """The layer of a module of the package; None for the package itself (its public surface) and for a
    module in no layer."""
    if module in FOUNDATION:
        return "foundation"
    parts = module.split(".")
    if len(parts) >= 2 and parts[1] in LAYERS:
        return parts[1]
    return None


def resolve(importer: str, node: ast.ImportFrom | ast.Import) -> set[str]:
    """The modules of the package an import statement in ``importer`` names."""
    if isinstance(node, ast.Import):
        names = {alias.name for alias in node.names}
    else:
        package = importer if MODULES[importer].name == "__init__.py" else importer.rpartition(".")[0]
        if node.level:
            base = package.split(".")
            base = base[:len(base) - (node.level - 1)]
            source = ".".join(base + ([node.module] if node.module else []))
        else:
            source = node.module or ""
        # ``from pkg import mod`` names the module pkg.mod; ``from mod import name`` names mod.
        names = {f"{source}.{alias.name}" if f"{source}.{alias.name}" in MODULES else source
                 for alias in node.names}
    found = set()
    for name in names:
        while name and name not in MODULES:  # ``import kvckpt_web.kv.cache.x`` style attribute paths
            name = name.rpartition(".")[0]
        if name == ROOT or name.startswith(ROOT + "."):
            found.add(name)
    return found


def third_party_imports() -> dict[str, set[str]]:
    """Module -> the top-level names of the modules outside the package it imports (anywhere in the file)."""
    found: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        names = found.setdefault(module, set())
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                names |= {alias.name.partition(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names.add((node.module or "").partition(".")[0])
        names.discard(ROOT)
    return found


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules of the package it imports (wherever in the file the import is)."""
    graph: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        graph[module] = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                graph[module] |= resolve(module, node) - {module}
    return graph


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    """Every import against the layer rule, as "importer -> imported (why)"."""
    bad = []
    for importer, imported in sorted(graph.items()):
        if importer == ROOT:
            continue  # the public surface re-exports from every layer
        mine = layer_of(importer)
        if mine is None:
            continue  # a module in no layer: test_every_module_is_in_a_layer reports it
        for target in sorted(imported):
            theirs = layer_of(target)
            if target == ROOT:
                bad.append(f"{importer} -> {target} (inside the package, import the module, not the public surface)")
            elif theirs is not None and mine != theirs and LAYERS[theirs] >= LAYERS[mine]:
                bad.append(f"{importer} ({mine}) -> {target} ({theirs})")
    return bad


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph.get(node, ())):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_every_module_is_in_a_layer():
    outside = [m for m in MODULES if m != ROOT and layer_of(m) is None]
    assert outside == [], f"modules in no layer of LAYERS: {outside}"


def test_imports_flow_down_the_layers():
    assert layer_violations(import_graph()) == []


def test_the_package_has_no_import_cycles():
    assert cycles(import_graph()) == []


def test_the_extras_are_imported_by_their_layers_only():
    outside = sorted(f"{module} imports {name}" for module, names in third_party_imports().items()
                     for name in names & ONLY_IN.keys() if layer_of(module) not in ONLY_IN[name])
    assert outside == []


def test_the_extras_are_no_dependency_of_the_package():
    project = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    required = {re.match(r"[A-Za-z0-9_.-]+", spec).group().lower() for spec in project["dependencies"]}
    assert not required & ONLY_IN.keys()
    for extra, modules in EXTRAS.items():
        assert {re.match(r"[A-Za-z0-9_.-]+", spec).group().lower()
                for spec in project["optional-dependencies"][extra]} == modules.keys()


def test_a_sibling_import_between_web_and_server_is_reported():
    graph = import_graph()
    graph["kvckpt_web.server.static"] = graph["kvckpt_web.server.static"] | {"kvckpt_web.web.js_api"}
    assert layer_violations(graph) == ["kvckpt_web.server.static (server) -> kvckpt_web.web.js_api (web)"]


def test_an_upward_import_is_reported():
    graph = import_graph()
    graph["kvckpt_web.gpu.device"] = graph["kvckpt_web.gpu.device"] | {"kvckpt_web.kv.cache"}
    assert layer_violations(graph) == ["kvckpt_web.gpu.device (gpu) -> kvckpt_web.kv.cache (kv)"]


def test_a_sibling_import_is_reported():
    graph = import_graph()
    graph["kvckpt_web.tvm.layout"] = graph["kvckpt_web.tvm.layout"] | {"kvckpt_web.stores.base"}
    assert layer_violations(graph) == ["kvckpt_web.tvm.layout (tvm) -> kvckpt_web.stores.base (stores)"]


def test_a_cycle_within_a_layer_is_reported():
    graph = import_graph()
    graph["kvckpt_web.kv.kernels"] = graph["kvckpt_web.kv.kernels"] | {"kvckpt_web.kv.transfer"}
    assert cycles(graph) == [["kvckpt_web.kv.kernels", "kvckpt_web.kv.transfer"]]


def test_a_model_module_importing_the_checkpoints_is_reported():
    graph = import_graph()
    graph["kvckpt_web.model.llama"] = graph["kvckpt_web.model.llama"] | {"kvckpt_web.durable.save"}
    assert layer_violations(graph) == ["kvckpt_web.model.llama (model) -> kvckpt_web.durable.save (durable)"]


def test_a_benchmark_importing_the_command_line_is_reported():
    graph = import_graph()
    graph["kvckpt_web.bench.rows"] = graph["kvckpt_web.bench.rows"] | {"kvckpt_web.cli.main"}
    assert layer_violations(graph) == ["kvckpt_web.bench.rows (bench) -> kvckpt_web.cli.main (cli)"]
