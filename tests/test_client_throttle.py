"""The clients' adaptive throttling (`toolauthz.client.throttle`): the probability, the
window, which answers count as accepts, and, against a real gRPC server that refuses
every Authorize, how many calls still reach it."""

from __future__ import annotations

import asyncio
import random

import grpc
import pytest

from toolauthz.client import (
    NO_RETRY,
    AsyncAuthzClient,
    AuthzClient,
    Principal,
    ProposedCall,
    Throttled,
    ThrottlePolicy,
    TrustedContext,
)
from toolauthz.client.throttle import AdaptiveThrottle
from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb
from toolauthz.proto.toolauthz.v1 import authorizer_pb2_grpc as pb_grpc

ALICE = TrustedContext("acme", Principal("User", "alice"), "run-1")
RE = grpc.StatusCode.RESOURCE_EXHAUSTED


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Draw:
    """The throttle's random source: 1.0 lets every call through (p < 1 always), 0.0
    refuses every call whose probability is above 0."""

    def __init__(self) -> None:
        self.value = 1.0

    def __call__(self) -> float:
        return self.value


def throttle(policy: ThrottlePolicy | None = None) -> tuple[AdaptiveThrottle, Clock, Draw]:
    clock, draw = Clock(), Draw()
    return AdaptiveThrottle(policy, clock=clock, rand=draw), clock, draw


def counted(t: AdaptiveThrottle, requests: int, accepts: int) -> None:
    """`requests` admitted calls, the first `accepts` of them accepted."""
    for i in range(requests):
        t.admit()
        t.answered(None if i < accepts else RE)


def test_nothing_is_refused_below_min_requests():
    t, _, draw = throttle(ThrottlePolicy(min_requests=20))
    draw.value = 0.0
    counted(t, 19, 0)  # none refused: fewer than 20 in the window when each was admitted
    assert t.rejection_probability() == 0.0
    t.admit()  # the 20th passes too: the probability is taken before it is counted
    assert t.rejection_probability() == pytest.approx(0.999)  # each refusal halved the share sent, to the floor
    with pytest.raises(Throttled):
        t.admit()


def test_a_refusal_halves_the_share_let_through_against_what_it_was_when_the_call_was_sent():
    t, _, _ = throttle(ThrottlePolicy(min_requests=0))
    t.answered(RE, sent_at=0.5)
    assert t.rejection_probability() == pytest.approx(0.75)  # 1 - 0.5 * 0.5
    for _ in range(20):  # the other answers to calls sent at 0.5: the same news, no further cut
        t.answered(RE, sent_at=0.5)
    assert t.rejection_probability() == pytest.approx(0.75)
    t.answered(RE, sent_at=0.0)  # a call sent before the cut never undoes it
    assert t.rejection_probability() == pytest.approx(0.75)
    t.answered(RE, sent_at=0.75)  # one sent after it: the next cut
    assert t.rejection_probability() == pytest.approx(0.875)
    t.answered(RE)  # sent at an unknown probability: as if at the present one
    assert t.rejection_probability() == pytest.approx(1 - 0.125 * 0.5)


def test_a_mark_cuts_the_share_by_a_fifth_and_means_nothing_on_a_failure():
    t, _, _ = throttle(ThrottlePolicy(min_requests=0))
    t.answered(None, congested=True, sent_at=0.5)
    assert t.rejection_probability() == pytest.approx(0.6)  # 1 - 0.5 * 0.8: gentler than a refusal
    t.answered(None, congested=True, sent_at=0.5)
    assert t.rejection_probability() == pytest.approx(0.6)
    t.answered(grpc.StatusCode.INVALID_ARGUMENT, congested=True, sent_at=0.6)  # an answer like any other
    assert t.rejection_probability() == pytest.approx(0.6 - 0.01)
    with t.counted() as answer:  # what a client does with a marked response's trailing metadata
        answer.congested = True
    assert answer.sent_at == pytest.approx(0.59)  # the probability it passed (the draw, 1.0, lets all through)
    assert t.rejection_probability() == pytest.approx(1 - 0.41 * 0.8)


@pytest.mark.parametrize("bad", [float("nan"), -0.1, 1.5])
def test_a_call_sent_at_no_probability_is_refused(bad):
    t, _, _ = throttle(ThrottlePolicy(min_requests=0))
    with pytest.raises(ValueError, match="sent_at"):
        t.answered(RE, sent_at=bad)
    assert t.rejection_probability() == 0.0


