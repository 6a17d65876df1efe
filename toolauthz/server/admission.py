"""The decision pump's queue, fair across peers (server/pump.py).

One FIFO per peer (a client connection, as the service layer names it), taken in round
robin: a batch takes one job from each peer in turn, so a lone client's call is in the
next batch or the one after, however many calls a multiplexing client has queued on its
connection, and the multiplexing client still gets its turn in every round.

The same order gives each call's wait: with `q` plans of its own peer ahead of it, a new
call waits for at most `q + 1` plans of every other peer (fewer where a peer has fewer
queued). `position` is that count, which the pump multiplies by what a plan takes to
refuse, at once and undecided, a call that would wait longer than the queue's bound or
than its own deadline. A peer with a long queue of its own is so refused first; a peer
with nothing queued is admitted while the queue is within its bound for one round.

Under load, `unwanted` sorts out of a batch the jobs no one waits for any more, and
those that waited too long or past their deadline, before any work is spent on them.
`waiting_time` is the estimate the pump refuses by, and `batch_limit` keeps each batch
to a quarter of the bound, since a call's answer waits for its whole batch. Before the
bound refuses, `congestion` marks a growing share of the answers, telling the clients to
slow down (their throttle, client/throttle.py).

Not thread-safe: the pump holds its lock around every call of a FairQueue.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from collections.abc import Iterator
from typing import Generic, Protocol, TypeVar


class Queued(Protocol):
    @property
    def peer(self) -> str: ...

    @property
    def plans(self) -> int: ...

    @property
    def future(self) -> asyncio.Future: ...

    @property
    def queued_at(self) -> float: ...

    @property
    def deadline(self) -> float | None: ...


J = TypeVar("J", bound=Queued)


class FairQueue(Generic[J]):
    def __init__(self) -> None:
        # Peers with jobs queued, in the order of their next turn.
        self._peers: OrderedDict[str, deque[J]] = OrderedDict()
        self._plans: dict[str, int] = {}
        self._jobs = 0

    def __len__(self) -> int:
        return self._jobs

    def __iter__(self) -> Iterator[J]:
        for jobs in self._peers.values():
            yield from jobs

    def push(self, job: J) -> None:
        jobs = self._peers.get(job.peer)
        if jobs is None:
            jobs = self._peers[job.peer] = deque()  # a new peer's turn comes after those waiting
        jobs.append(job)
        self._plans[job.peer] = self._plans.get(job.peer, 0) + job.plans
        self._jobs += 1

    def position(self, peer: str, plans: int) -> int:
        """The plans taken, in round robin, up to the last of `plans` new plans of `peer`."""
        own = self._plans.get(peer, 0) + plans
        return own + sum(min(queued, own) for other, queued in self._plans.items() if other != peer)

    def take(self, max_plans: int) -> tuple[list[J], int]:
        """A batch in round robin, one job per peer in turn, of at most `max_plans` plans
        (but at least one job); and its plans."""
        batch: list[J] = []
        plans = 0
        while self._peers:
            peer, jobs = next(iter(self._peers.items()))
            if batch and plans + jobs[0].plans > max_plans:
                break
            job = jobs.popleft()
            batch.append(job)
            plans += job.plans
            self._jobs -= 1
            self._plans[peer] -= job.plans
            if jobs:
                self._peers.move_to_end(peer)
            else:
                del self._peers[peer], self._plans[peer]
        return batch, plans


def unwanted(batch: list[J], now: float, limit: float) -> tuple[list[J], list[J], list[J]]:
    """A batch taken under load, split: the jobs to decide; those whose caller has gone
    since they were queued (its future cancelled: the client's deadline passed or it went
    away), dropped; and those that waited over `limit` seconds or whose deadline has
    passed, refused. Read from the pump's thread, `done()` may be a moment stale: a job
    cancelled meanwhile is decided as before."""
    waiting: list[J] = []
    gone: list[J] = []
    late: list[J] = []
    for job in batch:  # one read of each future: a job lands in exactly one list
        if job.future.done():
            gone.append(job)
        elif now - job.queued_at > limit or (job.deadline is not None and job.deadline <= now):
            late.append(job)
        else:
            waiting.append(job)
    return waiting, gone, late


BATCH_SHARE = 4  # a batch takes at most 1/BATCH_SHARE of the queue's bound in time


def waiting_time(running_plans: int, running_for: float, position: int, plan_seconds: float) -> float:
    """A new call's wait, in seconds: what is left of the running batch, by what a plan
    takes and how long the batch has run, then the `position` plans up to its own.
    Counted whole until it ends, a long batch would refuse every call arriving while it
    runs, in a burst that throttling clients answer by sending too little (the pump then
    idles)."""
    left = max(0.0, running_plans * plan_seconds - running_for)
    return left + position * plan_seconds


def batch_limit(max_batch: int, bound: float | None, plan_seconds: float) -> int:
    """The most plans the next batch takes: `max_batch` (one transaction's) and, with the
    queue bounded in time, those of a quarter of the bound. Every call waits for its
    whole batch, the plans taken after it included: in batches of 256 plans (0.6 s each
    at 2.5x load), the accepted calls waited over twice the bound."""
    if not bound or not plan_seconds:  # unbounded (None or 0), or nothing measured yet
        return max_batch
    return max(1, min(max_batch, int(bound / BATCH_SHARE / plan_seconds)))


MARK_FROM = 0.1  # the share of the queue's bound from which answers are marked congested


def congestion(wait: float, bound: float | None) -> float:
    """The share of a connection's answers to mark congested, by the wait a new call of
    its own would have (`waiting_time`): none below a tenth of the bound, all at the
    bound, in proportion between. The clients' throttles slow down on the marks, so the
    queue settles between a tenth and half of its bound, long enough that the pump never
    waits for work and short enough that it seldom refuses: a refusal costs the sidecar
    what an empty RPC costs, a mark nothing (it rides on an answer)."""
    if not bound:
        return 0.0
    low = bound * MARK_FROM
    return min(1.0, max(0.0, (wait - low) / (bound - low)))
