"""Approvers proven by their identity provider: an ID token decides who approves.

The issuer's keys are generated here (RSA and EC, with `cryptography` through joserfc),
and its JWKS written to a file as an operator would publish it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json

import grpc
import pytest
from conftest import make_request
from joserfc import jwt
from joserfc.jwk import ECKey, OctKey, RSAKey

from toolauthz.audit.store import AuditQuery
from toolauthz.bundle import load_bundle
from toolauthz.clock import FrozenClock
from toolauthz.engine import ApprovalSubject, may_approve
from toolauthz.errors import KeyFileError
from toolauthz.identity.jwks import static_keys
from toolauthz.identity.oidc import IdTokenRefused, IdTokenVerifier, OidcSettings
from toolauthz.model import Decision, Principal, TrustedContext
from toolauthz.proto.toolauthz.v1 import approvals_pb2 as apb
from toolauthz.proto.toolauthz.v1 import approvals_pb2_grpc as apb_grpc
from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb
from toolauthz.server.config import ApproverSettings, OidcApproverSettings

ISSUER, AUDIENCE = "https://idp.acme.example", "toolauthz-approvals"
NOW = 1_800_000_000
RSA_KEY = RSAKey.generate_key(2048, parameters={"kid": "rsa-1"})
EC_KEY = ECKey.generate_key("P-256", parameters={"kid": "ec-1"})
JWKS = {"keys": [RSA_KEY.as_dict(private=False), EC_KEY.as_dict(private=False)]}
LARGE = {"order_id": "ord_1", "amount_cents": 6000}


def claims(**changes) -> dict:
    base = {"iss": ISSUER, "aud": AUDIENCE, "sub": "dave", "iat": NOW, "exp": NOW + 300, "groups": ["finance"]}
    base.update(changes)
    return {k: v for k, v in base.items() if v is not None}


def id_token(key=RSA_KEY, alg="RS256", kid="rsa-1", typ=None, **changes) -> str:
    header = {"alg": alg, "kid": kid, **({"typ": typ} if typ else {})}
    return jwt.encode(header, claims(**changes), key, algorithms=[alg])


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unsigned(alg: str, signature: str = "") -> str:
    header = b64(json.dumps({"alg": alg, "kid": "rsa-1"}).encode())
    return f"{header}.{b64(json.dumps(claims()).encode())}.{signature}"


def hmac_with_public_key() -> str:
    """Alg confusion: HS256 keyed with the issuer's public key, which anyone has."""
    header = b64(json.dumps({"alg": "HS256", "kid": "rsa-1"}).encode())
    body = b64(json.dumps(claims()).encode())
    secret = json.dumps(RSA_KEY.as_dict(private=False)).encode()
    return f"{header}.{body}.{b64(hmac.new(secret, f'{header}.{body}'.encode(), hashlib.sha256).digest())}"


BAD_TOKENS = {
    "missing": lambda: "",
    "garbage": lambda: "not.a.token",
    "alg none": lambda: unsigned("none"),
    "HMAC keyed with the public key": hmac_with_public_key,
    "HMAC with a symmetric key": lambda: id_token(OctKey.import_key(b"k" * 32), alg="HS256"),
    "expired beyond the leeway": lambda: id_token(exp=NOW - 31),
    "not yet valid": lambda: id_token(nbf=NOW + 31),
    "issued in the future": lambda: id_token(iat=NOW + 31),
    "wrong issuer": lambda: id_token(iss="https://evil.example"),
    "wrong audience": lambda: id_token(aud="someone-else"),
    "no exp": lambda: id_token(exp=None),
    "no audience": lambda: id_token(aud=None),
    "unknown kid": lambda: id_token(kid="rsa-2"),
    "no kid": lambda: jwt.encode({"alg": "RS256"}, claims(), RSA_KEY),
    "signed by another key": lambda: id_token(RSAKey.generate_key(2048, parameters={"kid": "rsa-1"})),
    "EC kid with an RSA algorithm": lambda: id_token(EC_KEY, alg="ES256", kid="rsa-1"),
    "algorithm not configured": lambda: id_token(alg="RS512"),
    "a principal id the sidecar refuses": lambda: id_token(sub="dave\n"),
    "groups not a list of strings": lambda: id_token(groups="finance"),
    "an access token (typ at+jwt)": lambda: id_token(typ="at+jwt"),
    "an access token (typ application/at+jwt)": lambda: id_token(typ="application/at+jwt"),
    "a logout token": lambda: id_token(typ="logout+jwt"),
    "no iat": lambda: id_token(iat=None),
    "exp far in the future": lambda: id_token(exp=1e30),
    "a lifetime over the bound": lambda: id_token(iat=NOW - 3000, exp=NOW + 601),
    "several audiences, no azp": lambda: id_token(aud=["other", AUDIENCE]),
    "several audiences, azp of another client": lambda: id_token(aud=["other", AUDIENCE], azp="other"),
    "azp of another client": lambda: id_token(azp="other"),
}


