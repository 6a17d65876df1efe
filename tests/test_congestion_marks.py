"""Congestion marks: while its decision queue is long, the sidecar puts the trailing
metadata `toolauthz-congested: 1` on a share of its Authorize and AuthorizeBatch answers
(server/admission.py's `congestion`, the pump's, the service's `marked`); the SDKs'
throttles slow down on a mark as on a refusal, against the share they sent at when they
sent that call (client/throttle.py). Here: the share by the queue's time, the pump's
share as its queue grows, the service's metadata, the clients reading it, and a model
of a sidecar's queue offered 2.5 times what it decides, with throttling clients."""

from __future__ import annotations

import asyncio
import heapq
import random
import statistics

import grpc
import pytest
from conftest import make_request
from test_pump_overload import Clock, _settled, holding, measured, plan_for

from toolauthz.client import NO_RETRY, AsyncAuthzClient, AuthzClient, Principal, ProposedCall, Throttled, TrustedContext
from toolauthz.client.throttle import CONGESTED, AdaptiveThrottle, ThrottlePolicy, congested
from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb
from toolauthz.proto.toolauthz.v1 import authorizer_pb2_grpc as pb_grpc
from toolauthz.server.admission import congestion
from toolauthz.server.pump import DecisionPump
from toolauthz.service.authorizer import CONGESTED_METADATA, marked
from toolauthz.telemetry import metrics

RE = grpc.StatusCode.RESOURCE_EXHAUSTED


def test_the_share_marked_grows_from_a_tenth_of_the_bound_to_all_at_the_bound():
    assert congestion(0.0, 0.5) == 0.0
    assert congestion(0.05, 0.5) == 0.0  # a tenth of the bound: a queue that keeps the pump fed
    assert congestion(0.275, 0.5) == pytest.approx(0.5)
    assert congestion(0.5, 0.5) == 1.0
    assert congestion(3.0, 0.5) == 1.0
    assert congestion(3.0, None) == congestion(3.0, 0) == 0.0  # unbounded: nothing to warn of


def test_the_pump_marks_more_of_its_answers_as_its_queue_grows(sidecar):
    clock = Clock()
    pump = DecisionPump(sidecar.authorizer, inline_after=None, clock=clock, max_queue_seconds=0.25, min_queue=0)

    async def main():
        assert pump.congestion == 0.0  # nothing measured, nothing queued
        await measured(pump, clock, 0.1)  # a plan takes 0.1 s
        assert pump.congestion == 0.0
        busy, release = await holding(pump, clock, 0.0)
        running = pump.congestion  # one plan's 0.1 s: (0.1 - 0.025) / 0.225
        queued = asyncio.ensure_future(pump.answer(plan_for(sidecar, "queued")))
        await asyncio.sleep(0)
        longer = pump.congestion  # two plans, 0.2 s
        release.set()
        await _settled(busy)
        await queued
        return running, longer, pump.congestion

    try:
        running, longer, after = asyncio.run(main())
    finally:
        pump.close()
    assert running == pytest.approx(1 / 3) and longer == pytest.approx(7 / 9) and after == 0.0


class Context:
    def __init__(self) -> None:
        self.trailing = None

    def set_trailing_metadata(self, metadata) -> None:
        self.trailing = metadata


@pytest.mark.parametrize("share, draw, marks", [(0.0, 0.0, False), (0.3, 0.29, True), (0.3, 0.3, False),
                                                (1.0, 0.999, True)])
def test_an_answer_is_marked_with_the_share_as_its_probability(share, draw, marks):
    context, before = Context(), metrics.CONGESTION_MARKS._value.get()
    marked(context, share, lambda: draw)
    assert context.trailing == (((CONGESTED_METADATA, "1"),) if marks else None)
    assert metrics.CONGESTION_MARKS._value.get() == before + marks  # toolauthz_congestion_marks_total


def test_the_sidecar_and_the_sdks_name_the_mark_alike():
    assert CONGESTED_METADATA == CONGESTED == "toolauthz-congested"
    assert congested(((CONGESTED, "1"),)) and not congested(((CONGESTED, "0"),)) and not congested(None)


@pytest.mark.parametrize("share", [0.0, 1.0])
def test_authorize_and_authorize_batch_answers_carry_the_mark_while_the_pump_is_congested(
        monkeypatch, sidecar, stub, share):
    monkeypatch.setattr(DecisionPump, "congestion", property(lambda self: share))
    request = make_request(call_id=f"marked-{share}")
    response, call = stub.Authorize.with_call(request, timeout=10)
    assert response.decision == pb.ALLOW
    member = make_request(call_id=f"batch-{share}")
    context = pb.TrustedContext()
    context.CopyFrom(member.context)
    context.ClearField("entities_json")  # a batch's entities belong to each call
    batch = pb.AuthorizeBatchRequest(context=context, calls=[
        pb.BatchCall(call=member.call, entities_json=member.context.entities_json)])
    answers, batch_call = stub.AuthorizeBatch.with_call(batch, timeout=10)
    assert answers.answers[0].response.decision == pb.ALLOW
    for each in (call, batch_call):
        assert congested(each.trailing_metadata()) is (share == 1.0)


