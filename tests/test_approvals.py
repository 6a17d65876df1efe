"""Human approval: a second principal approves the exact call, and only that call."""

from __future__ import annotations

import json
import threading

import grpc
import pytest
from conftest import make_request, verify_request

from toolauthz.audit.store import AuditQuery
from toolauthz.cli.main import main
from toolauthz.errors import StoreUnavailable
from toolauthz.model import Principal, TrustedContext
from toolauthz.proto.toolauthz.v1 import approvals_pb2 as apb
from toolauthz.proto.toolauthz.v1 import approvals_pb2_grpc as apb_grpc
from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb

LARGE = {"order_id": "ord_1", "amount_cents": 6000, "reason": "parcel lost; card 4111-1111"}


@pytest.fixture
def approvals(channel) -> apb_grpc.ApprovalsStub:
    return apb_grpc.ApprovalsStub(channel)


def approver(name: str = "bob", tenant: str = "acme") -> pb.TrustedContext:
    return pb.TrustedContext(tenant=tenant, principal=pb.Principal(type="User", id=name), request_id="approval-ui")


def decide(approvals, approval_id, who="bob", tenant="acme", verdict=apb.APPROVE, reason="checked the order"):
    return approvals.DecideApproval(apb.DecideApprovalRequest(
        approval_id=approval_id, approver=approver(who, tenant), verdict=verdict, reason=reason))


def pending(stub, **kwargs):
    request = make_request(args=LARGE, **kwargs)
    response = stub.Authorize(request)
    assert response.decision == pb.APPROVAL_REQUIRED and response.approval_id and not response.token
    return request, response


@pytest.mark.both_stores
def test_approval_by_finance_yields_a_token_for_the_same_call(stub, approvals):
    request, response = pending(stub)
    shown = approvals.GetApproval(apb.GetApprovalRequest(approval_id=response.approval_id))
    assert shown.status == apb.PENDING and shown.group == "finance"
    assert [(f.label, f.value) for f in shown.shown_fields] == [("Order", "ord_1"), ("Amount", "60.00 EUR")]
    assert shown.policy_id == "refund-own-order-large-needs-finance"
    assert (shown.tool, shown.resource, shown.requester.id) == ("issue_refund", 'Order::"ord_1"', "alice")
    assert json.loads(shown.arguments_json) == {"/order_id": "ord_1", "/amount_cents": 6000}
    assert "4111" not in str(shown) and shown.digest == response.digest
    assert len(shown.short_code) == 9 and shown.token == ""

    decided = decide(approvals, response.approval_id)
    assert decided.status == apb.APPROVED and decided.approver.id == "bob" and decided.token == ""
    mine = approvals.GetApproval(apb.GetApprovalRequest(approval_id=response.approval_id, context=request.context))
    assert mine.token.startswith("v4.public.")
    first = stub.Verify(verify_request(request, mine.token))
    assert first.valid and first.decision_id == response.decision_id
    assert stub.Verify(verify_request(request, mine.token)).code == "already_used"


def test_approved_token_carries_the_approval_and_fails_for_other_arguments(stub, approvals, sidecar):
    request, response = pending(stub)
    decide(approvals, response.approval_id)
    token = approvals.GetApproval(apb.GetApprovalRequest(approval_id=response.approval_id,
                                                         context=request.context)).token
    changed = verify_request(request, token)
    changed.call.input_json = json.dumps({**LARGE, "amount_cents": 600_000}).encode()
    assert stub.Verify(changed).code == "bad_signature"
    from toolauthz.tokens import CallClaims
    checked = sidecar.authorizer.verifier.verify(
        token, response.digest, CallClaims("acme", "User", "alice", "issue_refund", "toolu_1"))
    assert checked.ok and checked.claims["approval_id"] == response.approval_id
    assert checked.claims["approver"] == 'User::"bob"'


def test_token_is_only_for_the_requester(stub, approvals):
    request, response = pending(stub)
    decide(approvals, response.approval_id)
    for ctx in (approver("bob"), approver("alice", tenant="globex")):
        with pytest.raises(grpc.RpcError) as info:
            approvals.GetApproval(apb.GetApprovalRequest(approval_id=response.approval_id, context=ctx))
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert approvals.GetApproval(apb.GetApprovalRequest(approval_id=response.approval_id)).token == ""
    assert approvals.GetApproval(apb.GetApprovalRequest(approval_id=response.approval_id,
                                                        context=request.context)).token


