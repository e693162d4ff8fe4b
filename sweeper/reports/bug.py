"""`sweep report --issue`: Markdown for vLLM's bug template, from a stored run (reads results only).

The "Your current environment" block is built from the failing cell's fingerprint; "Describe the
bug" holds the minimal failing configuration (`sweeper.judge.explain`), the `vllm serve` command line and
environment of a failing cell, one failing request as a runnable `curl` command with what came back,
the passing neighbours, and the culprit commit when a bisect under the same runs folder found one.
A mode of an `expect:` bound (a serving metric outside it) has no failing request: its report shows the
metric in the failing cell, in the same settings at other commits (before → after) and in its
neighbours, each as a mean with its 95 % interval over server starts, and the `vllm bench serve`
command that reproduces the load point, built from the bench spec stored in the run's manifest.

Secrets never reach the text: the sweeper's own API key is never stored, settings whose names look
secret (`*TOKEN*`, `*KEY*`, `*SECRET*`, `*PASSWORD*`, ...) are shown as `<redacted>`, and their
values are scrubbed from everything else printed (log lines, content), as are well-known token shapes.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from sweeper.errors import SweepError
from sweeper.judge import metric_starts as ms
from sweeper.judge.expectations import is_expect_mode
from sweeper.judge.explain import TEST as TEST_NAME
from sweeper.judge.explain import (
    Classified,
    Explanation,
    ModeExplanation,
    Verdict,
    classify,
    display_axis,
    value_text,
)
from sweeper.judge.metric_names import METRICS
from sweeper.judge.stats import wilson
from sweeper.reports.expectations import expectation_evidence, with_expectations
from sweeper.spec.bench import INF, BenchSpec, JsonlDataset
from sweeper.store import frames as analysis
from sweeper.store.manifest import Manifest
from sweeper.store.metrics_table import read_metrics
from sweeper.store.run_folder import RunDir, open_run

REDACTED = "<redacted>"
_SECRET_NAME = re.compile(r"TOKEN|KEY|SECRET|PASSW|CREDENTIAL|AUTH|COOKIE|SESSION", re.IGNORECASE)
# Shapes of tokens worth scrubbing wherever they appear (Hugging Face, OpenAI-style, GitHub, bearer).
_TOKEN_SHAPES = re.compile(r"\b(hf_[A-Za-z0-9]{16,}|sk-[A-Za-z0-9_-]{16,}|gh[pousr]_[A-Za-z0-9]{20,}|"
                           r"github_pat_[A-Za-z0-9_]{20,})\b|(?<=Bearer )[A-Za-z0-9._~+/=-]{8,}")
_MAX_BODY_CHARS = 20_000


class Redactor:
    """Scrubs the secret values of a matrix (and token-shaped strings) out of any text."""

    def __init__(self, matrix: Mapping[str, Any] | None) -> None:
        self.values: set[str] = set()
        for name, value in _settings(matrix or {}):
            if is_secret(name) and value not in (None, True, False) and len(str(value)) >= 4:
                self.values.add(str(value))

    def text(self, text: str | None, replacement: str = REDACTED) -> str:
        out = str(text or "")
        for value in sorted(self.values, key=len, reverse=True):
            out = out.replace(value, replacement)
        return _TOKEN_SHAPES.sub(replacement, out)

    def env(self, env: Mapping[str, str]) -> dict[str, str]:
        return {k: REDACTED if is_secret(k) else self.text(v) for k, v in env.items()}

    def argv(self, argv: Sequence[str]) -> list[str]:
        out, hide = [], False
        for arg in argv:
            flag = arg.split("=", 1)[0]
            if hide:
                out.append(REDACTED)
            elif arg.startswith("--") and "=" in arg and is_secret(flag):
                out.append(f"{flag}={REDACTED}")
            else:
                out.append(self.text(arg))
            hide = arg.startswith("--") and "=" not in arg and is_secret(arg)
        return out


def is_secret(name: str) -> bool:
    # `--enable-auto-tool-choice` is no secret; names are matched on their words.
    return bool(_SECRET_NAME.search(name.lstrip("-").replace("-", "_")))


def _settings(matrix: Mapping[str, Any]) -> Iterable[tuple[str, Any]]:
    for section in ("env", "serve", "request"):
        for name, value in dict(matrix.get(section) or {}).items():
            yield str(name), value
    for axis, values in dict(matrix.get("axes") or {}).items():
        for value in values or []:
            yield str(axis).split(".", 1)[-1], value
    for rule in [*(matrix.get("include") or []), *(matrix.get("exclude") or [])]:
        for axis, value in dict(rule or {}).items():
            yield str(axis).split(".", 1)[-1], value


# ---- the pieces -----------------------------------------------------------------------------------

@dataclass
class _Context:
    run: RunDir
    manifest: Manifest
    samples: pd.DataFrame
    cells: pd.DataFrame
    classified: Classified
    explanation: Explanation
    redact: Redactor


def pick_mode(explanation: Explanation, wanted: str | None) -> ModeExplanation:
    """The mode `wanted` names (its exact name, a unique part of it, or its 1-based number), else the
    most frequent one with an explanation."""
    modes = list(explanation.modes)
    if not modes:
        raise SweepError("this run has no failures: nothing to report")
    if wanted is None:
        good = [m for m in modes if m.verdict in (Verdict.EXPLAINED, Verdict.NOT_IDENTIFIABLE)]
        return (good or modes)[0]
    if wanted.isdigit() and 1 <= int(wanted) <= len(modes):
        return modes[int(wanted) - 1]
    exact = [m for m in modes if m.mode == wanted]
    found = exact or [m for m in modes if wanted.lower() in m.mode.lower()]
    if len(found) != 1:
        names = "; ".join(f"{i}: {m.mode}" for i, m in enumerate(modes, 1))
        what = "matches no mode" if not found else f"matches {len(found)} modes"
        raise SweepError(f"--mode {wanted!r} {what}; modes: {names}")
    return found[0]


def environment_block(cell: Mapping[str, Any], sha: str | None, redact: Redactor) -> str:
    rows = [("vLLM version", cell.get("vllm_version")), ("vLLM commit", sha),
            ("PyTorch version", cell.get("torch_version")), ("CUDA used to build PyTorch", cell.get("cuda_version")),
            ("GPU models and configuration", cell.get("gpu_name")), ("Nvidia driver version", cell.get("gpu_driver")),
            ("CPU", cell.get("cpu_model"))]
    width = max(len(k) for k, _ in rows)
    body = "\n".join(f"{k:<{width}} : {redact.text(_text(v)) if _text(v) else 'unknown'}" for k, v in rows)
    return ("<details>\n<summary>The environment of the failing cell, as recorded by sweep</summary>\n\n"
            f"```text\n{body}\n```\n\n</details>")


def _text(value: Any) -> str:
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return ""
    return str(value)


def rebuild_cell(manifest: Manifest, axes: Mapping[str, Any]) -> Any:
    """The matrix cell with these axis values, rebuilt from the matrix stored in the manifest."""
    from sweeper.spec.matrix import MatrixFile, make_cell

    spec = MatrixFile.model_validate(manifest.matrix)
    order = list(manifest.matrix.get("axes") or axes)
    return spec, make_cell(spec, dict(axes), order)


def serve_command(manifest: Manifest, axes: Mapping[str, Any], redact: Redactor) -> tuple[list[str], dict[str, str]]:
    """`vllm serve` argv and the environment that started this cell's server (without the API key
    the sweeper adds for itself)."""
    from sweeper.vllm.flags import Command
    from sweeper.vllm.flags import serve_command as command

    spec, cell = rebuild_cell(manifest, axes)
    launch = command(cell, model=spec.model, spec_config=spec.spec_config, installed=Command(("vllm", "serve")),
                     host="127.0.0.1", port=8000, api_key=None)
    return redact.argv(launch.argv), redact.env(dict(launch.env))


def request_body(manifest: Manifest, axes: Mapping[str, Any], case_id: str, suite: Any) -> dict[str, Any] | None:
    """The request this case sent in this cell: the suite's body with the cell's request fields."""
    if suite is None:
        return None
    case = next((c for c in suite.cases if c.case_id == case_id), None)
    if case is None:
        return None
    spec, cell = rebuild_cell(manifest, axes)
    body: dict[str, Any] = case.request(str(spec.serve.get("--served-model-name") or spec.model))
    for key, value in cell.request.items():
        if value is None:
            body.pop(key, None)
        else:
            body[key] = value
    return body


def curl_command(body: Mapping[str, Any], base_url: str = "http://127.0.0.1:8000") -> str:
    data = json.dumps(body, separators=(",", ":"), ensure_ascii=False)
    return (f"curl -sS {base_url}/v1/chat/completions -H 'Content-Type: application/json' "
            f"-d {shlex.quote(data)}")


def shell_command(argv: Sequence[str], env: Mapping[str, str]) -> str:
    prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items()))
    return (prefix + " \\\n" if prefix else "") + shlex.join(argv)


def _axes_of(row: Mapping[str, Any]) -> dict[str, Any]:
    raw = row.get("axes")
    pairs = raw.items() if isinstance(raw, dict) else (raw if raw is not None else [])
    return {str(k): json.loads(v) for k, v in pairs}


def sample_run(run: RunDir, sample: Mapping[str, Any]) -> RunDir:
    """The run a sample was stored in: `run`, or a run beside it (a report over samples of several
    runs, as a triage's, reads each request's log where its server wrote it)."""
    other = _text(sample.get("run_id"))
    if not other or other == run.run_id:
        return run
    try:
        return open_run(run.runs_dir, other, create=False)
    except SweepError:
        return run


def log_lines(run: RunDir, group_id: str, cell_id: str, request_id: str, limit: int = 20) -> list[str]:
    """Lines of the cell's server log that name this request."""
    for name in (group_id, cell_id):
        text = run.read_log(name)
        if text is not None:
            return [line[-600:] for line in text.split("\n") if request_id in line][:limit]
    return []


