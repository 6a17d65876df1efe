"""Approval watches wait on the event loop, within limits per caller and per process.

Many runtimes waiting for a person must leave the sidecar answering: 500 watches open
on one server, Authorize and QueryDecisions still answer, and a decision reaches its
watcher. Over a limit a watch is RESOURCE_EXHAUSTED, and its place comes back however
the watch ends (terminal status, client cancel, deadline, server stop).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import grpc
import pytest
from conftest import make_request, order_entity
from grpc_health.v1 import health_pb2, health_pb2_grpc

from toolauthz.approvals import ApprovalDesk
from toolauthz.errors import ResourceExhaustedError, ToolAuthzError
from toolauthz.model import Principal, TrustedContext
from toolauthz.proto.toolauthz.v1 import approvals_pb2 as apb
from toolauthz.proto.toolauthz.v1 import approvals_pb2_grpc as apb_grpc
from toolauthz.proto.toolauthz.v1 import audit_pb2 as aupb
from toolauthz.proto.toolauthz.v1 import audit_pb2_grpc as aupb_grpc
from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb
from toolauthz.proto.toolauthz.v1 import authorizer_pb2_grpc as pb_grpc
from toolauthz.server.build import build_sidecar, create_server
from toolauthz.server.config import Settings, load_settings
from toolauthz.service import watching
from toolauthz.service.callers import UNAUTHENTICATED
from toolauthz.service.watching import WatchLimits

OPEN = 500
LARGE = {"order_id": "ord_1", "amount_cents": 6000, "reason": "parcel lost"}
GENEROUS = 30.0  # seconds: a deadline that only a hang reaches
BOB = TrustedContext("acme", Principal("User", "bob"), "approval-ui")


@pytest.fixture
def settings(settings):
    """Room for OPEN watches; each takes one of the max_streaming_rpcs places (1000), and
    `max_watches` stays below max_concurrent_rpcs too (the HTTP API's waits count there)."""
    return Settings.model_validate({**settings.model_dump(), "max_concurrent_rpcs": 1024,
                                    "approvals": {"max_watches_per_caller": OPEN + 10, "max_watches": OPEN + 10}})


def pending_request(i: int) -> pb.AuthorizeRequest:
    """60.00 waiting for approval, by one of 20 customers (each refunding their own order):
    a pending approval holds its share of the customer's daily refund budget."""
    customer = f"customer{i % 20}"
    return make_request(args=LARGE, call_id=f"toolu_{i}", request_id=f"run-{i}", principal=customer,
                        entities=[order_entity("ord_1", customer)])


async def open_pending(channel: grpc.aio.Channel, count: int) -> list[str]:
    stub = pb_grpc.ToolAuthorizerStub(channel)
    answers = await asyncio.gather(*(stub.Authorize(pending_request(i), timeout=GENEROUS) for i in range(count)))
    assert {a.decision for a in answers} == {pb.APPROVAL_REQUIRED}
    return [a.approval_id for a in answers]


def watch(channel: grpc.aio.Channel, approval_id: str, timeout: float = GENEROUS):
    return apb_grpc.ApprovalsStub(channel).WatchApproval(apb.GetApprovalRequest(approval_id=approval_id),
                                                         timeout=timeout)


async def opened(channel: grpc.aio.Channel, approval_id: str, timeout: float = GENEROUS):
    """A watch whose first message (the approval, pending) has arrived."""
    stream = watch(channel, approval_id, timeout)
    first = await stream.read()
    assert first.status == apb.PENDING
    return stream


async def refused(stream) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stream.read()
    return info.value


def run(scenario) -> object:
    return asyncio.run(asyncio.wait_for(scenario, 60))


def released(sidecar, count: int = 0) -> bool:
    return sidecar.watches.wait_until_at_most(count, GENEROUS)


def test_five_hundred_open_watches_leave_the_sidecar_answering(sidecar, server):
    _srv, port = server

    async def scenario():
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            ids = await open_pending(channel, OPEN)
            streams = await asyncio.gather(*(opened(channel, approval_id) for approval_id in ids))
            assert sidecar.watches.open_watches() == OPEN

            authorized = await pb_grpc.ToolAuthorizerStub(channel).Authorize(
                make_request(call_id="toolu_small", request_id="run-small"), timeout=GENEROUS)
            assert authorized.decision == pb.ALLOW and authorized.token
            query = aupb_grpc.AuditStub(channel).QueryDecisions(aupb.QueryDecisionsRequest(limit=3),
                                                                timeout=GENEROUS)
            assert [r.seq async for r in query] == [1, 2, 3]

            decided = await apb_grpc.ApprovalsStub(channel).DecideApproval(apb.DecideApprovalRequest(
                approval_id=ids[250], verdict=apb.APPROVE, reason="checked",
                approver=pb.TrustedContext(tenant="acme", principal=pb.Principal(type="User", id="bob"),
                                           request_id="approval-ui")), timeout=GENEROUS)
            assert decided.status == apb.APPROVED
            delivered = await streams[250].read()
            assert delivered.status == apb.APPROVED and delivered.approval_id == ids[250]
            assert await streams[250].read() is grpc.aio.EOF

            for stream in streams:
                stream.cancel()

    run(scenario())
    assert released(sidecar)


def test_open_watches_take_stream_places_and_leave_the_unary_places_to_decisions(settings, clock):
    """As configured through the sidecar's own server: 3 approval watches and 2 health
    watches, more streams than the 4 unary places, and Authorize still answers; one stream
    more is over max_streaming_rpcs."""
    tight = Settings.model_validate({**settings.model_dump(), "max_concurrent_rpcs": 4, "max_streaming_rpcs": 5,
                                     "approvals": {"max_watches_per_caller": 3, "max_watches": 3}})
    car = build_sidecar(tight, clock=clock)
    srv, port = create_server(car, "127.0.0.1:0")

    async def scenario():
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            ids = await open_pending(channel, 3)
            streams = [await opened(channel, approval_id) for approval_id in ids]
            health: Any = health_pb2_grpc.HealthStub(channel)
            for _ in range(2):
                streams.append(health.Watch(health_pb2.HealthCheckRequest(), timeout=GENEROUS))
                assert (await streams[-1].read()).status == health_pb2.HealthCheckResponse.SERVING
            stub = pb_grpc.ToolAuthorizerStub(channel)
            for i in range(4):
                answer = await stub.Authorize(make_request(call_id=f"toolu_free{i}"), timeout=GENEROUS)
                assert answer.decision == pb.ALLOW and answer.token
            error = await refused(health.Watch(health_pb2.HealthCheckRequest(), timeout=GENEROUS))
            assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "too many streams" in error.details()
            for stream in streams:
                stream.cancel()

    try:
        run(scenario())
    finally:
        srv.stop(None)
        car.close()


def test_a_decision_made_by_another_process_reaches_the_watch(sidecar, server, monkeypatch):
    """Another worker shares the database, not the pokes: the watch looks again within
    MAX_WATCH_WAIT (shortened here)."""
    monkeypatch.setattr(watching, "MAX_WATCH_WAIT", 0.05)
    _srv, port = server

    async def scenario():
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            [approval_id] = await open_pending(channel, 1)
            stream = await opened(channel, approval_id)
            # This process hears nothing of the decision, as another worker's would not.
            with monkeypatch.context() as deaf:
                deaf.setattr(sidecar.approvals.listeners, "tell", lambda approval_id: None)
                await asyncio.to_thread(sidecar.approvals.decide, approval_id, BOB, "APPROVE")
            assert (await stream.read()).status == apb.APPROVED

    run(scenario())


@pytest.mark.parametrize(("limits", "message"), [
    ({"max_watches_per_caller": 2, "max_watches": 10}, "approvals.max_watches_per_caller"),
    ({"max_watches_per_caller": 10, "max_watches": 2}, "approvals.max_watches"),
])
def test_a_watch_over_the_limit_is_resource_exhausted(sidecar, limits, message):
    """Every unauthenticated caller is the one caller `unauthenticated`."""
    sidecar.watches = WatchLimits(per_caller=limits["max_watches_per_caller"], total=limits["max_watches"])
    server, port = create_server(sidecar, "127.0.0.1:0")

    async def scenario():
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            ids = await open_pending(channel, 3)
            first = await opened(channel, ids[0])
            await opened(channel, ids[1])
            error = await refused(watch(channel, ids[2]))
            assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert message in error.details()
            first.cancel()
            assert await asyncio.to_thread(released, sidecar, 1)
            await opened(channel, ids[2])  # the place given back is taken again

    try:
        run(scenario())
    finally:
        server.stop(None)


def test_the_place_comes_back_when_the_watch_ends(sidecar, server):
    _srv, port = server

    async def scenario():
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            approvals = apb_grpc.ApprovalsStub(channel)
            ids = await open_pending(channel, 3)

            decided = await opened(channel, ids[0])  # ends with its terminal status
            await approvals.DecideApproval(apb.DecideApprovalRequest(
                approval_id=ids[0], verdict=apb.REJECT,
                approver=pb.TrustedContext(tenant="acme", principal=pb.Principal(type="User", id="bob"),
                                           request_id="approval-ui")), timeout=GENEROUS)
            assert (await decided.read()).status == apb.REJECTED
            assert await decided.read() is grpc.aio.EOF
            assert await asyncio.to_thread(released, sidecar)

            cancelled = await opened(channel, ids[1])
            cancelled.cancel()
            assert await asyncio.to_thread(released, sidecar)

            late = await opened(channel, ids[2], timeout=0.5)  # its deadline passes while it waits
            assert (await refused(late)).code() == grpc.StatusCode.DEADLINE_EXCEEDED
            assert await asyncio.to_thread(released, sidecar)

            unknown = await refused(watch(channel, "01NOSUCHAPPROVAL"))
            assert unknown.code() == grpc.StatusCode.NOT_FOUND
            assert await asyncio.to_thread(released, sidecar)

    run(scenario())


def test_stopping_the_server_gives_back_every_place(sidecar):
    server, port = create_server(sidecar, "127.0.0.1:0")

    async def scenario():
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            ids = await open_pending(channel, 3)
            streams = [await opened(channel, approval_id) for approval_id in ids]
            assert sidecar.watches.open_watches(UNAUTHENTICATED.id) == 3
            await asyncio.to_thread(server.stop, None)
            for stream in streams:
                assert (await refused(stream)).code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)

    try:
        run(scenario())
    finally:
        server.stop(None)
    assert sidecar.watches.open_watches() == 0


