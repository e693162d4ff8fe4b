"""The cost model: GPU-seconds of a plan's installs, server starts and requests. Pure.

A profile says how long each of the three takes: stated per install kind (its `cost_s`) and per matrix
(`cost: {install_s, start_s, request_s}`), or learnt from a run's own cells rows (`learn`), each
later source filling in what it knows over the earlier ones. The `gpu_seconds` of a result row is
its cell's share of what its server group measured (`cell_seconds`), the same for sweeps and bisects. A server holds its GPUs from the
install of its environment to its stop, so every second of the three is `gpus_per_cell` GPU-seconds.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from sweeper.spec.bench import BenchSpec
from sweeper.spec.matrix import CostKey, MatrixFile, ServerGroup


@dataclass(frozen=True)
class Profile:
    """Seconds per install, per server start (to healthy), per request (server time at the matrix's
    concurrency: a replay's seconds over its requests); `source` says where the figures came from."""

    install_s: float
    start_s: float
    request_s: float
    source: str

    def record(self) -> dict[str, Any]:
        return {"install_s": self.install_s, "start_s": self.start_s, "request_s": self.request_s,
                "source": self.source}


@dataclass(frozen=True)
class Measured:
    """What a run measured; None where it measured nothing of that kind."""

    start_s: float | None = None
    request_s: float | None = None
    install_s: float | None = None
    groups: int = 0


def stated(kind: str, seconds: tuple[float, float, float]) -> Profile:
    """An install kind's stated profile: (install, start, request) seconds."""
    install_s, start_s, request_s = seconds
    return Profile(install_s=install_s, start_s=start_s, request_s=request_s, source=f"{kind} defaults")


def profile_for(spec: MatrixFile, defaults: Profile, measured: Measured | None = None) -> Profile:
    """The install kind's `defaults`, under the matrix's `cost:` key, under what a run measured."""
    profile = _over(defaults, spec.cost, "matrix cost")
    if measured is not None and measured.groups:
        profile = _over(profile, CostKey(install_s=measured.install_s, start_s=measured.start_s,
                                         request_s=measured.request_s), f"measured over {measured.groups} servers")
    return profile


def _over(profile: Profile, key: CostKey, source: str) -> Profile:
    given = {k: v for k, v in key.model_dump().items() if v is not None}
    if not given:
        return profile
    return replace(profile, **given, source=f"{profile.source}, {source} ({', '.join(sorted(given))})")


def learn(rows: Iterable[Mapping[str, Any]]) -> Measured:
    """Install, start and request seconds from cells rows (one per cell; cells of a group share a
    server), each the median over the servers that measured it.

    A start is `startup_s` of a server that became healthy; a request is the group's `replay_s`
    over its samples (rows before schema version 2: the rest of `duration_s` after the start); an
    install is the longest `install_s` of each commit (the environment is built once per commit and
    node, then looked up: the build is the slowest of its lookups).
    """
    by_group: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        by_group.setdefault(str(row.get("group_id") or row.get("cell_id")), []).append(row)
    starts: list[float] = []
    per_request: list[float] = []
    installs: dict[str, float] = {}
    for members in by_group.values():
        head = members[0]
        installed = _number(head.get("install_s"))
        if installed is not None:
            key = str(head.get("commit_sha") or head.get("commit"))
            installs[key] = max(installs.get(key, 0.0), installed)
        startup, duration = _number(head.get("startup_s")), _number(head.get("duration_s"))
        if startup is None:
            continue  # never healthy: no start to learn from
        starts.append(startup)
        samples = sum(_number(r.get("n_samples")) or 0 for r in members)
        replay = _number(head.get("replay_s"))
        if replay is None and duration is not None:
            replay = max(0.0, duration - startup)
        if replay is not None and samples > 0:
            per_request.append(replay / samples)
    return Measured(start_s=statistics.median(starts) if starts else None,
                    request_s=statistics.median(per_request) if per_request else None,
                    install_s=statistics.median(installs.values()) if installs else None, groups=len(starts))


def cell_seconds(*, gpus: float, cells: int, samples: int, group_samples: int, install_s: float | None,
                 startup_s: float | None, replay_s: float | None, duration_s: float) -> float:
    """One cell's GPU-seconds, from what its group measured: the group's install and start split
    evenly over its cells, its replay by each cell's share of the samples (an adaptive cell that
    stopped early holds the server for less of it). A group that never served (an install or a
    start that failed) spent its whole `duration_s` holding the GPUs, split evenly. Each second
    is `gpus` GPU-seconds: a server holds its GPUs from the install to its stop."""
    share = 1.0 / max(1, cells)
    if replay_s is None:
        return gpus * duration_s * share
    fixed = (install_s or 0.0) + (startup_s or 0.0)
    rest = max(0.0, duration_s - fixed - replay_s)  # post-processing: by cell, like the fixed part
    replay_share = samples / group_samples if group_samples else share
    return gpus * ((fixed + rest) * share + replay_s * replay_share)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


@dataclass(frozen=True)
class Estimate:
    """What a set of servers costs under one profile."""

    installs: int
    starts: int
    requests: int
    gpus_per_cell: float
    profile: Profile
    # Seconds of the benches' load phases (their extra starts are in `starts`): `load_phase_seconds`.
    bench_s: float = 0.0

    @property
    def gpu_seconds(self) -> float:
        p = self.profile
        return self.gpus_per_cell * (self.installs * p.install_s + self.starts * p.start_s
                                     + self.requests * p.request_s + self.bench_s)

    @property
    def gpu_hours(self) -> float:
        return self.gpu_seconds / 3600.0


def estimate(groups: Sequence[ServerGroup], spec: MatrixFile, profile: Profile, requests_per_cell: int) -> Estimate:
    """`groups` run once each: one start per server, one install per commit (environments are cached
    per node: a run spread over N nodes installs up to N times that), every cell's whole suite."""
    commits = {g.head.commit for g in groups}
    cells = sum(len(g.cells) for g in groups)
    installs = len(commits) if spec.install.kind != "preinstalled" else 0
    bench = spec.bench
    if bench is None:
        return Estimate(installs=installs, starts=len(groups), requests=cells * requests_per_cell,
                        gpus_per_cell=spec.gpus_per_cell, profile=profile)
    replayed = 0 if bench.after == "instead" else requests_per_cell
    return Estimate(installs=installs, starts=len(groups) * bench.starts, requests=cells * replayed,
                    gpus_per_cell=spec.gpus_per_cell, profile=profile,
                    bench_s=cells * bench.starts * load_phase_seconds(bench, profile))


def load_phase_seconds(bench: BenchSpec, profile: Profile) -> float:
    """Seconds one cell's load phases take on one server start: per load point, its warm-ups and
    prompts at the profile's seconds per request, or the time its arrivals take when they come
    slower than that (num_prompts / request_rate)."""
    total = 0.0
    for point in bench.points():
        served = bench.requests_per_point() * profile.request_s
        arriving = bench.num_prompts / point.request_rate if math.isfinite(point.request_rate) else 0.0
        total += max(served, arriving)
    return total


def server_seconds(group: ServerGroup, profile: Profile, requests_per_cell: int, bench: BenchSpec | None = None) -> float:
    """Seconds one server group holds its GPUs, installs apart: its start and its cells' replays, and
    with a bench its other starts and every load phase (`estimate` over one group, less the install)."""
    if bench is None:
        return profile.start_s + len(group.cells) * requests_per_cell * profile.request_s
    replayed = 0 if bench.after == "instead" else requests_per_cell
    return (bench.starts * profile.start_s + len(group.cells) * replayed * profile.request_s
            + len(group.cells) * bench.starts * load_phase_seconds(bench, profile))
