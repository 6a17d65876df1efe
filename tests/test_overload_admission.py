"""Graceful overload through a real gRPC server on port 0 (server/pump.py, server/admission.py):
a call the decision queue cannot take in time is refused at once, RESOURCE_EXHAUSTED with
no token and an aggregate audit record; a call that cannot be decided before its own
deadline likewise; and a client multiplexing many calls on one connection neither starves
a client with one call at a time nor is starved itself. The pump's clock is injected, so
what a plan takes is what the test says; outcomes are counted, never timed."""

from __future__ import annotations

import threading

import grpc
import pytest
from conftest import make_request

from toolauthz.audit.store import AuditQuery
from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb
from toolauthz.proto.toolauthz.v1 import authorizer_pb2_grpc as pb_grpc
from toolauthz.server.admission import FairQueue
from toolauthz.server.pump import DecisionPump
from toolauthz.service.refusals import DECISION_RPCS, OVERLOADED, SYSTEM_STREAM, shed_recorder


class Ticks:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class HeldWrites:
    """Every ledger write waits for `release`; the clock moves `advance` seconds as it is
    let through, which is what the pump then measures a plan to take."""

    def __init__(self, sidecar, ticks: Ticks, monkeypatch) -> None:
        self.entered, self.release, self.advance, self.ticks = threading.Event(), threading.Event(), 0.0, ticks
        self.holding = True
        real_apply = sidecar.ledger.apply

        def held_apply(ops):
            if self.holding:
                self.entered.set()
                self.release.wait(30)
                self.ticks.now += self.advance
            return real_apply(ops)

        monkeypatch.setattr(sidecar.ledger, "apply", held_apply)

    def rearm(self, advance: float) -> None:
        self.entered, self.release, self.advance = threading.Event(), threading.Event(), advance


@pytest.fixture
def ticks() -> Ticks:
    return Ticks()


@pytest.fixture
def serve(sidecar, ticks):
    """`serve(bound, max_batch)`: the sidecar's pump replaced by one on the test's clock
    (no short queue exempt, no inline decision: every call goes through the queue), and
    the address of a server of it on port 0."""
    from toolauthz.server.build import create_server

    servers = []

    def start(bound: float, max_batch: int = 256) -> str:
        sidecar.pump.close()
        sidecar.pump = DecisionPump(sidecar.authorizer, inline_after=None, clock=ticks, max_queue_seconds=bound,
                                    min_queue=0, max_batch=max_batch)
        sidecar.pump.on_shed = shed_recorder(sidecar.gate.refusals)
        srv, port = create_server(sidecar, "127.0.0.1:0")
        servers.append(srv)
        return f"127.0.0.1:{port}"

    yield start
    for srv in servers:
        srv.stop(None)


def _stub(address: str) -> tuple[grpc.Channel, pb_grpc.ToolAuthorizerStub]:
    # Its own connection: channels with equal arguments in one process would share one.
    channel = grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
    return channel, pb_grpc.ToolAuthorizerStub(channel)


def _authorize(stub, call_id: str, timeout: float = 30):
    return stub.Authorize.future(make_request(call_id=call_id, request_id=f"run-{call_id}"), timeout=timeout)


def _code(future) -> grpc.StatusCode:
    try:
        future.result()
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def _teach(held: HeldWrites, stub, seconds_per_plan: float) -> None:
    """One decision, through the held write, that the pump measures as `seconds_per_plan`."""
    held.rearm(seconds_per_plan)
    first = _authorize(stub, "teach")
    assert held.entered.wait(30)
    held.release.set()
    assert first.result().decision == pb.ALLOW


def _shed_records(car) -> list:
    car.gate.refusals.flush(everything=True)
    return [r.event for r in car.audit_log.query(AuditQuery(result="refused"), limit=50)
            if r.event.error_codes == (OVERLOADED,)]