def culprit(runs_dir: str | Path, mode: str, terms: Mapping[str, str]) -> list[dict[str, Any]]:
    """Regressions of `mode` that a bisect under `runs_dir` found, in a cell where the conjunction holds."""
    out = []
    for run in analysis.run_dirs(runs_dir):
        summary = run.read_json("bisect.json")
        if not isinstance(summary, dict):
            continue
        for cell in summary.get("cells", []):
            settings = {k: value_text(v) for k, v in (cell.get("cell") or {}).items()}
            if any(settings.get(axis) != value for axis, value in terms.items() if axis in settings):
                continue
            for change in cell.get("changes", []):
                if change.get("mode") == mode and change.get("direction") == "regression" \
                        and str(change.get("found")) in ("True", "true", "1"):
                    out.append({**change, "run_id": run.run_id, "cell_label": cell.get("label")})
    return out


# ---- the document ---------------------------------------------------------------------------------

def issue_markdown(run: RunDir, *, mode: str | None = None, runs_dir: str | Path | None = None,
                   samples: pd.DataFrame | None = None, cells: pd.DataFrame | None = None,
                   explanation: Explanation | None = None, sections: Sequence[str] | None = None,
                   footer: str | None = None) -> str:
    """The bug report for one failure mode of this run (see the module docstring).

    A caller that explained more than this run (a triage: the bad and the good commit together)
    passes those `samples`, `cells` and their `explanation`; `sections` (Markdown lines) then stand
    where the culprits found under `runs_dir` would, and `footer` replaces the last line."""
    from sweeper.reports import tables as report

    manifest = run.read_manifest()
    if samples is None or cells is None:
        # The run's `expect:` judgements are failures like the requests' (`sweeper.judge.expectations`).
        samples, cells = with_expectations(run, analysis.load_samples(run)), analysis.load_cells(run)
    suite = report.run_suite(run)
    if explanation is None:
        explanation = report.explain_run(run, samples, cells)
    ctx = _Context(run, manifest, samples.reset_index(drop=True), cells, classify(samples.reset_index(drop=True), suite),
                   explanation, Redactor(manifest.matrix))
    m = pick_mode(explanation, mode)
    cell_id, count = m.failing_cells[0]
    cell = cells[cells["cell_id"] == cell_id].iloc[0].to_dict() if (cells["cell_id"] == cell_id).any() else {}
    if m.unit == SERVER_STARTS:
        return _server_issue(ctx, m, cell_id, cell, runs_dir)
    if is_expect_mode(m.mode):
        return _expect_issue(ctx, m, cell_id, cell, runs_dir, sections, footer)
    hit = [(i, r) for i, r in enumerate(ctx.samples.to_dict("records"))
           if r["cell_id"] == cell_id and ctx.classified.mode[i] == m.mode]
    # A first repeat replays alone on a fresh server: the likeliest to fail again the same way.
    example = min((r for _, r in hit), key=lambda r: (r.get("repeat") or 0, str(r.get("request_id"))))
    axes = _axes_of(example)
    sha = _text(example.get("commit_sha")) or None
    r = ctx.redact
    out = ["### Your current environment", "", environment_block(cell, sha, r), "",
           "### 🐛 Describe the bug", ""]
    out += _minimal(m, r)
    argv, env = serve_command(manifest, axes, r)
    out += ["", "**A failing configuration** (cell `" + cell_id + "`, commit "
            + f"`{axes.get('commit', cell.get('commit'))}`" + (f" = `{sha}`" if sha else "") + "):", "",
            "```bash", r.text(shell_command(argv, env)), "```"]
    out += _request(ctx, m, example, axes, count, suite)
    out += _neighbours(ctx, m, axes)
    out += list(sections) if sections is not None else _culprits(runs_dir or run.runs_dir.shown, m)
    out += ["", footer or (f"<sub>Generated by `sweep report {run.run_id} --issue` from run `{run.run_id}` "
                           f"({explanation.n_samples:,} samples).</sub>")]
    return r.text("\n".join(out)) + "\n"


