"""The import graph, read with `ast`: the folders are the layers, and a layer only points down
(docs/design.md, "Who may import whom").

Every `import` and `from ... import` in the product's modules counts, at module level or inside a
function (a late import is still a dependency), and so do imports under `if TYPE_CHECKING:`: a module
whose signatures name a higher layer's types is built on that layer's design. The rules come from
the folder a module lies in (`sweeper/<layer>/...`), never from a list of module names, so a new
module is held to its folder's rules the day it is written:

- no import circle among the product's modules, type-only imports included;
- a layer imports only the layers below it (`ALLOWED`); the readers (`reports/`) import nothing from
  `execute/`, `install/` or `drivers/`, anywhere in them or in what they import when it is imported;
- the pure layers (`spec/`, `vllm/`, `judge/`, `plan/`, `bisect/`) import nothing that starts a
  process, opens a socket or talks to a cluster, and `judge/`, `plan/` and `bisect/` nothing that
  reads files either;
- the product imports nothing from the simulator (the top-level `vllmsim` package), and the
  simulator nothing from the product.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = "sweeper"
SIMULATORS = ("vllmsim",)

# Each layer (a folder of the package) and the layers it may import; a layer always may import itself.
# The order is the data flow: what is asked (spec) and how vLLM reads it (vllm), how it is judged
# (judge), what to run next (plan, bisect), what is stored (store), how vLLM is installed (install)
# and run (execute), what is read back (reports), and the drivers that chain them for the CLI.
PURE = ("spec", "vllm", "judge", "plan", "bisect")
ALLOWED: dict[str, frozenset[str]] = {
    "spec": frozenset(),
    "vllm": frozenset({"spec"}),
    "judge": frozenset({"spec", "vllm"}),
    "plan": frozenset({"spec", "vllm", "judge"}),
    "bisect": frozenset({"spec", "vllm", "judge"}),
    "store": frozenset({"spec", "vllm", "judge", "plan", "bisect"}),
    "install": frozenset({"spec", "vllm", "judge", "plan", "bisect", "store"}),
    "execute": frozenset({"spec", "vllm", "judge", "plan", "bisect", "store", "install"}),
    "reports": frozenset({"spec", "vllm", "judge", "plan", "bisect", "store"}),
    "drivers": frozenset({"spec", "vllm", "judge", "plan", "bisect", "store", "install", "execute", "reports"}),
}
# The package's top: the error tree (every layer raises its errors), the public API and the CLI.
# `errors` names one leaf of `spec/` (the cell statuses a server error implies) and nothing else.
TOP_ERRORS = "sweeper.errors"
ERRORS_MAY_IMPORT = frozenset({"sweeper.spec.status"})
# What a pure layer never imports: processes, sockets, HTTP, a cluster.
STARTS = ("subprocess", "socket", "httpx", "ray", "psutil", "asyncio", "multiprocessing", "threading", "signal")
# ... and what judge/, plan/ and bisect/ never import besides: files, caches and stored results.
READS = ("shutil", "tempfile", "filelock", "pyarrow.parquet", "pyarrow.dataset", "duckdb", "glob")


@dataclass
class Module:
    name: str
    path: Path
    runs: set[str] = field(default_factory=set)  # modules it imports when it (or a function of it) runs
    top: set[str] = field(default_factory=set)  # of those, the ones it imports when it is imported
    typing: set[str] = field(default_factory=set)  # modules it imports for type checking only
    external: set[str] = field(default_factory=set)  # modules outside the tree it imports (any kind)


def _name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(node: ast.AST, package: str, typing: bool = False,
             nested: bool = False) -> Iterator[tuple[str, str | None, bool, bool]]:
    """(module, name imported from it or None, type-checking only, inside a function) for every
    import under `node`."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for sub in child.body:
                yield from _imports(ast.Module(body=[sub], type_ignores=[]), package, True, nested)
            for sub in child.orelse:
                yield from _imports(ast.Module(body=[sub], type_ignores=[]), package, typing, nested)
            continue
        if isinstance(child, ast.Import):
            for alias in child.names:
                yield alias.name, None, typing, nested
        elif isinstance(child, ast.ImportFrom):
            base = child.module or ""
            if child.level:
                parts = package.split(".")[:len(package.split(".")) - child.level + 1]
                base = ".".join([*parts, *([base] if base else [])])
            for alias in child.names:
                yield base, alias.name, typing, nested
        else:
            inside = nested or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            yield from _imports(child, package, typing, inside)