def verifier(clock=None, **changes) -> IdTokenVerifier:
    settings = OidcSettings(ISSUER, AUDIENCE, static_keys(JWKS), **{"tenants": ("acme",), **changes})
    return IdTokenVerifier(settings, clock or FrozenClock(NOW))


@pytest.mark.parametrize("name", sorted(BAD_TOKENS))
def test_each_bad_id_token_is_refused(name):
    with pytest.raises(IdTokenRefused):
        verifier().verify(BAD_TOKENS[name](), "acme")


def test_a_valid_token_proves_its_person_and_groups_within_the_leeway():
    person = verifier().verify(id_token(groups=["finance", "oncall", "finance"]), "acme")
    assert person.principal == Principal("User", "dave") and person.groups == ("finance", "oncall")
    assert verifier().verify(id_token(EC_KEY, alg="ES256", kid="ec-1"), "acme").principal.id == "dave"
    assert verifier(FrozenClock(NOW + 300 + 29)).verify(id_token(), "acme").principal.id == "dave"  # clock skew
    several = id_token(aud=["other", AUDIENCE], azp=AUDIENCE, nbf=NOW + 29)
    assert verifier().verify(several, "acme").principal.id == "dave"
    for typ in ("JWT", "jwt", "application/jwt"):
        assert verifier().verify(id_token(typ=typ), "acme").principal.id == "dave"
    assert verifier().verify(id_token(iat=NOW - 3000, exp=NOW + 600), "acme")  # exactly the largest lifetime
    assert verifier(max_lifetime_seconds=7200).verify(id_token(iat=NOW - 3000, exp=NOW + 601), "acme")


def test_the_clock_is_the_injected_one():
    token = id_token()
    clock = FrozenClock(NOW)
    checker = verifier(clock)
    assert checker.verify(token, "acme")
    clock.advance(300 + 30)
    with pytest.raises(IdTokenRefused, match="expired"):
        checker.verify(token, "acme")


def test_a_token_is_accepted_only_in_a_tenant_the_provider_is_bound_to():
    with pytest.raises(IdTokenRefused) as err:
        verifier().verify(id_token(), "globex")
    assert err.value.code == "id_token_tenant"
    with pytest.raises(IdTokenRefused):
        verifier(tenants=()).verify(id_token(), "acme")  # no binding: no tenant at all
    claimed = verifier(tenants=("acme", "globex"), tenant_claim="org")
    assert claimed.verify(id_token(org="globex"), "globex").principal.id == "dave"
    assert claimed.verify(id_token(org=["acme", "globex"]), "acme").principal.id == "dave"
    for org in ("acme", None, ["acme"], 7, ""):
        with pytest.raises(IdTokenRefused) as err:
            claimed.verify(id_token(org=org), "globex")
        assert err.value.code == "id_token_tenant"
    anywhere = verifier(tenants=("*",), tenant_claim="org")
    assert anywhere.verify(id_token(org="initech"), "initech").principal.id == "dave"
    with pytest.raises(KeyFileError, match="tenant_claim"):
        verifier(tenants=("*",))


@pytest.mark.parametrize("jwks", [
    {"keys": []},
    {"keys": [{"kty": "oct", "k": b64(b"k" * 32), "kid": "hs"}]},
    {"keys": [RSA_KEY.as_dict(private=True)]},
    {"keys": [{**RSA_KEY.as_dict(private=False), "kid": ""}]},
    {"keys": [RSA_KEY.as_dict(private=False), RSA_KEY.as_dict(private=False)]},
])
def test_a_jwks_with_secrets_private_keys_or_unnamed_keys_is_refused_at_start(jwks):
    with pytest.raises(KeyFileError):
        static_keys(jwks)


