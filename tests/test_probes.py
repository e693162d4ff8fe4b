"""The probes run by another environment's interpreter are standalone files run with `python -I`:
they import nothing from the sweeper, ignore the caller's PYTHONPATH, and print one line of JSON.
The simulator package and the product import nothing from each other."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from sweeper.install import probes
from sweeper.install.steps import query_version

ROOT = Path(__file__).resolve().parents[1]
PROBES = sorted(p for p in (ROOT / "sweeper" / "probes").glob("*.py") if p.name != "__init__.py")


def run_probe(name: str, *args: str, env: dict[str, str] | None = None) -> object:
    done = subprocess.run(probes.argv(sys.executable, name, *args), capture_output=True, text=True, timeout=120,
                          check=True, env=env)
    (line,) = done.stdout.splitlines()
    return json.loads(line)


def test_the_version_probe_names_the_first_installed_distribution() -> None:
    assert run_probe("dist_version", "no-such-distribution", "pytest", "typer") == metadata.version("pytest")
    assert run_probe("dist_version", "no-such-distribution") is None
    assert query_version(sys.executable) is None  # this environment has no vLLM


def test_the_torch_probe_without_torch() -> None:
    assert run_probe("torch_build", "no-such-distribution") == {"torch": None, "cuda": None}


def test_a_probe_ignores_the_callers_python_path(tmp_path: Path) -> None:
    # A module on PYTHONPATH would shadow the standard library's for a probe run without -I.
    (tmp_path / "json.py").write_text("raise ImportError('the caller’s path was used')\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    assert run_probe("dist_version", "pytest", env=env) == metadata.version("pytest")


def imported(path: Path) -> set[str]:
    """Top-level names of the modules a file imports (relative imports excluded)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("path", PROBES, ids=lambda p: p.name)
def test_a_probe_imports_only_the_standard_library(path: Path) -> None:
    assert imported(path) <= set(sys.stdlib_module_names) | {"__future__"}


def test_the_simulator_and_the_product_import_nothing_from_each_other() -> None:
    sim = {p.relative_to(ROOT): imported(p) for p in (ROOT / "vllmsim").rglob("*.py")}
    product = {p.relative_to(ROOT): imported(p) for p in (ROOT / "sweeper").rglob("*.py")}
    assert sim and product
    assert {str(p) for p, names in sim.items() if "sweeper" in names} == set()
    assert {str(p) for p, names in product.items() if "vllmsim" in names} == set()
