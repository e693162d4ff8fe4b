"""Run one server group anywhere: environment -> server -> replay -> checks -> Arrow tables.

This is the whole life of one server key. It knows no Ray and no CLI: `cluster` calls it inside a
Ray task, tests call it in-process. Every outcome is data: an install that fails, a server that
won't start, crashes or hangs becomes cell rows with a status and the log tail.
"""

from __future__ import annotations

import codecs
import os
import re
import secrets
import shutil
import socket
import statistics
import tempfile
import time
import traceback
import zlib
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import httpx
import pyarrow as pa

from sweeper import vllm
from sweeper.errors import InstallError, ServerError, SweepError
from sweeper.execute import bench_phase, fingerprint, rounds
from sweeper.execute import server_metrics as metrics
from sweeper.execute.replay import Abort, ReplayOutcome, Reply, Request, run_replay
from sweeper.execute.server import ServerProcess, free_port, new_api_key, tail
from sweeper.execute.transport import tls
from sweeper.install import cache as environments
from sweeper.install.portable import RepoSource, node_repo
from sweeper.install.supported import supported_flags
from sweeper.judge import sequential, verdict
from sweeper.judge.stats import wilson
from sweeper.plan import cost
from sweeper.spec.bench import BenchSpec
from sweeper.spec.checks import Exchange, run_checks
from sweeper.spec.matrix import Cell, MatrixFile, ServerGroup, canonical
from sweeper.spec.status import Status as Status  # noqa: PLC0414  (re-exported: `runner.Status` is the cell status)
from sweeper.spec.suite import Suite, expand
from sweeper.store import files
from sweeper.store.metrics_table import METRICS_SCHEMA
from sweeper.store.run_folder import CELL_SCHEMA, SAMPLE_SCHEMA, table
from sweeper.vllm import crash
from sweeper.vllm.logs import LogIndex

CONTENT_TAIL_CHARS = 200
# Env the sweeper's own process carries that must not leak into a server (Ray's, the driver's).
_DROP_ENV = re.compile(r"^(RAY_|PYTEST_|COV_)")
# A server whose engine died answers 500 and exits a moment later (vLLM's API server shuts down
# once its engine core is gone). A replay that ends on such an answer can finish inside that
# moment: before calling the server alive, give it this long to exit, when there is a reason to
# think it dies (the log shows engine death, or its /health no longer answers 200). A server that
# answers its health check after a transport error is alive: no wait.
CRASH_GRACE_S = 5.0
HEALTH_CHECK_S = 2.0
# An exception inside a group: its traceback's last characters go into the cells' log_tail.
TRACEBACK_TAIL_CHARS = 3000


@dataclass(frozen=True)
class GroupJob:
    """Everything a worker needs to run one server group (picklable, no open handles), and nothing
    that names the driver's disk: settings and suite by value, the repository as a `RepoSource`.
    Paths in `spec` (install.cache_dir, install.python) and `cache_dir` name the same place on
    every node (made absolute on the driver)."""

    run_id: str
    group: ServerGroup
    spec: MatrixFile
    suite: Suite
    sha: str | None = None
    repo: RepoSource | None = None
    cache_dir: str | None = None
    # Only these cells' requests are sent (bisect probes one cell of a group); None = all.
    cell_ids: tuple[str, ...] | None = None
    repeats_override: int | None = None
    # CUDA_VISIBLE_DEVICES for the server, when the executor deals GPUs itself (in-process); under
    # Ray the worker's own environment carries the devices Ray chose.
    devices: str | None = None


@dataclass
class GroupResult:
    group_id: str
    samples: pa.Table
    cells: pa.Table
    statuses: dict[str, Status] = field(default_factory=dict)
    # Seconds per phase (install, startup, replay, postprocess, total) on the worker: benchmarks
    # and the driver's schedule read them; they are not stored.
    timings: dict[str, float] = field(default_factory=dict)
    # The server's log, zlib-compressed: written by the driver (`log_text`), never on the worker.
    log: bytes = b""
    # The bench's metrics rows (`sweeper.store.metrics_table`): one per cell, server start and load point.
    metrics: pa.Table = field(default_factory=METRICS_SCHEMA.empty_table)

    @property
    def status(self) -> Status:
        return next(iter(self.statuses.values()), Status.OK)

    def log_text(self) -> str:
        return zlib.decompress(self.log).decode("utf-8", "replace") if self.log else ""


