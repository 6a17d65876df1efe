"""A lone call decided on the event loop (toolauthz/server/pump.py): the same answer,
audit record and cancellation rules as on the pump's thread, and never for calls that
arrive together or while the pump is busy."""

from __future__ import annotations

import asyncio
import dataclasses
import threading

import pytest
from conftest import hold_ledger_writes, make_request, verify_request
from test_fail_closed import FakeContext
from test_pump import held_first_batch

from toolauthz.audit.store import AuditQuery
from toolauthz.errors import InputError, StoreUnavailable
from toolauthz.model import Decision
from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb
from toolauthz.server.pump import DecisionPump
from toolauthz.service.authorizer import ToolAuthorizerService
from toolauthz.service.common import proposed_call, trusted_context


class Recorded:
    """Plans for the sidecar's authorizer that note the thread they were made on."""

    def __init__(self, car):
        self.car, self.threads = car, []

    def authorize(self, request, still_wanted=lambda: True):
        def make_plan():
            self.threads.append(threading.current_thread())
            return self.car.authorizer.plan_authorize(trusted_context(request.context), proposed_call(request.call),
                                                      still_wanted)
        return make_plan

    def verify(self, request, token):
        verify = verify_request(request, token)

        def make_plan():
            self.threads.append(threading.current_thread())
            return self.car.authorizer.plan_verify(verify.token, trusted_context(verify.context),
                                                   proposed_call(verify.call))
        return make_plan


@pytest.fixture
def plans(sidecar):
    return Recorded(sidecar)


@pytest.fixture
def inline_pump(sidecar):
    pump = DecisionPump(sidecar.authorizer, inline_after=0)
    yield pump
    pump.close()


def audit_of(car, call_id):
    [record] = car.audit_log.query(AuditQuery(call_id=call_id, kind="authorize"), limit=5)
    return record.event


def comparable(event):
    """An audit event without what differs between two calls (ids, times, the token's
    id, the digest of the call's ids, the usage meters the first call charged)."""
    detail = {k: v for k, v in event.detail.items() if k != "usage"}
    return dataclasses.replace(event, decision_id="", request_id="", call_id="", time=0.0, jti="", digest="",
                               detail=detail)


@pytest.mark.both_stores
def test_a_lone_call_is_decided_on_the_loop_and_answered_and_audited_as_by_the_pump(sidecar, plans):
    inline = DecisionPump(sidecar.authorizer, inline_after=0)
    pumped = DecisionPump(sidecar.authorizer, inline_after=None)

    async def main():
        return (threading.current_thread(),
                await inline.answer(plans.authorize(make_request(call_id="on-loop", request_id="r1"))),
                await pumped.answer(plans.authorize(make_request(call_id="on-pump", request_id="r2"))))

    try:
        loop_thread, on_loop, on_pump = asyncio.run(main())
    finally:
        inline.close()
        pumped.close()
    assert plans.threads[0] is loop_thread and plans.threads[1].name == "decision-pump"
    assert (inline.inlined, inline.batches, inline.answered) == (1, 1, 1)
    assert (pumped.inlined, pumped.batches, pumped.answered) == (0, 1, 1)
    assert on_loop.decision is on_pump.decision is Decision.ALLOW and on_loop.token and on_pump.token
    assert dataclasses.replace(on_loop, decision_id="", token=None, digest="") == \
        dataclasses.replace(on_pump, decision_id="", token=None, digest="")
    first, second = audit_of(sidecar, "on-loop"), audit_of(sidecar, "on-pump")
    assert first.jti == on_loop.token.jti and second.jti == on_pump.token.jti
    assert comparable(first) == comparable(second)
    assert (first.detail["usage"], second.detail["usage"]) == ({"refund_cents_24h": 0}, {"refund_cents_24h": 1500})


def test_lone_calls_go_to_the_pump_until_inline_after_of_them_came_alone(sidecar, plans):
    pump = DecisionPump(sidecar.authorizer, inline_after=2)

    async def main():
        for i in range(4):
            await pump.answer(plans.authorize(make_request(call_id=f"c{i}")))
        return threading.current_thread()

    try:
        loop_thread = asyncio.run(main())
    finally:
        pump.close()
    assert [t is loop_thread for t in plans.threads] == [False, False, True, True]
    assert pump.inlined == 2 and pump.batches == 4


