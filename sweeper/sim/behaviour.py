"""Which declared bugs bite: at start-up, and per request.

A rate-based bug bites a request when hash(server seed, version, bug id, canonical body, n) < rate,
n being how many times this server has seen that same body before. Repeats of one request thus fail
a fraction `rate` of the time, while a restarted server replays the same outcomes.
"""

from __future__ import annotations

import hashlib
import threading
from collections import Counter
from typing import Any

from sweeper.sim.config import EngineConfig
from sweeper.sim.tree import Bug, Effect, Tree


def matches(when: dict[str, tuple[Any, ...]], traits: dict[str, Any]) -> bool:
    for key, accepted in when.items():
        value = traits.get(key)
        if value not in accepted and not (value is None and "none" in accepted):
            return False
    return True


class Behaviour:
    def __init__(self, tree: Tree, cfg: EngineConfig) -> None:
        traits = cfg.traits()
        self.version = tree.version
        self.seed = cfg.seed
        # Bugs whose server-side conditions this configuration does not meet can never bite.
        self.bugs = tuple(b for b in tree.bugs if matches(b.server_when(), traits))
        self._lock = threading.Lock()
        self._seen: Counter[str] = Counter()
        self._crash_counts: Counter[str] = Counter()

    def start_refusal(self) -> Bug | None:
        return next((b for b in self.bugs if b.effect is Effect.REFUSE_START), None)

    def bites(self, canonical: str, traits: dict[str, Any]) -> tuple[int, list[Bug]]:
        """How often this body was seen before, and the bugs it triggers now (in declared order)."""
        with self._lock:
            n = self._seen[canonical]
            self._seen[canonical] += 1
            hit: list[Bug] = []
            for bug in self.bugs:
                if bug.effect is Effect.REFUSE_START or not matches(bug.request_when(), traits):
                    continue
                if not self._draw(bug, canonical, n):
                    continue
                if bug.effect is Effect.CRASH:
                    self._crash_counts[bug.id] += 1
                    if self._crash_counts[bug.id] <= bug.after_requests:
                        continue
                hit.append(bug)
            return n, hit

    def _draw(self, bug: Bug, canonical: str, n: int) -> bool:
        if bug.rate >= 1.0:
            return True
        key = f"{self.seed}\0{self.version}\0{bug.id}\0{canonical}\0{n}".encode()
        value = int.from_bytes(hashlib.sha256(key).digest()[:8], "big") / 2**64
        return value < bug.rate
