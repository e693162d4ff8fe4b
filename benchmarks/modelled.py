"""An executor whose servers are modelled in this process: the simulator's bug declarations read
and applied here, without starting a server, so that hundreds of histories fit on two cores.

It is a `sweeper.execute.executor.Executor`: the sweep, its store, explain and zoom run exactly as they do
with servers; only what a group's server would answer is computed here. Per group (one server
start): the effective traits of its cell as the simulator derives them (the V2 model runner falls
back to V1 under ngram; every other trait as asked), each declared bug whose `when` the traits meet
bites each request with its rate, or with a rate drawn for this start from Beta(mean rate, sd
rate_sd), and a bitten request fails the checks the simulator's `fsm_whitespace` fails. A job with an
adaptive rule (`--adaptive`) sends its cells' requests as the runner does: in the interleaved
order, in rounds, each cell stopping once the product's rule settles it. The group's
server log is one start-up banner and one line per bitten request, so starts are counted from logs
in the same way as for the simulator's. `benchmarks/zoom.py --real` runs the simulator's own
servers instead (the local executor), to check this model against it.
"""

from __future__ import annotations

import functools
import random
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import yaml

from sweeper.execute.runner import GroupJob, GroupResult, Status, adaptive_rule
from sweeper.judge import sequential
from sweeper.spec.matrix import Cell, canonical
from sweeper.spec.suite import expand
from sweeper.store.run_folder import CELL_SCHEMA, SAMPLE_SCHEMA, table

FAILED = ["finish_reason", "json_schema", "no_whitespace_tail", "log_absent"]  # fsm_whitespace's checks
BANNER = "Starting vLLM API server"
TRAITS = {
    "spec_method": lambda v: str(v), "attention_backend": lambda v: str(v), "serve.--dtype": lambda v: str(v),
    "serve.--enforce-eager": lambda v: bool(v), "serve.--reasoning-parser": lambda v: str(v),
    "serve.--tool-call-parser": lambda v: str(v),
    "env.VLLM_ENFORCE_STRICT_TOOL_CALLING": lambda v: str(v) == "1",
}
NAMES = {"serve.--dtype": "dtype", "serve.--enforce-eager": "enforce_eager", "serve.--reasoning-parser":
         "reasoning_parser", "serve.--tool-call-parser": "tool_call_parser",
         "env.VLLM_ENFORCE_STRICT_TOOL_CALLING": "strict_tool_calling"}


@functools.cache
def _bugs(repo: str) -> list[dict[str, Any]]:
    """The bugs the repository's one commit declares (its sim.yaml, as the simulator reads it)."""
    bugs: list[dict[str, Any]] = (yaml.safe_load((Path(repo) / "sim.yaml").read_text()) or {}).get("bugs", [])
    return bugs


def traits(cell: Cell) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for axis, fn in TRAITS.items():
        if axis in cell.values:
            out[NAMES.get(axis, axis)] = fn(cell.values[axis])
    want_v2 = str(cell.values.get("env.VLLM_USE_V2_MODEL_RUNNER", "1")) == "1"
    out["model_runner"] = "V2" if want_v2 and out.get("spec_method", "none") != "ngram" else "V1"
    return out


def bites(when: dict[str, Any], got: dict[str, Any]) -> bool:
    return all(got.get(k) in (v if isinstance(v, list) else [v]) for k, v in when.items())


def start_rate(bug: dict[str, Any], rng: random.Random) -> float:
    rate, sd = float(bug.get("rate", 1.0)), float(bug.get("rate_sd", 0.0))
    if sd <= 0:
        return rate
    common = rate * (1 - rate) / (sd * sd) - 1
    return rng.betavariate(rate * common, (1 - rate) * common)


class Modelled:
    """Runs group jobs by modelling their servers (see the module docstring)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.starts = 0

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        return None

    def preflight(self, gpus_per_cell: float) -> None:
        return None

    def free_slots(self, gpus_per_cell: float) -> int:
        return 1

    def run(self, jobs: Sequence[GroupJob], *, on_start: Any = None,
            on_retry: Any = None) -> Iterator[tuple[GroupJob, GroupResult]]:
        for job in jobs:
            yield job, self._one(job)

    def _one(self, job: GroupJob) -> GroupResult:
        bugs = _bugs(str(job.spec.install.repo))
        head = job.group.head
        got = traits(head)
        self.starts += 1
        rates = [start_rate(b, self.rng) for b in bugs if bites(b.get("when", {}), got)]
        log = [f"INFO [api_server.py:1] {BANNER} (modelled) for {job.group.group_id}"]
        samples, cells = [], []
        for cell in job.group.cells:
            common = {
                "run_id": job.run_id, "group_id": job.group.group_id, "cell_id": cell.cell_id,
                "server_key": cell.server_key, "settings_key": cell.settings_key, "commit": cell.commit,
                "commit_sha": job.sha, "spec_method": cell.spec_method,
                "num_speculative_tokens": cell.num_speculative_tokens, "async_scheduling": cell.async_scheduling,
                "attention_backend": cell.attention_backend,
                "axes": [(k, canonical(v)) for k, v in cell.values.items()],
                "suite": job.suite.name, "suite_digest": job.suite.digest,
            }
            rows = []
            pairs = [(case.case_id, r) for case, r in expand(job.suite, job.spec.repeats)]
            rule = adaptive_rule(job)
            stop: sequential.Stop | None = None
            n_failed = 0
            if rule is not None:
                # As the runner replays an adaptive cell: the interleaved order (its seed is the cell's),
                # the rule asked after each round of `rule.round` samples.
                pairs = sequential.interleave(pairs, zlib.crc32(cell.cell_id.encode()))
            for i, (case_id, r) in enumerate(pairs):
                if rule is not None and i and i % rule.round == 0:
                    stop = rule.decide(n_failed, len(rows))
                    if stop is not None:
                        break
                failed = any(self.rng.random() < rate for rate in rates)
                n_failed += failed
                rid = f"{cell.cell_id}-{case_id}-{r}"
                if failed:
                    log.append(f"ERROR [backend_xgrammar.py:160] Failed to advance FSM for request {rid}")
                rows.append({**common, "case_id": case_id, "repeat": r, "request_id": rid, "passed": not failed,
                             "failed_checks": list(FAILED) if failed else [], "check_details": [],
                             "finish_reason": "length" if failed else "stop", "http_status": 200,
                             "latency_s": 0.5})
            if rule is not None and stop is None:
                stop = rule.decide(n_failed, len(rows)) or sequential.Stop.EXHAUSTED
            samples += rows
            differs = ["model_runner"] if str(cell.values.get("env.VLLM_USE_V2_MODEL_RUNNER")) == "1" \
                and got["model_runner"] == "V1" else []
            cells.append({**common, "status": Status.OK.value, "n_samples": len(rows), "n_failed": n_failed,
                          "failure_rate": n_failed / len(rows) if rows else None, "server_starts": 1,
                          "samples_planned": len(pairs), "stop_reason": stop.value if stop is not None else None,
                          "effective_model_runner": got["model_runner"],
                          "effective_spec_method": str(cell.values.get("spec_method", "none")),
                          "effective_differs": differs, "vllm_version": "0.33.0"})
        return GroupResult(job.group.group_id, table(samples, SAMPLE_SCHEMA), table(cells, CELL_SCHEMA),
                           statuses={c.cell_id: Status.OK for c in job.group.cells},
                           log=zlib.compress("\n".join(log).encode()))