def test_each_other_answer_lowers_the_probability_by_recovery():
    t, _, _ = throttle(ThrottlePolicy(min_requests=0))
    t.answered(None, congested=True, sent_at=0.5)
    counted(t, 3, 3)
    assert t.rejection_probability() == pytest.approx(0.6 - 3 * 0.01)
    counted(t, 1000, 1000)
    assert t.rejection_probability() == 0.0  # never below 0
    counted(t, 1000, 0)
    assert t.rejection_probability() == pytest.approx(0.999)  # never 1: some calls still see the sidecar


def test_a_refused_call_fails_closed_as_resource_exhausted_and_counts_as_a_request():
    t, _, draw = throttle(ThrottlePolicy(min_requests=0))
    counted(t, 30, 10)
    draw.value = 0.0
    with pytest.raises(Throttled) as refused:
        t.admit()
    assert isinstance(refused.value, grpc.RpcError) and refused.value.code() == RE
    assert refused.value.details() == ("throttled by the client: the sidecar refused or marked congested 20 of the 30 "
                                       "calls it answered in the last 10 s (adaptive throttling); retry later")
    assert sum(t._requests) == 31


def test_the_probability_halves_every_half_life():
    t, clock, _ = throttle(ThrottlePolicy(min_requests=0, half_life=5.0))
    counted(t, 10, 0)
    p = t.rejection_probability()
    clock.now += 5.0
    assert t.rejection_probability() == pytest.approx(p / 2)
    clock.now += 10.0
    assert t.rejection_probability() == pytest.approx(p / 8)
    clock.now -= 100.0  # a clock that steps back changes nothing
    assert t.rejection_probability() == pytest.approx(p / 8)


def test_the_window_forgets_the_requests_counted_against_min_requests():
    t, clock, _ = throttle(ThrottlePolicy(window=10.0, min_requests=20, half_life=3600))
    counted(t, 50, 0)
    assert t.rejection_probability() > 0.9
    clock.now += 5.0  # half the window: the counts are still there
    assert t.rejection_probability() > 0.9
    clock.now += 5.01  # all of it: fewer than 20 requests, nothing is refused here
    assert t.rejection_probability() == 0.0
    counted(t, 20, 20)
    assert t.rejection_probability() > 0.0  # the probability itself was kept (only decay lowers it)
    clock.now += 1000.0
    assert t.rejection_probability() == 0.0


@pytest.mark.parametrize("code, accept", [
    (None, True), (grpc.StatusCode.INVALID_ARGUMENT, True), (grpc.StatusCode.PERMISSION_DENIED, True),
    (grpc.StatusCode.UNAVAILABLE, True), (grpc.StatusCode.DEADLINE_EXCEEDED, True), (RE, False)])
def test_only_the_sidecars_shedding_raises_the_probability(code, accept):
    t, _, _ = throttle(ThrottlePolicy(min_requests=0))
    counted(t, 10, 0)
    before = t.rejection_probability()
    t.admit()
    t.answered(code)
    assert (t.rejection_probability() < before) is accept


def _simulate(t: AdaptiveThrottle, clock: Clock, seconds: float, rate: int, capacity: int | None) -> tuple[int, int]:
    """`rate` calls a second for `seconds`, against a sidecar that accepts `capacity` a
    second (None: all); (sent, accepted)."""
    sent = accepted = 0
    budget, second = capacity, int(clock.now)
    for _ in range(int(seconds * rate)):
        clock.now += 1 / rate
        if int(clock.now) != second:
            budget, second = capacity, int(clock.now)
        try:
            t.admit()
        except Throttled:
            continue
        sent += 1
        if budget is None or budget > 0:
            budget = None if budget is None else budget - 1
            accepted += 1
            t.answered(None)
        else:
            t.answered(RE)
    return sent, accepted


def test_under_overload_about_1_05_times_what_is_accepted_is_sent_and_it_recovers_in_seconds():
    clock = Clock()
    t = AdaptiveThrottle(ThrottlePolicy(), clock=clock, rand=random.Random(3).random)
    _simulate(t, clock, 10, rate=1000, capacity=400)  # 2.5 times the capacity
    sent, accepted = _simulate(t, clock, 10, rate=1000, capacity=400)
    # A refusal halves the share sent (p about 0.6: +0.2), an accept lowers p by 0.01: 1 in 20.
    assert 1.0 <= sent / accepted <= 1.1 and accepted >= 0.9 * 4000
    _simulate(t, clock, 3, rate=1000, capacity=None)  # the overload ends
    assert t.rejection_probability() < 0.01


