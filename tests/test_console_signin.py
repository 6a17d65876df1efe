"""The console's authenticators: trusted proxy headers and the development sign-in
(OIDC ID tokens: test_console_oidc.py)."""

from __future__ import annotations

import pytest
from console_pages import browser, console_for, csrf_of, post_form, propose, sign_in

from toolauthz.audit.store import AuditQuery
from toolauthz.console.signin import DevSignIn, SignInRefused
from toolauthz.errors import ToolAuthzError
from toolauthz.server.config import load_settings

PROXY = {"sign_in": "proxy", "proxy": {"trusted": ["10.0.0.0/24"]}}
BOB = {"X-Forwarded-User": "bob", "X-Forwarded-Groups": "finance, auditors", "X-Forwarded-Tenant": "acme"}


def test_a_proxy_with_a_fixed_tenant_never_reads_the_tenant_header(sidecar):
    _, result = propose(sidecar)
    console = console_for(sidecar, listen="0.0.0.0:0", sign_in="proxy",
                          proxy={"trusted": ["127.0.0.1/32"], "tenant": "acme"})
    proxied = browser(console, peer="127.0.0.1", host="console.example")
    person = {"X-Forwarded-User": "bob", "X-Forwarded-Groups": "finance"}
    page = proxied.get("/inbox", headers={**person, "X-Forwarded-Tenant": "globex"})  # a client's, passed through
    assert page.status_code == 200 and result.approval_id in page.text  # acme's inbox, not globex's
    assert proxied.get("/inbox", headers=person).status_code == 200


def test_proxy_headers_sign_in_from_a_trusted_proxy_only(sidecar):
    _, result = propose(sidecar)
    console = console_for(sidecar, listen="0.0.0.0:0", **PROXY)
    trusted = browser(console, peer="10.0.0.7", host="console.example")
    page = trusted.get("/inbox", headers=BOB)
    assert page.status_code == 200 and result.approval_id in page.text
    assert 'data-testid="signed-in-as">User::&#34;bob&#34;<' in page.text
    assert trusted.get("/audit", headers=BOB).status_code == 200  # `auditors` from the proxy's header
    # The same headers from anyone else are refused, never believed.
    stranger = browser(console, peer="192.0.2.9", host="console.example")
    refused = stranger.get("/inbox", headers=BOB)
    assert refused.status_code == 403 and "only from the configured proxy addresses" in refused.text
    assert stranger.get("/inbox").status_code == 303  # no headers: sign in (through the proxy)
    assert "through its reverse proxy" in stranger.get("/signin").text
    # A decision through the proxy's person, with the page's CSRF token.
    approve = f"/approvals/{result.approval_id}"
    token = csrf_of(trusted.get(approve, headers=BOB).text)
    decided = trusted.post(f"{approve}/decide", headers=BOB, data={"csrf_token": token, "verdict": "APPROVE"})
    assert decided.status_code == 303
    [record] = sidecar.audit_log.query(AuditQuery(kind="approval"), limit=5)
    assert (record.event.approver, record.event.caller) == ('User::"bob"', "console:proxy")


def test_malformed_proxy_headers_are_refused(sidecar):
    console = console_for(sidecar, listen="0.0.0.0:0", **PROXY)
    trusted = browser(console, peer="10.0.0.7", host="console.example")
    for headers in ({**BOB, "X-Forwarded-User": "bob admin"}, {**BOB, "X-Forwarded-Tenant": "*"},
                    {**BOB, "X-Forwarded-Groups": "a b"}):
        assert trusted.get("/inbox", headers=headers).status_code == 403
    # A header sent twice (a client's passed on beside the proxy's) is refused, not merged.
    for name in ("x-forwarded-user", "x-forwarded-groups", "x-forwarded-tenant"):
        doubled = [(k, v) for k, v in BOB.items()] + [(name, "auditors" if "groups" in name else "mallory")]
        assert trusted.get("/inbox", headers=doubled).status_code == 403, name


def test_the_development_sign_in_is_refused_off_loopback(sidecar, tmp_path):
    with pytest.raises(ToolAuthzError, match="allowed only when console_listen is a loopback address"):
        load_settings(None, console_listen="0.0.0.0:8700", data_dir=str(tmp_path))
    with pytest.raises(ToolAuthzError, match="loopback"):
        load_settings(None, console_listen="192.0.2.1:8700", console={"sign_in": "dev"})
    assert load_settings(None, console_listen="[::1]:0").console.sign_in == "dev"
    # Even with settings that were never validated, the console refuses to build.
    with pytest.raises(SignInRefused, match="loopback"):
        console_for(sidecar, listen="0.0.0.0:0", sign_in="dev")
    with pytest.raises(SignInRefused):
        DevSignIn(loopback=False)


def test_the_development_sign_in_says_so_on_every_page(sidecar):
    console = console_for(sidecar, sign_in="dev")
    client = browser(console)
    assert 'id="dev-banner"' in client.get("/signin").text
    sign_in(client, "erin", groups="auditors")
    for path in ("/inbox", "/audit", "/status"):
        assert 'id="dev-banner"' in client.get(path).text, path
    refused = post_form(client, "/signin", "/signin", principal="bob smith", tenant="acme")
    assert refused.status_code == 403 and "is not a principal id" in refused.text


def test_settings_that_cannot_work_are_refused():
    for console, problem in (({"sign_in": "proxy"}, "needs `console.proxy`"),
                             ({"sign_in": "oidc", "oidc": {"tenant": "acme"}}, "needs `console.oidc`"),
                             ({"sign_in": "proxy", "proxy": {"trusted": ["not-a-cidr"]}}, "not an address")):
        with pytest.raises(ToolAuthzError, match=problem):
            load_settings(None, console_listen="127.0.0.1:0", console=console)