def test_groups_of_another_tenant_are_not_honoured(bundle_dir):
    entities = json.loads((bundle_dir / "entities.json").read_text())
    entities.append({"uid": {"type": "Group", "id": "ops"}, "attrs": {},
                     "parents": [{"type": "Tenant", "id": "globex"}]})
    (bundle_dir / "entities.json").write_text(json.dumps(entities))
    (bundle_dir / "approvals.cedar").write_text(
        '@id("ops-approves")\npermit (principal in Group::"ops", action == Action::"approve", resource is Approval);')
    bundle = load_bundle(bundle_dir)
    subject = ApprovalSubject("01J0000000000000000000000A", "acme", "issue_refund", "finance", 'User::"alice"')
    dave = TrustedContext("acme", Principal("User", "dave"), "")
    assert may_approve(bundle, dave, subject, ["ops"]).decision is Decision.DENY
    in_globex = ApprovalSubject("01J0000000000000000000000B", "globex", "issue_refund", "finance", 'User::"gina"')
    assert may_approve(bundle, TrustedContext("globex", Principal("User", "dave"), ""), in_globex,
                       ["ops"]).decision is Decision.ALLOW


def test_the_token_replaces_static_memberships_of_its_person(bundle_dir):
    bundle = load_bundle(bundle_dir)  # static: bob is in Group::"finance" in acme
    subject = ApprovalSubject("01J0000000000000000000000A", "acme", "issue_refund", "finance", 'User::"alice"')
    bob = TrustedContext("acme", Principal("User", "bob"), "")
    assert may_approve(bundle, bob, subject).decision is Decision.ALLOW
    assert may_approve(bundle, bob, subject, []).decision is Decision.DENY
    assert may_approve(bundle, bob, subject, ["finance"]).decision is Decision.ALLOW


# -- through the sidecar -----------------------------------------------------------------


@pytest.fixture
def settings(settings, tmp_path):
    jwks_file = tmp_path / "idp-jwks.json"
    jwks_file.write_text(json.dumps(JWKS))
    oidc = OidcApproverSettings(issuer=ISSUER, audience=AUDIENCE, jwks_file=jwks_file, tenants=("acme",))
    return settings.model_copy(update={"approvers": ApproverSettings(oidc=oidc)})


@pytest.fixture
def approvals(channel) -> apb_grpc.ApprovalsStub:
    return apb_grpc.ApprovalsStub(channel)


def pending(stub, call_id="toolu_big") -> tuple[pb.AuthorizeRequest, pb.AuthorizeResponse]:
    request = make_request(args=LARGE, call_id=call_id)
    response = stub.Authorize(request)
    assert response.decision == pb.APPROVAL_REQUIRED
    return request, response


def decide(approvals, approval_id, token, who=("", ""), entities=b""):
    return approvals.DecideApproval(apb.DecideApprovalRequest(
        approval_id=approval_id, verdict=apb.APPROVE, reason="ok", id_token=token,
        approver=pb.TrustedContext(tenant="acme", principal=pb.Principal(type=who[0], id=who[1]),
                                   entities_json=entities)))


def refusals(sidecar) -> list:
    return [r.event for r in sidecar.audit_log.query(AuditQuery(kind="approval", result="refused"), limit=100)]


def test_a_valid_token_decides_as_the_person_it_names_with_its_groups(stub, approvals, sidecar):
    request, response = pending(stub)
    # dave is no static member of anything: the token's group makes him a finance approver.
    decided = decide(approvals, response.approval_id, id_token(sub="dave", groups=["finance"]))
    assert decided.status == apb.APPROVED and decided.approver.id == "dave"
    [record] = [r.event for r in sidecar.audit_log.query(AuditQuery(kind="approval", result="APPROVE"), limit=5)]
    assert (record.approver, record.caller, record.detail["id_token_groups"]) == \
        ('User::"dave"', "unauthenticated", ["finance"])
    token = approvals.GetApproval(apb.GetApprovalRequest(approval_id=response.approval_id, context=request.context))
    assert token.token.startswith("v4.public.")


def test_each_bad_token_is_refused_and_audited(stub, approvals, sidecar):
    _request, response = pending(stub)
    for name in sorted(BAD_TOKENS):
        with pytest.raises(grpc.RpcError) as err:
            decide(approvals, response.approval_id, BAD_TOKENS[name]())
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED, name
    events = refusals(sidecar)
    assert len(events) == len(BAD_TOKENS)
    assert {e.error_codes for e in events} == {("invalid_id_token",)}
    assert all(e.detail["reason"] and e.caller == "unauthenticated" for e in events)
    assert approvals.GetApproval(apb.GetApprovalRequest(approval_id=response.approval_id)).status == apb.PENDING


