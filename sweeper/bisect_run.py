"""`sweep bisect`: drive the pure search (`sweeper.bisect`) with real probes on Ray.

A probe runs the bisected cell's settings at one commit, through the same runner as a sweep. Only
failures that match the bad endpoint's signature (the checks failing there) count as "bad"; an
install failure, a server that won't start, a crash or a hang makes the commit untestable (skipped).
Stored samples of the same commit + cell settings + suite, from any run under `runs/`, are used
instead of re-running, which is also how `--resume` spends no probe twice.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sweeper import __version__, analysis, gitrepo
from sweeper.bisect import BisectResult, EndpointIssue, ProbeRequest, Search, Verdict
from sweeper.cluster import Cluster
from sweeper.errors import BisectError
from sweeper.matrix import Cell, Matrix, ServerGroup, canonical, make_cell
from sweeper.runner import GroupJob, GroupResult
from sweeper.server import kill_leftovers
from sweeper.stats import wilson
from sweeper.store import PROBE_SCHEMA, RunDir, host_info, new_run_id, now_utc, open_run, table, write_atomic, \
    write_json_atomic
from sweeper.sweep import load_suites, repo_for, spec_with_repo, sweep_gpus
from sweeper.suite import Suite

OK = "ok"


@dataclass
class Evidence:
    """What is known about one commit: its samples' failed checks, or why it is untestable."""

    failed_checks: list[list[str]] = field(default_factory=list)
    skip: str | None = None
    gpu_seconds: float = 0.0

    def counts(self, signature: set[str]) -> tuple[int, int]:
        return sum(1 for f in self.failed_checks if signature & set(f)), len(self.failed_checks)


@dataclass
class BisectOutcome:
    run: RunDir
    result: BisectResult
    commits: list[gitrepo.CommitInfo]
    signature: list[str]
    cell: Cell
    gpu_seconds: float
    summary: dict[str, Any]


def select_cell(matrix: Matrix, where: Sequence[str]) -> Cell:
    """The one cell (settings apart from the commit) that `--where AXIS=VALUE` pairs pick."""
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

    def text(v: Any) -> str:
        return v if isinstance(v, str) else canonical(v)

    matches = [c for c in matrix.cells if all(k == "commit" or text(c.values.get(k)) == v for k, v in wanted.items())]
    by_settings: dict[str, Cell] = {}
    for c in matches:
        by_settings.setdefault(c.settings_key, c)
    if not by_settings:
        raise BisectError(f"no cell of {matrix.path} matches {' '.join(where) or '(nothing)'}")
    if len(by_settings) > 1:
        listed = "; ".join(" ".join(f"{k}={text(v)}" for k, v in c.values.items() if k != "commit")
                           for c in list(by_settings.values())[:8])
        raise BisectError(f"{len(by_settings)} cells match {' '.join(where) or '(nothing)'}; add --where to pick "
                          f"one of: {listed}")
    return next(iter(by_settings.values()))


def cell_at(matrix: Matrix, cell: Cell, sha: str) -> Cell:
    order = [n for n, _ in matrix.axes]
    return make_cell(matrix.spec, {**cell.values, "commit": sha}, order)


def stored_evidence(runs_dir: Path, settings_key: str, suite_digest: str, shas: set[str]) -> dict[str, Evidence]:
    """Samples and untestable verdicts already stored for these commits with these settings."""
    found: dict[str, Evidence] = defaultdict(Evidence)
    for run in analysis.run_dirs(runs_dir):
        cells = analysis.load_table(run, "cells")
        if cells.num_rows:
            mask = pc.and_(pc.equal(cells["settings_key"], settings_key), pc.equal(cells["suite_digest"], suite_digest))
            for row in cells.filter(mask).select(["commit_sha", "status", "status_detail"]).to_pylist():
                if row["commit_sha"] in shas and row["status"] != OK:
                    found[row["commit_sha"]].skip = f"{row['status']}: {row['status_detail']}"
        samples = analysis.load_table(run, "samples")
        if samples.num_rows:
            mask = pc.and_(pc.equal(samples["settings_key"], settings_key),
                           pc.equal(samples["suite_digest"], suite_digest))
            for row in samples.filter(mask).select(["commit_sha", "failed_checks"]).to_pylist():
                if row["commit_sha"] in shas:
                    found[row["commit_sha"]].failed_checks.append(row["failed_checks"] or [])
    return dict(found)