def test_calls_handed_over_in_one_loop_iteration_share_a_pump_batch(sidecar, plans, inline_pump):
    async def main():
        together = await asyncio.gather(*(inline_pump.answer(plans.authorize(make_request(call_id=f"t{i}")))
                                          for i in range(3)))
        alone = await inline_pump.answer(plans.authorize(make_request(call_id="alone")))
        return threading.current_thread(), together, alone

    loop_thread, together, alone = asyncio.run(main())
    assert [t.name for t in plans.threads[:3]] == ["decision-pump"] * 3 and plans.threads[3] is loop_thread
    assert all(r.decision is Decision.ALLOW and r.token for r in [*together, alone])
    assert (inline_pump.batches, inline_pump.inlined) == (2, 1)


def test_a_call_arriving_while_the_pump_is_busy_queues_and_starts_the_count_again(sidecar, plans):
    pump = DecisionPump(sidecar.authorizer, inline_after=1)
    hold, entered, release = held_first_batch(pump)

    async def main():
        first = asyncio.ensure_future(pump.answer(hold))  # alone, but the first: to the pump, which holds
        await asyncio.get_running_loop().run_in_executor(None, entered.wait, 30)
        queued = asyncio.ensure_future(pump.answer(plans.authorize(make_request(call_id="queued"))))
        await asyncio.sleep(0)
        assert pump.waiting == 1
        release.set()
        with pytest.raises(InputError):
            await first
        await queued
        for i in range(2):  # the count starts again: one to the pump, then inline
            await pump.answer(plans.authorize(make_request(call_id=f"after{i}")))
        return threading.current_thread()

    try:
        loop_thread = asyncio.run(main())
    finally:
        pump.close()
    assert [t is loop_thread for t in plans.threads] == [False, False, True]
    assert pump.inlined == 1


def test_a_lone_call_cancelled_before_its_turn_is_decided_on_the_pump_without_a_token(sidecar, plans, inline_pump):
    gone = threading.Event()

    async def main():
        call = asyncio.ensure_future(
            inline_pump.answer(plans.authorize(make_request(), still_wanted=lambda: not gone.is_set())))
        await asyncio.sleep(0)  # the call is handed over; the loop has not looked at it yet
        call.cancel()
        gone.set()  # as the handler does on cancellation
        [outcome] = await asyncio.gather(call, return_exceptions=True)
        return outcome

    assert isinstance(asyncio.run(main()), asyncio.CancelledError)
    inline_pump.close()  # the decision is made on the pump's thread
    assert [t.name for t in plans.threads] == ["decision-pump"] and inline_pump.inlined == 0
    event = audit_of(sidecar, "toolu_1")
    assert event.result == "ALLOW" and event.jti == "" and event.detail.get("client_gone") is True


def test_the_deadline_passing_during_an_inline_decision_means_no_token(sidecar, inline_pump):
    ctx = FakeContext(remaining=10.0)
    original = sidecar.authorizer.ledger.apply

    def slow_apply(ops):
        ctx.remaining = 0.0  # the deadline runs out while the decision is being stored
        return original(ops)

    sidecar.authorizer.ledger.apply = slow_apply
    service = ToolAuthorizerService(sidecar.authorizer, inline_pump, sidecar.keyring, sidecar.status,
                                    gate=sidecar.gate)
    response = asyncio.run(service.Authorize(make_request(), ctx))
    assert inline_pump.inlined == 1
    assert response.decision == pb.ALLOW and response.token == ""
    assert audit_of(sidecar, "toolu_1").result == "ALLOW"  # the decision stands; its token went to no one


def test_a_failed_inline_commit_fails_closed(sidecar, plans, inline_pump, monkeypatch):
    def broken_apply(ops):
        raise StoreUnavailable("disk gone")

    monkeypatch.setattr(sidecar.ledger, "apply", broken_apply)

    async def main():
        return await inline_pump.answer(plans.authorize(make_request()))

    with pytest.raises(StoreUnavailable):
        asyncio.run(main())
    assert inline_pump.inlined == 1 and inline_pump.answered == 1
    monkeypatch.undo()
    assert sidecar.ledger.get("acme", "toolu_1") is None


def test_an_inline_plan_that_raises_is_that_calls_answer(inline_pump):
    async def main():
        return await inline_pump.answer(lambda: (_ for _ in ()).throw(InputError("bad_input", "bad")))

    with pytest.raises(InputError) as info:
        asyncio.run(main())
    assert info.value.code == "bad_input" and inline_pump.inlined == 1