def load_graph() -> dict[str, Module]:
    files = sorted((ROOT / PRODUCT).rglob("*.py"))
    if (ROOT / "vllmsim").is_dir():
        files += sorted((ROOT / "vllmsim").rglob("*.py"))
    modules = {_name(p): Module(_name(p), p) for p in files}

    def resolve(name: str) -> str | None:
        """The module `name` is, or lies in (`a.b.X` where X is a class of module `a.b`)."""
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    for mod in modules.values():
        package = mod.name if mod.path.name == "__init__.py" else mod.name.rpartition(".")[0]
        for base, name, typing, nested in _imports(ast.parse(mod.path.read_text(), str(mod.path)), package):
            full = f"{base}.{name}" if name else base
            target = full if full in modules else resolve(base)
            if target is None:
                # Outside this tree: only the simulator's names matter (a package not yet moved here).
                if not any(full == s or full.startswith(s + ".") for s in SIMULATORS):
                    mod.external.add(base or full)
                    continue
                target = full
            if target != mod.name:
                (mod.typing if typing else mod.runs).add(target)
                if not typing and not nested:
                    mod.top.add(target)
    return modules


GRAPH = load_graph()


def _parents(name: str) -> list[str]:
    """The packages whose `__init__` runs when `name` is imported."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def reached(start: str, *, first: set[str] | None = None) -> dict[str, list[str]]:
    """Every module that importing and using `start` runs, with one chain of imports that gets there:
    what `start` imports anywhere (its functions included), then what those import when imported. An
    import inside a function of another module runs only when that function is called: a pure module
    may reach a shell registry lazily where it checks input (the matrix its install kinds), and that
    call is never made by a reader."""
    paths: dict[str, list[str]] = {}
    todo = [(m, [start, m]) for m in sorted(first if first is not None else GRAPH[start].runs)]
    while todo:
        name, path = todo.pop()
        for each in [*_parents(name), name]:
            if each in paths or each == start:
                continue
            paths[each] = path if each == name else [*path[:-1], f"{each} (package of {name})"]
            if each in GRAPH:
                todo.extend((m, [*paths[each], m]) for m in sorted(GRAPH[each].top))
    return paths


def _simulator(name: str) -> bool:
    return any(name == s or name.startswith(s + ".") for s in SIMULATORS)


def layer(name: str) -> str | None:
    """The layer a product module lies in: its folder under the package, None at the package's top."""
    parts = name.split(".")
    if parts[0] != PRODUCT or len(parts) < 2:
        return None
    return parts[1] if len(parts) > 2 or (ROOT / PRODUCT / parts[1] / "__init__.py").exists() else None


def _product(name: str) -> bool:
    return name == PRODUCT or name.startswith(PRODUCT + ".")