def test_requester_cannot_approve_their_own_call(stub, approvals, sidecar):
    _, response = pending(stub)
    with pytest.raises(grpc.RpcError) as info:
        decide(approvals, response.approval_id, who="alice")
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "own call" in info.value.details()
    [refused] = sidecar.audit_log.query(AuditQuery(kind="approval"), limit=5)
    assert (refused.event.result, refused.event.error_codes) == ("refused", ("self_approval",))
    assert approvals.GetApproval(apb.GetApprovalRequest(approval_id=response.approval_id)).status == apb.PENDING


def test_self_approval_is_refused_even_when_policy_would_permit(stub, approvals, sidecar, bundle_dir):
    """The rule is in code: a policy letting everyone approve does not make it possible."""
    (bundle_dir / "approvals.cedar").write_text(
        '@id("anyone") permit (principal, action == Action::"approve", resource);\n')
    from toolauthz.bundle import load_bundle
    sidecar.bundles.swap(load_bundle(bundle_dir))
    _, response = pending(stub)
    with pytest.raises(grpc.RpcError) as info:
        decide(approvals, response.approval_id, who="alice")
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert decide(approvals, response.approval_id, who="carol").status == apb.APPROVED


def test_approver_from_another_tenant_is_refused(stub, approvals):
    _, response = pending(stub)
    with pytest.raises(grpc.RpcError) as info:
        decide(approvals, response.approval_id, tenant="globex")
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED


def test_approver_outside_the_group_is_refused_by_policy(stub, approvals):
    _, response = pending(stub)
    with pytest.raises(grpc.RpcError) as info:
        decide(approvals, response.approval_id, who="carol")
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert 'User::"carol"' in info.value.details()


@pytest.mark.both_stores
def test_expired_approval_yields_no_token(stub, approvals, clock):
    request, response = pending(stub)
    clock.advance(901)
    with pytest.raises(grpc.RpcError) as info:
        decide(approvals, response.approval_id)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "expired" in info.value.details()
    seen = approvals.GetApproval(apb.GetApprovalRequest(approval_id=response.approval_id, context=request.context))
    assert seen.status == apb.EXPIRED and seen.token == ""
    assert stub.Authorize(request).token == ""


@pytest.mark.both_stores
def test_rejected_approval_yields_no_token_and_stays_rejected(stub, approvals):
    request, response = pending(stub)
    assert decide(approvals, response.approval_id, verdict=apb.REJECT, reason="not refundable").status == apb.REJECTED
    with pytest.raises(grpc.RpcError) as info:
        decide(approvals, response.approval_id)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    seen = approvals.GetApproval(apb.GetApprovalRequest(approval_id=response.approval_id, context=request.context))
    assert seen.status == apb.REJECTED and seen.token == ""


@pytest.mark.both_stores
def test_two_concurrent_approve_clicks_yield_one_token(stub, sidecar):
    request, response = pending(stub)
    ctx = TrustedContext("acme", Principal("User", "bob"), "ui")
    barrier = threading.Barrier(4)
    results, errors = [], []

    def click():
        barrier.wait()
        try:
            results.append(sidecar.approvals.decide(response.approval_id, ctx, "APPROVE"))
        except Exception as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=click) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and {r.status for r in results} == {"approved"}
    approvals_kept = [r.event for r in sidecar.audit_log.query(AuditQuery(kind="approval", result="APPROVE"), limit=10)]
    superseded = sidecar.audit_log.query(AuditQuery(kind="approval", result="superseded"), limit=10)
    stored = sidecar.approval_store.get(response.approval_id)
    # One APPROVE record, committed with the approval's change: the token that was kept.
    # A click that lost the race is recorded as superseded (one that came after the
    # winner's commit sees the approval approved and records nothing).
    assert [e.jti for e in approvals_kept] == [stored.token_jti]
    assert len(superseded) <= 3 and stored.token_jti not in {r.event.jti for r in superseded}
    assert stub.Verify(verify_request(request, stored.token)).valid