SERVER_STARTS = "server starts"  # the unit of a mode of servers that failed, crashed or hung (`sweeper.judge.explain`)
_LOG_TAIL_LINES = 30


def _server_issue(ctx: _Context, m: ModeExplanation, cell_id: str, cell: Mapping[str, Any],
                  runs_dir: str | Path | None) -> str:
    """The bug report for a mode of servers that did not come up, crashed or hung: no request
    answered, so the reason (`status_detail`), the command and the server log's tail are the evidence."""
    r = ctx.redact
    axes = _axes_of(cell)
    sha = _text(cell.get("commit_sha")) or None
    out = ["### Your current environment", "", environment_block(cell, sha, r), "", "### 🐛 Describe the bug", ""]
    out += _minimal(m, r)
    out += ["", "**Why** (the server's own words, per distinct reason):", ""]
    out += [f"- {r.text(detail)}" + (f" ({n} server starts)" if n > 1 else "") for detail, n in m.details]
    argv, env = serve_command(ctx.manifest, axes, r)
    out += ["", "**A failing configuration** (cell `" + cell_id + "`, commit "
            + f"`{axes.get('commit', cell.get('commit'))}`" + (f" = `{sha}`" if sha else "") + "):", "",
            "```bash", r.text(shell_command(argv, env)), "```"]
    log = ctx.run.read_log(str(cell.get("group_id"))) or ctx.run.read_log(cell_id) or _text(cell.get("log_tail"))
    if log:
        tail = [line[-600:] for line in log.strip().split("\n")][-_LOG_TAIL_LINES:]
        out += ["", "Tail of the server log:", "", "```text", *(r.text(x) for x in tail), "```"]
    out += _culprits(runs_dir or ctx.run.runs_dir.shown, m)
    out += ["", f"<sub>Generated by `sweep report {ctx.run.run_id} --issue` from run `{ctx.run.run_id}`.</sub>"]
    return r.text("\n".join(out)) + "\n"