class Bisector:
    """One bisect run: the candidates, the evidence, the probes, and their records on disk."""

    def __init__(self, *, matrix: Matrix, cell: Cell, suite: Suite, repo: Path, run: RunDir, runs_dir: Path,
                 commits: list[str], confidence: float, max_samples: int | None, cache_dir: Path | None,
                 on_event: Callable[[str], None]) -> None:
        self.matrix, self.cell, self.suite, self.repo, self.run = matrix, cell, suite, repo, run
        self.runs_dir, self.commits, self.confidence, self.max_samples = runs_dir, commits, confidence, max_samples
        self.cache_dir = cache_dir
        self.say = on_event
        self.evidence = stored_evidence(runs_dir, cell.settings_key, suite.digest, set(commits))
        self.reused = {sha for sha, ev in self.evidence.items() if ev.failed_checks or ev.skip}
        self.signature: set[str] = set()
        self.probe_no = len(list((run.root / "probes").glob("*.parquet")))
        self.gpu_seconds = 0.0
        self.round = 0
        # (matching failures, samples) per commit as already told to the search.
        self.recorded: dict[str, tuple[int, int]] = {}

    # ---- probing ----------------------------------------------------------------------

    def _requests_per_repeat(self) -> int:
        return max(1, sum(c.repeat for c in self.suite.cases))

    def probe(self, cluster: Cluster, requests: Sequence[tuple[str, int]]) -> None:
        """Run (sha, samples wanted) probes at once, one server each; store and remember the results."""
        self.round += 1
        jobs = []
        for sha, wanted in requests:
            cell = cell_at(self.matrix, self.cell, sha)
            group = ServerGroup(cell.server_key, (cell,))
            self.probe_no += 1
            jobs.append(GroupJob(run_id=self.run.run_id, group=group, spec=spec_with_repo(self.matrix.spec, self.repo),
                                 suite=self.suite,
                                 matrix_dir=str(Path(self.matrix.path).parent), log_dir=str(self.run.logs), sha=sha,
                                 cache_dir=str(self.cache_dir) if self.cache_dir else None,
                                 repeats_override=max(1, math.ceil(wanted / self._requests_per_repeat()))))
        probe_ids = {job.group.group_id: self.probe_no - len(jobs) + i + 1 for i, job in enumerate(jobs)}
        for job, result in cluster.run(jobs):
            self._store(job, result, probe_ids[job.group.group_id])

    def _store(self, job: GroupJob, result: GroupResult, probe_no: int) -> None:
        sha = job.sha or job.group.head.commit
        name = f"p{probe_no:04d}-{sha[:10]}"
        # Samples and cells first, the probe row last: a probe row means its samples are on disk.
        self.run.write_group(name, result.samples, result.cells)
        ev = self.evidence.setdefault(sha, Evidence())
        status = result.cells.column("status")[0].as_py()
        gpu = float(pc.sum(result.cells["gpu_seconds"]).as_py() or 0.0)
        ev.gpu_seconds += gpu
        self.gpu_seconds += gpu
        failed = [f or [] for f in result.samples.column("failed_checks").to_pylist()]
        if status != OK:
            ev.skip = f"{status}: {result.cells.column('status_detail')[0].as_py()}"
        ev.failed_checks.extend(failed)
        k, n = ev.counts(self.signature) if self.signature else (sum(1 for f in failed if f), len(failed))
        row = {"run_id": self.run.run_id, "probe": probe_no, "round": self.round, "commit_sha": sha,
               "position": self.commits.index(sha), "status": status, "n_samples": len(failed),
               "n_matching_failures": k if self.signature else None, "n_failed": sum(1 for f in failed if f),
               "reused": False, "group_id": name, "gpu_seconds": gpu}
        write_atomic(table([row], PROBE_SCHEMA), self.run.root / "probes" / f"{name}.parquet")
        self.say(f"probe {probe_no} round {self.round}: {sha[:10]} (position {row['position']}) -> {status}, "
                 f"{row['n_failed']}/{len(failed)} failed")

    # ---- the search -------------------------------------------------------------------

    def ensure_endpoints(self, cluster: Cluster, parallel: int, first_batch: int) -> None:
        good, bad = self.commits[0], self.commits[-1]
        todo = [(sha, first_batch) for sha in (bad, good)
                if not (self.evidence.get(sha) and (self.evidence[sha].failed_checks or self.evidence[sha].skip))]
        for i in range(0, len(todo), parallel):
            self.probe(cluster, todo[i:i + parallel])
        bad_ev = self.evidence[bad]
        if bad_ev.skip and not bad_ev.failed_checks:
            raise BisectError(f"the bad endpoint {bad[:12]} is untestable ({bad_ev.skip}); pick another --bad")
        self.signature = {c for f in bad_ev.failed_checks for c in f}

    def search(self) -> Search:
        search = Search(self.commits, confidence=self.confidence, max_samples=self.max_samples)
        for sha in self.commits:
            ev = self.evidence.get(sha)
            if ev is None:
                continue
            if ev.skip and not ev.failed_checks:
                search.record_skip(sha, ev.skip)
            elif ev.failed_checks:
                k, n = ev.counts(self.signature)
                search.record(sha, k, n)
                self.recorded[sha] = (k, n)
        return search

    def drive(self, cluster: Cluster, parallel: int) -> BisectResult:
        search = self.search()
        while not search.done:
            reqs: list[ProbeRequest] = search.next_probes(parallel)
            if not reqs:
                break
            self.probe(cluster, [(r.commit, r.samples) for r in reqs])
            for r in reqs:
                ev = self.evidence[r.commit]
                # Only this probe's samples are new to the search: record the difference.
                k_all, n_all = ev.counts(self.signature)
                k_before, n_before = self.recorded.get(r.commit, (0, 0))
                if ev.skip and n_all == n_before:
                    search.record_skip(r.commit, ev.skip)
                else:
                    search.record(r.commit, k_all - k_before, n_all - n_before)
                    self.recorded[r.commit] = (k_all, n_all)
            self.save_state(search.result(), final=False)
        return search.result()

    def save_state(self, result: BisectResult, *, final: bool) -> dict[str, Any]:
        summary = describe(result, self.repo, self.signature, self.gpu_seconds, self.commits, self.cell)
        summary.update({"run_id": self.run.run_id, "final": final, "rounds": self.round, "probes": self.probe_no, "reused_commits": sorted(self.reused),
                        "updated": now_utc().isoformat()})
        write_json_atomic(summary, self.run.root / "bisect.json")
        return summary