def test_an_approval_is_never_recorded_without_its_change(stub, sidecar):
    """The decision on an approval and its audit record are one transaction: before, the
    record was committed first, and a store failure after it left an APPROVE on record
    that never happened."""
    import sqlite3

    _, response = pending(stub)
    ctx = TrustedContext("acme", Principal("User", "bob"), "ui")
    with sqlite3.connect(sidecar.settings.database_path) as db:  # the approval's update fails
        db.execute("CREATE TRIGGER refuse BEFORE UPDATE ON approvals BEGIN SELECT RAISE(ABORT, 'disk full'); END")
    with pytest.raises(StoreUnavailable):
        sidecar.approvals.decide(response.approval_id, ctx, "APPROVE")
    assert sidecar.approval_store.get(response.approval_id).status == "pending"
    assert sidecar.audit_log.query(AuditQuery(kind="approval"), limit=10) == []
    with sqlite3.connect(sidecar.settings.database_path) as db:
        db.execute("DROP TRIGGER refuse")
    assert sidecar.approvals.decide(response.approval_id, ctx, "APPROVE").status == "approved"
    [record] = sidecar.audit_log.query(AuditQuery(kind="approval", result="APPROVE"), limit=10)
    assert record.event.jti == sidecar.approval_store.get(response.approval_id).token_jti


@pytest.mark.both_stores
def test_watching_runtime_receives_the_token_when_approved(stub, approvals, channel):
    request, response = pending(stub)
    stream = approvals.WatchApproval(apb.GetApprovalRequest(approval_id=response.approval_id,
                                                            context=request.context), timeout=30)
    first = next(stream)
    assert first.status == apb.PENDING and not first.token
    decide(approvals, response.approval_id)
    second = next(stream)
    assert second.status == apb.APPROVED and second.token
    assert list(stream) == []  # terminal: the stream ends
    assert stub.Verify(verify_request(request, second.token)).valid


def test_watch_ends_when_the_approval_expires(stub, approvals, sidecar, clock):
    request, response = pending(stub)
    stream = approvals.WatchApproval(apb.GetApprovalRequest(approval_id=response.approval_id), timeout=30)
    assert next(stream).status == apb.PENDING
    clock.advance(901)
    sidecar.approvals.poke()
    assert next(stream).status == apb.EXPIRED


@pytest.mark.both_stores
def test_replayed_authorize_after_approval_returns_a_token(stub, approvals):
    request, response = pending(stub)
    decide(approvals, response.approval_id)
    again = stub.Authorize(request)
    assert again.replayed and again.decision == pb.ALLOW and again.token
    assert again.approval_id == response.approval_id
    assert stub.Verify(verify_request(request, again.token)).valid
    assert stub.Authorize(request).token == ""  # executed: no token, ever again


def test_changing_an_argument_needs_a_new_approval(stub, approvals):
    _, first = pending(stub)
    decide(approvals, first.approval_id)
    _, second = pending(stub, call_id="toolu_2")
    assert second.approval_id != first.approval_id
    assert approvals.GetApproval(apb.GetApprovalRequest(approval_id=second.approval_id)).status == apb.PENDING


@pytest.mark.both_stores
def test_list_filters(stub, approvals):
    _, a = pending(stub, call_id="t1")
    _, b = pending(stub, call_id="t2")
    decide(approvals, b.approval_id)
    listed = approvals.ListApprovals(apb.ListApprovalsRequest(tenant="acme", status=apb.PENDING, group="finance"))
    assert [x.approval_id for x in listed.approvals] == [a.approval_id]
    assert approvals.ListApprovals(apb.ListApprovalsRequest(tenant="globex")).approvals == []
    assert all(x.token == "" for x in approvals.ListApprovals(apb.ListApprovalsRequest()).approvals)


def test_unknown_approval_is_not_found(approvals):
    with pytest.raises(grpc.RpcError) as info:
        approvals.GetApproval(apb.GetApprovalRequest(approval_id="nope"))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_cli_approve_and_refused_self_approval(stub, server, capsys):
    _, response = pending(stub)
    address = f"127.0.0.1:{server[1]}"
    assert main(["approvals", "--server", address, "list"]) == 0
    listed = capsys.readouterr().out
    assert response.approval_id in listed and "Order: ord_1; Amount: 60.00 EUR" in listed  # the display hints
    assert main(["approvals", "--server", address, "approve", response.approval_id, "--as", 'User::"alice"',
                 "--tenant", "acme"]) == 1
    assert "permission_denied" in capsys.readouterr().err
    assert main(["approvals", "--server", address, "approve", response.approval_id, "--as", 'User::"bob"',
                 "--tenant", "acme", "--reason", "ok"]) == 0
    out = capsys.readouterr().out
    assert "[approved]" in out and 'decided by User::"bob"' in out
    assert main(["approvals", "--server", address, "show", response.approval_id]) == 0
    shown = capsys.readouterr().out
    assert "issue_refund on Order::\"ord_1\"" in shown and "arguments  Order: ord_1; Amount: 60.00 EUR" in shown
    assert "4111" not in shown  # the reason is not allow-listed


