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
from toolauthz.errors import ResourceExhaustedError
from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb
from toolauthz.proto.toolauthz.v1 import authorizer_pb2_grpc as pb_grpc
from toolauthz.server.admission import congestion
from toolauthz.server.pump import DecisionPump
from toolauthz.service.authorizer import marked
from toolauthz.service.congestion import CONGESTED_METADATA
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
    pump = DecisionPump(sidecar.authorizer, inline_after=None, clock=clock, max_queue_seconds=1.0, min_queue=0)

    async def main():
        assert pump.congestion() == 0.0  # nothing measured, nothing queued
        await measured(pump, clock, 0.1)  # a plan takes 0.1 s
        assert pump.congestion() == 0.0
        busy, release = await holding(pump, clock, 0.0)
        running = pump.congestion()  # a new call: the running plan and its own, 0.2 s: (0.2 - 0.1) / 0.9
        queued = asyncio.ensure_future(pump.answer(plan_for(sidecar, "queued")))
        await asyncio.sleep(0)
        longer = pump.congestion()  # and the one queued: 0.3 s
        release.set()
        await _settled(busy)
        await queued
        return running, longer, pump.congestion()

    try:
        running, longer, after = asyncio.run(main())
    finally:
        pump.close()
    assert running == pytest.approx(1 / 9) and longer == pytest.approx(2 / 9) and after == 0.0


def test_a_connection_is_marked_for_its_own_place_in_the_queue_not_for_anothers(sidecar):
    """The share follows the wait a new call of the connection itself would have, as the
    queue's refusals do: a light connection is not slowed down for a heavy one's queue."""
    clock = Clock()
    pump = DecisionPump(sidecar.authorizer, inline_after=None, clock=clock, max_queue_seconds=1.0, min_queue=0)

    async def main():
        await measured(pump, clock, 0.1)
        busy, release = await holding(pump, clock, 0.0)
        heavy = [asyncio.ensure_future(pump.answer(plan_for(sidecar, f"heavy-{n}"), peer="heavy")) for n in range(8)]
        await asyncio.sleep(0)
        shares = pump.congestion("heavy"), pump.congestion("light")
        release.set()
        await _settled(busy)
        await asyncio.gather(*heavy)
        return shares

    try:
        heavy, light = asyncio.run(main())
    finally:
        pump.close()
    # heavy: the running plan, its 8 and its new one: 1.0 s, the bound; light: the running
    # plan, one of heavy's in the round robin, its own: 0.3 s, (0.3 - 0.1) / 0.9
    assert heavy == 1.0 and light == pytest.approx(2 / 9)


def test_a_queue_within_min_queue_is_never_marked(sidecar):
    """Never refused either: on a slow store a few calls in flight are no overload."""
    clock = Clock()
    pump = DecisionPump(sidecar.authorizer, inline_after=None, clock=clock, max_queue_seconds=0.25, min_queue=64)

    async def main():
        await measured(pump, clock, 0.1)
        busy, release = await holding(pump, clock, 0.0)
        queued = [asyncio.ensure_future(pump.answer(plan_for(sidecar, f"slow-{n}"))) for n in range(10)]
        await asyncio.sleep(0)
        share = pump.congestion()  # 1.1 s of plans, over four times the bound: 11 plans, within 64
        release.set()
        await _settled(busy)
        await asyncio.gather(*queued)
        return share

    try:
        assert asyncio.run(main()) == 0.0
    finally:
        pump.close()


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
    monkeypatch.setattr(DecisionPump, "congestion", lambda self, peer="": share)
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


def test_an_error_answer_is_never_marked(monkeypatch, sidecar, stub):
    monkeypatch.setattr(DecisionPump, "congestion", lambda self, peer="": 1.0)
    bad = make_request(call_id="bad-entities")
    bad.context.entities_json = b"{not json"  # the runtime's fault: INVALID_ARGUMENT, no decision
    with pytest.raises(grpc.RpcError) as refused:
        stub.Authorize(bad, timeout=10)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert not congested(refused.value.trailing_metadata())
    shed = make_request(call_id="shed")
    monkeypatch.setattr(DecisionPump, "check_admission", lambda self, **_: (_ for _ in ()).throw(
        ResourceExhaustedError("overloaded: the decision queue is full for now; retry after a short wait")))
    with pytest.raises(grpc.RpcError) as overloaded:
        stub.Authorize(shed, timeout=10)
    assert overloaded.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert not congested(overloaded.value.trailing_metadata())


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
    # one mark on a call sent at 0: a fifth less sent (the real clock decays it by 4e-5 a second)
    assert before == 0.0 and after == pytest.approx(0.2, abs=1e-3)


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
