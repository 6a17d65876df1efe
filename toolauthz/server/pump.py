"""The decision pump: one thread that makes this process's decisions, in batches, and
decides a lone call on the event loop itself.

With a thread per request, 32 calls in flight would be 32 threads taking turns on the
interpreter lock (31-32 context switches per call against 13, docs/performance.md).
Here the event loop only moves messages. It queues each request and awaits its answer;
the pump takes everything queued, plans it (validation, the decision's inputs), runs
all the plans' ledger writes together (`Authorizer.run_many`: Cedar and the token
signature before the write lock, one transaction, one fsync after the lock), and hands
the answers back to the loop in one wake-up per batch.

At one call in flight that hand-off is pure cost: two thread wake-ups per call and
nothing to batch. So a call that is alone (the only one its loop handed over in this
iteration and still awaits, the pump idle with nothing queued, and `inline_after` calls
before it alone too) is decided on the event loop, in the same `run_many`, which is then
blocked for one decision and its commit (what a call queued behind a batch waits too).
Calls arriving meanwhile wait in gRPC's core and, once the loop sees two at a time or
the pump busy, go to the pump: the inline path never turns many calls into batches of
one. An inline decision cannot see its client cancel (the loop that would tell it is
busy), as a pump decision cannot once its token is minted: the deadline is still
checked before the token, and a cancelled call's answer reaches no one.

The queue is fair across peers and bounded by time (server/admission.py): a request that
would wait longer than `max_queue_seconds`, or past its deadline, is refused at once
(ResourceExhaustedError) before any work is spent on it; under load, a batch refuses
unplanned those that waited over twice the bound or past their deadline, and drops those
whose caller went away. Refusals are counted (`metrics.SHED`) and handed to `on_shed`,
outside the lock, to be audited in aggregate. Before the bound refuses, `congestion` is
the share of answers the service marks congested, so that clients slow down.

The pump knows no gRPC: a job is a function that returns a Plan, and its answer is
whatever the plan's `finish` returns, or the exception it raised (raised again in the
awaiting coroutine). A group job (`answer_group`, AuthorizeBatch) returns many plans,
which always run in the same `run_many`, so their writes share one transaction: a batch
takes jobs up to `max_batch` plans (a group counts its members), the most the ledger's
group commit puts in one transaction. A group never runs inline.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from toolauthz.authorizer import Authorizer, Plan
from toolauthz.errors import ResourceExhaustedError, StoreUnavailable
from toolauthz.server.admission import FairQueue, batch_limit, congestion, unwanted, waiting_time
from toolauthz.store.group_commit import MAX_BATCH
from toolauthz.telemetry import metrics, timeline

log = logging.getLogger("toolauthz.pump")


_SMOOTHING = 0.2  # weight of the newest batch in the time a plan takes
MIN_QUEUE = 64  # plans that may always queue: they share the next batches


class _Job:
    __slots__ = ("make_plan", "future", "loop", "group", "plans", "queued_at", "peer", "deadline", "timeline")

    def __init__(self, make_plan: Callable[[], Any], future: asyncio.Future, loop: asyncio.AbstractEventLoop,
                 group: bool = False, plans: int = 1, peer: str = "", deadline: float | None = None):
        self.make_plan, self.future, self.loop, self.group, self.plans = make_plan, future, loop, group, plans
        self.queued_at, self.timeline = 0.0, timeline.reached("queued")  # the bench's timeline (None: off)
        self.peer, self.deadline = peer, deadline  # the deadline on the pump's clock


class _Stage:
    """One event loop's side: the jobs handed over in this loop iteration (sent on by
    one `_flush` callback after it), the calls still awaiting an answer, and how many
    calls in a row were alone. Touched only on its loop's thread."""

    __slots__ = ("jobs", "awaiting", "alone")

    def __init__(self) -> None:
        self.jobs: list[_Job] = []
        self.awaiting = 0
        self.alone = 0