def _minimal(m: ModeExplanation, r: Redactor) -> list[str]:
    lines = [f"**Failure mode:** `{m.mode}` — {m.failures:,} failing {m.unit}."]
    if m.verdict in (Verdict.EXPLAINED, Verdict.NOT_IDENTIFIABLE, Verdict.TOO_FEW):
        # The test named is the one explain ran (`TEST`), so that a maintainer can weigh the p-value.
        lines.append(f"**Minimal failing configuration:** `{m.conjunction}` → {m.inside} {m.unit} fail vs "
                     f"{m.outside} elsewhere on the same commits ({TEST_NAME} over {m.tried:,} conjunctions: "
                     f"adjusted p = {m.p_adjusted:.2g}).")
        for w in m.without:
            others = " ∧ ".join(str(t) for t in m.terms if t != w.term)
            lines.append(f"- `{others}` without `{w.term}`: {w.count} fail")
        if m.verdict is Verdict.NOT_IDENTIFIABLE:
            lines.append("- Not identifiable in this matrix: the same cells are also selected by "
                         + " or ".join("`" + " ∧ ".join(map(str, a)) + "`" for a in m.alternatives))
        lines.extend(f"- Effective configuration: {note}" for note in m.effective_notes)
    elif m.verdict is Verdict.EVERYWHERE:
        lines.append("**Minimal failing configuration:** every configuration tried fails alike on these commits.")
    else:
        lines.append("**Minimal failing configuration:** none found — no conjunction of at most three settings "
                     "separates the failing requests.")
    if m.commits:
        clean = ", ".join(f"`{c}` ({cnt})" for c, cnt in m.clean_commits if cnt.n)
        lines.append(f"Seen on {', '.join(f'`{c}`' for c in m.commits)}" + (f"; not on {clean}." if clean else "."))
    return [r.text(x) for x in lines]


