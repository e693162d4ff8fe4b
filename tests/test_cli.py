"""Every command says what it does, with an example; the CLI translates errors into one line."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import pytest
from typer.main import get_command
from typer.testing import CliRunner

from sweeper.cli import app

runner = CliRunner()


def commands(group: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = []
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        out.append((*prefix, name))
        if hasattr(cmd, "list_commands"):
            out.extend(commands(cmd, (*prefix, name)))
    return out


ALL = commands(get_command(app))  # type: ignore[arg-type]


def test_the_main_commands_exist() -> None:
    assert {("matrix",), ("bisect",), ("report",), ("sim",),
            ("suite", "show"), ("suite", "checks"), ("cache", "list"), ("cache", "clear"), ("model", "tiny")} <= set(ALL)


def test_top_level_help_has_an_example() -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    assert "Example: sweep matrix matrices/demo.yaml" in result.output


# `sweep sim` hands its arguments to the simulator's own command line in this process's place: it
# is run as a command below, never inside the test process.
@pytest.mark.parametrize("path", [p for p in ALL if p != ("sim",)], ids=" ".join)
def test_every_command_has_help_with_an_example(path: tuple[str, ...]) -> None:
    result = runner.invoke(app, [*path, "--help"])
    assert result.exit_code == 0, result.output
    assert "Example" in result.output, result.output


@pytest.mark.parametrize("args", [["--help"], ["make-repo", "--help"]], ids=" ".join)
def test_sweep_sim_is_the_simulators_command_line(args: list[str]) -> None:
    done = subprocess.run([sys.executable, "-m", "sweeper", "sim", *args], capture_output=True, text=True,
                          timeout=60, check=False, env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0, done.stderr
    assert "Example" in done.stdout, done.stdout
    if args == ["--help"]:
        assert "serve" in done.stdout and "make-repo" in done.stdout


def test_suite_show_lists_cases() -> None:
    result = runner.invoke(app, ["suite", "show", "suites/thinking-budget.yaml"])
    assert result.exit_code == 0
    assert result.output.startswith("thinking-budget: 4 cases")
    assert "first_token_id" in result.output


def test_cache_list_is_a_table(tmp_path: Path) -> None:
    root = tmp_path / "sim-abc-1234"
    root.mkdir()
    (root / "blob").write_bytes(b"x" * 2500)
    (root / "meta.json").write_text(json.dumps({"key": root.name, "kind": "sim", "commit": "v0.28.0", "sha": "f" * 40,
                                                "version": "0.28.0", "launch": ["x"], "created": 0, "size_bytes": 2500}))
    result = runner.invoke(app, ["cache", "list", "--cache-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    header, row = [[c.strip() for c in re.split("[│┃]", line)[1:-1]]
                   for line in result.output.splitlines() if re.search("[│┃]", line)]
    assert header == ["key", "kind", "commit", "vLLM", "size", "last used", "state"]
    assert row == ["sim-abc-1234", "sim", "v0.28.0 (ffffffffffff)", "0.28.0", "2.5 KB", "just now", "ready"]
    empty = runner.invoke(app, ["cache", "list", "--cache-dir", str(tmp_path / "none")])
    assert empty.output.strip() == f"no cached environments in {tmp_path / 'none'}"
