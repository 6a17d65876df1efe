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

Not thread-safe: the pump holds its lock around every call.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterator
from typing import Generic, Protocol, TypeVar


class Queued(Protocol):
    @property
    def peer(self) -> str: ...

    @property
    def plans(self) -> int: ...


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
