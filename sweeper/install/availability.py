"""`sweep matrix --check-wheels`: asks the place each commit's vLLM comes from (the per-commit wheel
index of the matrix's variant) whether it is there, before any install starts or a GPU is spent."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sweeper.errors import ConfigError, InstallError
from sweeper.install.kind import Availability
from sweeper.install.registry import kind_of

if TYPE_CHECKING:
    from sweeper.spec.matrix import Install

_PARALLEL = 8  # questions to the index at once


@dataclass(frozen=True)
class CommitCheck:
    ref: str
    sha: str | None
    variant: str | None
    answer: Availability

    @property
    def found(self) -> bool:
        return self.answer.problem is None

    def line(self) -> str:
        """One line: the commit, the variant, found or missing, where it was asked (and why missing)."""
        sha = f" ({self.sha[:12]})" if self.sha and self.sha != self.ref else ""
        variant = f"variant {self.variant}" if self.variant else "no variant"
        where = f" at {self.answer.where}" if self.answer.where else ""
        if self.found:
            return f"wheel for {self.ref}{sha}, {variant}: found{where}"
        return f"wheel for {self.ref}{sha}, {variant}: missing{where} ({self.answer.problem})"


def check_commits(install: Install, shas: Mapping[str, str | None], refs: Sequence[str]) -> list[CommitCheck]:
    """Each of `refs` (resolved by `shas`) asked of its kind's index, in the order given. ConfigError
    when the matrix's install kind has no index to ask."""
    kind = kind_of(install.kind)

    def ask(ref: str) -> Availability | None:
        return kind.availability(install, shas.get(ref))

    with ThreadPoolExecutor(max_workers=max(1, min(_PARALLEL, len(refs)))) as pool:
        answers = list(pool.map(ask, refs))
    out = []
    for ref, answer in zip(refs, answers, strict=True):
        if answer is None:
            raise ConfigError(f"install kind {install.kind} installs no per-commit wheels, so there is no "
                              "index to ask (--check-wheels is for install kind wheels)", key="--check-wheels")
        out.append(CommitCheck(ref, shas.get(ref), install.variant, answer))
    return out


def require_all(checks: Sequence[CommitCheck]) -> None:
    """InstallError naming the commits without a wheel, if any."""
    missing = [c.ref for c in checks if not c.found]
    if missing:
        raise InstallError(f"{len(missing)} of {len(checks)} commits have no wheel on the index "
                           f"({', '.join(missing)}); a fresh commit's wheel can take an hour to appear, or try "
                           "another install.variant")