def _request(ctx: _Context, m: ModeExplanation, example: Mapping[str, Any], axes: Mapping[str, Any],
             count: Any, suite: Any) -> list[str]:
    r = ctx.redact
    low, high = wilson(count.failed, count.n)
    out = ["", (f"**One failing request** (`{example.get('case_id')}`, request id `{example.get('request_id')}`); "
           f"in this cell {count} such requests failed ({100 * count.failed / count.n:.0f} %, "
           f"95 % CI {100 * low:.0f}–{100 * high:.0f} %):"), ""]
    repeat = int(example.get("repeat") or 0)
    if repeat:
        # No failing request of this mode was a first send: a lone curl to a fresh server may pass.
        out[-2] = out[-2].removesuffix(":") + (f"; it failed on repeat {repeat + 1} of its case, the earlier "
                                               f"ones on that server passing: send it {repeat + 1} times to a "
                                               "fresh server to see it:")
    body = request_body(ctx.manifest, axes, str(example.get("case_id")), suite)
    if body is None:
        out.append("(the run's suite file is not available: the request body cannot be shown)")
    else:
        text = r.text(curl_command(body))
        if len(text) > _MAX_BODY_CHARS:
            out.append(f"(the request body is {len(text):,} characters; see case `{example.get('case_id')}` of the suite)")
        else:
            out += ["```bash", text, "```"]
    checks = example.get("failed_checks")
    failed = ", ".join(f"`{c}`" for c in (list(checks) if checks is not None else []))
    details = example.get("check_details")
    detail_pairs = details.items() if isinstance(details, dict) else (details if details is not None else [])
    out += ["", (f"What came back: HTTP {example.get('http_status')}, finish_reason `{example.get('finish_reason')}`, "
            f"{_text(example.get('completion_tokens')) or '?'} completion tokens "
            f"({_text(example.get('reasoning_tokens')) or '?'} reasoning); failed checks: {failed}.")]
    for name, detail in detail_pairs:
        out.append(f"- `{name}`: {r.text(str(detail))}")
    tail = _text(example.get("content_tail"))
    out += ["", "Tail of the content:", "", "```text", r.text(repr(tail) if tail else "(no content)"), "```"]
    lines = log_lines(sample_run(ctx.run, example), str(example.get("group_id")), str(example.get("cell_id")),
                      str(example.get("request_id")))
    if lines:
        out += ["", "Server log lines of this request:", "", "```text", *(r.text(x) for x in lines), "```"]
    return out


def _neighbours(ctx: _Context, m: ModeExplanation, axes: Mapping[str, Any]) -> list[str]:
    """Cells on the same commit that differ from the failing cell in exactly one term's axis."""
    if not m.terms:
        return []
    want = {k: value_text(v) for k, v in axes.items()}
    rows = []
    hit = [x == m.mode for x in ctx.classified.mode]
    relevant = ctx.samples["case_id"].astype(str).isin(m.cases)
    frame = ctx.samples.assign(_hit=hit)[relevant]
    for cell_id, group in frame.groupby("cell_id", sort=False):
        other = {k: value_text(v) for k, v in _axes_of(group.iloc[0].to_dict()).items()}
        # An axis that does not apply on one side (no token count without spec decoding) is no difference.
        differs = [k for k in set(want) & set(other)
                   if want[k] is not None and other[k] is not None and want[k] != other[k]]
        term_axes = {t.axis for t in m.terms}
        if len(differs) == 1 and differs[0] in term_axes:
            axis = differs[0]
            rows.append((display_axis(axis), other.get(axis), int(group["_hit"].sum()), len(group), str(cell_id)))
    if not rows:
        return []
    out = ["", "**Passing neighbours** (the same cell with one setting of the configuration changed):", ""]
    ran_other: dict[str, list[str]] = {}
    if "effective_differs" in ctx.cells.columns:
        for c, d in zip(ctx.cells["cell_id"], ctx.cells["effective_differs"], strict=True):
            if d is not None and len(d):
                ran_other[str(c)] = [str(x) for x in d]
    for axis, value, k, n, cell_id in sorted(rows):
        verdict = "passes" if k == 0 else "also fails"
        ran = f"; ran another {', '.join(ran_other[cell_id])} than requested" if cell_id in ran_other else ""
        out.append(f"- `{axis}={value}`: {k}/{n} fail — {verdict} (cell `{cell_id}`{ran})")
    return out


