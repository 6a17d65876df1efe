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
awaiting coroutine).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from sidecar.authorizer import Authorizer, Plan
from sidecar.errors import StoreUnavailable

log = logging.getLogger("toolauthz.pump")


class _Job:
    __slots__ = ("make_plan", "future", "loop")

    def __init__(self, make_plan: Callable[[], Plan], future: asyncio.Future, loop: asyncio.AbstractEventLoop):
        self.make_plan, self.future, self.loop = make_plan, future, loop


class DecisionPump:
    def __init__(self, authorizer: Authorizer, *, max_batch: int = 256):
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
        future = loop.create_future()
        with self._cond:
            if self._closed:
                raise StoreUnavailable("the decision pump is closed")
            self._jobs.append(_Job(make_plan, future, loop))
            self._cond.notify()
        return await future

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
                batch = [self._jobs.popleft() for _ in range(min(len(self._jobs), self._max_batch))]
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
        plans, planned = [], []
        for i, job in enumerate(batch):
            try:
                plans.append(job.make_plan())
                planned.append(i)
            except Exception as exc:  # noqa: BLE001 - this request's answer
                answers[i] = exc
        for i, answer in zip(planned, self._authorizer.run_many(plans), strict=True):
            answers[i] = answer
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