def test_a_call_the_queue_cannot_take_in_time_is_refused_at_once_undecided_and_audited(
        sidecar, serve, ticks, monkeypatch):
    held = HeldWrites(sidecar, ticks, monkeypatch)
    channel, stub = _stub(serve(0.25))
    with channel:
        _teach(held, stub, 0.2)  # a plan takes 0.2 s: one more behind a running one waits 0.4 s
        held.rearm(0.0)
        busy = _authorize(stub, "busy")
        assert held.entered.wait(30)
        refused = _authorize(stub, "refused")
        code = _code(refused)  # answered while the pump is still held: refused without waiting for it
        held.release.set()
        assert busy.result().decision == pb.ALLOW and busy.result().token
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "overloaded" in refused.exception().details()
    assert sidecar.ledger.get("acme", "refused") is None  # never decided: no ledger row, no token
    assert sidecar.pump.shed == 1
    [record] = _shed_records(sidecar)
    assert record.tenant == SYSTEM_STREAM and record.result == "refused" and record.caller == ""
    assert record.detail["count"] == 1 and record.detail["rpc"] == DECISION_RPCS


def test_a_call_that_cannot_be_decided_before_its_deadline_is_refused_at_once(sidecar, serve, ticks, monkeypatch):
    held = HeldWrites(sidecar, ticks, monkeypatch)
    channel, stub = _stub(serve(600.0))  # the queue's bound far away: only a deadline refuses
    with channel:
        _teach(held, stub, 10.0)  # a plan takes 10 s on the pump's clock
        held.rearm(0.0)
        busy = _authorize(stub, "busy", timeout=120)
        assert held.entered.wait(30)
        hopeless = _authorize(stub, "hopeless", timeout=15)  # 20 s of plans until its answer
        hopeful = _authorize(stub, "hopeful", timeout=120)  # 30 s of plans: in time
        hopeless_code = _code(hopeless)  # answered while the pump is still held
        held.release.set()
        assert busy.result().decision == pb.ALLOW
        assert hopeful.result().decision == pb.ALLOW
    assert hopeless_code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "deadline" in hopeless.exception().details()
    assert sidecar.ledger.get("acme", "hopeless") is None
    assert sum(r.detail["count"] for r in _shed_records(sidecar)) == 1


def test_a_multiplexing_connection_neither_starves_a_lone_client_nor_is_starved(sidecar, serve, ticks, monkeypatch):
    """One connection sends 40 calls at once while the pump is held; the queue's bound
    (0.245 s at 0.01 s a plan, one plan running) takes 23 of them and refuses the rest.
    Then a client on another connection sends one call at a time: each is admitted (its
    turn comes in the next round, whatever the other connection has queued) and decided
    in the first batch of two after the pump is let go, while every call the multiplexer
    had admitted is decided too. Counted in the order of the decisions' audit records."""
    held = HeldWrites(sidecar, ticks, monkeypatch)
    pushed, real_push = threading.Event(), FairQueue.push

    def push(queue, job) -> None:
        real_push(queue, job)
        pushed.set()

    monkeypatch.setattr(FairQueue, "push", push)
    address = serve(0.245, max_batch=2)
    many_channel, many = _stub(address)
    lone_channel, lone = _stub(address)
    with many_channel, lone_channel:
        _teach(held, many, 0.01)
        held.rearm(0.0)
        busy = _authorize(many, "busy")
        assert held.entered.wait(30)
        refusals_answered, answered, lock = threading.Event(), [0], threading.Lock()

        def on_answer(future) -> None:
            if _code(future) == grpc.StatusCode.RESOURCE_EXHAUSTED:
                with lock:
                    answered[0] += 1
                    if answered[0] == 17:
                        refusals_answered.set()

        flood = [_authorize(many, f"many-{i}") for i in range(40)]
        for future in flood:
            future.add_done_callback(on_answer)
        assert refusals_answered.wait(30)  # 17 refused while the pump is held: the 23 queued before
        pushed.clear()
        first_lone = _authorize(lone, "lone-1")
        assert pushed.wait(30)  # queued
        held.holding = False  # every later write goes straight through
        held.release.set()
        lone_codes = [_code(first_lone)] + [_code(_authorize(lone, f"lone-{i}")) for i in range(2, 6)]
        many_codes = [_code(f) for f in flood]
        assert busy.result().decision == pb.ALLOW
    assert lone_codes == [grpc.StatusCode.OK] * 5  # the lone client is never refused
    assert many_codes.count(grpc.StatusCode.OK) == 23 and many_codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED) == 17
    order = [r.event.call_id for r in sidecar.audit_log.query(AuditQuery(kind="authorize"), limit=200)
             if r.event.result != "refused" and r.event.call_id.startswith(("many-", "lone-"))]
    assert order.index("lone-1") < 2  # in the first batch of two after the release, not after 23 of the other's