def _culprits(runs_dir: str | Path, m: ModeExplanation) -> list[str]:
    terms = {t.axis: t.value for t in m.terms}
    found = culprit(runs_dir, m.mode, terms)
    if not found:
        return ["", "No bisect of this failure mode in these runs yet (`sweep bisect` finds the commit)."]
    out = ["", "**Culprit** (found by `sweep bisect`):"]
    seen = set()
    for ch in found:
        c = ch.get("commit") or {}
        if c.get("sha") in seen:
            continue
        seen.add(c.get("sha"))
        pr = f" (#{c['pr']})" if c.get("pr") and f"#{c['pr']}" not in str(c.get("subject")) else ""
        sure = float(ch.get("confidence", 0))
        before, after = ch.get("before") or {}, ch.get("after") or {}
        out.append(f"- `{c.get('short')}` {c.get('subject')}{pr}: {before.get('failures')}/{before.get('samples')} → "
                   f"{after.get('failures')}/{after.get('samples')} failing, confidence "
                   f"{'> 99.99' if sure > 0.9999 else f'{100 * sure:.2f}'} % (bisect run `{ch['run_id']}`, {ch.get('cell_label')})")
    return out


# ---- a serving metric outside an `expect:` bound -------------------------------------------------

BASE_URL = "http://127.0.0.1:8000"  # where `serve_command`'s server listens


def bench_command(bench: BenchSpec | None, row: Mapping[str, Any], model: str, served: str | None,
                  base_url: str = BASE_URL) -> list[str] | None:
    """`vllm bench serve` argv that sends the load point of this metrics row as the sweeper did: the
    dataset and its lengths, the prompt count, warm-ups, concurrency or rate, seed and temperature,
    from the `bench:` section stored in the manifest (the row's own columns where it has none). None
    for a suite dataset: `vllm bench serve` cannot send a suite's chat cases."""
    def pick(name: str, default: Any = None) -> Any:
        value = getattr(bench, name, None) if bench is not None else None
        if value is None:
            value = row.get(name)
        return default if value is None or (isinstance(value, float) and pd.isna(value)) else value

    dataset = bench.dataset_name if bench is not None else str(row.get("dataset") or "random")
    if dataset == "suite":
        return None
    endpoint = bench.effective_endpoint if bench is not None else str(row.get("endpoint") or "completions")
    argv = ["vllm", "bench", "serve", "--backend", "openai-chat" if endpoint == "chat" else "openai",
            "--base-url", base_url, "--endpoint", "/v1/chat/completions" if endpoint == "chat" else "/v1/completions",
            "--model", model]
    if served and served != model:
        argv += ["--served-model-name", served]
    output_len = (bench.effective_output_len if bench is not None else None) or pick("output_len")
    if dataset == "random":
        input_len = (bench.effective_input_len if bench is not None else None) or pick("input_len")
        argv += ["--dataset-name", "random", "--random-input-len", str(int(input_len)),
                 "--random-output-len", str(int(output_len))]
        if float(pick("range_ratio", 0.0)):
            argv += ["--random-range-ratio", f"{float(pick('range_ratio')):g}"]
    else:
        path = bench.dataset.jsonl if bench is not None and isinstance(bench.dataset, JsonlDataset) \
            else dataset.removeprefix("jsonl:")
        argv += ["--dataset-name", "custom", "--dataset-path", path]
        if output_len:
            argv += ["--custom-output-len", str(int(output_len))]
    argv += ["--num-prompts", str(int(pick("num_prompts", 100)))]
    if int(pick("num_warmups", 0)):
        argv += ["--num-warmups", str(int(pick("num_warmups")))]
    # The load point from the row itself: it names the one that broke the bound.
    concurrency, rate = row.get("concurrency"), ms.number(row.get("request_rate"))
    if concurrency is not None and not pd.isna(concurrency):
        argv += ["--max-concurrency", str(int(concurrency))]
    if rate is not None and rate != INF:
        argv += ["--request-rate", f"{rate:g}"]
        if float(pick("burstiness", 1.0)) != 1.0:
            argv += ["--burstiness", f"{float(pick('burstiness')):g}"]
    elif concurrency is None or pd.isna(concurrency):
        argv += ["--request-rate", "inf"]
    # Every request generates exactly output_len tokens, as the sweeper's did.
    argv += ["--ignore-eos", "--seed", str(int(pick("seed", 0))), "--temperature", f"{float(pick('temperature', 0.0)):g}"]
    return argv


