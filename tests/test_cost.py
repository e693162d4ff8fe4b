"""The cost model: stated profiles per install kind and per matrix, what a run's own cells rows
teach it, and the GPU-seconds it gives a plan and the full product."""

from __future__ import annotations

from pathlib import Path

import pytest

from sweeper.install.matrix_loader import load_matrix
from sweeper.install.registry import stated_profile
from sweeper.plan import cost
from sweeper.plan.cost import Measured, Profile, estimate, learn, profile_for
from sweeper.spec.matrix import Matrix

ROOT = Path(__file__).resolve().parent.parent
SUITE = "cases: [{id: a, body: {messages: [{role: user, content: hi}]}}]\n"


def spec_of(tmp_path: Path, text: str) -> Matrix:
    (tmp_path / "s.yaml").write_text(SUITE)
    (tmp_path / "m.yaml").write_text("model: m\nsuite: s.yaml\n" + text)
    return load_matrix(tmp_path / "m.yaml")


def test_every_install_kind_has_a_stated_profile() -> None:
    from sweeper.install import registry as install

    for name in install.names():
        profile = cost.stated(name, install.kind_of(name).cost_s)
        assert profile.start_s > 0 and profile.request_s > 0 and profile.source == f"{name} defaults"


def test_a_matrix_cost_key_overrides_the_kinds_defaults(tmp_path: Path) -> None:
    matrix = spec_of(tmp_path, "install: {kind: wheels}\ncost: {start_s: 30, request_s: 0.5}\n"
                               "axes: {commit: ['" + "a" * 40 + "']}\n")
    assert profile_for(matrix.spec, stated_profile(matrix.spec)) == Profile(install_s=90.0, start_s=30.0, request_s=0.5,
                                               source="wheels defaults, matrix cost (request_s, start_s)")
    plain = spec_of(tmp_path, "install: {kind: sim}\naxes: {spec_method: [none]}\n")
    assert profile_for(plain.spec, stated_profile(plain.spec)) == cost.stated("sim", (2.0, 1.0, 0.05))


def test_a_profile_is_learnt_from_cells_rows() -> None:
    """One start per group (its cells share the server); a request is the group's time after its
    start over its samples; a server that never became healthy teaches nothing."""
    rows = [
        {"group_id": "g1", "cell_id": "c1", "startup_s": 10.0, "duration_s": 30.0, "n_samples": 5},
        {"group_id": "g1", "cell_id": "c2", "startup_s": 10.0, "duration_s": 30.0, "n_samples": 5},
        {"group_id": "g2", "cell_id": "c3", "startup_s": 20.0, "duration_s": 50.0, "n_samples": 10},
        {"group_id": "g3", "cell_id": "c4", "startup_s": None, "duration_s": 600.0, "n_samples": 0},
    ]
    measured = learn(rows)
    assert measured == Measured(start_s=15.0, request_s=2.5, groups=2)
    assert learn([]) == Measured()


def test_measured_figures_win_over_stated_ones(tmp_path: Path) -> None:
    matrix = spec_of(tmp_path, "install: {kind: sim}\ncost: {start_s: 30, install_s: 5}\naxes: {spec_method: [none]}\n")
    profile = profile_for(matrix.spec, stated_profile(matrix.spec), Measured(start_s=3.0, request_s=0.2, groups=4))
    assert (profile.install_s, profile.start_s, profile.request_s) == (5.0, 3.0, 0.2)
    assert profile.source.endswith("measured over 4 servers (request_s, start_s)")
    assert profile_for(matrix.spec, stated_profile(matrix.spec), Measured()) == profile_for(matrix.spec, stated_profile(matrix.spec))


def test_gpu_seconds_of_installs_starts_and_requests(tmp_path: Path) -> None:
    """thor.yaml: 96 servers, one install per commit (3), 101 requests per cell, 1 GPU each."""
    thor = load_matrix(ROOT / "matrices" / "thor.yaml")
    e = estimate(thor.groups(), thor.spec, cost.stated("wheels", (90.0, 240.0, 2.0)), 101)
    assert (e.installs, e.starts, e.requests) == (3, 96, 9696)
    assert e.gpu_seconds == 3 * 90 + 96 * 240 + 9696 * 2
    assert e.gpu_hours == pytest.approx(42702 / 3600)
    two = spec_of(tmp_path, "install: {kind: preinstalled}\ngpus_per_cell: 2\ncost: {start_s: 100, request_s: 1}\n"
                            "axes: {spec_method: [none, ngram], request.temperature: [0, 1]}\n")
    e = estimate(two.groups(), two.spec, profile_for(two.spec, stated_profile(two.spec)), 10)
    # Nothing to install for a preinstalled vLLM; 2 servers of 2 cells of 10 requests, on 2 GPUs each.
    assert (e.installs, e.starts, e.requests, e.gpu_seconds) == (0, 2, 40, 2 * (2 * 100 + 40 * 1))


def test_installs_and_replays_are_learnt_from_rows_of_schema_version_2() -> None:
    rows = [
        # Commit a built once (30 s) and looked up once (0.1 s); commit b looked up only.
        {"group_id": "g1", "commit_sha": "a", "install_s": 30.0, "startup_s": 4.0, "replay_s": 10.0,
         "duration_s": 45.0, "n_samples": 10},
        {"group_id": "g1", "commit_sha": "a", "install_s": 30.0, "startup_s": 4.0, "replay_s": 10.0,
         "duration_s": 45.0, "n_samples": 10},
        {"group_id": "g2", "commit_sha": "a", "install_s": 0.1, "startup_s": 6.0, "replay_s": 4.0,
         "duration_s": 11.0, "n_samples": 8},
        {"group_id": "g3", "commit_sha": "b", "install_s": 2.0, "startup_s": None, "replay_s": None,
         "duration_s": 3.0, "n_samples": 0},
    ]
    m = learn(rows)
    # Installs: the slowest of each commit's (30, 2), median 16; starts and requests of served groups.
    assert (m.install_s, m.start_s, m.groups) == (16.0, 5.0, 2)
    assert m.request_s == pytest.approx((10 / 20 + 4 / 8) / 2)


def test_a_cells_gpu_seconds_are_its_share_of_its_groups_measured_time() -> None:
    # Two cells on one server: install 10 s + start 20 s + 2 s after the replay, split evenly; the
    # 60 s replay by samples (one cell stopped after 10 of the group's 40).
    kw = {"gpus": 2.0, "cells": 2, "group_samples": 40, "install_s": 10.0, "startup_s": 20.0, "replay_s": 60.0,
          "duration_s": 92.0}
    short = cost.cell_seconds(samples=10, **kw)  # type: ignore[arg-type]
    long = cost.cell_seconds(samples=30, **kw)  # type: ignore[arg-type]
    assert short == 2.0 * (16.0 + 15.0) and long == 2.0 * (16.0 + 45.0)
    assert short + long == 2.0 * 92.0
    # A group that never served: its whole time, split evenly.
    failed = cost.cell_seconds(gpus=1.0, cells=4, samples=0, group_samples=0, install_s=3.0, startup_s=None,
                               replay_s=None, duration_s=40.0)
    assert failed == 10.0
