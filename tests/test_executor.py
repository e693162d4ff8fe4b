"""The executor seam: the CLI chooses it by name; it refuses what it can never schedule and deals
GPUs to its slots. That the in-process executor gives Ray's results on the demo is checked in
tests/test_report_output.py, beside the demo's run on Ray through a terminal."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from conftest import make_sim_repo, run_cli

from sweeper.errors import ClusterError
from sweeper.execute.choice import choose
from sweeper.execute.inprocess import InProcess, deal_devices
from sweeper.install.matrix_loader import load_matrix
from sweeper.store import frames as analysis
from sweeper.store.run_folder import RunDir

ROOT = Path(__file__).resolve().parent.parent


def test_choose_names_the_executors_and_refuses_what_does_not_fit(tmp_path: Path) -> None:
    with pytest.raises(ClusterError, match="--executor 'slurm': expected one of ray, local"):
        choose("slurm")
    with pytest.raises(ClusterError, match="--address names a Ray cluster"):
        choose("local", address="127.0.0.1:6379")
    matrix = load_matrix(ROOT / "matrices" / "demo.yaml")
    local = choose("local")(matrix)
    assert isinstance(local, InProcess) and local.logical_gpus == 4  # the simulator's logical slots
    assert isinstance(choose("local", gpus=2)(matrix), InProcess)
    assert choose("local", gpus=2)(matrix).free_slots(1) == 2  # type: ignore[attr-defined]


def test_in_process_refuses_a_cell_larger_than_the_machine() -> None:
    with pytest.raises(ClusterError, match="each cell needs 8 GPUs but this machine has 4"):
        InProcess(logical_gpus=4).preflight(8)
    with pytest.raises(ClusterError, match="has 0"):
        InProcess(devices=[]).preflight(1)
    InProcess(devices=["0", "1"]).preflight(2)
    assert InProcess(devices=["0", "1", "2", "3"]).free_slots(2) == 2
    assert InProcess(logical_gpus=4, cpus=3).free_slots(0) == 3  # no GPU: one group per core


def test_physical_gpus_are_dealt_to_slots_without_overlap() -> None:
    assert deal_devices(["0", "1", "2", "3"], slots=2, per_cell=2) == ["0,1", "2,3"]
    assert deal_devices(["0", "1", "2"], slots=3, per_cell=1) == ["0", "1", "2"]
    # Logical slots (the simulator) and GPU-less cells get no CUDA_VISIBLE_DEVICES of their own.
    assert deal_devices(None, slots=2, per_cell=1) == [None, None]
    assert deal_devices(["0", "1"], slots=2, per_cell=0) == [None, None]


def test_sweep_matrix_runs_in_process_with_the_cli_flag(tmp_path: Path, tiny_suite: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    repo = tmp_path / "vllm"
    make_sim_repo(repo, [("good", {}), ("bad", {"bugs": [{"effect": "fsm_whitespace", "rate": 1.0}]})])
    matrix = tmp_path / "m.yaml"
    matrix.write_text(f"name: t\nmodel: m\nsuite: {tiny_suite}\ninstall: {{kind: sim, repo: {repo}}}\n"
                      "timeouts: {startup_s: 30, request_s: 10}\n"
                      "axes: {commit: [good, bad], spec_method: [none], request.temperature: [0, 0.5]}\n")
    argv = ["matrix", str(matrix), "--executor", "local", "--runs-dir", str(tmp_path / "runs"), "--run-id", "r",
            "--cache-dir", str(tmp_path / "cache")]
    code, _, err = run_cli([*argv, "--address", "127.0.0.1:1"], capsys)
    assert (code, err) == (1, "error: --address names a Ray cluster; it cannot be used with --executor local\n")
    code, out, err = run_cli(argv, capsys)
    assert code == 0, err
    assert "results: " in out
    cells = analysis.load_cells(RunDir(tmp_path / "runs" / "r"))
    assert len(cells) == 4 and set(cells.status) == {"ok"}
    assert cells.groupby("commit")["n_failed"].sum().to_dict() == {"good": 0, "bad": 12}


@pytest.mark.usefixtures("ray_cluster")
@pytest.mark.usefixtures("ray_cluster")
def test_a_clusters_slots_are_its_capacity_not_what_is_free_this_instant(tmp_path: Path) -> None:
    """A bisect plans its rounds on `slots`: right after the warm-up Ray still counts the warm-up
    tasks' GPUs as taken, and a round planned on the free ones ran one server at a time."""
    import ray

    from sweeper.execute.ray_executor import Cluster

    release = tmp_path / "release"

    @ray.remote(num_gpus=3, num_cpus=0)
    def hold(flag: str) -> None:
        while not os.path.exists(flag):
            time.sleep(0.05)

    held = hold.remote(str(release))
    try:
        with Cluster() as cluster:
            deadline = time.monotonic() + 30
            while cluster.free_slots(1) != 1 and time.monotonic() < deadline:
                time.sleep(0.1)
            assert cluster.free_slots(1) == 1  # three of the four are taken right now
            assert cluster.slots(1) == 4 and cluster.slots(2) == 2 and cluster.slots(0) >= 1
    finally:
        release.touch()
        ray.get(held)
