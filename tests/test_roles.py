"""Callers and roles: each role's allowed and refused RPCs, tenants, and every refusal audited.

Real mTLS is not needed here: the sidecar is built with a caller resolver that reads a
test-only metadata header (`x-test-caller`), standing in for the identity a listener
proves (toolauthz/service/callers.py `caller_of`).
"""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from conftest import calls_audited, make_request, verify_request

from toolauthz.audit.store import AuditQuery
from toolauthz.proto.toolauthz.v1 import approvals_pb2 as apb
from toolauthz.proto.toolauthz.v1 import approvals_pb2_grpc as apb_grpc
from toolauthz.proto.toolauthz.v1 import audit_pb2 as aupb
from toolauthz.proto.toolauthz.v1 import audit_pb2_grpc as aupb_grpc
from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb
from toolauthz.proto.toolauthz.v1 import authorizer_pb2_grpc as pb_grpc
from toolauthz.server.config import CallerSettings
from toolauthz.service.callers import UNAUTHENTICATED, Caller
from toolauthz.service.refusals import SYSTEM_STREAM
from toolauthz.service.roles import (
    ROLES,
    RPC_ROLES,
    CallerGrant,
    CallerRefused,
    RolePolicy,
    authorize_rpc,
)

HEADER = "x-test-caller"
AGENT, GLOBEX_AGENT = "spiffe://acme.example/agent", "spiffe://globex.example/agent"
CONSOLE, AUDITOR, SEC_AUDITOR = "spiffe://acme.example/console", "spiffe://acme.example/audit", "spiffe://sec/audit"
STRANGER = "spiffe://elsewhere.example/who"
LARGE = {"order_id": "ord_1", "amount_cents": 6000}
CALLERS = [
    {"id": AGENT, "roles": ["runtime"], "tenants": ["acme"]},
    {"id": GLOBEX_AGENT, "roles": ["runtime"], "tenants": ["globex"]},
    {"id": CONSOLE, "roles": ["approver"], "tenants": ["acme"]},
    {"id": AUDITOR, "roles": ["auditor"], "tenants": ["acme"]},
    {"id": SEC_AUDITOR, "roles": ["auditor"], "tenants": ["*"]},
]


def header_callers(context) -> Caller:
    """Test-only: the caller named by a metadata header, as if a listener had proved it."""
    named = dict(context.invocation_metadata()).get(HEADER)
    return Caller(named, True) if named else UNAUTHENTICATED


def as_(caller: str) -> tuple[tuple[str, str], ...]:
    return ((HEADER, caller),)


def with_callers(settings, clock, callers: list[dict]) -> Iterator:
    """A sidecar whose `callers:` are `callers`, each named by the test-only header."""
    from toolauthz.server.build import build_sidecar

    configured = settings.model_copy(update={"callers": tuple(CallerSettings(**c) for c in callers)})
    car = build_sidecar(configured, clock=clock, callers=header_callers)
    yield car
    car.close()


@pytest.fixture
def sidecar(settings, clock):
    yield from with_callers(settings, clock, CALLERS)


@pytest.fixture
def approvals(channel) -> apb_grpc.ApprovalsStub:
    return apb_grpc.ApprovalsStub(channel)


@pytest.fixture
def audit(channel) -> aupb_grpc.AuditStub:
    return aupb_grpc.AuditStub(channel)


def refused(sidecar, **filters) -> list:
    return [r.event for r in sidecar.audit_log.query(AuditQuery(result="refused", **filters), limit=100)]


def denied(call, *args, **kwargs) -> None:
    with pytest.raises(grpc.RpcError) as err:
        result = call(*args, **kwargs)
        if hasattr(result, "__iter__") and not hasattr(result, "ListFields"):
            list(result)
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED, err.value.details()


def pending(stub, tenant="acme", call_id="toolu_big", agent=AGENT):
    request = make_request(args=LARGE, tenant=tenant, call_id=call_id)
    if tenant != "acme":
        request.context.entities_json = b'[{"uid": {"type": "Order", "id": "ord_1"}, "attrs": {"owner": ' \
                                        b'{"__entity": {"type": "User", "id": "alice"}}, "refundable_cents": ' \
                                        b'10000}, "parents": []}]'
    response = stub.Authorize(request, metadata=as_(agent))
    assert response.decision == pb.APPROVAL_REQUIRED
    return request, response


def bob(tenant="acme") -> pb.TrustedContext:
    return pb.TrustedContext(tenant=tenant, principal=pb.Principal(type="User", id="bob"))


