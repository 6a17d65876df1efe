"""The decision queue is bounded by time: a request that would wait longer than
`max_queue_seconds` is refused at once (RESOURCE_EXHAUSTED, undecided, no token), and
one that waited over twice that when a batch takes it is refused then, unplanned; a
queue no longer than `min_queue` plans is never refused. The clock is injected: the
pump measures what a plan takes on it."""

from __future__ import annotations

import asyncio
import threading

import pytest
from conftest import make_request

from toolauthz.errors import InputError, ResourceExhaustedError
from toolauthz.model import Decision
from toolauthz.server.admission import batch_limit, waiting_time
from toolauthz.server.pump import DecisionPump
from toolauthz.service.common import proposed_call, trusted_context
from toolauthz.telemetry import metrics


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def plan_for(car, call_id: str):
    request = make_request(call_id=call_id, request_id=f"run-{call_id}")
    return lambda: car.authorizer.plan_authorize(trusted_context(request.context), proposed_call(request.call))


def taking(clock: Clock, seconds: float, make_plan):
    """`make_plan`, planned in `seconds` on the pump's clock."""
    def timed():
        clock.now += seconds
        return make_plan()
    return timed


def held(clock: Clock, advance: float):
    """A job that holds the pump until released, the clock `advance` seconds on when it is."""
    entered, release = threading.Event(), threading.Event()

    def make_plan():
        entered.set()
        release.wait(30)
        clock.now += advance
        raise InputError("held", "held on purpose")

    return make_plan, entered, release


@pytest.fixture
def ticks():
    return Clock()


@pytest.fixture
def pump(sidecar, ticks):
    pump = DecisionPump(sidecar.authorizer, inline_after=None, clock=ticks, max_queue_seconds=0.25, min_queue=0)
    yield pump
    pump.close()


async def _settled(task):
    try:
        return await task
    except Exception as exc:  # noqa: BLE001 - the answer under test
        return exc


async def measured(pump, clock: Clock, seconds: float) -> None:
    """One plan run on the pump in `seconds`: what a plan takes, as the pump measures it."""
    task, release = await holding(pump, clock, seconds)
    release.set()
    await _settled(task)


async def holding(pump, clock: Clock, advance: float):
    """A plan that holds the pump (`held`), once it does: its task and its release."""
    make_plan, entered, release = held(clock, advance)
    task = asyncio.ensure_future(pump.answer(make_plan))
    await asyncio.get_running_loop().run_in_executor(None, entered.wait, 30)
    return task, release


def test_a_request_that_would_wait_too_long_is_refused_at_once_undecided(sidecar, pump, ticks):
    clock = ticks
    shed_before = metrics.SHED._value.get()
    told = []
    pump.on_shed = told.append

    async def main():
        loop = asyncio.get_running_loop()
        first, entered, release = held(clock, 0.1)  # one plan takes 0.1 s, as the pump measures it
        task = asyncio.ensure_future(pump.answer(first))
        await loop.run_in_executor(None, entered.wait, 30)
        release.set()
        with pytest.raises(InputError):
            await task
        second, entered, release = held(clock, 0.0)  # the pump busy with one plan again
        busy = asyncio.ensure_future(pump.answer(second))
        await loop.run_in_executor(None, entered.wait, 30)
        queued = asyncio.ensure_future(pump.answer(plan_for(sidecar, "fits")))  # 2 plans x 0.1 s: 0.2 s
        await asyncio.sleep(0)
        with pytest.raises(ResourceExhaustedError, match="overloaded"):  # 3 x 0.1 s: over 0.25 s
            await pump.answer(plan_for(sidecar, "refused"))
        release.set()
        return await _settled(busy), await queued

    held_answer, fits = asyncio.run(main())
    assert isinstance(held_answer, InputError)
    assert fits.decision == Decision.ALLOW and fits.token
    assert sidecar.ledger.get("acme", "refused") is None  # never decided, nothing written
    assert pump.shed == 1 and told == [1] and metrics.SHED._value.get() == shed_before + 1


