"""A sweep that runs a covering design: real simulator servers in this process (the local
executor), a git history made here, real Parquet. Only the design's cells run, the manifest records
the design and the cost profile, a resume keeps the same cells, and `--dry-run` shows the design's
modelled GPU time next to the full product's."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import make_sim_repo, run_cli

from sweeper.drivers.sweep import run_matrix
from sweeper.errors import StoreError
from sweeper.execute.choice import choose as executor
from sweeper.install.matrix_loader import load_matrix
from sweeper.install.registry import stated_profile
from sweeper.plan import cost
from sweeper.plan.design import choose
from sweeper.spec.matrix import DesignSpec
from sweeper.store import frames as analysis
from sweeper.store.manifest import SweepManifest

ROOT = Path(__file__).resolve().parent.parent


def matrix_file(tmp_path: Path, suite: Path, repo: Path, design: str = "") -> Path:
    path = tmp_path / "m.yaml"
    path.write_text(f"""name: t
model: Qwen/Qwen3-8B
suite: {suite}
install: {{kind: sim, repo: {repo}}}
concurrency: 2
timeouts: {{startup_s: 30, request_s: 10}}
{design}
axes:
  commit: [good, other]
  spec_method: [none, mtp]
  num_speculative_tokens: [2]
  env.A: ["0", "1"]
  env.B: ["0", "1"]
  request.temperature: [0, 0.5]
""")
    return path


def test_a_covering_run_runs_only_its_cells_and_resumes_them(tmp_path: Path, tiny_suite: Path) -> None:
    repo = tmp_path / "vllm"
    make_sim_repo(repo, [("good", {}), ("other", {})])
    path = matrix_file(tmp_path, tiny_suite, repo, "design: covering:2")
    runs, cache = tmp_path / "runs", tmp_path / "cache"
    matrix = load_matrix(path)
    design = choose(matrix, DesignSpec(kind="covering", strength=2))
    assert len(matrix.groups()) == 16 and len(design.groups) < 16
    outcome = run_matrix(path, runs_dir=runs, run_id="r", executor=executor("local"), cache_dir=cache)
    cells = analysis.load_cells(outcome.run)
    assert sorted(cells.cell_id) == sorted(c.cell_id for c in design.cells)
    assert len(cells) == 2 * len(design.groups) and set(cells.status) == {"ok"}
    manifest = outcome.run.read_manifest()
    assert isinstance(manifest, SweepManifest) and manifest.design is not None and manifest.cost is not None
    assert (manifest.design.kind, manifest.design.strength, manifest.design.servers) == \
        ("covering", 2, len(design.groups))
    assert (manifest.cells, manifest.groups) == (len(design.cells), len(design.groups))
    assert manifest.cost.source == "sim defaults"

    # One group's results lost: the resume runs that one again and nothing of the rest of the product.
    lost = design.groups[0].group_id
    for kind in ("cells", "samples"):
        (outcome.run.root / kind / f"{lost}.parquet").unlink()
    again = run_matrix(path, runs_dir=runs, resume="r", executor=executor("local"), cache_dir=cache)
    assert again.ran == [lost] and len(again.skipped) == len(design.groups) - 1
    assert sorted(analysis.load_cells(again.run).cell_id) == sorted(cells.cell_id)
    with pytest.raises(StoreError, match=r"^run r ran the design covering:2 \(seed 0\), not full; resume it "):
        run_matrix(path, runs_dir=runs, resume="r", executor=executor("local"), design_spec=DesignSpec(kind="full"))

    # The run's own rows teach the cost model its starts and requests.
    measured = cost.learn(analysis.load_cells(again.run).to_dict("records"))
    assert measured.groups == len(design.groups) and measured.start_s and measured.request_s
    profile = cost.profile_for(matrix.spec, stated_profile(matrix.spec), measured)
    assert profile.start_s == measured.start_s and profile.source.startswith("sim defaults, measured over")


def test_the_design_option_overrides_the_matrix_and_a_resume_keeps_the_recorded_one(
        tmp_path: Path, tiny_suite: Path) -> None:
    """`--design covering:1` on a matrix without a design key; resumed without the option, the run
    keeps its design (every group is done: nothing runs)."""
    repo = tmp_path / "vllm"
    make_sim_repo(repo, [("good", {}), ("other", {})])
    path = matrix_file(tmp_path, tiny_suite, repo)
    runs = tmp_path / "runs"
    one = DesignSpec(kind="covering", strength=1)
    first = run_matrix(path, runs_dir=runs, run_id="r", executor=executor("local"), design_spec=one,
                       cache_dir=tmp_path / "cache")
    chosen = choose(load_matrix(path), one)
    assert len(first.ran) == len(chosen.groups) == 2  # every axis has 2 values: 2 servers cover each
    again = run_matrix(path, runs_dir=runs, resume="r", executor=executor("local"), cache_dir=tmp_path / "cache")
    assert again.ran == [] and sorted(again.skipped) == sorted(first.ran)
    # A lost manifest: the copies in the results' footers know the design, and the rebuilt one keeps it.
    (runs / "r" / "manifest.json").unlink()
    rebuilt = run_matrix(path, runs_dir=runs, resume="r", executor=executor("local"), cache_dir=tmp_path / "cache")
    assert rebuilt.ran == [] and len(rebuilt.notes) == 1
    manifest = rebuilt.run.read_manifest()
    assert isinstance(manifest, SweepManifest) and manifest.design is not None
    assert (manifest.design.strength, manifest.design.digest) == (1, chosen.digest)


def test_dry_run_prints_the_designs_servers_and_gpu_hours_next_to_the_products(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(["matrix", str(ROOT / "matrices" / "thor.yaml"), "--design", "covering:3", "--dry-run",
                              "--runs-dir", str(tmp_path / "runs")], capsys)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == "thor: 26 cells on 26 servers, 101 requests per cell (suite thinking-budget+structured-output)"
    assert sum(line.startswith("server ") for line in lines) == 26
    assert any(line.startswith("then zoom: on; phases of servers that tell each failure mode's candidates apart")
               for line in lines)
    assert lines[-4:] == [
        "design: covering, strength 3 over 6 server axes (seed 0): 26 of 96 servers, 26 of 96 cells",
        "modelled GPU time (wheels defaults: install 90 s, start 240 s, request 2 s; 1 GPU per server):",
        "  this design   26 starts, 3 installs, 2,626 requests: 3.27 GPU-hours",
        "  full product  96 starts, 3 installs, 9,696 requests: 11.86 GPU-hours",
    ]
    code, out, err = run_cli(["matrix", str(ROOT / "matrices" / "thor.yaml"), "--dry-run",
                              "--runs-dir", str(tmp_path / "runs")], capsys)
    assert code == 0 and out.splitlines()[-2:] == [
        "modelled GPU time (wheels defaults: install 90 s, start 240 s, request 2 s; 1 GPU per server):",
        "  this design  96 starts, 3 installs, 9,696 requests: 11.86 GPU-hours"]
    assert "design: full product, 96 servers, 96 cells" in out
    code, out, err = run_cli(["matrix", str(ROOT / "matrices" / "thor.yaml"), "--design", "pairs", "--dry-run"], capsys)
    expected = "error: --design: expected full, covering or covering:T (T from 1 to 6), got 'pairs'\n"
    assert (code, out, err) == (1, "", expected)
