"""The console's OIDC sign-in: ID tokens verified as the approvers' gRPC path verifies
them (toolauthz/identity/oidc.py), and handed to the approval desk, which verifies them again."""

from __future__ import annotations

import json

import pytest
from console_pages import browser, console_for, post_form, propose
from joserfc import jwt
from joserfc.jwk import RSAKey
from pydantic import ValidationError

from toolauthz.audit.store import AuditQuery
from toolauthz.server.config import Settings

ISSUER, AUDIENCE, NOW = "https://idp.acme.example", "toolauthz-approvals", 1_800_000_000
KEY = RSAKey.generate_key(2048, parameters={"kid": "rsa-1"})


def id_token(key=KEY, **changes) -> str:
    claims = {"iss": ISSUER, "aud": AUDIENCE, "sub": "dave", "iat": NOW, "exp": NOW + 300, "groups": ["finance"],
              **changes}
    return jwt.encode({"alg": "RS256", "kid": "rsa-1"}, claims, key, algorithms=["RS256"])


@pytest.fixture
def settings(settings, tmp_path):
    jwks = tmp_path / "jwks.json"
    jwks.write_text(json.dumps({"keys": [KEY.as_dict(private=False)]}))
    return Settings.model_validate({**settings.model_dump(), "approvers": {"oidc": {
        "issuer": ISSUER, "audience": AUDIENCE, "jwks_file": str(jwks), "tenants": ["acme", "globex"]}}})


def oidc_console(sidecar):
    return console_for(sidecar, sign_in="oidc", oidc={"tenant": "acme"})


def test_an_id_token_signs_in_and_decides_as_the_person_it_proves(sidecar):
    _, result = propose(sidecar)
    client = browser(oidc_console(sidecar))
    signed = post_form(client, "/signin", "/signin", id_token=id_token())
    assert signed.status_code == 303
    inbox = client.get("/inbox").text
    assert result.approval_id in inbox  # dave is in finance by his token's groups
    page = f"/approvals/{result.approval_id}"
    assert post_form(client, page, f"{page}/decide", verdict="APPROVE", reason="ok").status_code == 303
    record = sidecar.approvals.get(result.approval_id)
    assert (record.status, record.approver) == ("approved", 'User::"dave"')
    [audited] = sidecar.audit_log.query(AuditQuery(kind="approval"), limit=5)
    assert audited.event.detail["id_token_groups"] == ["finance"] and audited.event.caller == "console:oidc"


def test_a_bad_or_expired_id_token_signs_nobody_in(sidecar, clock):
    client = browser(oidc_console(sidecar))
    stranger = RSAKey.generate_key(2048, parameters={"kid": "rsa-1"})
    for bad, reason in ((id_token(stranger), "bad signature"), (id_token(aud="other"), "wrong audience"),
                        ("garbage", "malformed")):
        refused = post_form(client, "/signin", "/signin", id_token=bad)
        assert refused.status_code == 403 and reason in refused.text
        assert client.get("/inbox").status_code == 303
    assert client.get("/inbox", headers={"Authorization": f"Bearer {id_token(stranger)}"}).status_code == 403
    # A bearer token from an auth proxy works per request; a session's token until it expires.
    assert client.get("/inbox", headers={"Authorization": f"Bearer {id_token()}"}).status_code == 200
    assert post_form(client, "/signin", "/signin", id_token=id_token()).status_code == 303
    assert client.get("/inbox").status_code == 200
    clock.advance(301 + 30)
    assert client.get("/inbox").status_code == 303


def test_with_approvers_proven_by_id_tokens_the_console_must_sign_in_with_them(settings):
    with pytest.raises(ValidationError, match="console.sign_in must be `oidc`"):
        Settings.model_validate({**settings.model_dump(), "console_listen": "127.0.0.1:0"})


def test_an_id_token_too_large_for_a_cookie_is_refused_at_sign_in(sidecar):
    client = browser(oidc_console(sidecar))
    large = id_token(groups=[f"group-{i:04d}" for i in range(250)])
    refused = post_form(client, "/signin", "/signin", id_token=large)
    assert refused.status_code == 403 and "Authorization: Bearer" in refused.text
    assert client.get("/inbox", headers={"Authorization": f"Bearer {large}"}).status_code == 200


def test_the_console_signs_people_in_only_through_the_providers_tenant_binding(sidecar):
    """The binding of DecideApproval (ApprovalDesk.prove_person): bob is acme's user, so
    no token signs him into globex's console; a tenant the provider is not bound to
    signs nobody in."""
    globex = browser(console_for(sidecar, sign_in="oidc", oidc={"tenant": "globex"}))
    refused = post_form(globex, "/signin", "/signin", id_token=id_token(sub="bob"))
    assert refused.status_code == 403 and "another tenant" in refused.text
    assert globex.get("/inbox", headers={"Authorization": f"Bearer {id_token(sub='bob')}"}).status_code == 403
    assert post_form(globex, "/signin", "/signin", id_token=id_token(sub="gina")).status_code == 303
    unbound = browser(console_for(sidecar, sign_in="oidc", oidc={"tenant": "initech"}))
    refused = post_form(unbound, "/signin", "/signin", id_token=id_token(sub="dave"))
    assert refused.status_code == 403 and "not bound to this tenant" in refused.text


def test_a_console_tenant_the_provider_is_not_bound_to_is_refused_at_start(settings):
    console = {"sign_in": "oidc", "oidc": {"tenant": "initech"}}
    with pytest.raises(ValidationError, match="not among approvers.oidc.tenants"):
        Settings.model_validate({**settings.model_dump(), "console_listen": "127.0.0.1:0", "console": console})
