"""Calls owned by their caller: a call belongs to the caller its listener proved and to the
principal and run (request id) it was decided for. Verify, ReportOutcome, a replayed
Authorize and an approval's token answer its owner alone; anyone else is
PERMISSION_DENIED, audited as `refused` (`not_call_owner`), and changes nothing.

The callers are named by the test-only header of tests/test_roles.py; the HTTP API's and
the identity namespaces' tests use real mTLS (tests/test_ownership_mtls.py)."""

from __future__ import annotations

import grpc
import pytest
import test_roles
from conftest import make_request, verify_request
from test_roles import as_, denied, with_callers

from toolauthz.audit.store import AuditQuery
from toolauthz.proto.toolauthz.v1 import approvals_pb2 as apb
from toolauthz.proto.toolauthz.v1 import approvals_pb2_grpc as apb_grpc
from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb
from toolauthz.proto.toolauthz.v1 import authorizer_pb2_grpc as pb_grpc

X, Y = "spiffe://acme.example/agent/support", "spiffe://acme.example/agent/billing"
CONSOLE = "spiffe://acme.example/console"
LARGE = {"order_id": "ord_1", "amount_cents": 6000}
CALLERS = [
    {"id": X, "roles": ["runtime"], "tenants": ["acme"]},
    {"id": Y, "roles": ["runtime"], "tenants": ["acme"]},
    {"id": CONSOLE, "roles": ["approver"], "tenants": ["acme"]},
]


@pytest.fixture
def sidecar(settings, clock):
    yield from with_callers(settings, clock, CALLERS)


approvals = test_roles.approvals  # the fixture: an Approvals stub on the test's channel


def refusals(sidecar) -> list:
    return [r.event for r in sidecar.audit_log.query(AuditQuery(error_code="not_call_owner"), limit=100)]


def outcome(request: pb.AuthorizeRequest, status=pb.CANCELLED) -> pb.ReportOutcomeRequest:
    return pb.ReportOutcomeRequest(context=request.context, call_id=request.call.call_id, status=status)


def allowed(stub, **kwargs) -> tuple[pb.AuthorizeRequest, pb.AuthorizeResponse]:
    request = make_request(**kwargs)
    response = stub.Authorize(request, metadata=as_(X))
    assert response.decision == pb.ALLOW and response.token
    return request, response


def approved(stub, approvals) -> tuple[pb.AuthorizeRequest, pb.AuthorizeResponse]:
    request = make_request(args=LARGE, call_id="toolu_big")
    response = stub.Authorize(request, metadata=as_(X))
    assert response.decision == pb.APPROVAL_REQUIRED
    bob = pb.TrustedContext(tenant="acme", principal=pb.Principal(type="User", id="bob"))
    decided = approvals.DecideApproval(apb.DecideApprovalRequest(
        approval_id=response.approval_id, approver=bob, verdict=apb.APPROVE), metadata=as_(CONSOLE))
    assert decided.status == apb.APPROVED
    return request, response


def in_run(request: pb.AuthorizeRequest, run: str) -> pb.TrustedContext:
    context = pb.TrustedContext()
    context.CopyFrom(request.context)
    context.request_id = run
    return context


@pytest.mark.both_stores
def test_another_runtime_of_the_tenant_cannot_cancel_the_call(stub, sidecar):
    """Reproduction: Y reported CANCELLED for X's call, and X's Verify then said call_closed."""
    request, response = allowed(stub)
    denied(stub.ReportOutcome, outcome(request), metadata=as_(Y))
    assert sidecar.ledger.get("acme", "toolu_1").outcome == ""
    [refusal] = refusals(sidecar)
    assert (refusal.kind, refusal.caller, refusal.decision_id, refusal.detail["mismatch"]) == (
        "outcome", Y, response.decision_id, ["caller"])
    assert stub.Verify(verify_request(request, response.token), metadata=as_(X)).code == "ok"
    assert stub.ReportOutcome(outcome(request, pb.COMPLETED), metadata=as_(X)).decision_id == response.decision_id


