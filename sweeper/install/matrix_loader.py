"""The matrix loader: a matrix file read, checked against the registered install kinds, and parsed.

Parsing and expansion (`sweeper.spec.matrix.build_matrix`) are pure and name no install kind: what
they must know of the kinds (their names, each one's default commit and rule on the commit axis, the
simulated histories) is asked of the registry here and handed over as values (`KindFacts`). This is
the one place a matrix meets the registry. It lives beside the registry, in the lowest layer that may
ask it, so drivers, scripts and tests load a matrix through it; the loader's disk checks (the suite
files exist) are here too, so the parse reads nothing.
"""

from __future__ import annotations

import dataclasses
import os
import stat
from pathlib import Path
from typing import Any

from sweeper.errors import clip
from sweeper.install import registry
from sweeper.install.sim import Sim
from sweeper.spec import bench_sweep_params
from sweeper.spec.bench import read_bench_files
from sweeper.spec.matrix import KindFacts, Matrix, MatrixFile, build_matrix, resolve_path, suite_names
from sweeper.spec.yamlfile import Positions, load, os_reason

__all__ = ["kind_facts", "load_matrix", "parse_matrix"]


def kind_facts() -> KindFacts:
    """What a matrix's parse must know of the install kinds registered now."""
    names = registry.names()
    kinds = {name: registry.kind_of(name) for name in names}
    return KindFacts(names=names,
                     default_commits={name: kind.default_commit for name, kind in kinds.items()},
                     commits_problems={name: kind.commits_problem for name, kind in kinds.items()},
                     sim_histories=tuple(Sim.HISTORIES))


def parse_matrix(data: Any, pos: Positions, path: str) -> Matrix:
    """The matrix of already-read data, checked against the registered install kinds (touches no disk;
    `path` only names it and anchors the relative paths it holds)."""
    return build_matrix(data, pos, path, kind_facts())


def load_matrix(path: str | Path) -> Matrix:
    """Read and parse a matrix file, then check the files it names (its suites) exist."""
    data, pos = load(path)
    # `vllm bench sweep` param files named by the matrix become its axes and load points.
    data = bench_sweep_params.apply(data, pos, str(path))
    matrix = parse_matrix(data, pos, str(path))
    _check_suites(matrix.spec, pos, str(path))
    check_expect(matrix, pos)
    bench = read_bench_files(matrix.spec.bench, pos, str(path))  # a `jsonl:` dataset's prompts, by value
    if bench is not matrix.spec.bench:
        matrix = dataclasses.replace(matrix, spec=matrix.spec.model_copy(update={"bench": bench}))
    return matrix


def check_expect(matrix: Matrix, pos: Positions) -> None:
    """The `expect:` section against the metric names and the matrix's commits (one line, exit 1)."""
    from sweeper.judge.metric_names import METRICS
    from sweeper.spec.expect import parse_expect

    known = {name: m.higher_is_better for name, m in METRICS.items()}
    parse_expect(matrix.spec.expect, pos, [str(v) for v in dict(matrix.axes).get("commit", ())], known)


def _check_suites(spec: MatrixFile, pos: Positions, path: str) -> None:
    """Every suite file exists, is a regular file, and is listed once."""
    seen: dict[str, int] = {}
    for i, (where, name) in enumerate(suite_names(spec)):
        try:
            suite_path = resolve_path(path, name)
            info = os.stat(suite_path)
            real = os.path.realpath(suite_path)
        except FileNotFoundError:
            raise pos.error(where, f"suite file not found: {resolve_path(path, name)}") from None
        except OSError as exc:
            raise pos.error(where, f"cannot read suite file {clip(name)}: {os_reason(exc)}") from None
        except (RuntimeError, ValueError) as exc:  # `~nobody/x`: no such home directory
            raise pos.error(where, f"cannot resolve suite file {clip(name)}: {exc}") from None
        if not stat.S_ISREG(info.st_mode):
            raise pos.error(where, f"suite file {suite_path} is not a regular file")
        if real in seen:
            raise pos.error(where, f"the same suite file is listed twice (also suite[{seen[real]}])")
        seen[real] = i


def check_files(path: str | Path) -> None:
    """Load the matrix and its suites only to refuse a bad one: its one line (file, line, key) before a
    command imports what runs it."""
    from sweeper.spec.suite import load_suites

    load_suites(load_matrix(path).suite_paths)