def test_verify_inline_consumes_the_token_once(sidecar, plans, inline_pump):
    request = make_request()

    async def main():
        decided = await inline_pump.answer(plans.authorize(request))
        first = await inline_pump.answer(plans.verify(request, decided.token.token))
        second = await inline_pump.answer(plans.verify(request, decided.token.token))
        return first, second

    first, second = asyncio.run(main())
    assert (first.code, second.code) == ("ok", "already_used") and inline_pump.inlined == 3


def test_a_job_handed_over_just_before_close_is_refused(sidecar, plans, inline_pump):
    async def main():
        call = asyncio.ensure_future(inline_pump.answer(plans.authorize(make_request())))
        await asyncio.sleep(0)  # handed over, not yet looked at
        inline_pump.close()
        return await asyncio.gather(call, return_exceptions=True)

    [outcome] = asyncio.run(main())
    assert isinstance(outcome, StoreUnavailable) and plans.threads == []
    assert sidecar.ledger.get("acme", "toolu_1") is None


def test_close_waits_for_an_inline_decision_in_progress(sidecar, plans, inline_pump, monkeypatch):
    entered, release = hold_ledger_writes(monkeypatch, sidecar)
    held_apply, committed = sidecar.ledger.apply, threading.Event()
    monkeypatch.setattr(sidecar.ledger, "apply", lambda ops: [held_apply(ops), committed.set()][0])
    found = {}

    def decide_on_a_loop():
        async def main():
            return await inline_pump.answer(plans.authorize(make_request()))
        found["answer"] = asyncio.run(main())

    def close_then_look():
        inline_pump.close()
        found["committed when close returned"] = committed.is_set()

    deciding = threading.Thread(target=decide_on_a_loop)
    deciding.start()
    assert entered.wait(30)  # the decision is in its commit, on that loop's thread
    closing = threading.Thread(target=close_then_look)
    closing.start()
    inline_pump._thread.join(30)  # close() has begun: the pump's thread is gone
    release.set()
    closing.join(30)
    deciding.join(30)
    assert found["committed when close returned"] is True
    assert found["answer"].token is not None and inline_pump.inlined == 1


def test_served_calls_one_at_a_time_are_decided_inline_after_the_first_few(sidecar, stub):
    responses = [stub.Authorize(make_request(call_id=f"s{i}", request_id=f"r{i}")) for i in range(11)]
    assert all(r.decision == pb.ALLOW and r.token for r in responses)
    assert sidecar.pump.inlined == 11 - 8  # the default: 8 lone calls first
    verified = stub.Verify(verify_request(make_request(call_id="s10", request_id="r10"), responses[-1].token))
    assert verified.valid and sidecar.pump.inlined == 4
    status = stub.GetStatus(pb.GetStatusRequest())
    assert (status.decisions, status.decision_batches) == (12, 12)


def test_a_slow_inline_decision_sends_calls_to_the_pump_for_a_while(sidecar, plans, monkeypatch):
    now = [1000.0]
    pump = DecisionPump(sidecar.authorizer, inline_after=0, slow_inline=0.05, slow_pause=30.0, clock=lambda: now[0])
    real_apply = sidecar.ledger.apply

    def slow_apply(ops):
        now[0] += 1.0  # this commit waited a second (a lock held elsewhere, a stalled disk)
        return real_apply(ops)

    async def one(call_id):
        return await pump.answer(plans.authorize(make_request(call_id=call_id)))

    try:
        monkeypatch.setattr(sidecar.ledger, "apply", slow_apply)
        assert asyncio.run(one("slow")).token  # inline, but slow
        monkeypatch.setattr(sidecar.ledger, "apply", real_apply)
        asyncio.run(one("paused"))
        now[0] += 30.0
        asyncio.run(one("again"))
    finally:
        pump.close()
    assert [t.name == "decision-pump" for t in plans.threads] == [False, True, False]
    assert pump.inlined == 2


def test_an_inline_decision_does_not_wake_the_pumps_idle_thread(sidecar, plans, monkeypatch):
    """The pump's thread sleeps on the condition until a job is queued: an inline decision
    notifying it would wake it for nothing (a futex round trip and a GIL hand-off per call
    at one call in flight)."""
    pump = DecisionPump(sidecar.authorizer, inline_after=0)
    notified, notify = [], pump._cond.notify  # notify_all() calls notify()
    monkeypatch.setattr(pump._cond, "notify", lambda n=1: [notified.append(n), notify(n)])

    async def main():
        for i in range(3):
            assert (await pump.answer(plans.authorize(make_request(call_id=f"i{i}")))).token

    try:
        asyncio.run(main())
        assert pump.inlined == 3 and notified == []
    finally:
        pump.close()
    assert notified  # close() wakes the thread to end it
