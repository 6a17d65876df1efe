"""Review of the clients' adaptive throttling (`toolauthz.client.throttle`): many threads
on one throttle, recovery after an overload, a cancelled asyncio call, and the Guards
failing closed (`authorization_unavailable`, no tool run) on a call refused here."""

from __future__ import annotations

import asyncio
import socket
import threading

import grpc
import pytest

from toolauthz.client import (
    NO_RETRY,
    AsyncAuthzClient,
    AsyncGuard,
    AuthzClient,
    Guard,
    Principal,
    ProposedCall,
    Throttled,
    ThrottlePolicy,
    ToolSet,
    TrustedContext,
)
from toolauthz.client.throttle import AdaptiveThrottle
from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb
from toolauthz.proto.toolauthz.v1 import authorizer_pb2_grpc as pb_grpc

ALICE = TrustedContext("acme", Principal("User", "alice"), "run-1")
RE = grpc.StatusCode.RESOURCE_EXHAUSTED
ARGS = '{"order_id": "ord_1", "amount_cents": 1}'


def test_many_threads_lose_no_count():
    t = AdaptiveThrottle(ThrottlePolicy(), clock=lambda: 5.0, rand=lambda: 1.0)  # 1.0: never refused

    def work() -> None:
        for _ in range(2000):
            t.admit()
            t.answered(None)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert sum(t._requests) == sum(t._answered) == 16_000 and sum(t._refused) == 0
    assert t.rejection_probability() == 0.0


class Slow(pb_grpc.ToolAuthorizerServicer):
    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()

    def Authorize(self, request, context):
        self.started.set()
        self.release.wait(10)
        return pb.AuthorizeResponse(decision=pb.ALLOW, decision_id="d")


def test_a_cancelled_async_call_counts_as_answered_not_as_an_overload(serve_authorizer):
    servicer = Slow()
    address = serve_authorizer(servicer)

    async def scenario() -> AdaptiveThrottle:
        async with AsyncAuthzClient(address, retry=NO_RETRY) as client:
            call = ProposedCall.of("toolu_1", "issue_refund", ARGS)
            task = asyncio.ensure_future(client.authorize(ALICE, call))
            while not servicer.started.is_set():
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert client.throttle is not None
            return client.throttle

    try:
        t = asyncio.run(scenario())
    finally:
        servicer.release.set()
    assert (sum(t._requests), sum(t._answered), sum(t._refused)) == (1, 1, 0)


def _shut() -> AdaptiveThrottle:
    """A throttle that refuses every call from now on."""
    t = AdaptiveThrottle(ThrottlePolicy(min_requests=0), rand=lambda: 0.0)
    for _ in range(10):
        try:
            t.admit()
        except Throttled:
            pass
    return t


def _unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tools(runs: list) -> ToolSet:
    tools = ToolSet()

    def refund(args, call):
        runs.append(call)
        return {"refund_id": "rf"}

    tools.register("issue_refund", refund)
    return tools


def test_the_guard_fails_closed_on_a_throttled_call():
    runs: list = []
    with AuthzClient(f"127.0.0.1:{_unused_port()}", timeout=1, retry=NO_RETRY) as client:
        client.throttle = _shut()
        guard = Guard(client, ALICE, _tools(runs))
        one = guard.run("toolu_1", "issue_refund", ARGS)
        turn = guard.run_turn([("toolu_2", "issue_refund", ARGS), ("toolu_3", "issue_refund", ARGS)])
    assert [(r.status, r.code) for r in [one, *turn]] == [("failed", "authorization_unavailable")] * 3
    assert runs == []


def test_the_async_guard_fails_closed_on_a_throttled_call():
    runs: list = []

    async def scenario():
        async with AsyncAuthzClient(f"127.0.0.1:{_unused_port()}", timeout=1, retry=NO_RETRY) as client:
            client.throttle = _shut()
            guard = AsyncGuard(client, ALICE, _tools(runs))
            one = await guard.run("toolu_1", "issue_refund", ARGS)
            turn = await guard.run_turn([("toolu_2", "issue_refund", ARGS), ("toolu_3", "issue_refund", ARGS)])
            return [one, *turn]

    results = asyncio.run(asyncio.wait_for(scenario(), 20))
    assert [(r.status, r.code) for r in results] == [("failed", "authorization_unavailable")] * 3
    assert runs == []


def test_a_closed_client_is_not_an_overload():
    """A call that fails in the client before any answer (here: the channel is closed) is
    no overload: the application keeps seeing that error, never `Throttled` in its place."""
    client = AuthzClient(f"127.0.0.1:{_unused_port()}", timeout=1, retry=NO_RETRY)
    client.close()
    errors = set()
    for i in range(60):
        try:
            client.authorize(ALICE, ProposedCall.of(f"toolu_{i}", "issue_refund", ARGS))
        except Exception as exc:  # noqa: BLE001 - what the application sees
            errors.add(type(exc).__name__)
    assert errors == {"ValueError"}, errors


def test_a_closed_async_client_is_not_an_overload():
    async def scenario() -> set:
        client = AsyncAuthzClient(f"127.0.0.1:{_unused_port()}", timeout=1, retry=NO_RETRY)
        await client.close()
        errors = set()
        for i in range(60):
            try:
                await client.authorize(ALICE, ProposedCall.of(f"toolu_{i}", "issue_refund", ARGS))
            except Exception as exc:  # noqa: BLE001 - what the application sees
                errors.add(type(exc).__name__)
        return errors

    errors = asyncio.run(scenario())
    assert "Throttled" not in errors and len(errors) == 1, errors