def _bench_spec(manifest: Manifest) -> BenchSpec | None:
    """The `bench:` section as the run stored it (a JSONL dataset by its file name: its prompts are read
    by the loader, and `vllm bench serve` reads the file itself)."""
    raw = manifest.matrix.get("bench")
    if not isinstance(raw, Mapping):
        return None
    try:
        return BenchSpec.model_validate(dict(raw))
    except ValueError:
        return None


def _run_metrics(ctx: _Context) -> pd.DataFrame:
    """The metrics of every run these samples came from (a triage's: the good and the bad sweep)."""
    ids = [ctx.run.run_id, *(str(x) for x in ctx.samples.get("run_id", pd.Series(dtype=object)).dropna().unique())]
    frames = []
    for run_id in dict.fromkeys(ids):
        other = sample_run(ctx.run, {"run_id": run_id})
        if other.run_id == run_id:
            found = read_metrics(other)
            if not found.empty:
                frames.append(found)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _interval(rows: Sequence[Mapping[str, Any]], metric: str) -> str:
    fig = ms.figure(rows, metric, METRICS[metric].se).mean_interval()
    if fig is None:
        return "—"
    mean, low, high = fig
    if not (pd.notna(low) and abs(low) != float("inf")):
        return f"{mean:.4g} (one start)"
    return f"{mean:.4g} [{low:.4g}, {high:.4g}]"


def _expect_issue(ctx: _Context, m: ModeExplanation, cell_id: str, cell: Mapping[str, Any],  # noqa: PLR0917
                  runs_dir: str | Path | None, sections: Sequence[str] | None, footer: str | None) -> str:
    """The bug report for a serving metric outside an `expect:` bound (see the module docstring)."""
    r = ctx.redact
    metrics = _run_metrics(ctx)
    found = pd.concat([expectation_evidence(sample_run(ctx.run, {"run_id": i}), metrics[metrics["run_id"] == i])
                       for i in metrics["run_id"].astype(str).unique()], ignore_index=True) \
        if not metrics.empty else pd.DataFrame()
    mine = found[found["bound"].astype(str) == m.mode] if not found.empty else found
    if mine.empty:
        raise SweepError(f"mode {m.mode!r}: the run's metrics no longer hold the starts that broke it")
    metric = str(mine["metric"].iloc[0])
    broke = mine[(mine["cell_id"].astype(str) == cell_id) & ~mine["passed"].astype(bool)]
    # The load point where most starts of the failing cell broke the bound (the first such in the run's order).
    point = str(broke["load_point"].value_counts(sort=True).index[0]) if not broke.empty else str(mine["load_point"].iloc[0])
    rows = ms.records(metrics)
    here = [x for x in rows if str(x.get("cell_id")) == cell_id]
    axes = _axes_of(here[0] if here else cell)
    sha = _text(cell.get("commit_sha")) or (_text(here[0].get("commit_sha")) if here else "") or None
    out = ["### Your current environment", "", environment_block(cell, sha, r), "", "### 🐛 Describe the bug", ""]
    out += _minimal(m, r)
    direction = "higher" if METRICS[metric].higher_is_better else "lower"
    out += ["", (f"**The metric:** `{metric}` ({METRICS[metric].unit}, {direction} is better), bound "
            f"`{m.mode.removeprefix('expect:')}`; each figure is the mean over valid server starts with its "
            "95 % interval (t over starts), and how many starts broke the bound."), ""]
    out += _metric_table(m, mine, rows, metric, cell_id, axes)
    argv, env = serve_command(ctx.manifest, axes, r)
    commit = axes.get("commit", cell.get("commit"))
    out += ["", f"**The failing configuration** (cell `{cell_id}`, commit `{commit}`" + (f" = `{sha}`" if sha else "")
            + "), started as:", "", "```bash", r.text(shell_command(argv, env)), "```"]
    point_rows = [x for x in here if str(x.get("load_point") or "") == point]
    spec, _ = rebuild_cell(ctx.manifest, axes)
    served = str(spec.serve.get("--served-model-name") or "") or None
    bench = bench_command(_bench_spec(ctx.manifest), point_rows[0] if point_rows else {}, spec.model, served)
    if bench is None:
        out += ["", (f"The load point `{point}` sent the suite's cases (`dataset: suite`), which `vllm bench serve` "
                "cannot send; `sweep matrix` on this cell measures it again.")]
    else:
        out += ["", (f"**The load point** `{point}` as `vllm bench serve` sends it (the same dataset lengths, "
                "prompt count, warm-ups, concurrency or rate, seed and temperature; vLLM draws its own random "
                f"tokens), against that server; `{metric}` is in its result:"), "",
                "```bash", r.text(shlex.join(bench)), "```"]
    out += list(sections) if sections is not None else _culprits(runs_dir or ctx.run.runs_dir.shown, m)
    out += ["", footer or (f"<sub>Generated by `sweep report {ctx.run.run_id} --issue` from run `{ctx.run.run_id}` "
                           f"({len(metrics):,} server start × load point rows).</sub>")]
    return r.text("\n".join(out)) + "\n"