# -- the policy alone ------------------------------------------------------------------


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("rpc", sorted(RPC_ROLES))
def test_each_role_is_allowed_exactly_the_rpcs_of_its_table(role, rpc):
    policy = RolePolicy.of([CallerGrant("c", frozenset({role}), frozenset({"acme"}))])
    caller = Caller("c", True)
    if role in RPC_ROLES[rpc]:
        assert authorize_rpc(policy, caller, rpc, "acme").tenants == frozenset({"acme"})
        with pytest.raises(CallerRefused):
            authorize_rpc(policy, caller, rpc, "globex")
    else:
        with pytest.raises(CallerRefused):
            authorize_rpc(policy, caller, rpc, "acme")


def test_the_table_gives_runtimes_no_approval_decision_and_approvers_no_authorize():
    assert "runtime" not in RPC_ROLES["DecideApproval"] and "runtime" not in RPC_ROLES["ListApprovals"]
    assert "approver" not in RPC_ROLES["Authorize"] and "auditor" not in RPC_ROLES["Authorize"]
    assert RPC_ROLES["QueryDecisions"] == frozenset({"auditor"})


def test_without_callers_everyone_may_call_everything_and_with_them_unknown_callers_only_getkeys():
    for rpc in RPC_ROLES:
        assert authorize_rpc(RolePolicy(), UNAUTHENTICATED, rpc, "acme").tenants is None
    policy = RolePolicy.of([CallerGrant("c", frozenset({"runtime"}), frozenset({"*"}))])
    assert authorize_rpc(policy, Caller("c", True), "Authorize", "anyone").tenants is None
    for caller in (UNAUTHENTICATED, Caller("other", True), Caller("c", False)):
        authorize_rpc(policy, caller, "GetKeys")
        with pytest.raises(CallerRefused):
            authorize_rpc(policy, caller, "Authorize", "acme")


# -- over gRPC ---------------------------------------------------------------------------


def test_a_runtime_authorizes_verifies_and_reports_in_its_tenant_and_its_records_name_it(stub, sidecar):
    request = make_request()
    response = stub.Authorize(request, metadata=as_(AGENT))
    assert response.decision == pb.ALLOW
    assert stub.Verify(verify_request(request, response.token), metadata=as_(AGENT)).valid
    stub.ReportOutcome(pb.ReportOutcomeRequest(context=request.context, call_id="toolu_1", status=pb.COMPLETED),
                       metadata=as_(AGENT))
    assert stub.GetKeys(pb.GetKeysRequest(), metadata=as_(AGENT)).keys
    assert stub.GetStatus(pb.GetStatusRequest(), metadata=as_(AGENT)).policy_version
    records = sidecar.audit_log.query(AuditQuery(call_id="toolu_1"), limit=10)
    assert [r.event.kind for r in records] == ["authorize", "verify", "outcome"]
    assert {r.event.caller for r in records} == {AGENT}


