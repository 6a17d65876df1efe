"""A CANCELLED status from the sidecar's side (gRPC's core refusing a call when the
backlog of calls its server has not yet taken is full) means the call was not decided:
the Guard reports `authorization_unavailable`, transient, as for UNAVAILABLE, never runs
the tool and does not retry it itself. A user's own cancellation stays `cancelled`: in
asyncio it is the task's CancelledError, never an RpcError."""

from __future__ import annotations

import asyncio
import threading

import grpc
import pytest

from toolauthz.client import (
    AsyncAuthzClient,
    AsyncGuard,
    AuthzClient,
    Guard,
    Principal,
    ToolSet,
    TrustedContext,
)
from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb
from toolauthz.proto.toolauthz.v1 import authorizer_pb2_grpc as pb_grpc

CONTEXT = TrustedContext("acme", Principal("User", "alice"), "run-1")
ARGS = '{"order_id": "ord_1"}'


class CancellingSidecar(pb_grpc.ToolAuthorizerServicer):
    """Answers every decision CANCELLED, as gRPC's core does when its backlog is full;
    with `hold` set, Authorize waits for it instead (a call in flight)."""

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.reports: list[tuple[int, str]] = []
        self.hold: threading.Event | None = None
        self.held = threading.Event()

    def Authorize(self, request, context):
        self.asked.append("Authorize")
        if self.hold is not None:
            self.held.set()
            self.hold.wait(10)
        context.abort(grpc.StatusCode.CANCELLED, "backlog full")

    def AuthorizeBatch(self, request, context):
        self.asked.append("AuthorizeBatch")
        context.abort(grpc.StatusCode.CANCELLED, "backlog full")

    def ReportOutcome(self, request, context):
        self.reports.append((request.status, request.error_code))
        return pb.ReportOutcomeResponse(decision_id="")


@pytest.fixture
def sidecar(serve_authorizer):
    fake = CancellingSidecar()
    yield fake, serve_authorizer(fake)
    if fake.hold is not None:
        fake.hold.set()  # before the server stops


class Runs:
    def __init__(self) -> None:
        self.count = 0
        self.tools = ToolSet()
        self.tools.register("lookup_order", self.lookup)

    def lookup(self, args, call):
        self.count += 1
        return {"order_id": args["order_id"]}


UNAVAILABLE_REPORTED = [(pb.FAILED, "authorization_unavailable")]


def test_the_blocking_guard_reports_a_cancelled_authorize_as_unavailable(sidecar):
    fake, address = sidecar
    runs = Runs()
    with AuthzClient(address, timeout=5) as client:
        guard = Guard(client, CONTEXT, runs.tools)
        result = guard.run("toolu_1", "lookup_order", ARGS)
        turn = guard.run_turn([("t1", "lookup_order", ARGS), ("t2", "lookup_order", ARGS)])
    assert [(r.status, r.code, r.executed) for r in (result, *turn)] == [
        ("failed", "authorization_unavailable", False)] * 3
    assert "right now" in result.content and result.decision_id == ""
    assert runs.count == 0
    assert fake.asked == ["Authorize", "AuthorizeBatch"]  # not retried by the SDK
    assert fake.reports == UNAVAILABLE_REPORTED * 3


def test_the_async_guard_reports_a_cancelled_authorize_as_unavailable(sidecar):
    fake, address = sidecar
    runs = Runs()

    async def scenario():
        async with AsyncAuthzClient(address, timeout=5) as client:
            guard = AsyncGuard(client, CONTEXT, runs.tools)
            return [await guard.run("toolu_1", "lookup_order", ARGS),
                    *await guard.run_turn([("t1", "lookup_order", ARGS), ("t2", "lookup_order", ARGS)])]

    results = asyncio.run(scenario())
    assert [(r.status, r.code, r.executed) for r in results] == [("failed", "authorization_unavailable", False)] * 3
    assert runs.count == 0
    assert fake.asked == ["Authorize", "AuthorizeBatch"]
    assert fake.reports == UNAVAILABLE_REPORTED * 3


def test_the_users_own_cancellation_in_asyncio_stays_cancelled(sidecar):
    fake, address = sidecar
    fake.hold = threading.Event()
    runs = Runs()

    async def scenario():
        async with AsyncAuthzClient(address, timeout=10) as client:
            guard = AsyncGuard(client, CONTEXT, runs.tools)
            task = asyncio.create_task(guard.run("toolu_1", "lookup_order", ARGS))
            assert await asyncio.to_thread(fake.held.wait, 5)  # the Authorize is in flight
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return guard.result("toolu_1")

    result = asyncio.run(scenario())
    assert result is not None and (result.status, result.code) == ("cancelled", "cancelled")
    assert runs.count == 0
    assert fake.reports == [(pb.CANCELLED, "cancelled")]