def pack_log(path: Path) -> bytes:
    try:
        return zlib.compress(path.read_bytes(), 6)
    except FileNotFoundError:
        return b""


def _ends_in_server_errors(replies: Sequence[Reply]) -> bool:
    last = replies[-1] if replies else None
    return last is not None and not last.timed_out and (last.http_status is None or last.http_status >= 500)


def _healthy(server: ServerProcess) -> bool:
    try:
        return httpx.get(f"{server.base_url}/health", timeout=HEALTH_CHECK_S,
                         verify=tls()).status_code == 200
    except httpx.HTTPError:
        return False


def _exits_within(server: ServerProcess, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while server.alive():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def server_env(extra: Mapping[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not _DROP_ENV.match(k)}
    env.update(extra)
    return env


def build_requests(job: GroupJob, cells: Sequence[Cell], *, interleaved: bool = False) -> list[tuple[Cell, Any, Request]]:
    """Every request of every cell: suite cases x repeats, with the cell's request fields merged.
    `interleaved`: each cell's in an order whose every prefix is a fair sample of its suite."""
    out = []
    model = str(job.spec.serve.get("--served-model-name") or job.spec.model)
    multiplier = job.repeats_override or job.spec.repeats
    salt = secrets.token_hex(3)  # unique ids across resumed or repeated runs of the same cell
    for cell in cells:
        short = cell.cell_id.rsplit("-", 1)[-1]
        pairs = list(expand(job.suite, multiplier))
        if interleaved:
            by_id = {case.case_id: case for case, _ in pairs}
            seed = zlib.crc32(cell.cell_id.encode())
            pairs = [(by_id[cid], r) for cid, r in sequential.interleave([(c.case_id, r) for c, r in pairs], seed)]
        for case, r in pairs:
            body = case.request(model)
            for key, value in cell.request.items():
                if value is None:
                    body.pop(key, None)
                else:
                    body[key] = value
            rid = f"sweep-{short}-{salt}-{re.sub(r'[^A-Za-z0-9_.-]', '', case.case_id)[:40]}-{r}"
            out.append((cell, case, Request(case.case_id, r, rid, body)))
    return out


def adaptive_rule(job: GroupJob) -> sequential.Rule | None:
    """The stopping rule of a job's cells; None: each replays its whole suite (a bisect's probes
    choose their own sample counts)."""
    spec = job.spec.adaptive_spec
    if spec is None or job.cell_ids is not None or job.repeats_override is not None:
        return None
    return sequential.Rule(threshold=spec.threshold, detect=spec.detect, confidence=spec.confidence,
                           width=spec.width, round=spec.round)


def _as_bytes(bundle: Any) -> bytes:
    return bytes(bundle)


def run_group(job: GroupJob, *, fetch: Callable[[Any], bytes] = _as_bytes) -> GroupResult:
    """Run one server group on this node; every outcome is rows. An exception inside becomes the
    group's cells with status `error`, the exception and its traceback tail. The server log is
    written in a temp folder of this node and comes back compressed in the result. `fetch` turns
    the job's shipped repository into bytes (the cluster layer passes its object store's get)."""
    cells = [c for c in job.group.cells if job.cell_ids is None or c.cell_id in job.cell_ids]
    t_start = time.monotonic()
    base = _CellBase(job, cells)
    remove_orphan_workdirs()
    workdir = Path(tempfile.mkdtemp(prefix=f"{WORKDIR_PREFIX}{os.getpid()}-"))
    log_path = workdir / "server.log"
    try:
        try:
            result = _run_group(job, base, cells, log_path, t_start, fetch)
        except Exception as exc:  # noqa: BLE001  (a failure is data: the group's cells say what raised)
            result = base.error(exc, tail(log_path), time.monotonic() - t_start)
        result.log = pack_log(log_path)
        return result
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


WORKDIR_PREFIX = "sweep-group-"


def remove_orphan_workdirs() -> list[Path]:
    """Remove the group folders of workers that are gone (a lost node, Ctrl-C, the end of a job)."""
    removed = files.orphan_dirs(Path(tempfile.gettempdir()) / WORKDIR_PREFIX)
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    return removed


def error_result(job: GroupJob, detail: str, trace: str = "") -> GroupResult:
    """`error` rows for a group whose run raised where no rows could be made (on the driver)."""
    cells = [c for c in job.group.cells if job.cell_ids is None or c.cell_id in job.cell_ids]
    return _CellBase(job, cells).failed(Status.ERROR, detail, trace[-TRACEBACK_TAIL_CHARS:], 0.0)


def _run_group(job: GroupJob, base: _CellBase, cells: Sequence[Cell], log_path: Path, t_start: float,  # noqa: PLR0915  (one group's life in order: install, start, replay, bench, rows)
               fetch: Callable[[Any], bytes]) -> GroupResult:
    group = job.group
    try:
        cache = environments.cache_dir_for(job.spec.install, Path("/"), Path(job.cache_dir) if job.cache_dir else None)
        # The job's paths are absolute (made so on the driver): no base folder is read here.
        installed = environments.prepare(job.spec.install, group.head.commit, job.sha, base_dir=Path("/"),
                                         cache_dir=cache, repo=node_repo(job.repo, cache, fetch))
    except (InstallError, SweepError) as exc:
        return base.failed(Status.INSTALL_FAILED, str(exc), "", time.monotonic() - t_start)
    words = frozenset(crash.setting_words(group.head.values, group.head.serve, group.head.env))
    timings = {"install": time.monotonic() - t_start}
    base.install_s = timings["install"]
    base.version = installed.version
    port, api_key = free_port(), new_api_key()
    try:
        # The installed version's own `--help` (cached per environment) says which flags it takes.
        launch = vllm.serve_command(group.head, model=job.spec.model, spec_config=job.spec.spec_config,
                                    installed=installed, host="127.0.0.1", port=port, api_key=api_key,
                                    supported=supported_flags(installed))
    except SweepError as exc:
        # A flag this version cannot take: reported before any server (or GPU time) is spent.
        return base.failed(Status.SERVER_FAILED, str(exc), "", time.monotonic() - t_start)
    # timeouts.group_s bounds the whole group on the worker: start-up and replay stop at its deadline
    # (an install under way is not cut short, but a group already past its time starts no server).
    startup_s, group_s = job.spec.timeouts.startup_s, job.spec.timeouts.group_s
    deadline = t_start + group_s if group_s is not None else None
    if deadline is not None:
        if time.monotonic() >= deadline:
            return base.failed(Status.TIMEOUT, f"timeouts.group_s ({group_s:g}s) ran out before the server "
                                               "started", "", time.monotonic() - t_start)
        startup_s = min(startup_s, deadline - time.monotonic())
    env = {**launch.env, **({"CUDA_VISIBLE_DEVICES": job.devices} if job.devices is not None else {})}
    server = ServerProcess(launch.argv, server_env(env), port=port, log_path=log_path,
                           startup_timeout_s=startup_s, api_key=api_key)
    base.server = server
    rule = adaptive_rule(job)
    bench = job.spec.bench
    requests = [] if bench is not None and bench.after == "instead" else \
        build_requests(job, cells, interleaved=rule is not None)
    benched = bench_phase.BenchRows()
    live = _LiveJudge(base, requests, log_path)
    try:
        # in_use: cache eviction on this node never removes an environment a server runs from.
        with environments.in_use(installed), server, live:
            base.startup_s = server.startup_s
            t_replay = time.monotonic()
            before = metrics.try_scrape(server.base_url, api_key)

            outcome = _replay(job, rule, server, api_key, requests=requests, live=live, deadline=deadline, base=base)
            alive_after = server.alive()
            log_text = server.log_text()
            answers = tuple(verdict.Answer(r.http_status, r.error, r.timed_out) for r in outcome.replies)
            # The engine can be dead while the API server still runs: the log or the answers say so.
            died = verdict.engine_dead(log_text, answers)
            if alive_after and (died or (_ends_in_server_errors(outcome.replies) and not _healthy(server))):
                alive_after = not _exits_within(server, CRASH_GRACE_S)
                log_text = server.log_text()
                died = died or crash.engine_died(log_text)
            after = metrics.try_scrape(server.base_url, api_key) if alive_after and not died else None
            timings["replay"] = base.replay_s = time.monotonic() - t_replay
            if bench is not None:  # the first start's load phase, after (or instead of) the replay
                benched = _bench_first_start(job, bench, base, cells, server, api_key,
                                             serving=alive_after and not died, deadline=deadline)
    except ServerError as exc:
        log = exc.log_tail or tail(log_path)
        out_of_time = deadline is not None and time.monotonic() >= deadline
        start_verdict = verdict.judge(verdict.StartFailed(
            Status(exc.status), str(exc), _read(log_path) or log, words,
            out_of_time_s=group_s if out_of_time else None))
        return base.failed(start_verdict.status, start_verdict.detail, log, time.monotonic() - t_start,
                           signature=start_verdict.signature)
    t_post = time.monotonic()
    timings["startup"] = base.startup_s or 0.0
    # alive_after is False too when the replay stopped because the process exited (Abort.CRASHED).
    cell_verdict = verdict.judge(verdict.Served(
        answers, outcome.unsent, hung=outcome.aborted == Abort.TIMEOUT,
        cut_off_s=group_s if outcome.aborted == Abort.DEADLINE else None,
        alive=alive_after, returncode=server.returncode, log_text=log_text))
    status, detail, signature = cell_verdict.status, cell_verdict.detail, cell_verdict.signature
    effective = vllm.effective_config(log_text)
    # One scrape before and one after the group's replay: the figures are the group's (see metrics).
    spec_figures, metrics_note = metrics.group_figures(before, after)
    detail = "; ".join(d for d in (detail, metrics_note) if d)
    finger = fingerprint.collect(installed)
    judged = live.finish(outcome.replies, log_text)
    samples: list[dict[str, Any]] = []
    by_cell: dict[str, list[dict[str, Any]]] = {c.cell_id: [] for c in cells}
    for cell, _, req in requests:
        sample = judged.get(req.request_id)
        if sample is None:
            continue  # never sent: the server was already gone
        samples.append(sample)
        by_cell[cell.cell_id].append(sample)
    duration = time.monotonic() - t_start
    base.group_samples = len(samples)
    log_tail = tail(log_path) if status != Status.OK else ""
    if bench is not None:  # the bench's other starts, a fresh server each (after the first start's verdict and log)
        with environments.in_use(installed):
            _bench_more_starts(job, bench, base, cells, server, api_key, deadline=deadline, benched=benched,
                               timings=timings)
        duration = time.monotonic() - t_start
    cell_rows = [base.cell_row(cell, by_cell[cell.cell_id], status=status, detail=detail, log_tail=log_tail,
                               duration=duration, effective=effective, spec=spec_figures, finger=finger,
                               signature=signature)
                 for cell in cells]
    result = GroupResult(group.group_id, table(samples, SAMPLE_SCHEMA), table(cell_rows, CELL_SCHEMA),
                         {c.cell_id: status for c in cells}, metrics=table(benched.rows, METRICS_SCHEMA))
    timings["postprocess"] = time.monotonic() - t_post
    timings["total"] = time.monotonic() - t_start
    result.timings = timings
    return result


def _metrics_common(base: _CellBase) -> Callable[[Cell], dict[str, Any]]:
    """A cell's identity columns of the metrics table: the ones its samples and cells rows have."""
    names = set(METRICS_SCHEMA.names)
    return lambda cell: {k: v for k, v in base.common(cell).items() if k in names}


def _bench_target(job: GroupJob, server: ServerProcess, api_key: str, deadline: float | None) -> bench_phase.Target:
    model = str(job.spec.serve.get("--served-model-name") or job.spec.model)
    return bench_phase.Target(server.base_url, api_key, model, job.suite, job.spec.timeouts.request_s,
                              server.alive, deadline, model_dir=job.spec.model, log_text=server.log_text)


def _bench_first_start(job: GroupJob, bench: BenchSpec, base: _CellBase, cells: Sequence[Cell],
                       server: ServerProcess, api_key: str, *, serving: bool,
                       deadline: float | None) -> bench_phase.BenchRows:
    """The load phase of the server start that replayed (or would have): its rows, or, when the server
    stopped serving during the replay, its rows marked invalid with that reason."""
    info = bench_phase.StartInfo(0, server.startup_s, _metrics_common(base), base.version)
    t = time.monotonic()
    if not serving:
        reason = "the server stopped serving during the correctness replay"
        return bench_phase.BenchRows(bench_phase.invalid_rows(bench, cells, info, reason))
    rows = bench_phase.run_start(bench, cells, info, _bench_target(job, server, api_key, deadline))
    return bench_phase.BenchRows(rows, seconds=time.monotonic() - t)


def _bench_more_starts(job: GroupJob, bench: BenchSpec, base: _CellBase, cells: Sequence[Cell],
                       server: ServerProcess, api_key: str, *, deadline: float | None,
                       benched: bench_phase.BenchRows, timings: dict[str, float]) -> None:
    """Starts 1 to `bench.starts − 1`: the server started again for each, benched, stopped; their rows
    join `benched`, their seconds `timings["bench"]`."""
    more = bench_phase.run_more_starts(bench, cells, server, _bench_target(job, server, api_key, deadline), first=1,
                                       common=_metrics_common(base), version=base.version)
    benched.rows += more.rows
    timings["bench"] = benched.seconds + more.seconds + more.start_s


def _replay(job: GroupJob, rule: sequential.Rule | None, server: ServerProcess, api_key: str, *,
            requests: Sequence[tuple[Cell, Any, Request]], live: _LiveJudge, deadline: float | None,
            base: _CellBase) -> ReplayOutcome:
    """The group's replay: every request at once, or (adaptive) in rounds until each cell is settled."""

    def send(batch: Sequence[Request]) -> ReplayOutcome:
        return run_replay(server.base_url, api_key, batch, concurrency=job.spec.concurrency,
                          timeout_s=job.spec.timeouts.request_s, alive=server.alive, on_reply=live.on_reply,
                          deadline=deadline, max_response_mb=job.spec.max_response_mb)

    if rule is None:
        return send([r for _, _, r in requests])
    queued: dict[str, list[Request]] = {}
    for cell, _, req in requests:
        queued.setdefault(cell.cell_id, []).append(req)
    adaptive = rounds.replay(queued, rule, send=send, failed=live.failed)
    base.stops = adaptive.stops
    return adaptive.outcome


class _LiveJudge:
    """Judges each reply as it arrives, with the server log as far as it is written, so the checks
    run while the replay waits on the server rather than after it. The complete log decides: a
    sample whose log lines changed since it was judged is judged again (checks are pure functions
    of the exchange, so an unchanged exchange keeps its verdicts). Either way each request's lines
    come from an index of the log by request id, never a scan of the whole log per sample."""

    def __init__(self, base: _CellBase, requests: Sequence[tuple[Cell, Any, Request]], log_path: Path) -> None:
        self.base = base
        self.meta = {req.request_id: (cell, case) for cell, case, req in requests}
        # `sweep-<cell>-<salt>-`: in every id this group sends, and in the ids vLLM derives from them.
        self.hints = tuple(dict.fromkeys("-".join(req.request_id.split("-")[:3]) + "-" for _, _, req in requests))
        self.index = LogIndex(hints=self.hints)
        self.reader = _LogReader(log_path)
        self.judged: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {}

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.reader.close()

    def on_reply(self, reply: Reply) -> None:
        try:
            self.index.add(self.reader.new_lines())
            rid = reply.request.request_id
            cell, case = self.meta[rid]
            lines = tuple(self.index.lines_for(rid, reply.response))
            self.judged[rid] = (self.base.sample(cell, case, reply, lines), lines)
        except Exception:  # noqa: BLE001  (never stop a replay: `finish` judges what is missing here)
            return

    def failed(self, replies: Sequence[Reply]) -> dict[str, bool]:
        """Whether each reply failed, on the log as far as it is written now (an adaptive round's end):
        a reply whose log lines grew since it was judged is judged again."""
        self.index.add(self.reader.new_lines())
        out = {}
        for reply in replies:
            rid = reply.request.request_id
            lines = tuple(self.index.lines_for(rid, reply.response))
            sample, seen = self.judged.get(rid, (None, None))
            if sample is None or seen != lines:
                cell, case = self.meta[rid]
                sample = self.base.sample(cell, case, reply, lines)
                self.judged[rid] = (sample, lines)
            out[rid] = not sample["passed"]
        return out

    def finish(self, replies: Sequence[Reply], log_text: str) -> dict[str, dict[str, Any]]:
        log_lines = log_text.splitlines()
        read = len(self.index.lines)
        if self.index.lines == log_lines[:read]:
            final = self.index  # what was read live is the log's beginning: index only the rest
            final.add(log_lines[read:])
        else:  # the log was split differently (a line separator other than \n): index it anew
            final = LogIndex(log_lines, hints=self.hints)
        out = {}
        for reply in replies:
            rid = reply.request.request_id
            lines = tuple(final.lines_for(rid, reply.response))
            sample, seen = self.judged.get(rid, (None, None))
            if sample is None or seen != lines:
                cell, case = self.meta[rid]
                sample = self.base.sample(cell, case, reply, lines)
            out[rid] = sample
        return out


class _LogReader:
    """The lines appended to a log file since the last call (split on newlines; the last, partial
    line waits for its end)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.file: Any = None
        self.partial = ""
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def new_lines(self) -> list[str]:
        if self.file is None:
            try:
                self.file = open(self.path, "rb")  # noqa: SIM115  (kept open across calls; closed by close())
            except FileNotFoundError:
                return []
        data = self.file.read()
        if not data:
            return []
        lines = (self.partial + self.decoder.decode(data)).split("\n")
        self.partial = lines.pop()
        return lines

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


class _CellBase:
    """Builds the rows of one group: the columns every sample and cell row of the group share."""

    def __init__(self, job: GroupJob, cells: Sequence[Cell]) -> None:
        self.job, self.cells = job, cells
        self.version: str | None = None
        self.startup_s: float | None = None
        self.server: ServerProcess | None = None  # the group's server, once made: it counts its starts
        self.install_s: float | None = None  # seconds getting the environment (a cached one: its lookup)
        self.replay_s: float | None = None
        self.group_samples = 0
        self.stops: dict[str, sequential.Stop] = {}  # an adaptive replay: why each cell stopped
        self.node = socket.gethostname()
        self._common: dict[str, dict[str, Any]] = {}

    def common(self, cell: Cell) -> dict[str, Any]:
        if cell.cell_id not in self._common:
            self._common[cell.cell_id] = self._make_common(cell)
        return self._common[cell.cell_id]

    def _make_common(self, cell: Cell) -> dict[str, Any]:
        return {
            "run_id": self.job.run_id, "group_id": self.job.group.group_id, "cell_id": cell.cell_id,
            "server_key": cell.server_key, "settings_key": cell.settings_key, "commit": cell.commit, "commit_sha": self.job.sha,
            "spec_method": cell.spec_method, "num_speculative_tokens": cell.num_speculative_tokens,
            "async_scheduling": cell.async_scheduling, "attention_backend": cell.attention_backend,
            "axes": [(k, canonical(v)) for k, v in cell.values.items()],
            "suite": self.job.suite.name, "suite_digest": self.job.suite.digest,
        }

    def sample(self, cell: Cell, case: Any, reply: Reply, rid_lines: tuple[str, ...]) -> dict[str, Any]:
        response = reply.response
        verdicts = run_checks(case.checks, Exchange(request=reply.request.body, http_status=reply.http_status,
                                                    response=response, error=reply.error, log_lines=rid_lines,
                                                    transport=reply.transport))
        failed = [v for v in verdicts if not v.passed]
        choice = ((response or {}).get("choices") or [{}])[0] if response else {}
        message = choice.get("message") or {}
        usage = (response or {}).get("usage") or {}
        details = usage.get("completion_tokens_details") or {}
        content = message.get("content") or ""
        if not content and message.get("tool_calls"):
            content = canonical([tc.get("function") for tc in message["tool_calls"]])
        return {
            **self.common(cell), "vllm_version": self.version, "case_id": case.case_id,
            "repeat": reply.request.repeat, "request_id": reply.request.request_id,
            "passed": not failed, "failed_checks": [v.check for v in failed],
            "check_details": [(v.check, v.detail) for v in failed],
            "finish_reason": choice.get("finish_reason"), "prompt_tokens": usage.get("prompt_tokens"),
            "completion_tokens": usage.get("completion_tokens"), "reasoning_tokens": details.get("reasoning_tokens"),
            "latency_s": reply.latency_s, "ttft_s": reply.ttft_s, "http_status": reply.http_status,
            "error": reply.error, "transport": reply.transport, "content_tail": content[-CONTENT_TAIL_CHARS:] if content else None,
            "log_errors": [ln[-500:] for ln in rid_lines if vllm.is_error_line(ln)],
            "started_at": reply.started_at,
        }

    def cell_row(self, cell: Cell, samples: Sequence[Mapping[str, Any]], *, status: Status, detail: str,  # noqa: PLR0913
                 log_tail: str, duration: float, effective: Any = None, spec: Mapping[str, Any] | None = None,
                 finger: Mapping[str, Any] | None = None, signature: str | None = None) -> dict[str, Any]:
        n = len(samples)
        n_failed = sum(not s["passed"] for s in samples)
        low, high = wilson(n_failed, n) if n else (None, None)
        failed_checks = Counter(c for s in samples for c in s["failed_checks"])
        differs: list[str] = []
        eff: dict[str, Any] = {}
        if effective is not None:
            differs = sorted(vllm.diff(cell, effective))
            eff = {
                "effective_model_runner": effective.model_runner,
                "effective_async_scheduling": effective.async_scheduling,
                "effective_attention_backend": effective.attention_backend,
                "effective_spec_method": effective.spec_method,
                "effective_num_speculative_tokens": effective.num_speculative_tokens,
                "effective_structured_backend": effective.structured_backend,
            }
        # Answers that came whole: a 200 that broke on the wire (a reset, a cap) has no latency to speak of.
        latencies = [s["latency_s"] for s in samples if s["http_status"] == 200 and not s.get("transport")]
        ttfts = [s["ttft_s"] for s in samples if s["ttft_s"] is not None]
        finger = finger or {}
        return {
            **self.common(cell), "status": status, "status_detail": detail, "failure_signature": signature,
            "log_tail": log_tail,
            "n_samples": n, "n_failed": n_failed, "failure_rate": (n_failed / n) if n else None,
            "ci_low": low, "ci_high": high, "failed_checks": list(failed_checks.items()),
            "startup_s": self.startup_s, "duration_s": duration,
            "gpu_seconds": self.gpu_seconds(n, duration),
            "install_s": self.install_s, "replay_s": self.replay_s,
            "samples_planned": self.planned(), "stop_reason": self.stop_reason(cell),
            "server_starts": self.server.starts if self.server else 0, "node": self.node,
            **eff, "effective_differs": differs,
            "vllm_version": self.version or finger.get("vllm_version"),
            "torch_version": finger.get("torch_version"), "cuda_version": finger.get("cuda_version"),
            "gpu_name": finger.get("gpu_name"), "gpu_driver": finger.get("gpu_driver"),
            "cpu_model": finger.get("cpu_model"), "hostname": finger.get("hostname") or self.node,
            **(spec or {}),
            "ttft_p50_s": statistics.median(ttfts) if ttfts else None,
            "latency_p50_s": statistics.median(latencies) if latencies else None,
        }

    def gpu_seconds(self, samples: int, duration: float) -> float:
        """This cell's share of what its group measured (`cost.cell_seconds`)."""
        return cost.cell_seconds(gpus=self.job.spec.gpus_per_cell, cells=len(self.cells), samples=samples,
                                 group_samples=self.group_samples, install_s=self.install_s,
                                 startup_s=self.startup_s, replay_s=self.replay_s, duration_s=duration)

    def planned(self) -> int:
        """The samples a whole replay of the suite sends per cell."""
        return sum(1 for _ in expand(self.job.suite, self.job.repeats_override or self.job.spec.repeats))

    def stop_reason(self, cell: Cell) -> str | None:
        stop = self.stops.get(cell.cell_id)
        return stop.value if stop is not None else None

    def error(self, exc: BaseException, log_tail: str, duration: float) -> GroupResult:
        trace = "".join(traceback.format_exception(exc))[-TRACEBACK_TAIL_CHARS:]
        detail = f"{type(exc).__name__}: {exc}".splitlines()[0][:500] if str(exc) else type(exc).__name__
        text = trace + (f"\n--- server log tail ---\n{log_tail}" if log_tail else "")
        return self.failed(Status.ERROR, detail, text, duration)

    def failed(self, status: Status, detail: str, log_tail: str, duration: float, *,
               signature: str | None = None) -> GroupResult:
        rows = [self.cell_row(c, [], status=status, detail=detail, log_tail=log_tail, duration=duration,
                              signature=signature)
                for c in self.cells]
        return GroupResult(self.job.group.group_id, table([], SAMPLE_SCHEMA), table(rows, CELL_SCHEMA),
                           {c.cell_id: status for c in self.cells})
