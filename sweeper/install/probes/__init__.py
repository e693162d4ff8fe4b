"""Small programs the sweeper runs with another environment's interpreter, as `python -I <file> args`.

Each probe is a standalone file: it imports nothing from the sweeper (the target environment never
imports our package, and `-I` keeps its `sys.path` free of ours), takes its inputs from argv and
prints one line of JSON. They are modules here only so that ruff and mypy check them.
"""

from __future__ import annotations

from pathlib import Path

_HERE = Path(__file__).resolve().parent


def argv(python: str, probe: str, *args: str) -> list[str]:
    """The command that runs probe `probe` (a file name of this folder without `.py`) under `python`."""
    path = _HERE / f"{probe}.py"
    if not path.is_file():
        raise ValueError(f"no probe named {probe!r}")
    return [python, "-I", str(path), *args]