def test_every_folder_of_the_package_is_a_layer_with_rules() -> None:
    # A new folder must say where it stands, or no rule would hold it.
    folders = {layer(n) for n in GRAPH if _product(n)} - {None}
    folders |= {p.name for p in (ROOT / PRODUCT).iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders == set(ALLOWED), f"folders without rules, or rules without a folder: {folders ^ set(ALLOWED)}"
    top = sorted(n for n in GRAPH if _product(n) and layer(n) is None)
    assert top == ["sweeper", "sweeper.__main__", "sweeper.cli", "sweeper.errors"], top


def _arrows() -> list[str]:
    bad: list[str] = []
    for name, mod in GRAPH.items():
        if not _product(name):
            continue
        for target in sorted(mod.runs | mod.typing):
            if not _product(target):
                continue
            here, there = layer(name), layer(target)
            if name == TOP_ERRORS:
                if target not in ERRORS_MAY_IMPORT:
                    bad.append(f"{name} -> {target} (the error tree imports only {sorted(ERRORS_MAY_IMPORT)})")
            elif here is None or target == TOP_ERRORS or here == there:
                continue
            elif there is None:
                bad.append(f"{name} -> {target} (a layer imports nothing from the package's top)")
            elif there not in ALLOWED[here]:
                bad.append(f"{name} -> {target} ({here}/ may import only {sorted(ALLOWED[here])})")
    return bad


def test_a_layer_imports_only_the_layers_below_it() -> None:
    bad = _arrows()
    assert not bad, "arrows up or across:\n" + "\n".join(bad)


@pytest.mark.parametrize("reader", sorted(n for n in GRAPH if layer(n) == "reports"))
def test_a_reader_reaches_no_execution_module(reader: str) -> None:
    # What a reader runs when it is imported or called, its own type-only imports included.
    shell = ("execute", "install", "drivers")
    first = GRAPH[reader].runs | GRAPH[reader].typing
    bad = {m: path for m, path in reached(reader, first=first).items() if layer(m) in shell}
    assert not bad, f"{reader} reaches execution modules: " + "; ".join(" -> ".join(p) for p in bad.values())


def _uses(mod: Module, names: tuple[str, ...]) -> list[str]:
    return sorted(e for e in mod.external for n in names if e == n or e.startswith(n + "."))


def test_the_pure_layers_start_nothing_and_read_no_results() -> None:
    bad = []
    for name, mod in GRAPH.items():
        if layer(name) in PURE:
            if used := _uses(mod, STARTS):
                bad.append(f"{name} imports {used}")
            if layer(name) in ("judge", "plan", "bisect") and (used := _uses(mod, READS)):
                bad.append(f"{name} imports {used}")
    assert not bad, "pure layers doing I/O:\n" + "\n".join(bad)


def test_the_rules_catch_an_arrow_up_a_type_only_import_and_a_pure_module_starting_a_process() -> None:
    # The rules are data the graph is checked against: each kind of breach, planted, is seen.
    planted = {
        "sweeper.judge._planted": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                   "    from sweeper.drivers.sweep import Plan\n"),
        "sweeper.plan._planted": "import subprocess\n",
    }
    for name, source in planted.items():
        mod = Module(name, ROOT / (name.replace(".", "/") + ".py"))
        for base, imported, typing, _nested in _imports(ast.parse(source), name.rpartition(".")[0]):
            full = f"{base}.{imported}" if imported else base
            target = full if full in GRAPH else base
            if _product(base):
                (mod.typing if typing else mod.runs).add(target if target in GRAPH else base)
            else:
                mod.external.add(base)
        GRAPH[name] = mod
    try:
        assert any(a.startswith("sweeper.judge._planted -> sweeper.drivers") for a in _arrows())
        assert _uses(GRAPH["sweeper.plan._planted"], STARTS) == ["subprocess"]
    finally:
        for name in planted:
            del GRAPH[name]


def test_the_walk_sees_function_level_and_type_checking_imports() -> None:
    source = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from a import T\nelse:\n    import e\n"
              "def f() -> None:\n    import b.c\n    from . import d\n    from ..x import y\n")
    assert set(_imports(ast.parse(source), "p.q")) == {
        ("typing", "TYPE_CHECKING", False, False), ("a", "T", True, False), ("e", None, False, False),
        ("b.c", None, False, True), ("p.q", "d", False, True), ("p.x", "y", False, True)}


def test_no_import_circle() -> None:
    product = {n: m for n, m in GRAPH.items() if not _simulator(n)}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted((product[v].runs | product[v].typing) & set(product)):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for name in sorted(product):
        if name not in index:
            visit(name)
    assert not circles, f"import circles: {circles}"


def test_the_product_imports_nothing_from_the_simulator() -> None:
    bad = sorted(f"{n} -> {m}" for n, mod in GRAPH.items() if not _simulator(n)
                 for m in mod.runs | mod.typing if _simulator(m))
    assert not bad, f"the product imports the simulator: {bad}"


def test_the_simulator_imports_nothing_from_the_product() -> None:
    sims = [n for n in GRAPH if _simulator(n)]
    assert sims, "no simulator modules found: the walk lost them"
    bad = sorted(f"{n} -> {m}" for n in sims for m in GRAPH[n].runs | GRAPH[n].typing if not _simulator(m)
                 and (m == PRODUCT or m.startswith(PRODUCT + ".")))
    assert not bad, f"the simulator imports the product: {bad}"
