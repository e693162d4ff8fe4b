"""What the failure search's rules read of it (`sweeper.bisect.rules`): a read-only view. Pure.

`Search` builds one per question it asks its rules, from what it was told; a test builds one by
hand. The rules see counts per commit and per mode, the per-mode posteriors and drifts, the
untestable commits and the options, never the probes themselves or what is in flight.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from sweeper.bisect.drift import Drift
from sweeper.bisect.options import SearchOptions
from sweeper.bisect.segments import ModePosterior, Prior

# A learned per-start correlation above this: the mode's rate varies between server starts.
RHO_VARIES = 0.02

V = TypeVar("V")


class Lazy(Mapping[str, V]):
    """A read-only mapping over `keys` whose values `get` gives when they are read: a mode's
    posterior or drifts cost a forward-backward pass, and a rule that returns early reads few."""

    def __init__(self, keys: Sequence[str], get: Callable[[str], V]) -> None:
        self._keys, self._get = tuple(keys), get

    def __getitem__(self, key: str) -> V:
        if key not in self._keys:
            raise KeyError(key)
        return self._get(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)


@dataclass(frozen=True)
class SearchView:
    """A search's state as its rules read it: commits are indices 0 (good) .. n_commits - 1 (bad).

    Counts absent from a mapping are 0. A view is read while the search is not told anything new:
    `posteriors` and `drifts` may read the search's own caches when asked."""

    options: SearchOptions
    n_commits: int
    modes: tuple[str, ...] = ()  # in the order they were first seen
    starts: Mapping[int, int] = field(default_factory=dict)  # per commit index: server starts told
    samples: Mapping[int, int] = field(default_factory=dict)  # per commit index: samples told
    failures: Mapping[str, Mapping[int, int]] = field(default_factory=dict)  # per mode, per commit index
    skipped: frozenset[int] = frozenset()  # untestable commits
    posteriors: Mapping[str, ModePosterior] = field(default_factory=dict)
    drifts: Mapping[str, Sequence[Drift]] = field(default_factory=dict)
    probes: int = 0  # server starts told in all (each with samples)

    @property
    def last(self) -> int:
        return self.n_commits - 1

    @property
    def prior(self) -> Prior:
        return self.options.prior or Prior.default()

    @property
    def confidence(self) -> float:
        return self.options.confidence

    @property
    def max_starts_varying(self) -> int:
        return max(self.options.max_starts_per_commit, self.options.max_starts_varying)

    @property
    def pass_starts(self) -> int:
        return max(1, min(self.options.pass_starts, self.options.max_starts_per_commit))

    @property
    def total_samples(self) -> int:
        return sum(self.samples.values())

    def starts_at(self, i: int) -> int:
        return self.starts.get(i, 0)

    def samples_at(self, i: int) -> int:
        return self.samples.get(i, 0)

    def failures_at(self, mode: str, i: int) -> int:
        return self.failures.get(mode, {}).get(i, 0)

    def start_cap(self) -> int:
        """Server starts one commit may get. When some mode's rate varies between starts, each start
        is one draw of that rate: only more starts (not more samples per start) narrow it, so such a
        search may start a commit more often."""
        if any(self.posteriors[m].rho > RHO_VARIES for m in self.modes):
            return self.max_starts_varying
        return self.options.max_starts_per_commit

    def probeable(self, i: int, cap: int | None = None) -> bool:
        """Whether commit i may get another start: testable, under `cap` starts (default: the start
        cap) and under the samples a commit may get."""
        return (i not in self.skipped and self.starts_at(i) < (cap or self.start_cap())
                and self.samples_at(i) < self.options.max_samples_per_commit)
