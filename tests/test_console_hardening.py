"""The console against an attacker: oversized bodies, cross-site requests, method
confusion, odd numbers and doubled proxy headers (the review of docs/console.md's
security model)."""

from __future__ import annotations

import pytest
from console_pages import browser, console_for, csrf_of, post_form, propose, sign_in

from toolauthz.audit.store import AuditQuery
from toolauthz.console.app import MAX_FORM_BYTES
from toolauthz.console.session import COOKIE

PROXY = {"sign_in": "proxy", "proxy": {"trusted": ["10.0.0.0/24"]}}
BOB = {"X-Forwarded-User": "bob", "X-Forwarded-Groups": "finance", "X-Forwarded-Tenant": "acme"}


@pytest.fixture
def console(sidecar):
    return console_for(sidecar, sign_in="dev")


def test_a_body_larger_than_any_form_is_refused_before_it_is_parsed(console):
    # Empty fields pass the per-field caps: only a cap on the body stops a flood of them,
    # which anyone could otherwise make the event loop parse before the CSRF check.
    client = browser(console)
    token = csrf_of(client.get("/signin").text)
    flood = f"csrf_token={token}&principal=bob&tenant=acme&".encode() + b"&" * (MAX_FORM_BYTES + 1)
    for headers in ({}, {"content-length": "999999999999"}):
        answer = client.post("/signin", content=flood, headers={
            "content-type": "application/x-www-form-urlencoded", **headers})
        assert answer.status_code == 413, answer.status_code
        assert "larger than" in answer.text
    assert client.get("/inbox").status_code == 303  # nobody signed in


def test_checking_the_chain_is_a_post_with_the_csrf_token(console):
    # It reads every record: a cross-site <img> (whose request a proxy's own SSO cookie
    # would authenticate) must not be able to start one.
    auditor = browser(console)
    sign_in(auditor, "erin", groups="auditors")
    assert auditor.get("/audit/verify").status_code == 405
    assert auditor.post("/audit/verify", data={}).status_code == 403
    answer = post_form(auditor, "/audit", "/audit/verify")
    assert answer.status_code == 200 and 'id="verify-result"' in answer.text
    assert 'id="verify-chain"' in auditor.get("/audit").text


def test_the_session_cookie_is_host_only_and_cross_site_posts_are_refused(sidecar, console):
    # `__Host-`: a sibling domain cannot plant its own session (and so its CSRF token)
    # in a person's browser; Sec-Fetch-Site refuses a form another site submits.
    assert COOKIE.startswith("__Host-")
    _, result = propose(sidecar)
    client = browser(console)
    sign_in(client, "bob")
    page = f"/approvals/{result.approval_id}"
    token = csrf_of(client.get(page).text)
    for site in ("cross-site", "same-site"):
        answer = client.post(f"{page}/decide", headers={"sec-fetch-site": site},
                             data={"csrf_token": token, "verdict": "APPROVE"})
        assert answer.status_code == 403 and "another site" in answer.text, site
    assert sidecar.approvals.get(result.approval_id).status == "pending"
    answer = client.post(f"{page}/decide", headers={"sec-fetch-site": "same-origin"},
                         data={"csrf_token": token, "verdict": "APPROVE"})
    assert answer.status_code == 303


@pytest.mark.parametrize("params", [{"limit": "\u00b2"}, {"after_seq": "\u0663"}, {"limit": "\uff15"}])
def test_paging_numbers_are_ascii_digits(console, params):
    auditor = browser(console)
    sign_in(auditor, "erin", groups="auditors")
    answer = auditor.get("/audit", params=params)
    assert answer.status_code == 400 and "whole number" in answer.text


def test_an_empty_second_proxy_header_is_refused_too(sidecar):
    # A proxy that appends rather than replaces, and a client that sent the header first.
    console = console_for(sidecar, listen="0.0.0.0:0", **PROXY)
    trusted = browser(console, peer="10.0.0.7", host="console.example")
    for name, value in (("x-forwarded-groups", "auditors"), ("x-forwarded-user", "mallory")):
        for pair in ([(name, value), (name, "")], [(name, ""), (name, value)]):
            headers = [(k, v) for k, v in BOB.items() if k.lower() != name] + pair
            assert trusted.get("/audit", headers=headers).status_code == 403, pair


def test_a_trusted_proxy_reached_over_a_dual_stack_socket_is_still_trusted(sidecar):
    console = console_for(sidecar, listen="[::]:0", **PROXY)
    mapped = browser(console, peer="::ffff:10.0.0.7", host="console.example")
    assert mapped.get("/inbox", headers=BOB).status_code == 200
    outside = browser(console, peer="::ffff:192.0.2.9", host="console.example")
    assert outside.get("/inbox", headers=BOB).status_code == 403


def test_deciding_another_tenants_approval_says_it_does_not_exist(sidecar, console):
    _, result = propose(sidecar)
    gina = browser(console)
    sign_in(gina, "gina", "globex")
    token = csrf_of(gina.get("/inbox").text)
    answer = gina.post(f"/approvals/{result.approval_id}/decide", data={"csrf_token": token, "verdict": "APPROVE"})
    assert answer.status_code == 404 and "no such approval" in answer.text
    assert "tenant" not in answer.text.partition('id="error"')[2].partition("</p>")[0]
    # The attempt is still audited as the desk refused it.
    [refused] = sidecar.audit_log.query(AuditQuery(kind="approval", result="refused"), limit=5)
    assert refused.event.error_codes == ("cross_tenant",)


@pytest.mark.both_stores
def test_a_reason_with_a_nul_is_a_bad_request_on_every_store(sidecar, console):
    # PostgreSQL text holds no NUL: the store's refusal read as "store unavailable" (503).
    _, result = propose(sidecar)
    bob = browser(console)
    sign_in(bob, "bob")
    page = f"/approvals/{result.approval_id}"
    answer = post_form(bob, page, f"{page}/decide", verdict="REJECT", reason="no\x00pe")
    assert answer.status_code == 400 and "NUL" in answer.text
    assert sidecar.approvals.get(result.approval_id).status == "pending"


@pytest.mark.both_stores
def test_the_explorer_reads_only_the_last_checkpoint(sidecar, console, monkeypatch):
    # One is signed a minute while calls come: every explorer page read them all.
    for call_id in ("toolu_1", "toolu_2"):
        propose(sidecar, call_id=call_id)
        sidecar.checkpointer.checkpoint()
    last = sidecar.audit_log.checkpoints()[-1]

    def every_checkpoint():
        raise AssertionError("the explorer read every checkpoint")

    monkeypatch.setattr(sidecar.audit_log, "checkpoints", every_checkpoint)
    auditor = browser(console)
    sign_in(auditor, "erin", groups="auditors")
    page = auditor.get("/audit")
    assert page.status_code == 200
    assert f'data-testid="last-checkpoint">{last.count}\n' in page.text


def test_a_requester_sees_their_approval_but_never_decides_it(sidecar, console):
    _, result = propose(sidecar)  # alice's call
    alice = browser(console)
    sign_in(alice, "alice", groups="finance")
    page = f"/approvals/{result.approval_id}"
    shown = alice.get(page)
    assert shown.status_code == 200 and 'id="decide-form"' not in shown.text
    answer = post_form(alice, page, f"{page}/decide", verdict="APPROVE")
    assert answer.status_code == 403 and "never approves their own call" in answer.text
    [refused] = sidecar.audit_log.query(AuditQuery(kind="approval", result="refused"), limit=5)
    assert refused.event.error_codes == ("self_approval",)
    assert sidecar.approvals.get(result.approval_id).status == "pending"
