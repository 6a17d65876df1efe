"""The listener proves the caller and the roles decide what it may do: the two halves of
authenticated calls, end to end over real mTLS (no test-only caller resolver)."""

from __future__ import annotations

import pathlib

import grpc
import pytest

from tests.certs import CertificateAuthority
from tests.conftest import make_request
from toolauthz.client import ClientTls
from toolauthz.proto.toolauthz.v1 import approvals_pb2 as apb
from toolauthz.proto.toolauthz.v1 import approvals_pb2_grpc as apb_grpc
from toolauthz.proto.toolauthz.v1 import audit_pb2 as aupb
from toolauthz.proto.toolauthz.v1 import audit_pb2_grpc as aupb_grpc
from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb
from toolauthz.proto.toolauthz.v1 import authorizer_pb2_grpc as pb_grpc
from toolauthz.server.build import build_sidecar, create_listener_server
from toolauthz.server.config import ListenerSettings
from toolauthz.store import SqliteAuditLog

RUNTIME = "spiffe://acme.example/agent/support"
APPROVER = "spiffe://acme.example/approval-console"
AUDITOR = "spiffe://sec.example/audit"
STRANGER = "spiffe://elsewhere.example/anyone"
LARGE = {"order_id": "ord_1", "amount_cents": 6000, "reason": "parcel lost"}


@pytest.fixture
def mtls(settings, clock, tmp_path: pathlib.Path):
    """A sidecar with `callers:` and one mTLS listener; channel(identity) -> a channel
    whose client certificate names `identity`."""
    ca = CertificateAuthority()
    cert, key = ca.server().write(tmp_path / "pki", "server")
    ca_file = ca.write(tmp_path / "pki" / "ca.pem")
    settings = type(settings).model_validate({**settings.model_dump(), "callers": [
        {"id": RUNTIME, "roles": ["runtime"], "tenants": ["acme"]},
        {"id": APPROVER, "roles": ["approver"], "tenants": ["acme"]},
        {"id": AUDITOR, "roles": ["auditor"], "tenants": ["globex"]},
    ]})
    sidecar = build_sidecar(settings, clock=clock)
    server, address = create_listener_server(sidecar, ListenerSettings(
        address="127.0.0.1:0", tls={"cert": cert, "key": key, "client_ca": ca_file}))
    channels: list[grpc.Channel] = []

    def channel(identity: str) -> grpc.Channel:
        client_cert, client_key = ca.issue(uris=(identity,)).write(tmp_path / "pki", f"client{len(channels)}")
        made = grpc.secure_channel(address, ClientTls(ca=ca_file, cert=client_cert, key=client_key).credentials())
        channels.append(made)
        return made

    yield sidecar, channel
    for made in channels:
        made.close()
    server.stop(None).wait()
    sidecar.close()


def code_of(call) -> grpc.StatusCode | None:
    try:
        call()
    except grpc.RpcError as exc:
        return exc.code()
    return None


def test_the_certificate_decides_what_a_caller_may_do(mtls):
    sidecar, channel = mtls
    runtime = pb_grpc.ToolAuthorizerStub(channel(RUNTIME))
    gated = runtime.Authorize(make_request(args=LARGE), timeout=10)
    assert gated.decision == pb.APPROVAL_REQUIRED

    approver = channel(APPROVER)
    bob = pb.TrustedContext(tenant="acme", principal=pb.Principal(type="User", id="bob"))
    # The console may not Authorize, and the runtime may not approve its own call's approval.
    assert code_of(lambda: pb_grpc.ToolAuthorizerStub(approver).Authorize(
        make_request(call_id="toolu_2"), timeout=10)) == grpc.StatusCode.PERMISSION_DENIED
    assert code_of(lambda: apb_grpc.ApprovalsStub(channel(RUNTIME)).DecideApproval(apb.DecideApprovalRequest(
        approval_id=gated.approval_id, approver=bob, verdict=apb.APPROVE), timeout=10)) == \
        grpc.StatusCode.PERMISSION_DENIED
    decided = apb_grpc.ApprovalsStub(approver).DecideApproval(apb.DecideApprovalRequest(
        approval_id=gated.approval_id, approver=bob, verdict=apb.APPROVE), timeout=10)
    assert decided.status == apb.APPROVED and not decided.token  # an approver never holds the token

    # A caller the CA signed but `callers:` does not list gets nothing but the keys.
    stranger = pb_grpc.ToolAuthorizerStub(channel(STRANGER))
    assert code_of(lambda: stranger.GetKeys(pb.GetKeysRequest(), timeout=10)) is None
    assert code_of(lambda: stranger.Authorize(make_request(call_id="toolu_3"), timeout=10)) == \
        grpc.StatusCode.PERMISSION_DENIED

    # globex's auditor sees none of acme's records, even asking for no tenant at all.
    auditor = aupb_grpc.AuditStub(channel(AUDITOR))
    assert list(auditor.QueryDecisions(aupb.QueryDecisionsRequest(limit=100), timeout=10)) == []
    assert code_of(lambda: list(auditor.QueryDecisions(aupb.QueryDecisionsRequest(tenant="acme"), timeout=10))) \
        == grpc.StatusCode.PERMISSION_DENIED

    log = SqliteAuditLog(str(sidecar.settings.database_path))
    try:
        records = [r.event for r in log.iter_records()]
    finally:
        log.close()
    assert {e.caller for e in records if e.kind == "authorize" and e.result == "APPROVAL_REQUIRED"} == {RUNTIME}
    refused = {(e.caller, e.result) for e in records if e.result == "refused"}
    assert {(APPROVER, "refused"), (RUNTIME, "refused"), (STRANGER, "refused")} <= refused
