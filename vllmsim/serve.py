"""`vllm serve MODEL [flags]`, simulated: flags parsed as vLLM parses them (argparse, `vllmsim.args`),
the startup resolved and logged, then the HTTP server. `python -m vllmsim serve` comes here without
the CLI's Typer, whose import (pydantic with it) cost as much CPU as the rest of a simulated start-up."""

from __future__ import annotations

import os
import sys

from vllmsim import args, config, tree
from vllmsim.behaviour import Behaviour
from vllmsim.logs import Logger


def serve_main(argv: list[str]) -> int:
    # The HTTP server's imports, paid by a server only (not by every `sweep` command), and before its
    # first log line: a stop signal that follows a line must find its handler installed.
    from vllmsim.server import run

    log = Logger()
    try:
        sim_tree = tree.load()
    except tree.TreeError as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        return 1
    ns = args.parse(argv, sim_tree.release)  # argparse exits 2 on an unknown flag, 0 after --help
    if not sim_tree.install_ok:
        print(
            f"ModuleNotFoundError: vLLM is not installed at this commit ({sim_tree.install})", file=sys.stderr
        )
        return 1
    startup = config.resolve(ns, os.environ, sim_tree)
    for line in startup.lines:
        log.emit(line)
    refusal = startup.refusal
    where = startup.refusal_where
    if refusal is None and startup.config is not None:
        bug = Behaviour(sim_tree, startup.config).start_refusal()
        if bug is not None:
            log.error_line("core.py:708", "EngineCore failed to start.", engine=True)
            refusal, where = (
                f"RuntimeError: {bug.message or 'Engine core initialization failed.'}",
                "core.py:699",
            )
    if refusal is not None:
        _traceback(log, where, refusal)
        return 1
    return run(startup, sim_tree, log)


def _traceback(log: Logger, where: str, message: str) -> None:
    file, _, line = where.partition(":")
    log.raw(
        "Traceback (most recent call last):\n"
        '  File "/usr/lib/python3/site-packages/vllm/entrypoints/cli/serve.py", line 60, in cmd\n'
        "    uvloop.run(run_server(args))\n"
        f'  File "/usr/lib/python3/site-packages/vllm/{file}", line {line or 1}, in __init__\n'
        f"    raise {message.partition(':')[0]}(...)\n"
        f"{message}"
    )
