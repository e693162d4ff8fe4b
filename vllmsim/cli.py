"""`python -m vllmsim` (also `sweep sim`): `serve` (a stand-in for `vllm serve`) and `make-repo`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from vllmsim import repo, tree
from vllmsim.serve import serve_main

app = typer.Typer(
    help="The vLLM simulator: a vLLM-compatible server whose bugs are declared per commit.\n\n"
         "Example: python -m vllmsim make-repo /tmp/vllm-sim",
    no_args_is_help=True,
    add_completion=False,
)


def _version(value: bool) -> None:
    if value:
        try:
            typer.echo(tree.load().version)
        except tree.TreeError as exc:
            typer.echo(f"Error: {exc}", err=True)
            raise typer.Exit(1) from None
        raise typer.Exit(0)


@app.callback()
def main(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the simulated vLLM version and exit."
        ),
    ] = False,
) -> None:
    """The vLLM simulator."""


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}
)
def serve(ctx: typer.Context) -> None:
    """Serve like `vllm serve MODEL [flags]` (run `serve --help` for the flags of this version).

    Example: SWEEP_SIM_TREE=/tmp/tree sweep sim serve Qwen/Qwen3-8B --port 8000
    """
    raise typer.Exit(serve_main(list(ctx.args)))


@app.command("make-repo")
def make_repo(
    directory: Annotated[Path, typer.Argument(help="Where to create the repository (absent or empty).")],
    scenario: Annotated[repo.Scenario, typer.Option(help="Which history to plant.")] = repo.Scenario.DEMO,
    commits: Annotated[int, typer.Option(help="Number of commits (bisect scenario).")] = 240,
    seed: Annotated[int, typer.Option(help="Chooses the planted positions.")] = 0,
    rate_sd: Annotated[
        float,
        typer.Option(
            "--rate-sd",
            help="Per-start standard deviation of the rate of every planted bug with a rate below 1: "
            "each server start draws its rate from a Beta with that mean and spread (0: off).",
        ),
    ] = 0.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the planted facts as JSON.")] = False,
) -> None:
    """Create a git repository of simulated vLLM history with planted bugs.

    Example: sweep sim make-repo /tmp/vllm-sim --scenario bisect --json
    Example: sweep sim make-repo /tmp/vllm-sim --rate-sd 0.15
    """
    try:
        plan = repo.make(directory, scenario=scenario, commits=commits, seed=seed, rate_sd=rate_sd)
    except repo.RepoError as exc:
        typer.echo(f"Error: {exc}", err=True)
        raise typer.Exit(1) from None
    if as_json:
        typer.echo(json.dumps(plan, indent=2))
    else:
        typer.echo(
            f"{directory}: {plan['commits']} commits, tags {', '.join(plan['tags'])}; "
            f"plan in {Path(directory) / '.git' / 'sim-plan.json'}"
        )