@pytest.mark.both_stores
def test_a_token_presented_by_another_caller_or_in_another_run_is_refused_and_not_consumed(stub, sidecar):
    request, response = allowed(stub)
    denied(stub.Verify, verify_request(request, response.token), metadata=as_(Y))  # stolen: the exact call
    other_run = pb.VerifyRequest(token=response.token, context=in_run(request, "run-2"), call=request.call)
    denied(stub.Verify, other_run, metadata=as_(X))
    assert sidecar.ledger.get("acme", "toolu_1").verified_jti == ""
    assert [(e.kind, e.caller, e.request_id, e.detail["mismatch"], bool(e.jti)) for e in refusals(sidecar)] == [
        ("verify", Y, "run-1", ["caller"], True), ("verify", X, "run-2", ["request_id"], True)]
    assert stub.Verify(verify_request(request, response.token), metadata=as_(X)).code == "ok"
    denied(stub.Verify, verify_request(request, response.token), metadata=as_(Y))  # not even `already_used`


@pytest.mark.both_stores
def test_a_replay_by_another_caller_or_run_gets_no_decision_nor_token(stub, sidecar):
    request, response = allowed(stub)
    denied(stub.Authorize, request, metadata=as_(Y))
    denied(stub.Authorize, make_request(request_id="run-2"), metadata=as_(X))
    batch = pb.AuthorizeBatchRequest(context=pb.TrustedContext(
        tenant="acme", principal=request.context.principal, request_id="run-1"),
        calls=[pb.BatchCall(call=request.call, entities_json=request.context.entities_json)])
    [answer] = stub.AuthorizeBatch(batch, metadata=as_(Y)).answers
    assert answer.WhichOneof("answer") == "error" and answer.error.code == "PERMISSION_DENIED"
    assert [(e.kind, e.caller, e.detail["mismatch"]) for e in refusals(sidecar)] == [
        ("authorize", Y, ["caller"]), ("authorize", X, ["request_id"]), ("authorize", Y, ["caller"])]
    mine = stub.Authorize(request, metadata=as_(X))
    assert (mine.replayed, mine.decision_id) == (True, response.decision_id) and mine.token


@pytest.mark.both_stores
def test_an_approved_token_goes_to_the_requesting_caller_and_run_alone(stub, approvals, sidecar):
    """Reproduction: Y asked GetApproval with the requester's principal and any request
    id, got the token and consumed it; X then got already_used."""
    request, response = approved(stub, approvals)
    for caller, context in ((Y, request.context), (Y, in_run(request, "run-9")), (X, in_run(request, "run-9"))):
        asked = apb.GetApprovalRequest(approval_id=response.approval_id, context=context)
        denied(approvals.GetApproval, asked, metadata=as_(caller))
        denied(approvals.WatchApproval, asked, metadata=as_(caller), timeout=10)
    denied(approvals.GetApproval, apb.GetApprovalRequest(approval_id=response.approval_id), metadata=as_(Y))
    assert {(e.detail["rpc"], e.caller, e.request_id, tuple(e.detail["mismatch"])) for e in refusals(sidecar)} == {
        ("GetApproval", Y, "run-1", ("caller",)), ("WatchApproval", Y, "run-1", ("caller",)),
        ("GetApproval", Y, "run-9", ("caller", "request_id")), ("WatchApproval", Y, "run-9", ("caller", "request_id")),
        ("GetApproval", X, "run-9", ("request_id",)), ("WatchApproval", X, "run-9", ("request_id",)),
        ("GetApproval", Y, "", ("caller",))}
    assert all(e.kind == "approval" and e.approval_id == response.approval_id for e in refusals(sidecar))
    # The approver reads it, without the token; the requester gets it, and runs the call.
    console_view = approvals.GetApproval(apb.GetApprovalRequest(approval_id=response.approval_id),
                                         metadata=as_(CONSOLE))
    assert console_view.status == apb.APPROVED and console_view.token == ""
    mine = apb.GetApprovalRequest(approval_id=response.approval_id, context=request.context)
    token = approvals.GetApproval(mine, metadata=as_(X)).token
    assert [a.token for a in approvals.WatchApproval(mine, metadata=as_(X), timeout=10)][-1] == token
    assert stub.Verify(verify_request(request, token), metadata=as_(X)).code == "ok"