def test_limits_count_each_caller_apart():
    limits = WatchLimits(per_caller=2, total=3)
    alice = [limits.admit("alice"), limits.admit("alice")]
    with pytest.raises(ResourceExhaustedError, match="`alice` has 2 approval watches open"):
        limits.admit("alice")
    bob = limits.admit("bob")
    with pytest.raises(ResourceExhaustedError, match="the sidecar has 3"):
        limits.admit("carol")
    alice[0].release()
    alice[0].release()  # a second release gives nothing back twice
    assert (limits.open_watches("alice"), limits.open_watches()) == (1, 2)
    carol = limits.admit("carol")
    for slot in (alice[1], bob, carol):
        slot.release()
    assert limits.open_watches() == 0 and limits._open == {}


def test_the_desk_tells_its_listeners_which_approval_changed(sidecar, stub):
    class Heard:
        def __init__(self):
            self.ids: list[str | None] = []

        def changed(self, approval_id):
            self.ids.append(approval_id)

    desk: ApprovalDesk = sidecar.approvals
    heard = Heard()
    desk.subscribe(heard)
    response = stub.Authorize(make_request(args=LARGE))
    desk.decide(response.approval_id, BOB, "APPROVE")
    desk.poke()
    desk.unsubscribe(heard)
    desk.poke()
    assert heard.ids == [response.approval_id, None]


def test_config_reads_the_watch_limits(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps({"approvals": {"max_watches_per_caller": 8, "max_watches": 100}}))
    approvals = load_settings(path).approvals
    assert (approvals.max_watches_per_caller, approvals.max_watches) == (8, 100)
    defaults = load_settings().approvals
    assert (defaults.max_watches_per_caller, defaults.max_watches) == (64, 128)


def test_watches_must_leave_places_to_the_other_calls(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps({"max_concurrent_rpcs": 100, "approvals": {"max_watches": 100}}))
    with pytest.raises(ToolAuthzError, match=r"^invalid config: approvals.max_watches \(100\) must be below "):
        load_settings(path)
    path.write_text(json.dumps({"max_streaming_rpcs": 100, "approvals": {"max_watches": 100}}))
    with pytest.raises(ToolAuthzError, match=r"approvals.max_watches \(100\) must be below max_streaming_rpcs"):
        load_settings(path)