def test_approvals_can_listen_on_their_own_address(sidecar):
    from toolauthz.server.build import create_approvals_server, create_server

    main_srv, main_port = create_server(sidecar, "127.0.0.1:0", approvals_address="127.0.0.1:0")
    appr_srv, appr_port = create_approvals_server(sidecar, "127.0.0.1:0")
    try:
        with grpc.insecure_channel(f"127.0.0.1:{main_port}") as ch:
            with pytest.raises(grpc.RpcError) as info:
                apb_grpc.ApprovalsStub(ch).ListApprovals(apb.ListApprovalsRequest())
            assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
        with grpc.insecure_channel(f"127.0.0.1:{appr_port}") as ch:
            assert apb_grpc.ApprovalsStub(ch).ListApprovals(apb.ListApprovalsRequest()).approvals == []
    finally:
        main_srv.stop(None)
        appr_srv.stop(None)


def test_an_old_approval_is_not_re_tokenized(stub, approvals, clock):
    request, response = pending(stub)
    decide(approvals, response.approval_id)
    clock.advance(301)
    late = stub.Authorize(request)
    assert late.replayed and late.token == "" and late.decision == pb.APPROVAL_REQUIRED


@pytest.mark.both_stores
def test_a_decision_asking_for_approval_commits_with_its_approval_and_its_record(stub, sidecar):
    request, response = pending(stub)
    [record] = sidecar.audit_log.query(AuditQuery(call_id="toolu_1", kind="authorize"), limit=5)
    assert record.event.result == "APPROVAL_REQUIRED" and record.event.approval_id == response.approval_id
    entry = sidecar.ledger.get("acme", "toolu_1")
    assert (entry.decision, entry.approval_id) == ("APPROVAL_REQUIRED", response.approval_id)
    assert sidecar.approval_store.get(response.approval_id).status == "pending"


def test_an_audit_failure_opens_no_approval_and_records_no_decision(stub, sidecar, monkeypatch):
    """One transaction: an approval and a ledger row committed ahead of their audit record
    would leave, when the record fails, a pending approval the audit trail never mentions."""
    import sqlite3

    from toolauthz.store.sqlite.transaction import SqliteTransaction

    def disk_full(tx, events):
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(SqliteTransaction, "append_audit", disk_full)
    with pytest.raises(grpc.RpcError) as info:
        stub.Authorize(make_request(args=LARGE))
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert sidecar.ledger.get("acme", "toolu_1") is None
    assert sidecar.approval_store.list(tenant="acme", now=0.0, limit=10) == []
    monkeypatch.undo()
    _, response = pending(stub)  # the retry is decided afresh, with one approval
    assert [a.approval_id for a in sidecar.approval_store.list(tenant="acme", now=0.0, limit=10)] == \
        [response.approval_id]


# -- one evaluator, fresh decisions, contract --------------------------------------------

EMERGENCY_FORBID = 'forbid (principal, action == Action::"tool:issue_refund", resource);\n'


def reload_with(sidecar, bundle_dir, name: str, text: str) -> str:
    """Hot-swaps the running sidecar to the bundle with `name` written as `text`."""
    from toolauthz.bundle import load_bundle

    (bundle_dir / name).write_text(text)
    bundle = load_bundle(bundle_dir)
    sidecar.bundles.swap(bundle)
    return bundle.version


def refused_approvals(sidecar) -> list:
    return [r.event for r in sidecar.audit_log.query(AuditQuery(kind="approval", result="refused"), limit=10)]


def test_an_approver_forbid_that_errors_refuses_the_approver(stub, approvals, sidecar, bundle_dir):
    """The approver check goes through the engine: a forbid that cannot be evaluated
    (a Long overflow) denies, though Cedar itself answers Allow from the permit."""
    _, response = pending(stub)
    reload_with(sidecar, bundle_dir, "approver_overflow.cedar",
                '@id("approver-overflow") forbid (principal, action == Action::"approve", resource)\n'
                "when { 9223372036854775807 + 1 > 0 };\n")
    with pytest.raises(grpc.RpcError) as info:
        decide(approvals, response.approval_id)
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert [e.error_codes for e in refused_approvals(sidecar)] == [("approver_not_permitted",)]
    assert approvals.GetApproval(apb.GetApprovalRequest(approval_id=response.approval_id)).status == apb.PENDING


