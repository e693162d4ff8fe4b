"""Install kinds are classes chosen from one registry: a new kind is one class and one registration,
and the matrix, the planner, the in-process executor and the environment cache take it from there.
The simulator kind's histories are the ones the simulator's own command line makes."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import FAST

from sweeper.drivers.sweep import run_matrix
from sweeper.errors import ConfigError
from sweeper.execute.choice import choose
from sweeper.install import registry as install
from sweeper.install.cache import list_environments
from sweeper.install.kind import InstallKind, Recipe, digest, settings_of, slug
from sweeper.install.matrix_loader import load_matrix
from sweeper.install.sim import COMMAND, TREE_ENV, Sim
from sweeper.spec.matrix import Install
from sweeper.store import frames as analysis


class Launcher(InstallKind):
    """A toy kind: its install writes a launcher script that execs the simulator."""

    name = "toy-launcher"
    logical_gpus = True  # a simulator needs no GPU

    def commits_problem(self, commits: Any) -> str | None:
        return "the toy launcher is one commit" if len(commits) > 1 else None

    def recipe(self, install: Install, commit: str, sha: str | None, *, base_dir: Path, cache: Path,
               repo: Path | None) -> Recipe:
        return Recipe(f"toy-{slug(commit)}-{digest(settings_of(install), commit)}", self, commit, sha, install,
                      base_dir)

    def build(self, recipe: Recipe, root: Path) -> dict[str, Any]:
        tree = root / "tree"
        tree.mkdir()
        (tree / "sim.yaml").write_text(yaml.safe_dump({"version": "0.30.0", **FAST}))
        script = root / "vllm"
        script.write_text(f"#!/bin/sh\n{TREE_ENV}={shlex.quote(str(tree))} exec {shlex.join(COMMAND)} serve \"$@\"\n")
        script.chmod(0o755)
        return {"launch": [str(script)], "env": {}, "python": sys.executable, "version": "0.30.0"}


@pytest.fixture
def toy_kind() -> Iterator[InstallKind]:
    kind = install.register(Launcher())
    try:
        yield kind
    finally:
        install.unregister(kind.name)


def toy_matrix(tmp_path: Path, suite: Path, axes: str = "{spec_method: [none, ngram]}") -> Path:
    path = tmp_path / "m.yaml"
    path.write_text(f"name: toy\nmodel: m\nsuite: {suite}\ninstall: {{kind: toy-launcher}}\naxes: {axes}\n")
    return path


def test_a_registered_kind_runs_a_group_through_the_in_process_executor(toy_kind: InstallKind, tmp_path: Path,
                                                                         tiny_suite: Path) -> None:
    matrix = toy_matrix(tmp_path, tiny_suite)
    outcome = run_matrix(matrix, runs_dir=tmp_path / "runs", run_id="toy", executor=choose("local"),
                         cache_dir=tmp_path / "cache")
    cells = analysis.load_cells(outcome.run)
    assert sorted(cells.spec_method) == ["ngram", "none"]
    assert set(cells.status) == {"ok"}, cells[["cell_id", "status", "status_detail"]]
    assert set(cells.commit) == {"main"}  # the kind's default commit, with no commit axis
    assert set(cells.vllm_version) == {"0.30.0"}
    (env,) = list_environments(tmp_path / "cache")
    assert env.kind == "toy-launcher" and env.key.startswith("toy-main-")
    # The kind's own rules on a matrix are asked when it is parsed.
    with pytest.raises(ConfigError, match=r"m.yaml:5: axes.commit: the toy launcher is one commit"):
        load_matrix(toy_matrix(tmp_path, tiny_suite, "{commit: [a, b]}"))


def test_an_unregistered_kind_is_refused_by_name(toy_kind: InstallKind, tmp_path: Path, tiny_suite: Path) -> None:
    assert install.names() == ("sim", "preinstalled", "wheels", "source", "pip", "toy-launcher")
    with pytest.raises(ValueError, match="registered already"):
        install.register(Launcher())
    install.unregister(toy_kind.name)
    try:
        with pytest.raises(ConfigError, match=r"m\.yaml:4: install\.kind: expected one of 'sim', 'preinstalled', "
                                              r"'wheels', 'source' or 'pip', got 'toy-launcher'"):
            load_matrix(toy_matrix(tmp_path, tiny_suite))
    finally:
        install.register(toy_kind)


def test_the_sim_kinds_histories_are_the_simulators_scenarios() -> None:
    done = subprocess.run([*COMMAND, "make-repo", "--help"], capture_output=True, text=True, check=True, timeout=60,
                          env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
    offered = re.search(r"--scenario\s+<([a-z|]+)>", done.stdout)
    assert offered is not None, done.stdout
    assert tuple(offered.group(1).split("|")) == Sim.HISTORIES


def test_a_sim_history_made_by_an_older_simulator_is_made_again(tmp_path: Path) -> None:
    """A cached `sim:` history without this simulator's format stamp (one made before its histories
    planted what they plant now) is replaced; a current one is reused as it is."""
    old = tmp_path / "sim-bisect"
    (old / ".git").mkdir(parents=True)
    (old / ".git" / "made-by-an-older-simulator").write_text("")
    made = Sim.make_history("sim:bisect", tmp_path)
    assert made == old and not (made / ".git" / "made-by-an-older-simulator").exists()
    assert (made / "sim.yaml").exists() and (made / ".git" / "sweep-history-format").read_text().strip()
    (made / ".git" / "kept").write_text("")
    assert (Sim.make_history("sim:bisect", tmp_path) / ".git" / "kept").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["sim-bisect"]