def describe(result: BisectResult, repo: Path, signature: set[str], gpu_seconds: float, commits: Sequence[str],
             cell: Cell) -> dict[str, Any]:
    """The report of a bisect, as JSON-able data."""
    counts = {c.commit: c for c in result.counts}

    def side(sha: str | None) -> dict[str, Any] | None:
        if sha is None or sha not in counts:
            return None
        c = counts[sha]
        low, high = wilson(c.failures, c.samples) if c.samples else (None, None)
        return {"sha": sha, "failures": c.failures, "samples": c.samples, "ci_low": low, "ci_high": high,
                "skipped": c.skip_reason}

    culprit_info = None
    last_good = None
    if result.culprit:
        info = gitrepo.commit_info(repo, result.culprit)
        culprit_info = dataclasses.asdict(info)
        i = commits.index(result.candidates[0] if result.candidates else result.culprit)
        # The nearest tested commit before the culprit (and its skipped neighbours) is the good side.
        for j in range(i - 1, -1, -1):
            if commits[j] in counts and not counts[commits[j]].skip_reason:
                last_good = commits[j]
                break
    return {
        "verdict": result.kind.value, "culprit": culprit_info,
        "candidates": [dataclasses.asdict(gitrepo.commit_info(repo, c)) for c in result.candidates],
        "confidence": result.confidence,
        "endpoint_issue": result.endpoint_issue.value if result.endpoint_issue else None,
        "good_side": side(last_good), "bad_side": side(result.culprit),
        "good": side(commits[0]), "bad": side(commits[-1]),
        "p_good": result.p_good, "p_bad": result.p_bad, "signature": sorted(signature),
        "rounds": result.rounds, "probes": result.probes, "samples": result.samples,
        "gpu_seconds": gpu_seconds, "candidates_in_range": len(commits),
        "cell": {k: v for k, v in cell.values.items() if k != "commit"}, "sweeper": __version__,
    }


