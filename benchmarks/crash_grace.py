"""The crash grace after a transport error, when the server stays healthy: the cell's time.

    .venv/bin/python benchmarks/crash_grace.py [--rounds 3]

One sweep (in-process executor, one group at a time) of three cells on `tests/wireserver.py`, the
misbehaving test server, through a `preinstalled` install whose launcher it is: `hangup` closes the
connection without a status line, `reset` resets it after the status line, `ok` answers (the
control). Each cell sends two plain requests; the server stays up and healthy throughout. The
figure is each cell's `duration_s` (its whole group: start, replay, stop), median over the rounds.
Run it with `PYTHONPATH` at an older tree of the sweeper to measure that one (the matrix uses
nothing newer than the executor seam).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import textwrap
from pathlib import Path

import sweeper
from sweeper.drivers.sweep import run_matrix
from sweeper.execute.choice import choose
from sweeper.store import frames as analysis

WIRE_SERVER = Path(__file__).resolve().parent.parent / "tests" / "wireserver.py"
BEHAVIOURS = ("hangup", "reset", "ok")
SUITE = """
name: wire
defaults:
  repeat: 2
  body: {max_tokens: 16, messages: [{role: user, content: hi}]}
  checks: [http_ok, {finish_reason: {expected: stop}}]
cases:
  - id: plain
    body: {stream: false}
"""


def one_round(root: Path, n: int) -> dict[str, float]:
    folder = root / f"round-{n}"
    folder.mkdir()
    (folder / "s.yaml").write_text(SUITE)
    launch = json.dumps(["{python}", str(WIRE_SERVER), "serve"])
    (folder / "m.yaml").write_text(textwrap.dedent(f"""
        name: grace
        model: m
        suite: s.yaml
        install: {{kind: preinstalled, python: {json.dumps(sys.executable)}, launch: {launch}}}
        gpus_per_cell: 1
        concurrency: 1
        timeouts: {{startup_s: 60, request_s: 10}}
        axes:
          env.WIRE_BEHAVIOUR: {json.dumps(list(BEHAVIOURS))}
    """))
    outcome = run_matrix(folder / "m.yaml", runs_dir=folder / "runs", run_id="grace",
                         executor=choose("local", gpus=1), cache_dir=root / "cache")
    cells = analysis.load_table(outcome.run, "cells").to_pylist()
    return {json.loads(dict(c["axes"])["env.WIRE_BEHAVIOUR"]): float(c["duration_s"]) for c in cells}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"sweeper from {Path(sweeper.__file__).parent}")
    with tempfile.TemporaryDirectory(prefix="sweep-grace-") as tmp:
        rounds = [one_round(Path(tmp), n) for n in range(args.rounds)]
    print("| cell | duration_s per round | median |")
    print("| --- | --- | --- |")
    for name in BEHAVIOURS:
        values = [r[name] for r in rounds]
        print(f"| {name} | {', '.join(f'{v:.2f}' for v in values)} | {statistics.median(values):.2f} |")


if __name__ == "__main__":
    main()