class Marking(pb_grpc.ToolAuthorizerServicer):
    """Answers every Authorize, with `value` as its congestion mark (None: no mark)."""

    def __init__(self, value: str | None) -> None:
        self.value = value

    def Authorize(self, request, context):
        if self.value is not None:
            context.set_trailing_metadata(((CONGESTED, self.value),))
        return pb.AuthorizeResponse(decision=pb.ALLOW, decision_id="d")

    def Verify(self, request, context):
        context.set_trailing_metadata(((CONGESTED, "1"),))
        return pb.VerifyResponse(valid=True)


ALICE = TrustedContext("acme", Principal("User", "alice"), "run-1")
POLICY = ThrottlePolicy(min_requests=0, half_life=3600)


def _proposed(i: int) -> ProposedCall:
    return ProposedCall.of(f"toolu_{i}", "issue_refund", '{"order_id": "ord_1", "amount_cents": 1}')


@pytest.mark.parametrize("value, slows", [("1", True), (None, False), ("0", False)])
def test_the_sync_client_slows_down_on_marked_answers(serve_authorizer, value, slows):
    with AuthzClient(serve_authorizer(Marking(value)), retry=NO_RETRY, throttle=POLICY) as client:
        throttled = 0
        for i in range(40):
            try:
                client.authorize(ALICE, _proposed(i))
            except Throttled:
                throttled += 1
        for _ in range(5):  # a Verify is never throttled, nor counted, marked or not
            client.verify("v4.public.x", ALICE, _proposed(0))
        assert (client.throttle.rejection_probability() > 0.5) is slows
        assert (throttled > 0) is slows


def test_the_async_client_slows_down_on_marked_answers(serve_authorizer):
    address = serve_authorizer(Marking("1"))

    async def main():
        async with AsyncAuthzClient(address, retry=NO_RETRY, throttle=POLICY) as client:
            before = client.throttle.rejection_probability()
            await client.authorize(ALICE, _proposed(0))
            return before, client.throttle.rejection_probability()

    before, after = asyncio.run(main())
    assert before == 0.0 and after == pytest.approx(0.2)  # one mark on a call sent at 0: a fifth less sent


def _model(marks: bool, *, clients: int = 16, offered: float = 1000.0, capacity: float = 400.0,
           seconds: float = 20.0, bound: float = 0.5, seed: int = 7) -> dict:
    """A sidecar's decision queue as a model: first in, first out, `capacity` decisions
    a second, a call that would wait over `bound` refused at once, each answer marked
    with `congestion`'s share (`marks`: the clients read them). `clients` throttles with
    the default policy, each sent `offered / clients` calls a second on a fixed schedule.
    Over the second half: the share of the time the sidecar decided, its refusals per
    decision, and the median wait of what it decided."""
    rand = random.Random(seed)
    clock = Clock()
    throttles = [AdaptiveThrottle(clock=clock, rand=rand.random) for _ in range(clients)]
    period, service = clients / offered, 1 / capacity
    events = [(c * period / clients, 0, "due", c, 0.0, 0.0) for c in range(clients)]
    heapq.heapify(events)
    finish, order, half = 0.0, 1, seconds / 2
    decided = refused = 0
    waits = []
    while events:
        t, _, kind, c, sent_at, wait = heapq.heappop(events)
        clock.now = 1000.0 + t
        order += 1
        if kind == "due":
            if t + period < seconds:
                heapq.heappush(events, (t + period, order, "due", c, 0.0, 0.0))
            try:
                sent_at = throttles[c].admit()
            except Throttled:
                continue
            wait = max(0.0, finish - t)
            if wait > bound:
                refused += t >= half
                heapq.heappush(events, (t, order, "refused", c, sent_at, 0.0))
                continue
            finish = max(t, finish) + service
            heapq.heappush(events, (finish, order, "decided", c, sent_at, wait))
        elif kind == "refused":
            throttles[c].answered(RE, sent_at=sent_at)
        else:
            mark = marks and rand.random() < congestion(max(0.0, finish - t), bound)
            throttles[c].answered(None, congested=mark, sent_at=sent_at)
            if half <= t < seconds:
                decided += 1
                waits.append(wait)
    return {"busy": decided * service / half, "refused_per_decision": refused / decided,
            "median_wait": statistics.median(waits)}


def test_clients_that_slow_down_on_marks_keep_the_sidecar_busy_and_seldom_refused():
    with_marks, without = _model(marks=True), _model(marks=False)
    # Marks keep the queue a little above a tenth of its bound: the sidecar never waits
    # for work, and refuses almost nothing (a refusal costs it what an empty RPC does).
    assert with_marks["busy"] >= 0.98
    assert with_marks["refused_per_decision"] <= 0.01
    assert 0.05 <= with_marks["median_wait"] <= 0.25
    # Steered by refusals alone, the queue sits at its bound and refuses to steer.
    assert without["busy"] >= 0.98
    assert without["refused_per_decision"] >= 0.02 and without["median_wait"] >= 0.4
