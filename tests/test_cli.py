"""Every command says what it does, with an example; the CLI translates errors into one line."""

from __future__ import annotations

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
    assert {("matrix",), ("bisect",), ("report",), ("sim",), ("sim", "serve"), ("sim", "make-repo"),
            ("suite", "show"), ("suite", "checks"), ("cache", "list"), ("cache", "clear"), ("model", "tiny")} <= set(ALL)


def test_top_level_help_has_an_example() -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    assert "Example: sweep matrix matrices/demo.yaml" in result.output


@pytest.mark.parametrize("path", [p for p in ALL if p != ("sim", "serve")], ids=" ".join)
def test_every_command_has_help_with_an_example(path: tuple[str, ...]) -> None:
    result = runner.invoke(app, [*path, "--help"])
    assert result.exit_code == 0, result.output
    assert "Example" in result.output, result.output


def test_suite_show_lists_cases() -> None:
    result = runner.invoke(app, ["suite", "show", "suites/thinking-budget.yaml"])
    assert result.exit_code == 0
    assert result.output.startswith("thinking-budget: 4 cases")
    assert "first_token_id" in result.output
