"""An ID token approves only in a tenant its identity provider is bound to, and never
makes a user the bundle declares in another tenant an approver (README "Threat model").

The issue's reproduction, over mutual TLS as `deploy/kubernetes/overlays/central` runs
it: an approval front end holds the approver role in acme and globex; a globex runtime's
9000-cent refund waits for finance. The identity provider is served by the test over
HTTPS (tests/idp.py) and found by OpenID discovery.
"""

from __future__ import annotations

import grpc
import pytest
from idp import TestIdp
from joserfc import jwt
from joserfc.jwk import ECKey

from tests.certs import CertificateAuthority
from tests.conftest import make_request, order_entity
from toolauthz.audit.store import AuditQuery
from toolauthz.client import ClientTls
from toolauthz.proto.toolauthz.v1 import approvals_pb2 as apb
from toolauthz.proto.toolauthz.v1 import approvals_pb2_grpc as apb_grpc
from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb
from toolauthz.proto.toolauthz.v1 import authorizer_pb2_grpc as pb_grpc
from toolauthz.server.build import build_sidecar, create_listener_server
from toolauthz.server.config import ListenerSettings

RUNTIME = "spiffe://example.org/ns/agents/sa/support"
APPROVAL_UI = "spiffe://example.org/ns/tools/sa/approval-ui"
AUDIENCE, NOW = "toolauthz-approvals", 1_800_000_000
KEY = ECKey.generate_key("P-256", parameters={"kid": "idp-1"})
REFUND = {"order_id": "ord_9", "amount_cents": 9000}


@pytest.fixture
def idp(tmp_path):
    served = TestIdp(tmp_path / "idp")
    served.publish(KEY)
    yield served
    served.close()


@pytest.fixture
def central(settings, clock, tmp_path, idp):
    """central(**oidc) -> (sidecar, runtime stub, approvals stub of the front end)."""
    ca = CertificateAuthority()
    cert, key = ca.server().write(tmp_path / "pki", "server")
    ca_file = ca.write(tmp_path / "pki" / "ca.pem")
    opened: list = []

    def start(**oidc):
        configured = type(settings).model_validate({**settings.model_dump(), "callers": [
            {"id": RUNTIME, "roles": ["runtime"], "tenants": ["acme", "globex"]},
            {"id": APPROVAL_UI, "roles": ["approver"], "tenants": ["acme", "globex"]},
        ], "approvers": {"oidc": {"issuer": idp.issuer, "audience": AUDIENCE, "discovery": True,
                                  "ca_file": str(idp.ca_file), **oidc}}})
        sidecar = build_sidecar(configured, clock=clock)
        server, address = create_listener_server(sidecar, ListenerSettings(
            address="127.0.0.1:0", tls={"cert": cert, "key": key, "client_ca": ca_file}))
        opened.append((sidecar, server))

        def channel(identity: str) -> grpc.Channel:
            client_cert, client_key = ca.issue(uris=(identity,)).write(tmp_path / "pki", f"client{len(opened)}")
            made = grpc.secure_channel(address, ClientTls(ca=ca_file, cert=client_cert, key=client_key).credentials())
            opened.append(made)
            return made

        return (sidecar, pb_grpc.ToolAuthorizerStub(channel(RUNTIME)),
                apb_grpc.ApprovalsStub(channel(APPROVAL_UI)))

    yield start
    for item in reversed(opened):
        if isinstance(item, tuple):
            item[1].stop(None).wait()
            item[0].close()
        else:
            item.close()




def signed(idp, sub: str, groups=("finance",), **extra) -> str:
    claims = {"iss": idp.issuer, "aud": AUDIENCE, "sub": sub, "iat": NOW, "exp": NOW + 300,
              "groups": list(groups), **extra}
    return jwt.encode({"alg": "ES256", "kid": "idp-1"}, claims, KEY)


def refund_request(tenant: str, call_id: str) -> pb.AuthorizeRequest:
    return make_request(args=REFUND, tenant=tenant, principal="gus", call_id=call_id,
                        entities=[order_entity("ord_9", "gus")])


def waiting_refund(runtime, tenant: str = "globex", call_id: str = "toolu_refund") -> pb.AuthorizeResponse:
    response = runtime.Authorize(refund_request(tenant, call_id), timeout=10)
    assert response.decision == pb.APPROVAL_REQUIRED
    return response