def test_after_the_sidecar_refused_everything_for_30_s_the_client_recovers_in_seconds():
    clock = Clock()
    t = AdaptiveThrottle(ThrottlePolicy(), clock=clock, rand=random.Random(5).random)
    sent, _ = _simulate(t, clock, 30, rate=100, capacity=0)
    assert sent < 0.2 * 3000  # most were refused here, not by the sidecar
    _simulate(t, clock, 10, rate=100, capacity=None)
    assert t.rejection_probability() < 0.01


@pytest.mark.parametrize("bad", [dict(mark_backoff=0), dict(mark_backoff=1), dict(mark_backoff=float("nan")),
                                 dict(refusal_backoff=0), dict(refusal_backoff=1.5), dict(window=0),
                                 dict(window=float("inf")), dict(min_requests=-1), dict(recovery=0),
                                 dict(recovery=1.5), dict(recovery=float("inf")),
                                 dict(half_life=0), dict(half_life=float("nan"))])
def test_bad_policies_are_refused(bad):
    with pytest.raises(ValueError):
        ThrottlePolicy(**bad)


class Refusing(pb_grpc.ToolAuthorizerServicer):
    """Refuses every Authorize and AuthorizeBatch as an overloaded sidecar does; counts what arrives."""

    def __init__(self) -> None:
        self.seen: dict[str, int] = {"Authorize": 0, "AuthorizeBatch": 0, "Verify": 0}

    def Authorize(self, request, context):
        self.seen["Authorize"] += 1
        context.abort(RE, "overloaded")

    def AuthorizeBatch(self, request, context):
        self.seen["AuthorizeBatch"] += 1
        context.abort(RE, "overloaded")

    def Verify(self, request, context):
        self.seen["Verify"] += 1
        return pb.VerifyResponse(valid=False, code="malformed")


class Answering(Refusing):
    def Authorize(self, request, context):
        self.seen["Authorize"] += 1
        return pb.AuthorizeResponse(decision=pb.ALLOW, decision_id="d")


def _proposed(i: int) -> ProposedCall:
    return ProposedCall.of(f"toolu_{i}", "issue_refund", '{"order_id": "ord_1", "amount_cents": 1}')


def _codes(client: AuthzClient, n: int) -> list:
    codes = []
    for i in range(n):
        try:
            client.authorize(ALICE, _proposed(i))
            codes.append(None)
        except grpc.RpcError as exc:
            codes.append((type(exc) is Throttled, exc.code()))
    return codes


def test_a_refusing_sidecar_sees_a_fraction_of_the_calls(serve_authorizer):
    servicer = Refusing()
    with AuthzClient(serve_authorizer(servicer), retry=NO_RETRY) as client:
        codes = _codes(client, 300)
        verified = [client.verify("not-a-token", ALICE, _proposed(1)) for _ in range(30)]
    assert all(code is not None and code[1] == RE for code in codes)
    throttled = sum(1 for code in codes if code[0])
    # 20 before throttling starts; then each refusal raises the probability by 0.045 up to
    # 0.999 (about 22 refusals), so a few dozen reach the sidecar at most.
    assert servicer.seen["Authorize"] == 300 - throttled
    assert servicer.seen["Authorize"] < 60
    assert throttled > 240
    assert servicer.seen["Verify"] == 30 and all(not v.valid for v in verified)  # never throttled


def test_without_a_throttle_every_call_reaches_the_sidecar(serve_authorizer):
    servicer = Refusing()
    with AuthzClient(serve_authorizer(servicer), retry=NO_RETRY, throttle=None) as client:
        codes = _codes(client, 100)
    assert servicer.seen["Authorize"] == 100
    assert all(code == (False, RE) for code in codes)


def test_a_healthy_sidecar_sees_every_call(serve_authorizer):
    servicer = Answering()
    with AuthzClient(serve_authorizer(servicer), retry=NO_RETRY) as client:
        codes = _codes(client, 200)
    assert codes == [None] * 200 and servicer.seen["Authorize"] == 200


def test_the_async_client_throttles_the_same_way(serve_authorizer):
    servicer = Refusing()
    address = serve_authorizer(servicer)

    async def scenario() -> list:
        async with AsyncAuthzClient(address, retry=NO_RETRY) as client:
            out = []
            for i in range(200):
                try:
                    await client.authorize(ALICE, _proposed(i))
                except grpc.RpcError as exc:
                    out.append(type(exc) is Throttled)
            return out

    throttled = asyncio.run(scenario())
    assert len(throttled) == 200
    assert servicer.seen["Authorize"] == 200 - sum(throttled) < 60