def test_a_runtime_outside_its_tenant_is_refused_and_audited(stub, sidecar):
    # Recorded in the caller's own tenant, never the one the request names.
    denied(stub.Authorize, make_request(tenant="globex"), metadata=as_(AGENT))
    assert refused(sidecar, tenant="globex") == []
    [event] = refused(sidecar, tenant="acme")
    assert (event.kind, event.caller, event.error_codes) == ("authorize", AGENT, ("tenant_not_permitted",))
    assert event.detail == {"rpc": "Authorize", "count": 1, "minute": 60.0 * (event.time // 60)}
    assert event.principal == ""  # what the request says is not recorded


def test_only_a_runtime_of_the_tenant_may_authorize_a_batch_and_its_records_name_it(stub, sidecar):
    request = make_request()
    batch = pb.AuthorizeBatchRequest(context=request.context, calls=[
        pb.BatchCall(call=request.call, entities_json=request.context.entities_json)])
    batch.context.entities_json = b""
    for outsider in (CONSOLE, AUDITOR, GLOBEX_AGENT, STRANGER):
        denied(stub.AuthorizeBatch, batch, metadata=as_(outsider))
    denied(stub.AuthorizeBatch, batch)  # unauthenticated
    assert [(e.caller, e.error_codes, e.detail["rpc"], e.tenant) for e in refused(sidecar)] == [
        (CONSOLE, ("role_not_permitted",), "AuthorizeBatch", "acme"),
        (AUDITOR, ("role_not_permitted",), "AuthorizeBatch", "acme"),
        (GLOBEX_AGENT, ("tenant_not_permitted",), "AuthorizeBatch", "globex"),
        (STRANGER, ("caller_unknown",), "AuthorizeBatch", SYSTEM_STREAM),
        ("unauthenticated", ("caller_unknown",), "AuthorizeBatch", SYSTEM_STREAM)]
    assert sidecar.ledger.get("acme", "toolu_1") is None
    [answer] = stub.AuthorizeBatch(batch, metadata=as_(AGENT)).answers
    assert answer.response.decision == pb.ALLOW
    [record] = sidecar.audit_log.query(AuditQuery(call_id="toolu_1"), limit=10)
    assert (record.event.result, record.event.caller) == ("ALLOW", AGENT)


def test_only_a_runtime_of_the_tenant_may_report_a_refusal_and_its_record_names_it(stub, sidecar):
    request = make_request()
    report = pb.ReportRefusalRequest(context=request.context, call_id="toolu_1", tool="issue_refund",
                                     code="tool_changed", detail="changed=description")
    for outsider in (CONSOLE, AUDITOR, GLOBEX_AGENT, STRANGER):
        denied(stub.ReportRefusal, report, metadata=as_(outsider))
    denied(stub.ReportRefusal, report)  # unauthenticated
    assert [(e.caller, e.error_codes, e.detail["rpc"], e.tenant) for e in refused(sidecar)] == [
        (CONSOLE, ("role_not_permitted",), "ReportRefusal", "acme"),
        (AUDITOR, ("role_not_permitted",), "ReportRefusal", "acme"),
        (GLOBEX_AGENT, ("tenant_not_permitted",), "ReportRefusal", "globex"),
        (STRANGER, ("caller_unknown",), "ReportRefusal", SYSTEM_STREAM),
        ("unauthenticated", ("caller_unknown",), "ReportRefusal", SYSTEM_STREAM)]
    stub.ReportRefusal(report, metadata=as_(AGENT))
    [event] = [e for e in refused(sidecar) if e.error_codes == ("tool_changed",)]
    assert (event.kind, event.caller, event.tool) == ("authorize", AGENT, "issue_refund")


def test_only_a_runtime_of_the_tenant_may_ask_which_tools_are_visible(stub, sidecar):
    request = pb.ListVisibleRequest(context=make_request().context, tools=["issue_refund"])
    for outsider in (CONSOLE, AUDITOR, GLOBEX_AGENT, STRANGER):
        denied(stub.ListVisible, request, metadata=as_(outsider))
    denied(stub.ListVisible, request)  # unauthenticated
    assert [(e.caller, e.error_codes) for e in refused(sidecar)] == [
        (CONSOLE, ("role_not_permitted",)), (AUDITOR, ("role_not_permitted",)),
        (GLOBEX_AGENT, ("tenant_not_permitted",)), (STRANGER, ("caller_unknown",)),
        ("unauthenticated", ("caller_unknown",))]
    assert list(stub.ListVisible(request, metadata=as_(AGENT)).visible) == ["issue_refund"]


def test_a_runtime_cannot_approve_list_approvals_or_query_the_audit(stub, approvals, audit, sidecar):
    _request, response = pending(stub)
    denied(approvals.DecideApproval, apb.DecideApprovalRequest(
        approval_id=response.approval_id, approver=bob(), verdict=apb.APPROVE), metadata=as_(AGENT))
    denied(approvals.ListApprovals, apb.ListApprovalsRequest(tenant="acme"), metadata=as_(AGENT))
    denied(audit.QueryDecisions, aupb.QueryDecisionsRequest(tenant="acme"), metadata=as_(AGENT))
    events = refused(sidecar)
    assert [(e.detail["rpc"], e.caller, e.error_codes) for e in events] == [
        ("DecideApproval", AGENT, ("role_not_permitted",)), ("ListApprovals", AGENT, ("role_not_permitted",)),
        ("QueryDecisions", AGENT, ("role_not_permitted",))]
    assert approvals.GetApproval(apb.GetApprovalRequest(approval_id=response.approval_id),
                                 metadata=as_(CONSOLE)).status == apb.PENDING


def test_an_approver_cannot_authorize_nor_get_a_token_but_the_runtime_can(stub, approvals, sidecar):
    denied(stub.Authorize, make_request(), metadata=as_(CONSOLE))
    denied(stub.Verify, verify_request(make_request(), "v4.public.x"), metadata=as_(CONSOLE))
    request, response = pending(stub)
    decided = approvals.DecideApproval(apb.DecideApprovalRequest(
        approval_id=response.approval_id, approver=bob(), verdict=apb.APPROVE), metadata=as_(CONSOLE))
    assert decided.status == apb.APPROVED and decided.token == ""
    as_requester = apb.GetApprovalRequest(approval_id=response.approval_id, context=request.context)
    assert approvals.GetApproval(as_requester, metadata=as_(CONSOLE)).token == ""
    assert all(a.token == "" for a in approvals.WatchApproval(as_requester, metadata=as_(CONSOLE), timeout=10))
    assert approvals.GetApproval(as_requester, metadata=as_(AGENT)).token.startswith("v4.public.")
    [decision] = [r.event for r in sidecar.audit_log.query(AuditQuery(kind="approval", result="APPROVE"), limit=5)]
    assert (decision.approver, decision.caller) == ('User::"bob"', CONSOLE)
    assert {(e.detail["rpc"], e.caller) for e in refused(sidecar)} == {("Authorize", CONSOLE), ("Verify", CONSOLE)}


def test_approvers_and_runtimes_see_the_approvals_of_their_tenants_only(stub, approvals, sidecar):
    _request, acme = pending(stub)
    globex_request, globex = pending(stub, tenant="globex", call_id="toolu_gx", agent=GLOBEX_AGENT)
    listed = approvals.ListApprovals(apb.ListApprovalsRequest(), metadata=as_(CONSOLE)).approvals
    assert [a.approval_id for a in listed] == [acme.approval_id]
    denied(approvals.ListApprovals, apb.ListApprovalsRequest(tenant="globex"), metadata=as_(CONSOLE))
    denied(approvals.GetApproval, apb.GetApprovalRequest(approval_id=globex.approval_id), metadata=as_(CONSOLE))
    denied(approvals.GetApproval, apb.GetApprovalRequest(approval_id=acme.approval_id), metadata=as_(GLOBEX_AGENT))
    watch_globex = apb.GetApprovalRequest(approval_id=globex.approval_id, context=globex_request.context)
    denied(approvals.WatchApproval, watch_globex, metadata=as_(AGENT), timeout=10)
    # The console of acme naming a globex approver: refused by its tenants, before the desk.
    denied(approvals.DecideApproval, apb.DecideApprovalRequest(
        approval_id=globex.approval_id, approver=bob("globex"), verdict=apb.APPROVE), metadata=as_(CONSOLE))
    tenants_refused = {(e.detail["rpc"], e.caller, e.tenant) for e in refused(sidecar)}
    assert tenants_refused == {("ListApprovals", CONSOLE, "acme"), ("GetApproval", CONSOLE, "acme"),
                               ("GetApproval", GLOBEX_AGENT, "globex"), ("WatchApproval", AGENT, "acme"),
                               ("DecideApproval", CONSOLE, "acme")}  # each in the caller's own tenant
    assert approvals.GetApproval(apb.GetApprovalRequest(approval_id=globex.approval_id),
                                 metadata=as_(GLOBEX_AGENT)).status == apb.PENDING


def test_an_auditor_of_acme_sees_nothing_of_globex(stub, audit, sidecar):
    stub.Authorize(make_request(), metadata=as_(AGENT))
    stub.Authorize(make_request(tenant="globex", call_id="toolu_gx", entities=[]), metadata=as_(GLOBEX_AGENT))
    mine = list(audit.QueryDecisions(aupb.QueryDecisionsRequest(), metadata=as_(AUDITOR)))
    assert mine and {r.tenant for r in mine} == {"acme"}
    denied(audit.QueryDecisions, aupb.QueryDecisionsRequest(tenant="globex"), metadata=as_(AUDITOR))
    globex_call = aupb.QueryDecisionsRequest(call_id="toolu_gx", caller=GLOBEX_AGENT)
    assert list(audit.QueryDecisions(globex_call, metadata=as_(AUDITOR))) == []  # a filter widens no tenant
    assert [r.tenant for r in audit.QueryDecisions(globex_call, metadata=as_(SEC_AUDITOR))] == ["globex"]
    everyone = list(audit.QueryDecisions(aupb.QueryDecisionsRequest(), metadata=as_(SEC_AUDITOR)))
    assert {"acme", "globex"} <= {r.tenant for r in everyone}
    denied(stub.Authorize, make_request(), metadata=as_(SEC_AUDITOR))
    [event] = refused(sidecar, tenant="acme")  # the auditor of acme asked for globex's
    assert (event.caller, event.detail["rpc"]) == (AUDITOR, "QueryDecisions")
    [event] = refused(sidecar, tenant=SYSTEM_STREAM)  # an auditor of every tenant belongs to none
    assert (event.caller, event.detail["rpc"]) == (SEC_AUDITOR, "Authorize")
    system = aupb.QueryDecisionsRequest(tenant=SYSTEM_STREAM)  # read as any tenant, by an auditor of `*` only
    # The stream holds the sidecar's own records too: the bundle loaded at start-up.
    assert [(r.kind, r.caller, r.tenant) for r in audit.QueryDecisions(system, metadata=as_(SEC_AUDITOR))] == [
        ("bundle", "", SYSTEM_STREAM), ("authorize", SEC_AUDITOR, SYSTEM_STREAM)]
    denied(audit.QueryDecisions, system, metadata=as_(AUDITOR))


def test_an_auditor_of_several_tenants_pages_through_them_in_order(sidecar):
    from toolauthz.service.audit import visible_page

    for i, tenant in enumerate(["acme", "globex", "initech", "acme", "initech"]):
        sidecar.audit_writer.write(_event(tenant, i))
    page = visible_page(sidecar.audit_log, AuditQuery(), frozenset({"acme", "initech"}), limit=3, after_seq=0)
    assert [(r.event.tenant, r.event.call_id) for r in page] == [("acme", "c0"), ("initech", "c2"), ("acme", "c3")]
    rest = visible_page(sidecar.audit_log, AuditQuery(), frozenset({"acme", "initech"}), limit=3,
                        after_seq=page[-1].seq)
    assert [r.event.call_id for r in rest] == ["c4"]


def _event(tenant: str, i: int):
    from toolauthz.audit.records import AuditEvent

    return AuditEvent(kind="authorize", time=1_800_000_000.0 + i, tenant=tenant, call_id=f"c{i}", result="ALLOW")


def test_unlisted_and_unauthenticated_callers_get_the_public_keys_and_nothing_else(stub, sidecar):
    assert stub.GetKeys(pb.GetKeysRequest(), metadata=as_(STRANGER)).keys
    assert stub.GetKeys(pb.GetKeysRequest()).keys
    denied(stub.Authorize, make_request(), metadata=as_(STRANGER))
    denied(stub.Authorize, make_request())
    denied(stub.GetStatus, pb.GetStatusRequest())
    events = refused(sidecar)
    assert [(e.caller, e.error_codes, e.detail["rpc"]) for e in events] == [
        (STRANGER, ("caller_unknown",), "Authorize"), ("unauthenticated", ("caller_unknown",), "Authorize"),
        ("unauthenticated", ("caller_unknown",), "GetStatus")]


def test_without_callers_every_record_says_unauthenticated(settings, clock):
    from toolauthz.server.build import build_sidecar

    car = build_sidecar(settings, clock=clock)  # development: no callers, the default resolver
    try:
        request = make_request()
        result = car.authorizer.authorize(*_trusted(request), caller="unauthenticated")
        assert result.token is not None
        [record] = car.audit_log.query(AuditQuery(call_id="toolu_1"), limit=5)
        assert record.event.caller == "unauthenticated"
    finally:
        car.close()


def _trusted(request: pb.AuthorizeRequest):
    from toolauthz.service.common import proposed_call, trusted_context

    return trusted_context(request.context), proposed_call(request.call)


def test_a_development_server_admits_and_records_every_caller_as_unauthenticated(settings, clock):
    from toolauthz.server.build import build_sidecar, create_server

    car = build_sidecar(settings, clock=clock)
    server, port = create_server(car, "127.0.0.1:0")
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            assert pb_grpc.ToolAuthorizerStub(channel).Authorize(make_request()).decision == pb.ALLOW
            records = list(aupb_grpc.AuditStub(channel).QueryDecisions(aupb.QueryDecisionsRequest()))
        assert [r.event.caller for r in calls_audited(car)] == ["unauthenticated"]
        assert [(r.kind, r.tenant) for r in records] == [("bundle", "_system"), ("authorize", "acme")]
    finally:
        server.stop(None)
        car.close()


def test_the_catalog_is_served_to_runtimes_alone_as_the_bytes_the_sidecar_loaded(stub, sidecar, bundle_dir):
    served = stub.GetCatalog(pb.GetCatalogRequest(), metadata=as_(AGENT))
    files = {f.name: f.content for f in served.files}
    assert files == {f"tools/{p.name}": p.read_bytes() for p in (bundle_dir / "tools").iterdir()}
    assert served.bundle_digest == sidecar.bundles.current.digest and not served.HasField("revision")
    again = stub.GetCatalog(pb.GetCatalogRequest(known_digest=served.bundle_digest), metadata=as_(AGENT))
    assert again.unchanged and not again.files
    for caller in (CONSOLE, AUDITOR, STRANGER):
        denied(stub.GetCatalog, pb.GetCatalogRequest(), metadata=as_(caller))
    denied(stub.GetCatalog, pb.GetCatalogRequest())  # unauthenticated