def test_without_callers_a_call_belongs_to_its_principal_and_run(settings, clock):
    """Development mode: every caller is `unauthenticated`, so the principal and the run
    alone own a call, as before callers were recorded."""
    from toolauthz.server.build import build_sidecar, create_server

    car = build_sidecar(settings, clock=clock)
    server, port = create_server(car, "127.0.0.1:0")
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub, desk = pb_grpc.ToolAuthorizerStub(channel), apb_grpc.ApprovalsStub(channel)
            request = make_request(args=LARGE, call_id="toolu_big")
            response = stub.Authorize(request)
            bob = pb.TrustedContext(tenant="acme", principal=pb.Principal(type="User", id="bob"))
            desk.DecideApproval(apb.DecideApprovalRequest(approval_id=response.approval_id, approver=bob,
                                                          verdict=apb.APPROVE))
            other_run = apb.GetApprovalRequest(approval_id=response.approval_id, context=in_run(request, "run-2"))
            denied(desk.GetApproval, other_run)
            assert desk.GetApproval(apb.GetApprovalRequest(approval_id=response.approval_id)).token == ""
            token = desk.GetApproval(apb.GetApprovalRequest(approval_id=response.approval_id,
                                                            context=request.context)).token
            denied(stub.Verify, pb.VerifyRequest(token=token, context=in_run(request, "run-2"), call=request.call))
            assert stub.Verify(verify_request(request, token)).code == "ok"
        assert car.ledger.get("acme", "toolu_big").caller == "unauthenticated"
    finally:
        server.stop(None)
        car.close()



# -- the store: a call recorded before its caller was belongs to no caller ---------------


def test_a_sqlite_ledger_of_before_gains_the_caller_column_and_its_old_calls_no_owner(tmp_path):
    import sqlite3

    from toolauthz.store.open import open_store

    path = tmp_path / "old.db"
    with sqlite3.connect(path) as db:  # the calls table as it was, with one call in flight
        db.execute("CREATE TABLE calls (tenant TEXT NOT NULL, call_id TEXT NOT NULL, request_id TEXT NOT NULL, "
                   "tool TEXT NOT NULL, digest TEXT NOT NULL, principal TEXT NOT NULL, created_at REAL NOT NULL, "
                   "decision TEXT NOT NULL DEFAULT '', decision_id TEXT NOT NULL DEFAULT '', policy_version TEXT "
                   "NOT NULL DEFAULT '', reasons TEXT NOT NULL DEFAULT '[]', errors TEXT NOT NULL DEFAULT '[]', "
                   "approval_id TEXT NOT NULL DEFAULT '', verified_jti TEXT NOT NULL DEFAULT '', verified_at REAL, "
                   "outcome TEXT NOT NULL DEFAULT '', outcome_at REAL, extra TEXT NOT NULL DEFAULT '{}', "
                   "PRIMARY KEY (tenant, call_id))")
        db.execute("INSERT INTO calls (tenant, call_id, request_id, tool, digest, principal, created_at, decision) "
                   "VALUES ('acme', 'toolu_old', 'run-1', 'issue_refund', 'd', 'User::\"alice\"', 1.0, 'ALLOW')")
    with open_store(f"sqlite://{path}") as store:
        old = store.ledger.get("acme", "toolu_old")
        assert old is not None and old.caller == ""
        _nobody_may_close(store, old)


def test_a_postgresql_ledger_at_schema_1_is_migrated_to_record_callers(postgres_url):
    import psycopg

    from toolauthz.store.open import migrate_store, open_store
    from toolauthz.store.postgres.schema import MIGRATIONS

    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE toolauthz_schema (version INTEGER NOT NULL)")
        conn.execute("INSERT INTO toolauthz_schema (version) VALUES (1)")
        conn.execute(dict(MIGRATIONS)[1])
        conn.execute("INSERT INTO calls (tenant, call_id, request_id, tool, digest, principal, created_at, "
                     "decision) VALUES ('acme', 'toolu_old', 'run-1', 'issue_refund', 'd', 'User::\"alice\"', 1.0, "
                     "'ALLOW')")
    assert migrate_store(postgres_url)[0] == 1
    with open_store(postgres_url) as store:
        old = store.ledger.get("acme", "toolu_old")
        assert old is not None and old.caller == ""
        _nobody_may_close(store, old)


def _nobody_may_close(store, old) -> None:
    """Not even a development caller with the call's principal and run: fail closed."""
    from toolauthz.errors import ForbiddenError
    from toolauthz.store.ledger import CallOwner, RecordOutcome

    claimant = CallOwner("acme", "unauthenticated", old.principal, old.request_id)
    [refused] = store.ledger.apply([RecordOutcome("acme", old.call_id, "cancelled", "", "", 2.0, owner=claimant)])
    assert isinstance(refused, ForbiddenError)
    assert store.ledger.get("acme", old.call_id).outcome == ""