def run_bisect(*, matrix_path: Path, good: str, bad: str, where: Sequence[str] = (), repo: str | None = None,
               parallel: int | None = None, confidence: float = 0.99, max_samples: int | None = None,
               runs_dir: Path = Path("runs"), run_id: str | None = None, resume: str | None = None,
               address: str | None = None, gpus: float | None = None, cache_dir: Path | None = None,
               widen: bool = False, on_event: Callable[[str], None] = lambda _: None) -> BisectOutcome:
    from sweeper.matrix import load_matrix

    matrix = load_matrix(matrix_path)
    if repo:
        matrix = dataclasses.replace(matrix, spec=matrix.spec.model_copy(
            update={"install": matrix.spec.install.model_copy(update={"repo": repo})}))
    cell = select_cell(matrix, where)
    suite = load_suites(matrix.suite_paths)
    repo_path = repo_for(matrix, runs_dir)
    if repo_path is None:
        raise BisectError("bisect needs a repository of commits: set install.repo in the matrix or pass --repo")
    good_sha, bad_sha = gitrepo.resolve(repo_path, good), gitrepo.resolve(repo_path, bad)
    commits = gitrepo.first_parent_range(repo_path, good_sha, bad_sha)
    if resume:
        run = open_run(runs_dir, resume, create=False)
        old = run.read_manifest()
        if old.get("good_sha") != good_sha or old.get("bad_sha") != bad_sha or old.get("settings_key") != cell.settings_key:
            raise BisectError(f"run {resume} bisected another range or cell; start a new bisect instead")
    else:
        run = open_run(runs_dir, run_id or new_run_id(f"bisect-{matrix.name}"), create=True)
        run.write_manifest({"run_id": run.run_id, "kind": "bisect", "created": now_utc().isoformat(),
                            "sweeper": __version__, "host": host_info(), "matrix_path": str(matrix.path),
                            "matrix": matrix.raw, "good": good, "bad": bad, "good_sha": good_sha, "bad_sha": bad_sha,
                            "settings_key": cell.settings_key, "cell": {k: v for k, v in cell.values.items()},
                            "suite_digest": suite.digest, "repo": str(repo_path)})
    run.logs.mkdir(parents=True, exist_ok=True)
    on_event(f"bisecting {len(commits) - 1} commits {good_sha[:10]}..{bad_sha[:10]} in {repo_path}")
    gpus_per_cell = matrix.spec.gpus_per_cell
    try:
        with Cluster(address, logical_gpus=sweep_gpus(matrix, gpus)) as cluster:
            cluster.preflight(gpus_per_cell)
            k = parallel or max(1, cluster.free_gpu_slots(gpus_per_cell))
            on_event(f"{k} probes per round")
            while True:
                b = Bisector(matrix=matrix, cell=cell, suite=suite, repo=repo_path, run=run, runs_dir=runs_dir,
                             commits=commits, confidence=confidence, max_samples=max_samples, cache_dir=cache_dir,
                             on_event=on_event)
                first = max(8, len(suite.cases))
                b.ensure_endpoints(cluster, k, first)
                if not b.signature:
                    result = b.search().result()
                    result = dataclasses.replace(result, kind=Verdict.ENDPOINT_PROBLEM,
                                                 endpoint_issue=EndpointIssue.BAD_PASSES)
                else:
                    result = b.drive(cluster, k)
                if widen and result.endpoint_issue is EndpointIssue.GOOD_FAILS:
                    older = gitrepo.first_parent_ancestor(repo_path, bad_sha, 2 * (len(commits) - 1))
                    if older is None or older == commits[0]:
                        on_event("cannot widen further: reached the first commit")
                    else:
                        on_event(f"good endpoint {commits[0][:10]} fails; widening to {older[:10]}")
                        commits = gitrepo.first_parent_range(repo_path, older, bad_sha)
                        continue
                break
    finally:
        kill_leftovers(run.logs)
    summary = b.save_state(result, final=True)
    return BisectOutcome(run, result, [gitrepo.commit_info(repo_path, c) for c in result.candidates],
                         sorted(b.signature), cell, b.gpu_seconds, summary)


