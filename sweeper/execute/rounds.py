"""An adaptive replay: a server group's cells replay their suites in rounds, each cell stopping once
its verdict is settled (`sweeper.judge.sequential`).

Each cell's requests come in the interleaved order (`sequential.interleave`), so whatever prefix a
cell sends is a fair sample of its suite; a round sends the next `rule.round` requests of every cell
still going, the cells taken in turn, and the rule is asked about each cell after the round (never
inside one, so what decides is the samples in request order, not which answer came first). Cells of
one group share one server start: each is settled on its own samples, the server runs until the last
of them is, and a server that stops answering ends every cell still going.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from sweeper.execute.replay import ReplayOutcome, Reply, Request
from sweeper.judge.sequential import Rule, Stop


@dataclass(frozen=True)
class AdaptiveOutcome:
    outcome: ReplayOutcome  # every round's replies, as one replay
    stops: dict[str, Stop]  # cell -> why it stopped
    rounds: int


def replay(by_cell: Mapping[str, Sequence[Request]], rule: Rule, *,
           send: Callable[[Sequence[Request]], ReplayOutcome],
           failed: Callable[[Sequence[Reply]], Mapping[str, bool]]) -> AdaptiveOutcome:
    """Rounds until every cell is settled or has sent its whole suite. `send` replays some requests
    on the group's server; `failed` judges replies (request id -> failed)."""
    sent = dict.fromkeys(by_cell, 0)
    counts = {cell: [0, 0] for cell in by_cell}  # cell -> [samples, failures]
    cell_of = {req.request_id: cell for cell, reqs in by_cell.items() for req in reqs}
    stops: dict[str, Stop] = {}
    replies: list[Reply] = []
    unsent, rounds = 0, 0
    aborted = None
    while True:
        going = [c for c in by_cell if c not in stops]
        if not going:
            break
        batch: list[Request] = []
        slices = {c: list(by_cell[c][sent[c]:sent[c] + rule.round]) for c in going}
        for i in range(rule.round):
            batch.extend(reqs[i] for reqs in slices.values() if i < len(reqs))
        for c in going:
            sent[c] += len(slices[c])
        rounds += 1
        outcome = send(batch)
        replies.extend(outcome.replies)
        verdicts = failed(outcome.replies)
        for reply in outcome.replies:
            cell = cell_of[reply.request.request_id]
            counts[cell][0] += 1
            counts[cell][1] += bool(verdicts.get(reply.request.request_id, False))
        if outcome.aborted is not None:
            aborted = outcome.aborted
            unsent += outcome.unsent + sum(len(by_cell[c]) - sent[c] for c in going)
            stops.update(dict.fromkeys(going, Stop.SERVER))
            break
        for c in going:
            n, k = counts[c]
            stop = rule.decide(k, n)
            if stop is not None:
                stops[c] = stop
            elif sent[c] >= len(by_cell[c]):
                stops[c] = Stop.EXHAUSTED
    return AdaptiveOutcome(ReplayOutcome(tuple(replies), unsent, aborted), stops, rounds)