def test_an_emergency_forbid_stops_a_pending_approval(stub, approvals, sidecar, bundle_dir):
    request, response = pending(stub)
    new_version = reload_with(sidecar, bundle_dir, "emergency.cedar", EMERGENCY_FORBID)
    with pytest.raises(grpc.RpcError) as info:
        decide(approvals, response.approval_id)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert info.value.details().startswith("policy_changed: ")
    seen = approvals.GetApproval(apb.GetApprovalRequest(approval_id=response.approval_id, context=request.context))
    assert seen.status == apb.REJECTED and seen.reason.startswith("policy_changed") and seen.token == ""
    [refused] = refused_approvals(sidecar)
    assert refused.error_codes == ("policy_changed",) and refused.policy_version == new_version
    again = stub.Authorize(request)
    assert again.replayed and again.token == "" and again.decision != pb.ALLOW
    with pytest.raises(grpc.RpcError) as info:  # ended: no later click revives it
        decide(approvals, response.approval_id)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_an_emergency_forbid_after_approval_withholds_the_token(stub, approvals, sidecar, bundle_dir):
    request, response = pending(stub)
    decide(approvals, response.approval_id)
    reload_with(sidecar, bundle_dir, "emergency.cedar", EMERGENCY_FORBID)
    seen = approvals.GetApproval(apb.GetApprovalRequest(approval_id=response.approval_id, context=request.context))
    assert seen.status == apb.APPROVED and seen.token == ""
    watched = list(approvals.WatchApproval(apb.GetApprovalRequest(approval_id=response.approval_id,
                                                                   context=request.context), timeout=30))
    assert [(w.status, w.token) for w in watched] == [(apb.APPROVED, "")]
    again = stub.Authorize(request)
    assert again.replayed and again.decision == pb.DENY and again.token == ""
    assert "policy_changed" in [e.code for e in again.errors]


def test_an_approval_survives_a_reload_that_still_allows_the_call(stub, approvals, sidecar, bundle_dir):
    """Under other policies that still ask the same group, approving works and the token
    carries the version that re-decided it; after a further reload the token comes from
    the replay, decided afresh once more."""
    request, response = pending(stub)
    harmless = '@id("no-deletes") forbid (principal, action == Action::"tool:issue_refund", resource)\n' \
               'when { context.input.amount_cents < 0 };\n'
    approving_version = reload_with(sidecar, bundle_dir, "harmless.cedar", harmless)
    decided = decide(approvals, response.approval_id)
    assert decided.status == apb.APPROVED
    mine = approvals.GetApproval(apb.GetApprovalRequest(approval_id=response.approval_id, context=request.context))
    from toolauthz.tokens import CallClaims
    claims = CallClaims("acme", "User", "alice", "issue_refund", "toolu_1")
    assert sidecar.authorizer.verifier.verify(mine.token, response.digest, claims).claims["policy_version"] == \
        approving_version
    later_version = reload_with(sidecar, bundle_dir, "harmless.cedar", harmless + "// reworded\n")
    assert approvals.GetApproval(apb.GetApprovalRequest(approval_id=response.approval_id,
                                                        context=request.context)).token == ""
    again = stub.Authorize(request)
    assert again.replayed and again.decision == pb.ALLOW and again.token
    assert sidecar.authorizer.verifier.verify(again.token, response.digest, claims).claims["policy_version"] == \
        later_version
    assert stub.Verify(verify_request(request, again.token)).valid


def test_a_call_that_now_needs_no_approval_is_approved(stub, approvals, sidecar, bundle_dir):
    request, response = pending(stub)
    refunds = (bundle_dir / "refunds.cedar").read_text()
    reload_with(sidecar, bundle_dir, "refunds.cedar", refunds.replace('@approval("finance")\n', ""))
    assert decide(approvals, response.approval_id).status == apb.APPROVED
    mine = approvals.GetApproval(apb.GetApprovalRequest(approval_id=response.approval_id, context=request.context))
    assert stub.Verify(verify_request(request, mine.token)).valid


def test_a_call_that_now_needs_another_group_ends_its_approval(stub, approvals, sidecar, bundle_dir):
    request, response = pending(stub)
    refunds = (bundle_dir / "refunds.cedar").read_text()
    (bundle_dir / "legal.cedar").write_text(  # `check` refuses a group nobody can approve for
        '@id("legal-approves")\npermit (principal in Group::"legal", action == Action::"approve", resource is Approval)'
        '\nwhen { resource.group == "legal" };\n')
    reload_with(sidecar, bundle_dir, "refunds.cedar", refunds.replace('@approval("finance")', '@approval("legal")'))
    with pytest.raises(grpc.RpcError) as info:
        decide(approvals, response.approval_id)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "legal" in info.value.details()
    assert approvals.GetApproval(apb.GetApprovalRequest(approval_id=response.approval_id)).status == apb.REJECTED
    assert stub.Authorize(request).token == ""


