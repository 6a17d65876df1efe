"""The decision pump: one thread that makes this process's decisions, in batches.

With a thread per request, 32 calls in flight would be 32 threads taking turns on the
interpreter lock: each woken for its group commit, each handing the lock on, 31-32
context switches per call against 13 with this pump (docs/performance.md).
Here the event loop only moves messages. It queues each request and awaits its answer;
the pump takes everything queued, plans it (validation, the decision's inputs), runs
all the plans' ledger writes together (`Authorizer.run_many`: Cedar and the token
signature before the write lock, one transaction, one fsync after the lock), and hands
the answers back to the loop in one wake-up per batch.

The pump knows no gRPC: a job is a function that returns a Plan, and its answer is
whatever the plan's `finish` returns, or the exception it raised (raised again in the
awaiting coroutine). A group job (`answer_group`, AuthorizeBatch) returns many plans,
which always run in the same `run_many`, so their writes share one transaction: a batch
takes jobs up to `max_batch` plans (a group counts its members), the most the ledger's
group commit puts in one transaction.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from sidecar.authorizer import Authorizer, Plan
from sidecar.errors import StoreUnavailable
from sidecar.store.group_commit import MAX_BATCH

log = logging.getLogger("toolauthz.pump")


class _Job:
    __slots__ = ("make_plan", "future", "loop", "group", "plans")

    def __init__(self, make_plan: Callable[[], Any], future: asyncio.Future, loop: asyncio.AbstractEventLoop,
                 group: bool = False, plans: int = 1):
        self.make_plan, self.future, self.loop, self.group, self.plans = make_plan, future, loop, group, plans


class DecisionPump:
    def __init__(self, authorizer: Authorizer, *, max_batch: int = MAX_BATCH):
        self._authorizer = authorizer
        self._max_batch = max_batch
        self._jobs: deque[_Job] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._batches = 0
        self._answered = 0
        self.after_batch: Callable[[], None] | None = None  # the worker's status board (worker_status.py)
        self._thread = threading.Thread(target=self._run, name="decision-pump", daemon=True)
        self._thread.start()

    async def answer(self, make_plan: Callable[[], Plan]) -> Any:
        """`make_plan()` is called on the pump's thread; returns the plan's answer."""
        loop = asyncio.get_running_loop()
        return await self._queued(_Job(make_plan, loop.create_future(), loop))

    async def answer_group(self, make_plans: Callable[[], Sequence[Plan | Exception]], members: int) -> list[Any]:
        """`make_plans()` is called on the pump's thread and gives each of the `members`
        plans, or the exception that member failed with; returns each member's answer or
        exception, in order. The members' plans run in one `run_many`: one transaction
        while `members` is at most `max_batch`. An exception `make_plans` raises is raised
        here, for the whole group."""
        loop = asyncio.get_running_loop()
        answers: list[Any] = await self._queued(_Job(make_plans, loop.create_future(), loop, True, members))
        return answers

    async def _queued(self, job: _Job) -> Any:
        with self._cond:
            if self._closed:
                raise StoreUnavailable("the decision pump is closed")
            self._jobs.append(job)
            self._cond.notify()
        return await job.future

    @property
    def batches(self) -> int:
        """Batches run so far."""
        return self._batches

    @property
    def answered(self) -> int:
        """Requests answered so far (a failed one included)."""
        return self._answered

    @property
    def waiting(self) -> int:
        """Requests queued and not yet taken into a batch."""
        with self._cond:
            return len(self._jobs)

    def close(self) -> None:
        """Refuse new jobs; return once every queued job is answered."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._jobs or self._closed)
                if not self._jobs:
                    return  # closed and drained
                batch = [self._jobs.popleft()]
                plans = batch[0].plans  # then as many jobs as fit in one transaction with it
                while self._jobs and plans + self._jobs[0].plans <= self._max_batch:
                    plans += self._jobs[0].plans
                    batch.append(self._jobs.popleft())
            try:
                answers = self._answers(batch)
            except BaseException as exc:  # never leave a caller waiting
                log.error("decision batch failed", exc_info=exc)
                answers = [StoreUnavailable("the decision could not be made") for _ in batch]
            self._batches += 1
            self._answered += len(batch)
            self._deliver(batch, answers)
            if self.after_batch is not None:
                self.after_batch()

    def _answers(self, batch: list[_Job]) -> list[Any]:
        answers: list[Any] = [None] * len(batch)
        plans: list[Plan] = []
        planned: list[tuple[int, int | None]] = []  # each plan's job, and its place in a group job
        for i, job in enumerate(batch):
            try:
                made = job.make_plan()
            except Exception as exc:  # noqa: BLE001 - this request's answer
                answers[i] = exc
                continue
            if not job.group:
                plans.append(made)
                planned.append((i, None))
                continue
            answers[i] = members = list(made)  # a member that failed planning keeps its exception
            for place, member in enumerate(members):
                if isinstance(member, Plan):
                    plans.append(member)
                    planned.append((i, place))
        for (i, m), answer in zip(planned, self._authorizer.run_many(plans), strict=True):
            if m is None:
                answers[i] = answer
            else:
                answers[i][m] = answer
        return answers

    @staticmethod
    def _deliver(batch: list[_Job], answers: list[Any]) -> None:
        """One wake-up of each event loop for the whole batch."""
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future, Any]]] = {}
        for job, answer in zip(batch, answers, strict=True):
            by_loop.setdefault(job.loop, []).append((job.future, answer))
        for loop, settled in by_loop.items():
            try:
                loop.call_soon_threadsafe(_settle, settled)
            except RuntimeError:
                log.warning("%d answers dropped: their event loop is closed", len(settled))


def _settle(settled: list[tuple[asyncio.Future, Any]]) -> None:
    for future, answer in settled:
        if future.done():
            continue  # its caller was cancelled (the client went away)
        if isinstance(answer, BaseException):
            future.set_exception(answer)
        else:
            future.set_result(answer)
