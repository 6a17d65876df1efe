"""The grpc.aio server behind its blocking surface: binding, streams that clients leave,
stopping with calls in flight."""

from __future__ import annotations

import socket
import threading

import grpc
import pytest
from conftest import hold_ledger_writes, make_request
from test_approvals import pending

from toolauthz.audit.store import AuditQuery
from toolauthz.proto.toolauthz.v1 import approvals_pb2 as apb
from toolauthz.proto.toolauthz.v1 import approvals_pb2_grpc as apb_grpc
from toolauthz.proto.toolauthz.v1 import audit_pb2 as aupb
from toolauthz.proto.toolauthz.v1 import audit_pb2_grpc as aupb_grpc
from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb
from toolauthz.proto.toolauthz.v1 import authorizer_pb2_grpc as pb_grpc
from toolauthz.server.build import create_server


def stopped_within(server, seconds: float = 30.0) -> bool:
    """Stops the server on another thread: a hang fails the test instead of the suite."""
    done = threading.Event()
    threading.Thread(target=lambda: (server.stop(None).wait(), done.set()), daemon=True).start()
    return done.wait(seconds)


def test_an_address_in_use_is_an_os_error(sidecar):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        with pytest.raises(OSError, match="cannot listen"):
            create_server(sidecar, f"127.0.0.1:{taken.getsockname()[1]}")
    finally:
        taken.close()


def test_a_watch_the_client_cancels_ends_and_the_server_still_stops(sidecar):
    """grpc.aio never closes a plain generator whose client left, and its thread would
    block the server's stop forever: the watch is a coroutine."""
    server, port = create_server(sidecar, "127.0.0.1:0")
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        _, response = pending(pb_grpc.ToolAuthorizerStub(channel))
        stream = apb_grpc.ApprovalsStub(channel).WatchApproval(
            apb.GetApprovalRequest(approval_id=response.approval_id), timeout=30)
        assert next(stream).status == apb.PENDING
        stream.cancel()
        with pytest.raises(grpc.RpcError) as info:
            next(stream)
        assert info.value.code() == grpc.StatusCode.CANCELLED
    assert stopped_within(server)


def test_an_audit_query_the_client_leaves_does_not_block_the_stop(sidecar):
    server, port = create_server(sidecar, "127.0.0.1:0")
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.ToolAuthorizerStub(channel)
        for i in range(5):
            assert stub.Authorize(make_request(call_id=f"c{i}", request_id=f"r{i}")).decision == pb.ALLOW
        stream = aupb_grpc.AuditStub(channel).QueryDecisions(aupb.QueryDecisionsRequest(limit=5), timeout=30)
        assert next(stream).seq == 1
        stream.cancel()
    assert stopped_within(server)


def test_stopping_with_a_decision_in_flight_records_it_and_hands_out_no_token(sidecar, monkeypatch):
    """The client's call is cancelled by the stop; the pump still finishes the decision
    and records it, and the token minted for it is handed to no one."""
    entered, release = hold_ledger_writes(monkeypatch, sidecar)
    server, port = create_server(sidecar, "127.0.0.1:0")
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = pb_grpc.ToolAuthorizerStub(channel).Authorize.future(make_request(), timeout=30)
        assert entered.wait(30)
        assert stopped_within(server)
        with pytest.raises(grpc.RpcError) as info:
            call.result()
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    release.set()
    sidecar.pump.close()  # the batch in flight finishes
    [record] = sidecar.audit_log.query(AuditQuery(call_id="toolu_1"), limit=5)
    assert record.event.result == "ALLOW"
