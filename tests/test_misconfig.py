"""Misconfiguration caught before a GPU is spent, and what vLLM said it ignored after a run: env names
against the version's own list of VLLM_* variables (the installed environment's, else the pinned
one), request fields against vLLM's chat request schema. Real simulator servers, in-process."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import make_sim_repo, run_cli

from sweeper.drivers.preflight import check, pinned_env_names
from sweeper.drivers.sweep import make_plan, run_matrix
from sweeper.execute.choice import choose
from sweeper.reports import tables as report
from sweeper.store import frames as analysis
from sweeper.store.run_folder import RunDir
from sweeper.vllm import effective_config

MATRIX = """name: t
model: m
suite: {suite}
install: {{kind: sim, repo: {repo}}}
timeouts: {{startup_s: 30, request_s: 10}}
env: {{{env}: "1"}}
axes: {{commit: [{commits}], spec_method: [none], env.{axis}: ["0", "1"], request.{field}: [0.5]}}
"""


def write(tmp_path: Path, suite: Path, *, env: str = "VLLM_ENFORCE_STRICT_TOOL_CALLING",
          axis: str = "VLLM_USE_V2_MODEL_RUNNER", field: str = "temperature", commits: str = "old, new") -> Path:
    repo = tmp_path / "vllm"
    if not repo.exists():
        make_sim_repo(repo, [("old", {"version": "0.19.0"}), ("new", {"version": "0.28.0"})])
    path = tmp_path / "m.yaml"
    path.write_text(MATRIX.format(suite=suite, repo=repo, env=env, axis=axis, field=field, commits=commits))
    return path


def test_typos_in_env_names_and_request_fields_fail_the_dry_run_one_line_each(
        tmp_path: Path, tiny_suite: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, tiny_suite, axis="VLLM_USE_V2_MODEL_RUNER", field="temprature")
    argv = ["matrix", str(path), "--dry-run", "--runs-dir", str(tmp_path / "runs"), "--cache-dir", str(tmp_path / "c")]
    code, out, err = run_cli(argv, capsys)
    assert code == 1 and out == "" and "Traceback" not in err
    assert err.splitlines() == [
        (f"error: {path}: axes.env.VLLM_USE_V2_MODEL_RUNER: VLLM_USE_V2_MODEL_RUNER is not a variable vLLM reads "
        "(the pinned list (sweeper/vllm/env_names.txt), commit old); did you mean VLLM_USE_V2_MODEL_RUNNER? "
        "vLLM would warn and run its default"),
        (f"error: {path}: axes.request.temprature: temprature is not a field of vLLM's chat request (the pinned "
        "schema, sweeper/vllm/request_fields.py); did you mean temperature? vLLM would ignore it"),
    ]
    # The shipped demo passes.
    code, _, err = run_cli(["matrix", str(Path(__file__).parent.parent / "matrices" / "demo.yaml"), "--dry-run",
                            "--runs-dir", str(tmp_path / "runs"), "--cache-dir", str(tmp_path / "c")], capsys)
    assert code == 0 and "warning" not in err and "error" not in err


def test_a_name_missing_from_a_pinned_list_warns_and_strict_refuses_it(
        tmp_path: Path, tiny_suite: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, tiny_suite, env="VLLM_SOMETHING_NEWER", field="vllm_new_field")
    argv = ["matrix", str(path), "--dry-run", "--runs-dir", str(tmp_path / "runs"), "--cache-dir", str(tmp_path / "c")]
    code, out, err = run_cli(argv, capsys)
    assert code == 0 and "servers" in out
    assert [ln.split(":")[0] for ln in err.splitlines()] == ["warning", "warning"]
    assert "env.VLLM_SOMETHING_NEWER: VLLM_SOMETHING_NEWER is not a variable vLLM reads" in err
    code, _, err = run_cli([*argv, "--strict"], capsys)
    assert code == 1 and [ln.split(":")[0] for ln in err.splitlines()] == ["error", "error"]


def test_an_installed_environment_answers_with_its_own_list(tmp_path: Path, tiny_suite: Path) -> None:
    """After a run, the environment of each commit is asked (its vllmsim.envs, as vllm.envs in a real
    one): the simulated 0.19 reads no VLLM_ENFORCE_STRICT_TOOL_CALLING (it came in 0.24), so there it
    is an error, where the pinned list knows the name."""
    path = write(tmp_path, tiny_suite)
    plan = make_plan(path, tmp_path / "runs")
    assert check(plan.matrix, plan.shas, cache_dir=tmp_path / "cache") == []  # nothing installed: pinned list
    run_matrix(path, runs_dir=tmp_path / "runs", run_id="r", executor=choose("local"), cache_dir=tmp_path / "cache")
    (finding,) = check(plan.matrix, plan.shas, cache_dir=tmp_path / "cache")
    assert finding.error and finding.key == "env.VLLM_ENFORCE_STRICT_TOOL_CALLING"
    assert "the 0.19.0 environment" in finding.message and "environment's vllmsim.envs, commit old" in finding.message
    assert "VLLM_ENFORCE_STRICT_TOOL_CALLING" in pinned_env_names()


def test_what_vllm_ignored_is_requested_not_effective_with_its_name(tmp_path: Path, tiny_suite: Path) -> None:
    """An unknown env var (vLLM's start-up warning) and a request field outside the schema (logged at
    WARNING before 0.20, at DEBUG since: unseen at the default level) become requested != effective."""
    path = write(tmp_path, tiny_suite, env="VLLM_NOT_A_VARIABLE_AT_ALL", field="temprature")
    run = run_matrix(path, runs_dir=tmp_path / "runs", run_id="r", executor=choose("local"),
                     cache_dir=tmp_path / "cache").run
    cells = analysis.load_cells(RunDir(run.root))
    differs = {(r.commit, r.cell_id): set(r.effective_differs) for r in cells.itertuples()}
    assert len(differs) == 4
    for (commit, _), names in differs.items():
        expected = {"env.VLLM_NOT_A_VARIABLE_AT_ALL"} | ({"request.temprature"} if commit == "old" else set())
        assert names == expected, (commit, names)
    notes = [report._note(r) for r in cells.to_dict("records")]
    assert all("ignored by vLLM: env.VLLM_NOT_A_VARIABLE_AT_ALL" in n for n in notes)


def test_the_log_lines_vllm_prints_are_read() -> None:
    log = ("WARNING 12-02 10:00:00 [envs.py:1245] Unknown vLLM environment variable detected: VLLM_USE_V2_MODEL_RUNER\n"
           "(APIServer pid=7) WARNING 12-02 10:00:01 [protocol.py:51] The following fields were present in the "
           "request but ignored: {'temprature', 'top_kk'}\n")
    eff = effective_config(log)
    assert eff.unknown_env == ("VLLM_USE_V2_MODEL_RUNER",) and eff.ignored_fields == ("temprature", "top_kk")


def test_the_dry_run_prints_each_servers_vllm_serve_line(tmp_path: Path, tiny_suite: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, tiny_suite, env="HF_TOKEN")
    path.write_text(path.read_text().replace('{HF_TOKEN: "1"}', '{HF_TOKEN: "hf_abcdefghijklmnopqrstuvwx"}')
                    + "serve: {--max-model-len: 4096}\n")
    code, out, err = run_cli(["matrix", str(path), "--dry-run", "--runs-dir", str(tmp_path / "runs"),
                              "--cache-dir", str(tmp_path / "c")], capsys)
    assert code == 0, err
    lines = [ln.strip() for ln in out.splitlines() if ln.strip().startswith("$ ")]
    assert len(lines) == 4  # one per server: 2 commits x 2 runner values
    assert ("$ HF_TOKEN='<redacted>' VLLM_USE_V2_MODEL_RUNNER=0 vllm serve m --host 127.0.0.1 --port 8000 "
            "--max-model-len 4096") in lines
    assert "hf_abcdefghijklmnopqrstuvwx" not in out


def test_the_pinned_request_fields_are_the_simulators():
    """The product's pinned chat-request schema and the simulator's stand for the same vLLM
    `ChatCompletionRequest`; the two packages may not import each other, so this keeps them equal."""
    from sweeper.vllm.request_fields import CHAT_FIELDS as PINNED
    from vllmsim.request import CHAT_FIELDS as SIMULATED

    assert PINNED == SIMULATED, sorted(PINNED ^ SIMULATED)


def test_a_serve_flag_one_typo_from_vllms_fails_the_dry_run_and_others_are_left_to_help(
        tmp_path: Path, tiny_suite: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, tiny_suite)
    text = path.read_text()
    path.write_text(text.replace("env: {", "serve: {--max-modle-len: 4096, --no-enforce-eager: true, "
                                 "--a-flag-of-a-newer-release: 1}\nenv: {"))
    argv = ["matrix", str(path), "--dry-run", "--runs-dir", str(tmp_path / "runs"), "--cache-dir", str(tmp_path / "c")]
    code, out, err = run_cli(argv, capsys)
    assert code == 1 and out == "" and err.splitlines() == [
        (f"error: {path}: serve.--max-modle-len: --max-modle-len is not a flag of vllm serve (the pinned list, "
         "sweeper/vllm/serve_flags.txt); did you mean --max-model-len? vLLM would refuse to start")]