def decide(approvals, approval_id: str, tenant: str, token: str):
    return approvals.DecideApproval(apb.DecideApprovalRequest(
        approval_id=approval_id, verdict=apb.APPROVE, reason="ok", id_token=token,
        approver=pb.TrustedContext(tenant=tenant)), timeout=10)


def refused_with(approvals, approval_id: str, tenant: str, token: str) -> str:
    with pytest.raises(grpc.RpcError) as err:
        decide(approvals, approval_id, tenant, token)
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    return err.value.details()


def refusal_codes(sidecar) -> list[tuple[str, ...]]:
    events = [r.event for r in sidecar.audit_log.query(AuditQuery(kind="approval", result="refused"), limit=50)]
    assert all(e.caller == APPROVAL_UI for e in events)
    return [e.error_codes for e in events]


def test_acmes_user_never_approves_a_globex_call_whatever_the_token_says(central, idp):
    sidecar, runtime, approvals = central(tenants=["acme", "globex"])
    waiting = waiting_refund(runtime)
    # bob is acme's finance user (policies/entities.json); the IdP vouches for him.
    details = refused_with(approvals, waiting.approval_id, "globex", signed(idp, "bob"))
    assert "another tenant" in details
    assert refusal_codes(sidecar) == [("cross_tenant_approver",)]
    # Nothing changed: the approval waits, and a replay hands out no token.
    assert approvals.GetApproval(apb.GetApprovalRequest(approval_id=waiting.approval_id),
                                 timeout=10).status == apb.PENDING
    replay = runtime.Authorize(refund_request("globex", "toolu_refund"), timeout=10)
    assert replay.decision == pb.APPROVAL_REQUIRED and not replay.token
    # globex's own finance user approves it.
    assert decide(approvals, waiting.approval_id, "globex", signed(idp, "gina")).status == apb.APPROVED
    assert runtime.Authorize(refund_request("globex", "toolu_refund"), timeout=10).decision == pb.ALLOW


def test_an_undeclared_idp_user_is_refused_in_a_tenant_the_idp_is_not_bound_to(central, idp):
    sidecar, runtime, approvals = central(tenants=["acme"])
    waiting = waiting_refund(runtime)
    refused_with(approvals, waiting.approval_id, "globex", signed(idp, "dave"))
    refused_with(approvals, waiting.approval_id, "globex", signed(idp, "gina"))  # even globex's own user
    assert refusal_codes(sidecar) == [("id_token_tenant",)] * 2
    in_acme = waiting_refund(runtime, "acme", "toolu_acme")  # the bound tenant: dave's token works there
    assert decide(approvals, in_acme.approval_id, "acme", signed(idp, "dave")).status == apb.APPROVED


def test_a_tenant_claim_must_name_the_approvals_tenant(central, idp):
    sidecar, runtime, approvals = central(tenants=["acme", "globex"], tenant_claim="org")
    waiting = waiting_refund(runtime)
    refused_with(approvals, waiting.approval_id, "globex", signed(idp, "dave", org="acme"))
    refused_with(approvals, waiting.approval_id, "globex", signed(idp, "dave"))
    refused_with(approvals, waiting.approval_id, "globex", signed(idp, "bob", org="globex"))  # the IdP errs
    assert sorted(refusal_codes(sidecar)) == sorted([("id_token_tenant",)] * 2 + [("cross_tenant_approver",)])
    assert decide(approvals, waiting.approval_id, "globex", signed(idp, "dave", org="globex")).status == \
        apb.APPROVED


def test_an_unreachable_idp_refuses_and_never_allows(central, idp):
    sidecar, runtime, approvals = central(tenants=["globex"])
    waiting = waiting_refund(runtime)
    idp.respond("/jwks", b"", 503)
    details = refused_with(approvals, waiting.approval_id, "globex", signed(idp, "gina"))
    assert "keys are unavailable" in details
    [event] = [r.event for r in sidecar.audit_log.query(AuditQuery(kind="approval", result="refused"), limit=5)]
    assert event.error_codes == ("invalid_id_token",)
    assert event.detail["reason"] == "the identity provider's keys are unavailable"
