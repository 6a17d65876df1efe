"""Fail closed: deadlines, cancellation, floods and unexpected errors never end in a token."""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent import futures

import grpc
import pytest
from conftest import hold_ledger_writes, make_request

from toolauthz.audit.store import AuditQuery
from toolauthz.model import Principal, ProposedCall, TrustedContext
from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb
from toolauthz.service.authorizer import ToolAuthorizerService
from toolauthz.service.common import proposed_call, trusted_context


class FakeContext:
    """Just enough of grpc.aio.ServicerContext to drive a handler directly."""

    def __init__(self, remaining: float | None = 10.0):
        self.remaining, self.aborted = remaining, None

    def time_remaining(self):
        return self.remaining

    def invocation_metadata(self):
        return ()

    def peer(self):
        return "ipv4:127.0.0.1:1"

    async def abort(self, code, details):
        self.aborted = (code, details)
        raise grpc.RpcError(details)


def service(sidecar) -> ToolAuthorizerService:
    return ToolAuthorizerService(sidecar.authorizer, sidecar.pump, sidecar.keyring, sidecar.status,
                                 gate=sidecar.gate)


def authorize(sidecar, request, ctx):
    return asyncio.run(service(sidecar).Authorize(request, ctx))


def test_expired_deadline_is_refused_before_any_work(sidecar):
    ctx = FakeContext(remaining=-0.5)
    with pytest.raises(grpc.RpcError):
        authorize(sidecar, make_request(), ctx)
    assert ctx.aborted[0] == grpc.StatusCode.DEADLINE_EXCEEDED
    assert sidecar.ledger.get("acme", "toolu_1") is None
    assert sidecar.audit_log.head()[0] == 1  # record 1: the bundle loaded at start-up


def test_client_gone_before_the_token_means_no_token(sidecar, monkeypatch):
    """The client cancels while its call's decision is being stored: the handler is
    cancelled, the decision is still recorded, and the token is handed to no one."""
    entered, release = hold_ledger_writes(monkeypatch, sidecar)

    async def cancelled_while_deciding():
        call = asyncio.ensure_future(service(sidecar).Authorize(make_request(), FakeContext()))
        await asyncio.get_running_loop().run_in_executor(None, entered.wait, 30)
        call.cancel()
        [outcome] = await asyncio.gather(call, return_exceptions=True)
        release.set()
        return outcome

    assert isinstance(asyncio.run(cancelled_while_deciding()), asyncio.CancelledError)
    sidecar.pump.close()  # waits for the batch in flight
    [record] = sidecar.audit_log.query(AuditQuery(call_id="toolu_1"), limit=5)
    assert record.event.result == "ALLOW"
    monkeypatch.undo()
    retry = sidecar.authorizer.authorize(trusted_context(make_request().context), proposed_call(make_request().call),
                                         caller="unauthenticated")  # the caller of the cancelled RPC
    assert retry.replayed and retry.token  # the decision stands; the retry gets its token


def test_deadline_passing_during_the_decision_means_no_token(sidecar):
    ctx = FakeContext(remaining=10.0)
    original = sidecar.authorizer.ledger.apply

    def slow_apply(ops):
        ctx.remaining = 0.0  # the deadline runs out while the decision is being stored
        return original(ops)

    sidecar.authorizer.ledger.apply = slow_apply
    response = authorize(sidecar, make_request(), ctx)
    assert response.token == ""
    # The decision stands (a retry replays it); the token minted for it went to no one.
    [record] = sidecar.audit_log.query(AuditQuery(call_id="toolu_1"), limit=5)
    assert record.event.result == "ALLOW"


def test_flood_beyond_the_concurrency_limit_is_refused_fast(settings, clock):
    from toolauthz.proto.toolauthz.v1 import authorizer_pb2_grpc as pb_grpc
    from toolauthz.server.build import build_sidecar, create_server

    car = build_sidecar(settings.model_copy(update={"max_concurrent_rpcs": 2}), clock=clock)
    entered, release = threading.Semaphore(0), threading.Event()
    real_apply, real_answer = car.authorizer.ledger.apply, car.pump.answer

    def held_apply(ops):  # the pump's first batch waits here; the rest queue behind it
        release.wait(30)
        return real_apply(ops)

    async def counted_answer(make_plan, **turn):  # a call has reached its handler: it is in flight
        entered.release()
        return await real_answer(make_plan, **turn)

    car.authorizer.ledger.apply = held_apply  # type: ignore[method-assign]
    car.pump.answer = counted_answer  # type: ignore[method-assign]
    srv, port = create_server(car, "127.0.0.1:0")
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = pb_grpc.ToolAuthorizerStub(ch)
            held = [stub.Authorize.future(make_request(call_id=f"held{i}"), timeout=30) for i in range(2)]
            for _ in held:
                assert entered.acquire(timeout=30)
            with pytest.raises(grpc.RpcError) as info:
                stub.Authorize(make_request(call_id="flood"), timeout=30)
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            release.set()
            assert [f.result().decision for f in held] == [pb.ALLOW, pb.ALLOW]
        assert car.ledger.get("acme", "flood") is None
    finally:
        release.set()
        srv.stop(None)
        car.close()


def test_unexpected_error_is_internal_generic_and_logged(sidecar, stub, caplog, monkeypatch):
    import toolauthz.authorizer.deciding as authorizer_module

    def explode(*args, **kwargs):
        raise RuntimeError("cedar exploded: secret internals")

    monkeypatch.setattr(authorizer_module, "evaluate", explode)
    with caplog.at_level(logging.ERROR):
        with pytest.raises(grpc.RpcError) as info:
            stub.Authorize(make_request())
    assert info.value.code() == grpc.StatusCode.INTERNAL and info.value.details() == "internal error"
    assert "cedar exploded" in caplog.text
    # The decision rolled back: nothing is recorded, so the call id is not poisoned by a
    # passing fault, and a retry is decided afresh.
    assert sidecar.ledger.get("acme", "toolu_1") is None
    monkeypatch.undo()
    retry = stub.Authorize(make_request())
    assert retry.decision == pb.ALLOW and retry.token and not retry.replayed


def test_racing_authorizations_of_one_call_id_decide_once(sidecar):
    """Two runtimes racing the same call id: one decision, the other replays or waits."""
    ctx = TrustedContext("acme", Principal("User", "alice"), "run-1",
                         make_request().context.entities_json)
    call = ProposedCall("toolu_race", "issue_refund", make_request().call.input_json)
    barrier = threading.Barrier(6)

    def one():
        barrier.wait()
        return sidecar.authorizer.authorize(ctx, call)

    with futures.ThreadPoolExecutor(6) as pool:
        results = list(pool.map(lambda _: one(), range(6)))
    decision_ids = {r.decision_id for r in results if not r.errors}
    assert len(decision_ids) == 1
    assert sum(1 for r in results if not r.replayed and not r.errors) == 1
    assert all(r.decision.value == "ALLOW" or r.errors[0].code == "call_in_progress" for r in results)