def test_the_running_batch_counts_for_what_is_left_of_it(sidecar, pump, ticks):
    """A batch that has run for as long as its plans take holds no place in the queue's
    wait: counted whole until it ends, a long batch would refuse every call arriving while
    it runs, in a burst."""
    clock = ticks

    async def main():
        await measured(pump, clock, 0.1)  # one plan takes 0.1 s
        busy, release = await holding(pump, clock, 0.0)
        clock.now += 0.1  # the running batch has taken what its one plan takes: nothing left of it
        fits = [asyncio.ensure_future(pump.answer(plan_for(sidecar, f"fits-{n}"))) for n in range(2)]
        await asyncio.sleep(0)  # 0.1 s and 0.2 s of wait: within 0.25 s (the whole batch: 0.3 s for the second)
        with pytest.raises(ResourceExhaustedError, match="overloaded"):  # 0.3 s
            await pump.answer(plan_for(sidecar, "refused"))
        release.set()
        await _settled(busy)
        return await asyncio.gather(*fits)

    answers = asyncio.run(main())
    assert [answer.decision for answer in answers] == [Decision.ALLOW, Decision.ALLOW]
    assert pump.shed == 1


def test_a_batch_takes_at_most_a_quarter_of_the_bound(sidecar, ticks):
    """Every call waits for its whole batch: under a bound of 1 s, with plans measured at
    0.1 s, a batch takes two plans (0.25 s), not the whole queue."""
    clock = ticks
    pump = DecisionPump(sidecar.authorizer, inline_after=None, clock=clock, max_queue_seconds=1.0, min_queue=0)
    try:
        async def main():
            await measured(pump, clock, 0.1)
            busy, release = await holding(pump, clock, 0.1)
            queued = [asyncio.ensure_future(pump.answer(taking(clock, 0.1, plan_for(sidecar, f"q-{n}"))))
                      for n in range(6)]
            await asyncio.sleep(0)
            batches = pump.batches
            release.set()
            await _settled(busy)
            answers = await asyncio.gather(*queued)
            return answers, pump.batches - batches

        answers, batches = asyncio.run(main())
    finally:
        pump.close()
    assert [answer.decision for answer in answers] == [Decision.ALLOW] * 6
    assert batches == 1 + 3  # the held one, then the six queued calls two by two


def test_the_wait_and_the_batch_limit_by_their_numbers():
    assert waiting_time(200, 0.0, 10, 0.002) == pytest.approx(0.42)  # a batch just begun counts whole
    assert waiting_time(200, 0.3, 10, 0.002) == pytest.approx(0.12)  # ... and for what is left of it
    assert waiting_time(200, 1.0, 10, 0.002) == pytest.approx(0.02)  # never less than nothing
    assert batch_limit(256, None, 0.002) == 256  # no bound: one transaction's worth
    assert batch_limit(256, 0.0, 0.002) == 256  # 0 is no bound too, never batches of one
    assert batch_limit(256, 0.5, 0.0) == 256  # nothing measured yet
    assert batch_limit(256, 0.5, 0.0024) == 52
    assert batch_limit(256, 0.5, 1.0) == 1  # always at least one


def test_a_request_that_waited_over_twice_the_bound_is_refused_unplanned(sidecar, pump, ticks):
    clock = ticks
    planned = []

    def never_planned():
        planned.append(True)
        raise AssertionError("a late request must not be planned")

    async def main():
        loop = asyncio.get_running_loop()
        first, entered, release = held(clock, 0.6)  # while it runs, 0.6 s pass: the next waits that long
        task = asyncio.ensure_future(pump.answer(first))
        await loop.run_in_executor(None, entered.wait, 30)
        late = asyncio.ensure_future(pump.answer(never_planned))
        await asyncio.sleep(0)
        release.set()
        await _settled(task)
        return await _settled(late)

    answer = asyncio.run(main())
    assert isinstance(answer, ResourceExhaustedError) and not planned
    assert pump.shed == 1