def test_the_request_cannot_name_another_approver_nor_bring_entities(stub, approvals, sidecar):
    _request, response = pending(stub)
    with pytest.raises(grpc.RpcError) as err:  # bob is static finance: the request may not borrow him
        decide(approvals, response.approval_id, id_token(sub="carol", groups=[]), who=("User", "bob"))
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    finance = json.dumps([{"uid": {"type": "User", "id": "carol"}, "attrs": {},
                           "parents": [{"type": "Group", "id": "finance"}]}]).encode()
    with pytest.raises(grpc.RpcError) as err:
        decide(approvals, response.approval_id, id_token(sub="carol", groups=[]), entities=finance)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as err:  # carol's token carries no group: not a finance approver
        decide(approvals, response.approval_id, id_token(sub="carol", groups=[]), who=("User", "carol"))
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert [e.error_codes for e in refusals(sidecar)] == [
        ("approver_mismatch",), ("invalid_entities",), ("approver_not_permitted",)]
    assert decide(approvals, response.approval_id, id_token(sub="erin"), who=("User", "erin")).status == apb.APPROVED


def test_a_requester_token_never_approves_their_own_call(stub, approvals):
    _request, response = pending(stub)
    with pytest.raises(grpc.RpcError) as err:
        decide(approvals, response.approval_id, id_token(sub="alice", groups=["finance"]))
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED and "own call" in err.value.details()


def test_the_cli_sends_the_id_token_from_a_file_or_the_environment(stub, server, tmp_path, monkeypatch, capsys):
    from toolauthz.cli.main import main

    _srv, port = server
    _request, first = pending(stub)
    _request, second = pending(stub, call_id="toolu_big2")
    token_file = tmp_path / "id-token"
    token_file.write_text(id_token(sub="dave") + "\n")
    args = ["approvals", "--server", f"127.0.0.1:{port}", "approve"]
    assert main([*args, first.approval_id, "--as", "User::dave", "--tenant", "acme",
                 "--id-token-file", str(token_file)]) == 0
    monkeypatch.setenv("TOOLAUTHZ_ID_TOKEN", id_token(sub="erin"))
    assert main([*args, second.approval_id, "--as", "User::erin", "--tenant", "acme"]) == 0
    out = capsys.readouterr().out
    assert 'User::"dave"' in out and 'User::"erin"' in out


@pytest.mark.parametrize("changes, message", [
    ({"tenants": ()}, "at least 1"),
    ({"tenants": ("*",)}, "tenant_claim"),
    ({"jwks_uri": "https://idp.acme.example/jwks"}, "exactly one of"),
    ({"jwks_file": None}, "exactly one of"),
    ({"jwks_file": None, "jwks_uri": "http://idp.acme.example/jwks"}, "https://"),
    ({"jwks_file": None, "discovery": True, "issuer": "http://idp.acme.example"}, "https://"),
    ({"refresh_interval_seconds": 3600, "max_key_age_seconds": 600}, "refresh_interval_seconds"),
])
def test_the_oidc_settings_are_checked_at_load(tmp_path, changes, message):
    from pydantic import ValidationError

    given = {"issuer": ISSUER, "audience": AUDIENCE, "jwks_file": tmp_path / "jwks.json", "tenants": ("acme",),
             **changes}
    with pytest.raises(ValidationError, match=message):
        OidcApproverSettings(**given)


def test_the_keys_come_from_the_configured_source(settings, tmp_path, clock):
    from toolauthz.identity.jwks import RemoteJwks, StaticKeys
    from toolauthz.server.roles import approver_keys

    oidc = settings.approvers.oidc
    assert isinstance(approver_keys(oidc, clock), StaticKeys)
    by_uri = approver_keys(oidc.model_copy(update={"jwks_file": None, "jwks_uri": "https://idp.example/jwks"}),
                           clock)
    assert isinstance(by_uri, RemoteJwks) and by_uri.settings.jwks_uri == "https://idp.example/jwks"
    discovered = approver_keys(oidc.model_copy(update={"jwks_file": None, "discovery": True}), clock)
    assert isinstance(discovered, RemoteJwks) and discovered.settings.issuer == ISSUER


def test_a_provider_bound_to_several_tenants_without_a_claim_is_logged(settings, clock, caplog):
    from toolauthz.server.roles import id_token_verifier

    shared = settings.approvers.oidc.model_copy(update={"tenants": ("acme", "globex")})
    with caplog.at_level("WARNING", logger="toolauthz.server"):
        id_token_verifier(settings.model_copy(update={"approvers": ApproverSettings(oidc=shared)}), clock)
    assert "acme, globex without a tenant_claim" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="toolauthz.server"):
        id_token_verifier(settings, clock)
    assert caplog.text == ""
