"""The clients' adaptive throttling (`toolauthz.client.throttle`): the probability, the
window, which answers count as accepts, and, against a real gRPC server that refuses
every Authorize, how many calls still reach it."""

from __future__ import annotations

import asyncio
from concurrent import futures

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
    assert t.rejection_probability() == pytest.approx(20 / 21)
    with pytest.raises(Throttled):
        t.admit()


def test_the_probability_is_the_sre_formula():
    t, _, _ = throttle(ThrottlePolicy(multiplier=1.1, min_requests=0))
    counted(t, 30, 10)
    assert t.rejection_probability() == pytest.approx((30 - 1.1 * 10) / 31)
    t2, _, _ = throttle(ThrottlePolicy(multiplier=2.0, min_requests=0))
    counted(t2, 30, 20)  # 2 x 20 accepts cover 30 requests
    assert t2.rejection_probability() == 0.0


def test_a_refused_call_fails_closed_as_resource_exhausted_and_counts_as_a_request():
    t, _, draw = throttle(ThrottlePolicy(min_requests=0))
    counted(t, 30, 10)
    p = t.rejection_probability()
    draw.value = p + 1e-9  # just above: let through
    t.admit()
    t.answered(RE)
    draw.value = 0.0
    with pytest.raises(Throttled) as refused:
        t.admit()
    assert isinstance(refused.value, grpc.RpcError) and refused.value.code() == RE
    assert refused.value.details().startswith("throttled by the client: the sidecar accepted 10 of the last 31 calls")
    assert t.rejection_probability() == pytest.approx((32 - 11) / 33)  # the refused call counts


def test_the_window_forgets():
    t, clock, _ = throttle(ThrottlePolicy(window=10.0, min_requests=0))
    counted(t, 50, 0)
    assert t.rejection_probability() > 0.9
    clock.now += 5.0  # half the window: the counts are still there
    assert t.rejection_probability() > 0.9
    clock.now += 5.01  # all of it: nothing left
    assert t.rejection_probability() == 0.0
    counted(t, 50, 0)
    clock.now += 1000.0  # a long jump empties every bucket too
    assert t.rejection_probability() == 0.0


def test_buckets_expire_one_by_one():
    t, clock, _ = throttle(ThrottlePolicy(window=10.0, min_requests=0, multiplier=1.0))
    counted(t, 10, 0)  # old refusals
    clock.now += 6.0
    counted(t, 10, 10)  # newer accepts
    assert t.rejection_probability() == pytest.approx((20 - 10) / 21)
    clock.now += 4.5  # the refusals' bucket left the window, the accepts' did not
    assert t.rejection_probability() == 0.0


@pytest.mark.parametrize("code, accept", [
    (None, True), (grpc.StatusCode.INVALID_ARGUMENT, True), (grpc.StatusCode.PERMISSION_DENIED, True),
    (grpc.StatusCode.UNAVAILABLE, True), (RE, False), (grpc.StatusCode.DEADLINE_EXCEEDED, False)])
def test_which_answers_are_accepts(code, accept):
    t, _, _ = throttle(ThrottlePolicy(min_requests=0, multiplier=1.0))
    for _ in range(10):
        t.admit()
        t.answered(code)
    assert (t.rejection_probability() == 0.0) is accept


@pytest.mark.parametrize("bad", [dict(multiplier=0.9), dict(multiplier=float("nan")), dict(window=0),
                                 dict(window=float("inf")), dict(min_requests=-1)])
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


@pytest.fixture
def serve():
    started = []

    def start(servicer):
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_ToolAuthorizerServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        started.append(server)
        return f"127.0.0.1:{port}"

    yield start
    for server in started:
        server.stop(None)


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


def test_a_refusing_sidecar_sees_a_fraction_of_the_calls(serve):
    servicer = Refusing()
    with AuthzClient(serve(servicer), retry=NO_RETRY) as client:
        codes = _codes(client, 300)
        verified = [client.verify("not-a-token", ALICE, _proposed(1)) for _ in range(30)]
    assert all(code is not None and code[1] == RE for code in codes)
    throttled = sum(1 for code in codes if code[0])
    # 20 before throttling starts; then about 1.1 x accepts (none) + 1 in (requests + 1):
    # the chance of a call through falls as 1/(n+1), so a few dozen at most.
    assert servicer.seen["Authorize"] == 300 - throttled
    assert servicer.seen["Authorize"] < 60
    assert throttled > 240
    assert servicer.seen["Verify"] == 30 and all(not v.valid for v in verified)  # never throttled


def test_without_a_throttle_every_call_reaches_the_sidecar(serve):
    servicer = Refusing()
    with AuthzClient(serve(servicer), retry=NO_RETRY, throttle=None) as client:
        codes = _codes(client, 100)
    assert servicer.seen["Authorize"] == 100
    assert all(code == (False, RE) for code in codes)


def test_a_healthy_sidecar_sees_every_call(serve):
    servicer = Answering()
    with AuthzClient(serve(servicer), retry=NO_RETRY) as client:
        codes = _codes(client, 200)
    assert codes == [None] * 200 and servicer.seen["Authorize"] == 200


def test_the_async_client_throttles_the_same_way(serve):
    servicer = Refusing()
    address = serve(servicer)

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
