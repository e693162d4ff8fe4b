"""The import graph, read with `ast`: layers that only point down (DESIGN.md, "Who may import whom").

Every `import` and `from ... import` in the product's modules counts, at module level or inside a
function (a late import is still a dependency); imports under `if TYPE_CHECKING:` do not run, so
they are exempt from the rules on what runs. Three rules:

- no import circle among the product's modules;
- a reading module (the readers of stored results) imports no execution module (what installs,
  starts, talks to servers or drives runs), anywhere in it, nor does anything it imports when that
  is imported: importing `a.b.c` runs `a/__init__.py` and `a/b/__init__.py` too, so those count;
- the product imports nothing from the simulator (the top-level `vllmsim` package), and the
  simulator nothing from the product.

A reader's own type-only imports are held to the reading rule separately: a reader whose
signatures name a driver's types is built on that driver's design.
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

# The readers of stored results: they read the store and call the pure core only.
READING = frozenset({
    "sweeper.reports.tables", "sweeper.reports.html", "sweeper.reports.bug", "sweeper.reports.compare", "sweeper.store.frames",
    "sweeper.store.catalogue", "sweeper.judge.explain", "sweeper.reports.bisect", "sweeper.reports.spend", "sweeper.reports.triage",
})
# The shell that installs, starts processes, talks to servers or drives runs, and the CLI over it.
EXECUTION = frozenset({
    "sweeper.cli", "sweeper.drivers.sweep", "sweeper.reports.preview", "sweeper.drivers.runs", "sweeper.drivers.bisect",
    "sweeper.execute.executor", "sweeper.execute.ray_executor", "sweeper.execute.inprocess", "sweeper.execute.runner", "sweeper.execute.server",
    "sweeper.execute.replay", "sweeper.execute.server_metrics", "sweeper.install.cache", "sweeper.execute.fingerprint", "sweeper.install.git",
    "sweeper.install.history", "sweeper.install.repository", "sweeper.install.portable", "sweeper.execute.tinymodel", "sweeper.install.supported",
    "sweeper.execute.guard", "sweeper.execute.transport", "sweeper.drivers.bisect_evidence", "sweeper.execute.rounds", "sweeper.drivers.triage",
})


@dataclass
class Module:
    name: str
    path: Path
    runs: set[str] = field(default_factory=set)  # modules it imports when it (or a function of it) runs
    top: set[str] = field(default_factory=set)  # of those, the ones it imports when it is imported
    typing: set[str] = field(default_factory=set)  # modules it imports for type checking only


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


def test_every_named_module_exists() -> None:
    # A module renamed or moved must be renamed here too, or its rule silently stops applying.
    missing = sorted((READING | EXECUTION) - set(GRAPH))
    assert not missing, f"named in this test but not in the tree: {missing}"


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
        for w in sorted(product[v].runs & set(product)):
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


def _params(xfail: dict[str, str]) -> list[object]:
    return [pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=xfail[n])) if n in xfail else n
            for n in sorted(READING)]


@pytest.mark.parametrize("reader", _params({}))
def test_a_reader_reaches_no_execution_module(reader: str) -> None:
    bad = {m: path for m, path in reached(reader).items() if m in EXECUTION}
    assert not bad, f"{reader} reaches execution modules: " + "; ".join(" -> ".join(p) for p in bad.values())


@pytest.mark.parametrize("reader", _params({}))
def test_a_readers_types_come_from_no_execution_module(reader: str) -> None:
    bad = {m: path for m, path in reached(reader, first=GRAPH[reader].typing).items() if m in EXECUTION}
    assert not bad, f"{reader} names types of execution modules: " + "; ".join(" -> ".join(p) for p in bad.values())


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