def test_a_short_queue_is_never_refused_however_slow_the_plans(sidecar, ticks):
    pump = DecisionPump(sidecar.authorizer, inline_after=None, clock=ticks, max_queue_seconds=0.25, min_queue=2)
    try:
        async def main():
            loop = asyncio.get_running_loop()
            first, entered, release = held(ticks, 10.0)  # a plan took ten seconds
            task = asyncio.ensure_future(pump.answer(first))
            await loop.run_in_executor(None, entered.wait, 30)
            release.set()
            await _settled(task)
            second, entered, release = held(ticks, 0.0)
            busy = asyncio.ensure_future(pump.answer(second))
            await loop.run_in_executor(None, entered.wait, 30)
            queued = asyncio.ensure_future(pump.answer(plan_for(sidecar, "short-queue")))  # 2 plans: kept
            await asyncio.sleep(0)
            with pytest.raises(ResourceExhaustedError):  # a third: over min_queue and over the bound
                await pump.answer(plan_for(sidecar, "third"))
            release.set()
            await _settled(busy)
            return await queued

        assert asyncio.run(main()).decision == Decision.ALLOW
        assert pump.shed == 1
    finally:
        pump.close()


def test_a_request_whose_caller_has_gone_is_dropped_unplanned(sidecar, pump, ticks):
    """A client whose deadline passed (or that went away) while its request waited in the
    queue cancels the request: the batch that takes it spends no work on it."""
    planned = []

    def never_planned():
        planned.append(True)
        raise AssertionError("an abandoned request must not be planned")

    async def main():
        loop = asyncio.get_running_loop()
        first, entered, release = held(ticks, 0.0)
        task = asyncio.ensure_future(pump.answer(first))
        await loop.run_in_executor(None, entered.wait, 30)
        gone = asyncio.ensure_future(pump.answer(never_planned))
        kept = asyncio.ensure_future(pump.answer(plan_for(sidecar, "kept")))
        await asyncio.sleep(0)
        gone.cancel()  # as grpc does when the call's deadline passes
        await asyncio.sleep(0)
        release.set()
        await _settled(task)
        [cancelled] = await asyncio.gather(gone, return_exceptions=True)
        return await kept, cancelled

    kept, gone = asyncio.run(main())
    assert kept.decision == Decision.ALLOW and isinstance(gone, asyncio.CancelledError) and not planned
    assert pump.abandoned == 1 and pump.shed == 1


class _Queued:
    def __init__(self, peer: str, name: str, plans: int = 1):
        self.peer, self.name, self.plans = peer, name, plans


def test_the_queue_takes_peers_in_turn_and_places_a_new_call_by_its_peers_own_queue():
    from toolauthz.server.admission import FairQueue

    queue: FairQueue[_Queued] = FairQueue()
    for i in range(5):
        queue.push(_Queued("many", f"m{i}"))
    queue.push(_Queued("lone", "l0"))
    queue.push(_Queued("group", "g0", plans=3))
    assert queue.position("lone", 1) == 2 + 2 + 2  # its second: two rounds, two plans of each other peer
    assert queue.position("many", 1) == 6 + 1 + 3  # its sixth: behind everything the others queued
    assert queue.position("new", 1) == 1 + 1 + 1 + 1  # a new peer: one round
    batch, plans = queue.take(5)
    assert [job.name for job in batch] == ["m0", "l0", "g0"] and plans == 5  # one each, in order of arrival
    batch, plans = queue.take(2)
    assert [job.name for job in batch] == ["m1", "m2"] and plans == 2 and len(queue) == 2
    batch, _ = queue.take(1)  # a batch takes at least one job
    assert [job.name for job in batch] == ["m3"]