class DecisionPump:
    """`inline_after`: how many lone calls in a row go to the pump before the next one
    is decided on the event loop (None: never inline). An inline decision that took
    longer than `slow_inline` seconds (a store waiting on a lock, a slow disk or network)
    stops inline decisions for `slow_pause` seconds: the loop must not stall for long,
    its health checks and other calls would wait too. `clock`: monotonic seconds.
    `max_queue_seconds`: the queue's bound in time (None: unbounded; `serve` passes the
    `max_queue_seconds` setting). A queue of at most `min_queue` plans is never refused:
    they share the next batch, and on a slow machine a few calls in flight are not an
    overload."""

    def __init__(self, authorizer: Authorizer, *, max_batch: int = MAX_BATCH, inline_after: int | None = 8,
                 slow_inline: float = 0.25, slow_pause: float = 30.0, clock: Callable[[], float] = time.monotonic,
                 max_queue_seconds: float | None = None, min_queue: int = MIN_QUEUE):
        self._authorizer = authorizer
        self._max_queue_seconds = max_queue_seconds
        self._min_queue = min_queue
        self._plan_seconds = 0.0  # what a plan took in the last batches (smoothed)
        self._queued_plans = 0  # plans queued and in the running batch
        self._running_plans = 0
        self._running_since = 0.0  # when the running batch began, on `clock`
        self._shed = 0
        self.on_shed: Callable[[int], None] | None = None  # refusals to audit in aggregate (their count)
        self._max_batch = max_batch
        self._inline_after = inline_after
        self._slow_inline, self._slow_pause, self._clock = slow_inline, slow_pause, clock
        self._no_inline_until = float("-inf")
        self._jobs: FairQueue[_Job] = FairQueue()
        self._cond = threading.Condition()
        self._closed = False
        self._busy = False  # the pump's thread is running a batch
        self._inline_running = 0  # decisions being made on event loops now
        self._inlined = 0
        self._batches = 0
        self._answered = 0
        self._gone = 0
        self._stages: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Stage] = weakref.WeakKeyDictionary()
        self.after_batch: Callable[[], None] | None = None  # the worker's status board (worker_status.py)
        self._thread = threading.Thread(target=self._run, name="decision-pump", daemon=True)
        self._thread.start()

    async def answer(self, make_plan: Callable[[], Plan], *, peer: str = "", remaining: float | None = None) -> Any:
        """`make_plan()` is called on the pump's thread (or, for a lone call, on the
        event loop's); returns the plan's answer. `peer`: whose turn the request takes
        in the queue (a client connection); `remaining`: seconds to its deadline."""
        if self._closed:
            raise StoreUnavailable("the decision pump is closed")
        loop = asyncio.get_running_loop()
        job = _Job(make_plan, loop.create_future(), loop, peer=peer, deadline=self._deadline(remaining))
        stage = self._stages.get(loop)
        if stage is None:
            stage = self._stages[loop] = _Stage()
        stage.awaiting += 1
        try:
            if self._inline_after is None or self._busy or self._jobs:
                stage.alone = 0
                self._enqueue(job)
            else:  # maybe alone: `_flush` sees what else arrived in this iteration
                stage.jobs.append(job)
                if len(stage.jobs) == 1:
                    loop.call_soon(self._flush, stage)
            return await job.future
        finally:
            stage.awaiting -= 1

    async def answer_group(self, make_plans: Callable[[], Sequence[Plan | Exception]], members: int, *,
                           peer: str = "", remaining: float | None = None) -> list[Any]:
        """`make_plans()` is called on the pump's thread and gives each of the `members`
        plans, or the exception that member failed with; returns each member's answer or
        exception, in order. The members' plans run in one `run_many`: one transaction
        while `members` is at most `max_batch`. An exception `make_plans` raises is raised
        here, for the whole group."""
        loop = asyncio.get_running_loop()
        job = _Job(make_plans, loop.create_future(), loop, True, members, peer, self._deadline(remaining))
        self._enqueue(job)
        answers: list[Any] = await job.future
        return answers

    @property
    def batches(self) -> int:
        """Batches run so far (an inline decision is a batch of one)."""
        return self._batches

    @property
    def inlined(self) -> int:
        """Decisions made on an event loop, each alone (counted in `batches` too)."""
        return self._inlined

    @property
    def answered(self) -> int:
        """Requests answered so far (a failed one included)."""
        return self._answered

    @property
    def abandoned(self) -> int:
        """Requests dropped unplanned because their caller had gone when a batch took them."""
        return self._gone

    @property
    def shed(self) -> int:
        """Requests refused undecided: too long a wait, past their deadline, or their caller gone."""
        return self._shed

    def congestion(self, peer: str = "") -> float:
        """The share of `peer`'s answers to mark congested now (admission.congestion), by
        the wait a new call of its own would have, as `_refusal` estimates it: a light
        connection is not marked for a heavy one's queue. None within `min_queue`."""
        if not self._max_queue_seconds or self._queued_plans <= self._min_queue:
            return 0.0  # read without the lock: the usual answer costs no lock, a stale read one mark
        with self._cond:
            wait = self._wait(peer, 1, self._clock())
        return congestion(wait, self._max_queue_seconds)

    @property
    def waiting(self) -> int:
        """Requests queued and not yet taken into a batch."""
        with self._cond:
            return len(self._jobs)

    def close(self) -> None:
        """Refuse new jobs; return once every queued job is answered."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()
        with self._cond:
            self._cond.wait_for(lambda: not self._inline_running)

    def check_admission(self, *, peer: str = "", plans: int = 1, remaining: float | None = None) -> None:
        """Raises ResourceExhaustedError (counted as shed) for a request that would be
        refused if queued now: for a handler, before it spends work on the request."""
        self._admit(peer, plans, self._deadline(remaining), None)

    def _deadline(self, remaining: float | None) -> float | None:
        return None if remaining is None else self._clock() + remaining

    def _enqueue(self, job: _Job) -> None:
        self._admit(job.peer, job.plans, job.deadline, job)

    def _admit(self, peer: str, plans: int, deadline: float | None, job: _Job | None) -> None:
        """Queues `job` (None: only asks), or raises ResourceExhaustedError, counted as shed."""
        with self._cond:
            if self._closed and job is not None:
                raise StoreUnavailable("the decision pump is closed")
            now = self._clock()
            refusal = self._refusal(peer, plans, deadline, now)
            if refusal is None:
                if job is not None:
                    job.queued_at = now
                    self._queued_plans += job.plans
                    self._jobs.push(job)
                    self._cond.notify_all()
                return
            self._shed += plans
        self._told_shed(plans)
        raise refusal

    def _refusal(self, peer: str, plans: int, deadline: float | None, now: float) -> ResourceExhaustedError | None:
        """Why `plans` plans of `peer` would be refused now (None: admitted): after what
        is left of the running batch and the plans before them in the queue's round robin,
        they would wait longer than the bound, or past their deadline."""
        if self._max_queue_seconds is None:
            return None
        wait = self._wait(peer, plans, now)
        if deadline is not None and now + wait > deadline:
            return ResourceExhaustedError("overloaded: the request cannot be decided before its deadline; "
                                          "retry with a longer deadline or after a short wait")
        if self._queued_plans + plans > self._min_queue and wait > self._max_queue_seconds:
            return _overloaded()
        return None

    def _wait(self, peer: str, plans: int, now: float) -> float:
        """What `plans` new plans of `peer` would wait (admission.waiting_time); under the lock."""
        return waiting_time(self._running_plans, now - self._running_since, self._jobs.position(peer, plans),
                            self._plan_seconds)

    def _told_shed(self, count: int) -> None:
        """Called without the pump's lock: `on_shed` may write the audit trail."""
        metrics.SHED.inc(count)
        if self.on_shed is not None:
            self.on_shed(count)

    def _flush(self, stage: _Stage) -> None:
        """On the loop, after the coroutines of one iteration handed over their jobs:
        decide a lone one here, send the others to the pump."""
        jobs, stage.jobs = stage.jobs, []
        lone = len(jobs) == 1 and stage.awaiting == 1 and not jobs[0].future.done()
        with self._cond:
            if self._closed:  # since these jobs were handed over: answered as a later one is
                _settle([(job.future, StoreUnavailable("the decision pump is closed")) for job in jobs])
                return
            lone = lone and not self._busy and not self._jobs
            stage.alone = stage.alone + 1 if lone else 0
            assert self._inline_after is not None  # or nothing is staged
            if not (lone and stage.alone > self._inline_after and self._clock() >= self._no_inline_until):
                now = self._clock()
                for job in jobs:
                    job.queued_at = now
                    self._jobs.push(job)
                self._queued_plans += sum(job.plans for job in jobs)
                self._cond.notify_all()
                return
            self._inline_running += 1
        began = self._clock()
        try:
            answers = self._safe_answers(jobs, "inline")
        finally:
            ended = self._clock()
            if ended - began > self._slow_inline:
                log.warning("an inline decision took %.3f s: deciding on the pump's thread for the next %.0f s",
                            ended - began, self._slow_pause)
                self._no_inline_until = ended + self._slow_pause
            with self._cond:
                self._inline_running -= 1
                self._inlined += 1
                self._batches += 1
                self._answered += 1
                if self._closed:  # close() may be waiting for it; else no one is: the pump's
                    self._cond.notify_all()  # thread woken here would only take the GIL and sleep again
        _settle([(jobs[0].future, answers[0])])
        if self.after_batch is not None:
            self.after_batch()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._jobs or self._closed)
                if not self._jobs:
                    return  # closed and drained
                batch, plans = self._jobs.take(batch_limit(self._max_batch, self._max_queue_seconds,
                                                           self._plan_seconds))
                self._busy, self._running_plans = True, plans
                self._running_since = began = self._clock()
            batch, gone, late = self._unwanted(batch, plans, began)
            if gone or late:
                self._told_shed(sum(job.plans for job in gone + late))
            answers = self._safe_answers(batch) if batch else []
            ended = self._clock()
            with self._cond:  # idle before any caller has its answer (and sends the next call)
                self._busy, self._running_plans = False, 0
                self._batches += 1
                self._answered += len(batch) + len(late)
                self._gone += len(gone)
                self._queued_plans -= plans
                decided = plans - sum(job.plans for job in late) - sum(job.plans for job in gone)
                if decided:
                    took = (ended - began) / decided
                    self._plan_seconds = took if not self._plan_seconds else \
                        (1 - _SMOOTHING) * self._plan_seconds + _SMOOTHING * took
            self._deliver(late + batch, [_overloaded() for _ in late] + answers)
            if self.after_batch is not None:
                self.after_batch()

    def _unwanted(self, batch: list[_Job], plans: int, now: float) -> tuple[list[_Job], list[_Job], list[_Job]]:
        """Under load (the queue bounded and the batch over `min_queue` plans): the jobs to
        decide, and those gone or late (`admission.unwanted`), undecided and counted as
        shed. Not under load: all are decided (a call abandoned then is still recorded,
        `client_gone`, and replayed on a retry)."""
        if self._max_queue_seconds is None or plans <= self._min_queue:
            return batch, [], []
        waiting, gone, late = unwanted(batch, now, 2 * self._max_queue_seconds)
        if gone or late:
            with self._cond:
                self._shed += sum(job.plans for job in gone + late)
        return waiting, gone, late

    def _safe_answers(self, batch: list[_Job], taken: str = "taken") -> list[Any]:
        try:
            with timeline.in_batch((job.timeline for job in batch), taken):
                return self._answers(batch)
        except BaseException as exc:  # never leave a caller waiting
            log.error("decision batch failed", exc_info=exc)
            return [StoreUnavailable("the decision could not be made") for _ in batch]

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
        timeline.batch_mark("planned")
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


def _overloaded() -> ResourceExhaustedError:
    return ResourceExhaustedError("overloaded: the decision queue is full for now; retry after a short wait")


def _settle(settled: list[tuple[asyncio.Future, Any]]) -> None:
    for future, answer in settled:
        if future.done():
            continue  # its caller was cancelled (the client went away)
        if isinstance(answer, StopIteration):
            # A future refuses it (a coroutine's becomes a RuntimeError too): raised here,
            # it would leave the answers after it unset and their callers waiting.
            answer = RuntimeError("a plan raised StopIteration")
        if isinstance(answer, BaseException):
            future.set_exception(answer)
        else:
            future.set_result(answer)
