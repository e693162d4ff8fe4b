"""Which cells a bisect works on. Pure.

`--where AXIS=VALUE` pairs pick cells of a matrix (`select_cells`, `select_cell`); after a sweep,
the cells worth bisecting are those whose failures changed between good and bad (`screen`, on the
counts the sweep stored at either endpoint).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sweeper.errors import BisectError
from sweeper.judge import modes as fm
from sweeper.spec.matrix import Cell, Matrix, canonical

# A cell changes when some mode's Fisher p-value, Bonferroni-corrected over the modes tried, is below this.
ALPHA = 0.01


def select_cell(matrix: Matrix, where: Sequence[str]) -> Cell:
    """The one cell (settings apart from the commit) that `--where AXIS=VALUE` pairs pick."""
    cells = select_cells(matrix, where)
    if len(cells) > 1:
        listed = "; ".join(" ".join(f"{k}={_text(v)}" for k, v in c.values.items() if k != "commit")
                           for c in cells[:8])
        raise BisectError(f"{len(cells)} cells match {' '.join(where) or '(nothing)'}; add --where to pick "
                          f"one of: {listed}")
    return cells[0]


def _text(v: Any) -> str:
    return v if isinstance(v, str) else canonical(v)


def select_cells(matrix: Matrix, where: Sequence[str]) -> list[Cell]:
    """Every distinct cell setting (commit aside) matching `--where AXIS=VALUE` pairs."""
    wanted: dict[str, str] = {}
    for item in where:
        if "=" not in item:
            raise BisectError(f"--where {item!r}: expected AXIS=VALUE")
        key, value = item.split("=", 1)
        wanted[key.strip()] = value.strip()
    axis_names = {n for n, _ in matrix.axes} | {k for c in matrix.cells for k in c.values}
    for key in wanted:
        if key not in axis_names:
            raise BisectError(f"--where {key}: not an axis of {matrix.path}; axes: {', '.join(sorted(axis_names))}")
    matches = [c for c in matrix.cells if all(k == "commit" or _text(c.values.get(k)) == v for k, v in wanted.items())]
    by_settings: dict[str, Cell] = {}
    for c in matches:
        by_settings.setdefault(c.settings_key, c)
    if not by_settings:
        raise BisectError(f"no cell of {matrix.path} matches {' '.join(where) or '(nothing)'}")
    return list(by_settings.values())


@dataclass(frozen=True)
class Counts:
    """Failures per mode among `samples` samples."""

    samples: int
    failures: Mapping[str, int]


@dataclass(frozen=True)
class Ends:
    """What a sweep saw of one cell: its counts at good and at bad (None where it has no sample),
    and whether any of its samples failed at any commit."""

    good: Counts | None
    bad: Counts | None
    failed_somewhere: bool


def ends(by_commit: Mapping[str, Sequence[tuple[str, frozenset[str]]]], good: str, bad: str,
         modes: Mapping[tuple[str, frozenset[str]], str]) -> Ends:
    """One cell's `Ends` from its samples' label sets per commit, counted by mode."""
    def counts(sha: str) -> Counts | None:
        sets = by_commit.get(sha, ())
        return Counts(len(sets), fm.count_modes(sets, modes)) if sets else None

    failed = any(labels for sets in by_commit.values() for _, labels in sets)
    return Ends(counts(good), counts(bad), failed)


@dataclass(frozen=True)
class Screen:
    chosen: tuple[str, ...]  # the cells worth bisecting, in the order given
    checked: int  # cells measured at both endpoints
    unclear: int  # of those, cells failing at either but not credibly differently


def screen(cells: Mapping[str, Ends], alpha: float = ALPHA) -> Screen:
    """The cells worth bisecting: those where some failure mode is credibly more (a regression) or
    less (a fix) frequent at bad than at good, by Fisher's exact test at `alpha`, Bonferroni-corrected
    over the modes tried; and cells not measured at both endpoints but seen failing somewhere (the
    bisect measures their endpoints first)."""
    from scipy.stats import fisher_exact

    chosen, checked, unclear = [], 0, 0
    for key, seen in cells.items():
        good, bad = seen.good, seen.bad
        if good is None or bad is None:
            if seen.failed_somewhere:
                chosen.append(key)
            continue
        checked += 1
        tried = sorted(set(good.failures) | set(bad.failures))
        for mode in tried:
            k_g, k_b = good.failures.get(mode, 0), bad.failures.get(mode, 0)
            p = fisher_exact([[k_g, good.samples - k_g], [k_b, bad.samples - k_b]]).pvalue
            if p * len(tried) < alpha:
                chosen.append(key)
                break
        else:
            unclear += bool(tried)
    return Screen(tuple(chosen), checked, unclear)