def test_the_approver_needs_no_request_id_but_a_given_one_must_be_well_formed(stub, approvals):
    _, response = pending(stub)
    without = pb.TrustedContext(tenant="acme", principal=pb.Principal(type="User", id="bob"))
    malformed = pb.TrustedContext(tenant="acme", principal=pb.Principal(type="User", id="bob"), request_id="-bad")
    with pytest.raises(grpc.RpcError) as info:
        approvals.DecideApproval(apb.DecideApprovalRequest(approval_id=response.approval_id, approver=malformed,
                                                           verdict=apb.APPROVE))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    decided = approvals.DecideApproval(apb.DecideApprovalRequest(approval_id=response.approval_id, approver=without,
                                                                 verdict=apb.APPROVE))
    assert decided.status == apb.APPROVED


def test_the_runtime_still_needs_a_request_id(stub):
    request = make_request(args=LARGE)
    request.context.request_id = ""
    with pytest.raises(grpc.RpcError) as info:
        stub.Authorize(request)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_authorize_says_when_the_approval_expires(stub, clock):
    request, response = pending(stub)
    expected = clock.now() + 900
    assert response.approval_expires_at.ToNanoseconds() == int(expected * 1e9)
    clock.advance(10)
    again = stub.Authorize(request)
    assert again.replayed and again.approval_expires_at.ToNanoseconds() == int(expected * 1e9)
    assert not stub.Authorize(make_request()).HasField("approval_expires_at")  # a plain ALLOW


@pytest.mark.both_stores
def test_the_kept_arguments_are_erased_when_the_approval_ends_and_never_audited(stub, approvals, sidecar, clock):
    _, first = pending(stub, call_id="t1")
    _, second = pending(stub, call_id="t2")
    store = sidecar.approval_store
    assert b"4111" in store.get(first.approval_id).call_input  # kept while it can be decided
    decide(approvals, first.approval_id)
    assert (store.get(first.approval_id).call_input, store.get(first.approval_id).call_entities) == (b"", b"")
    clock.advance(901)
    pending(stub, call_id="t3")  # the next approval written sweeps the expired one
    assert store.get(second.approval_id).call_input == b""
    trail = [json.dumps(r.event.__dict__, default=str) for r in sidecar.audit_log.query(AuditQuery(), limit=100)]
    assert trail and not any("4111" in record for record in trail)
    assert "4111" not in str(approvals.GetApproval(apb.GetApprovalRequest(approval_id=second.approval_id)))


def test_an_approvals_table_from_before_the_kept_arguments_gains_their_columns(tmp_path):
    import sqlite3

    from toolauthz.store import SqliteStore

    path = str(tmp_path / "old.db")
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE approvals (approval_id TEXT PRIMARY KEY, tenant TEXT NOT NULL, call_id TEXT NOT NULL, "
                   "request_id TEXT NOT NULL, requester_type TEXT NOT NULL, requester_id TEXT NOT NULL, "
                   "tool TEXT NOT NULL, resource TEXT NOT NULL, group_name TEXT NOT NULL, policy_id TEXT NOT NULL, "
                   "digest TEXT NOT NULL, short_code TEXT NOT NULL, decision_id TEXT NOT NULL, "
                   "policy_version TEXT NOT NULL, created_at REAL NOT NULL, expires_at REAL NOT NULL, "
                   "fields TEXT NOT NULL, status TEXT NOT NULL, decided_at REAL, approver TEXT NOT NULL DEFAULT '', "
                   "reason TEXT NOT NULL DEFAULT '', token TEXT NOT NULL DEFAULT '', "
                   "token_jti TEXT NOT NULL DEFAULT '', token_expires_at REAL)")
        db.execute("INSERT INTO approvals VALUES ('a1', 'acme', 'c1', 'r1', 'User', 'alice', 'issue_refund', "
                   "'Order::\"o\"', 'finance', 'p', 'd', 'AAAA-AAAA', 'dec', 'v1', 1.0, 2.0, '{}', 'pending', "
                   "NULL, '', '', '', '', NULL)")
    store = SqliteStore(path)
    try:
        old = store.approvals.get("a1")
        assert (old.call_input, old.approved_version, old.status) == (b"", "", "pending")
    finally:
        store.close()