def probes_table(run: RunDir) -> pa.Table:
    return analysis.load_table(run, "probes")


def _side(label: str, side: dict[str, Any] | None) -> str:
    if not side:
        return f"  {label}: not measured"
    rate = side["failures"] / side["samples"] if side["samples"] else 0.0
    return (f"  {label}: {side['sha'][:12]}  {side['failures']}/{side['samples']} failing "
            f"({100 * rate:.1f}%, 95% CI {100 * (side['ci_low'] or 0):.1f}–{100 * (side['ci_high'] or 0):.1f}%)")


def _pct(p: float) -> str:
    return ">99.99%" if p > 0.9999 else f"{100 * p:.2f}%"


def render(summary: dict[str, Any]) -> str:
    """The final report as plain text."""
    lines = []
    verdict = summary["verdict"]
    culprit = summary.get("culprit")
    if verdict == Verdict.CULPRIT.value and culprit:
        pr = f"PR #{culprit['pr']}" if culprit.get("pr") else "no PR number"
        lines.append(f"culprit: {culprit['sha']}  {culprit['subject']}")
        lines.append(f"  {pr}, {culprit.get('date')}, confidence {_pct(summary['confidence'])}")
        if len(summary["candidates"]) > 1:
            lines.append("  could also be (untestable, right before it): "
                         + ", ".join(c["sha"][:12] for c in summary["candidates"][:-1]))
    elif verdict == Verdict.NO_CULPRIT.value:
        lines.append(f"no culprit: good and bad fail alike (confidence {_pct(summary['confidence'])})")
    elif verdict == Verdict.ENDPOINT_PROBLEM.value:
        issue = summary.get("endpoint_issue")
        what = {"good_fails": "the good endpoint fails too (try --widen or an older --good)",
                "bad_passes": "the bad endpoint does not fail with these settings"}.get(issue or "", issue)
        lines.append(f"no bisect: {what}")
    else:
        lines.append(f"undecided: best guess {culprit['sha'][:12] if culprit else '?'} with confidence "
                     f"{100 * summary['confidence']:.1f}% (raise --max-samples)")
    lines.append(_side("good side", summary.get("good_side") or summary.get("good")))
    lines.append(_side("bad side ", summary.get("bad_side") or summary.get("bad")))
    lines.append(f"  failure signature: {', '.join(summary['signature']) or '(none)'}")
    lines.append(f"  {summary['candidates_in_range'] - 1} commits after good, {summary['probes']} probes in {summary['rounds']} rounds, "
                 f"{summary['samples']} samples, {summary['gpu_seconds']:.0f} GPU-seconds")
    return "\n".join(lines)