def _metric_table(m: ModeExplanation, judged: pd.DataFrame, rows: Sequence[Mapping[str, Any]], metric: str,
                  cell_id: str, axes: Mapping[str, Any]) -> list[str]:
    """Markdown rows: the failing cell (after), the same settings at the other commits (before), and the
    cells one term of the conjunction away at its commit (passing neighbours), per load point."""
    want = {k: value_text(v) for k, v in axes.items()}
    settings = {k: v for k, v in want.items() if k != "commit"}
    term_axes = {t.axis for t in m.terms}
    by_cell: dict[str, list[Mapping[str, Any]]] = {}
    for x in rows:
        by_cell.setdefault(str(x.get("cell_id")), []).append(x)
    outside: dict[tuple[str, str], tuple[int, int]] = {}
    for e in ms.records(judged):
        key = (str(e["cell_id"]), str(e.get("load_point") or ""))
        k, n = outside.get(key, (0, 0))
        outside[key] = (k + (not e["passed"]), n + 1)
    picked: list[tuple[str, str, str]] = [("after (failing)", cell_id, "")]
    for other, members in by_cell.items():
        if other == cell_id or not members:
            continue
        theirs = {k: value_text(v) for k, v in _axes_of(members[0]).items()}
        rest = {k: v for k, v in theirs.items() if k != "commit"}
        if rest == settings and theirs.get("commit") != want.get("commit"):
            picked.append(("before: same settings", other, ""))
            continue
        differs = [k for k in set(want) & set(theirs) if want[k] is not None and theirs[k] is not None
                   and want[k] != theirs[k]]
        if theirs.get("commit") == want.get("commit") and len(differs) == 1 and differs[0] in term_axes:
            picked.append(("neighbour", other, f"{display_axis(differs[0])}={theirs[differs[0]]}"))
    lines = ["| | configuration | commit | load point | " + f"`{metric}` [95 % CI] | starts outside the bound |",
             "|---|---|---|---|---|---|"]
    for what, other, change in picked:
        members = by_cell.get(other, [])
        if not members:
            continue
        label = change or ms.label(ms.settings(members[0]))
        commit = str(members[0].get("commit"))
        for point, at in ms.group(members, with_commit=True).items():
            k, n = outside.get((other, point[1]), (0, 0))
            lines.append(f"| {what} | `{label}` | `{commit}` | `{point[1] or '(one)'}` | {_interval(at, metric)} | "
                         + (f"{k} of {n}" if n else "—") + " |")
    return lines
