"""Which declared bugs bite: at start-up, and per request.

A rate-based bug bites a request when hash(server seed, bug id, canonical body, n) < rate, n being
how many times this server has seen that same body before. Repeats of one request thus fail a
fraction `rate` of the time, while a restarted server replays the same outcomes. The version is not
in the hash: like a real binary, a commit that does not touch a bug leaves the requests it hits
unchanged, so unrelated commits do not look like changes of its rate.

A bug with `rate_sd` > 0 varies between server starts instead: at each start its rate is drawn once
from Beta(mean `rate`, sd `rate_sd`) and holds for the life of the process, and the start's nonce
joins the per-request hash, so two starts differ both in rate and in which requests are hit. The
nonce is fresh random bytes per process, or `SWEEP_SIM_START_SEED` when set (a test can then
replay a start exactly). Each such bug logs its drawn rate once at start-up (`start_lines`), so
triage can tell a bad start from a bad commit:

    (EngineCore_DP0 pid=N) INFO 11-29 08:15:02 [behaviour.py:71] Simulated bug fsm-whitespace: rate 0.412345 for this server start, drawn from Beta(mean=0.33, sd=0.1)
"""

from __future__ import annotations

import functools
import hashlib
import os
import random
import threading
from collections import Counter
from typing import Any

from vllmsim.config import EngineConfig
from vllmsim.logs import Line
from vllmsim.tree import Bug, Effect, Tree, beta_parameters

START_SEED_ENV = "SWEEP_SIM_START_SEED"
START_LINE_WHERE = "behaviour.py:71"


@functools.cache
def start_nonce() -> str:
    """Identifies this server start; one per process, so every `Behaviour` in it draws alike."""
    return os.environ.get(START_SEED_ENV) or os.urandom(16).hex()


def matches(when: dict[str, tuple[Any, ...]], traits: dict[str, Any]) -> bool:
    for key, accepted in when.items():
        value = traits.get(key)
        if value not in accepted and not (value is None and "none" in accepted):
            return False
    return True


def _uniform(key: str) -> float:
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2**64


class Behaviour:
    def __init__(self, tree: Tree, cfg: EngineConfig, nonce: str | None = None) -> None:
        traits = cfg.traits()
        self.version = tree.version
        self.seed = cfg.seed
        self.nonce = start_nonce() if nonce is None else nonce
        # Bugs whose server-side conditions this configuration does not meet can never bite.
        self.bugs = tuple(b for b in tree.bugs if matches(b.server_when(), traits))
        # The rate each bug bites at during this start, by position (ids need not be unique).
        self.rates = tuple(self._start_rate(i, b) for i, b in enumerate(self.bugs))
        self._lock = threading.Lock()
        self._seen: Counter[str] = Counter()
        self._crash_counts: Counter[str] = Counter()

    def _start_rate(self, index: int, bug: Bug) -> float:
        if bug.rate_sd <= 0:
            return bug.rate
        alpha, beta = beta_parameters(bug.rate, bug.rate_sd)
        key = f"start\0{self.nonce}\0{self.seed}\0{self.version}\0{bug.id}\0{index}"
        rng = random.Random(int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big"))
        return rng.betavariate(alpha, beta)

    def start_lines(self) -> list[Line]:
        """One line per bug whose rate was drawn for this start."""
        return [
            Line(
                "INFO",
                START_LINE_WHERE,
                f"Simulated bug {bug.id}: rate {rate:.6f} for this server start, "
                f"drawn from Beta(mean={bug.rate:g}, sd={bug.rate_sd:g})",
                True,
            )
            for bug, rate in zip(self.bugs, self.rates, strict=True)
            if bug.rate_sd > 0
        ]

    def start_refusal(self) -> Bug | None:
        return next((b for b in self.bugs if b.effect is Effect.REFUSE_START), None)

    def bites(self, canonical: str, traits: dict[str, Any]) -> tuple[int, list[Bug]]:
        """How often this body was seen before, and the bugs it triggers now (in declared order)."""
        with self._lock:
            n = self._seen[canonical]
            self._seen[canonical] += 1
            hit: list[Bug] = []
            for bug, rate in zip(self.bugs, self.rates, strict=True):
                if bug.effect is Effect.REFUSE_START or not matches(bug.request_when(), traits):
                    continue
                if not self._draw(bug, rate, canonical, n):
                    continue
                if bug.effect is Effect.CRASH:
                    self._crash_counts[bug.id] += 1
                    if self._crash_counts[bug.id] <= bug.after_requests:
                        continue
                hit.append(bug)
            return n, hit

    def _draw(self, bug: Bug, rate: float, canonical: str, n: int) -> bool:
        if rate >= 1.0:
            return True
        key = f"{self.seed}\0{bug.id}\0{canonical}\0{n}"
        if bug.rate_sd > 0:
            # Fresh per-request outcomes per start, not the same ones cut at a new threshold.
            key = f"{self.nonce}\0{key}"
        return _uniform(key) < rate
