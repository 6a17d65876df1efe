"""The browser console's approver pages (toolauthz/console/), against a real sidecar.

A decision made in the console goes through the approval desk exactly as gRPC
DecideApproval does: the same refusals and audit records, and the waiting runtime's
watch hears of it and gets its token.
"""

from __future__ import annotations

import re

import grpc
import pytest
from conftest import make_request, verify_request
from console_pages import LARGE, browser, console_for, csrf_of, post_form, propose, sign_in

from toolauthz.audit.store import AuditQuery
from toolauthz.console.app import CSP
from toolauthz.console.session import COOKIE
from toolauthz.proto.toolauthz.v1 import approvals_pb2 as apb
from toolauthz.proto.toolauthz.v1 import approvals_pb2_grpc as apb_grpc
from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb
from toolauthz.proto.toolauthz.v1 import authorizer_pb2_grpc as pb_grpc
from toolauthz.store.ledger import CallOwner

GENEROUS = 30.0  # seconds: a deadline only a hang reaches


@pytest.fixture
def console(sidecar):
    return console_for(sidecar, sign_in="dev")


def inbox_ids(client) -> set[str]:
    page = client.get("/inbox")
    assert page.status_code == 200
    return set(re.findall(r'data-testid="approval-row" data-approval-id="([^"]+)"', page.text))


def test_the_inbox_lists_only_what_the_person_may_approve_in_their_tenant(sidecar, console):
    _, acme = propose(sidecar, call_id="toolu_acme")
    _, globex = propose(sidecar, call_id="toolu_globex", principal="gail", tenant="globex")
    expected = {("bob", "acme", ""): {acme.approval_id},  # finance in acme (the bundle's entities)
                ("gina", "globex", ""): {globex.approval_id},  # finance in globex
                # Groups typed at the development sign-in grant no approval: the bundle's do.
                ("carol", "acme", "finance"): set(),
                ("alice", "acme", ""): set(),  # never one's own call
                ("bob", "globex", ""): set()}  # bob is finance in acme, not in globex
    for (who, tenant, groups), ids in expected.items():
        client = browser(console)
        sign_in(client, who, tenant, groups)
        assert inbox_ids(client) == ids, who


def test_an_approval_page_shows_the_call_and_a_live_countdown(sidecar, console):
    _, result = propose(sidecar)
    client = browser(console)
    sign_in(client, "bob")
    page = client.get(f"/approvals/{result.approval_id}")
    assert page.status_code == 200
    html = page.text.replace("<wbr>", "")  # ids offer line breaks after their separators
    record = sidecar.approvals.get(result.approval_id)
    for fragment in ('id="approval-tool" data-testid="approval-tool">issue_refund<',
                     'Order::&#34;ord_1&#34;', 'User::&#34;alice&#34;', "refund-own-order-large-needs-finance",
                     record.short_code, 'id="decide-form"', 'name="verdict" value="APPROVE"', ">Amount<",
                     ">60.00 EUR<", 'data-expires-epoch="1800000900.0"', ">2027-01-15T08:15:00Z<",
                     "class=\"threshold\">&gt; 50.00 EUR</span>"):
        assert fragment in html, fragment
    assert '<script src="/static/console.js"' in html
    countdown = client.get("/static/console.js")
    assert countdown.status_code == 200 and "data-expires-epoch" in countdown.text


def test_approving_in_the_console_gives_the_waiting_runtime_its_token(sidecar, console, channel):
    stub, approvals = pb_grpc.ToolAuthorizerStub(channel), apb_grpc.ApprovalsStub(channel)
    request = make_request(args=LARGE)
    response = stub.Authorize(request)
    assert response.decision == pb.APPROVAL_REQUIRED
    watch = approvals.WatchApproval(apb.GetApprovalRequest(approval_id=response.approval_id,
                                                           context=request.context), timeout=GENEROUS)
    assert next(watch).status == apb.PENDING

    client = browser(console)
    sign_in(client, "bob")
    page = f"/approvals/{response.approval_id}"
    answer = post_form(client, page, f"{page}/decide", verdict="APPROVE", reason="checked the order")
    assert answer.status_code == 303 and answer.headers["location"] == page

    heard = next(watch)
    assert heard.status == apb.APPROVED and heard.approver.id == "bob" and heard.token
    assert stub.Verify(verify_request(request, heard.token)).valid
    shown = client.get(page).text
    assert 'data-testid="approval-status" class="status-approved">approved<' in shown
    assert 'id="decide-form"' not in shown and "checked the order" in shown
    [record] = sidecar.audit_log.query(AuditQuery(kind="approval", approval_id=response.approval_id), limit=10)
    assert (record.event.result, record.event.approver, record.event.caller) == ("APPROVE", 'User::"bob"',
                                                                                  "console:dev")


def test_a_rejection_and_its_reason_are_recorded(sidecar, console):
    _, result = propose(sidecar)
    client = browser(console)
    sign_in(client, "bob")
    page = f"/approvals/{result.approval_id}"
    assert post_form(client, page, f"{page}/decide", verdict="REJECT", reason="not this order").status_code == 303
    record = sidecar.approvals.get(result.approval_id)
    assert (record.status, record.reason, record.approver) == ("rejected", "not this order", 'User::"bob"')
    requester = CallOwner("acme", "", 'User::"alice"', "run-toolu_1")  # the call's owner: no token when rejected
    assert sidecar.approvals.call_owner(record) == requester
    assert not sidecar.approvals.get(result.approval_id, requester).token


def test_an_expired_approval_is_shown_expired_and_cannot_be_decided(sidecar, console, clock):
    _, result = propose(sidecar)
    client = browser(console)
    sign_in(client, "bob")
    page = f"/approvals/{result.approval_id}"
    token = csrf_of(client.get(page).text)
    clock.advance(sidecar.settings.approvals.ttl_seconds + 1)
    shown = client.get(page).text
    assert 'class="status-expired">expired<' in shown and 'id="expired-notice"' in shown
    assert 'id="decide-form"' not in shown and 'name="verdict"' not in shown
    assert result.approval_id not in inbox_ids(client)
    late = client.post(f"{page}/decide", data={"csrf_token": token, "verdict": "APPROVE"})
    assert late.status_code == 412 and "the approval is expired" in late.text
    assert sidecar.approvals.get(result.approval_id).status == "expired"
    refused = sidecar.audit_log.query(AuditQuery(kind="approval", result="refused"), limit=10)
    assert [r.event.error_codes for r in refused] == [("approval_expired",)]


def test_the_desk_refuses_in_the_console_what_it_refuses_over_grpc(sidecar, console):
    _, result = propose(sidecar)
    page = f"/approvals/{result.approval_id}"
    carol = browser(console)
    sign_in(carol, "carol", groups="finance")
    # Not shown to her (not an approver of it), and refused if she posts anyway.
    assert carol.get(page).status_code == 403
    token = csrf_of(carol.get("/inbox").text)
    refused = carol.post(f"{page}/decide", data={"csrf_token": token, "verdict": "APPROVE"})
    assert refused.status_code == 403 and "may not approve this call" in refused.text
    gina = browser(console)
    sign_in(gina, "gina", "globex")
    assert gina.get(page).status_code == 404  # another tenant's approval does not exist for her
    token = csrf_of(gina.get("/inbox").text)
    assert gina.post(f"{page}/decide", data={"csrf_token": token, "verdict": "APPROVE"}).status_code == 404
    bob = browser(console)
    sign_in(bob, "bob")
    assert post_form(bob, page, f"{page}/decide", verdict="REJECT", reason="no").status_code == 303
    again = post_form(bob, "/inbox", f"{page}/decide", verdict="APPROVE")
    assert again.status_code == 412 and "the approval is rejected" in again.text
    codes = [r.event.error_codes for r in sidecar.audit_log.query(
        AuditQuery(kind="approval", result="refused"), limit=10)]
    assert codes == [("approver_not_permitted",), ("cross_tenant",), ("approval_rejected",)]
    assert post_form(bob, page, f"{page}/decide", verdict="MAYBE").status_code == 400


def test_a_post_without_the_csrf_token_is_refused_before_any_work(sidecar, console):
    _, result = propose(sidecar)
    client = browser(console)
    sign_in(client, "bob")
    action = f"/approvals/{result.approval_id}/decide"
    for data in ({"verdict": "APPROVE"}, {"verdict": "APPROVE", "csrf_token": "forged"},
                 {"verdict": "APPROVE", "csrf_token": ""}):
        answer = client.post(action, data=data)
        assert answer.status_code == 403 and "CSRF" in answer.text
    # Another session's token is worth nothing in this one.
    other = browser(console)
    sign_in(other, "gina", "globex")
    stolen = csrf_of(other.get("/inbox").text)
    assert client.post(action, data={"verdict": "APPROVE", "csrf_token": stolen}).status_code == 403
    assert sidecar.approvals.get(result.approval_id).status == "pending"
    assert not sidecar.audit_log.query(AuditQuery(kind="approval"), limit=10)
    # Signing in and out are state changes too.
    fresh = browser(console)
    assert fresh.post("/signin", data={"principal": "bob", "tenant": "acme"}).status_code == 403
    assert client.post("/signout", data={}).status_code == 403


def test_every_response_carries_the_security_headers_and_a_strict_cookie(console):
    client = browser(console)
    for path in ("/signin", "/static/console.css", "/static/console.js", "/nowhere"):
        answer = client.get(path)
        assert answer.headers["content-security-policy"] == CSP, path
        assert answer.headers["x-content-type-options"] == "nosniff"
        assert answer.headers["referrer-policy"] == "no-referrer"
        assert answer.headers["x-frame-options"] == "DENY"
    assert CSP == ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
                   "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
    cookie = client.get("/signin").headers["set-cookie"]
    for flag in ("HttpOnly", "Secure", "SameSite=strict", "Path=/"):
        assert flag in cookie
    page = client.get("/signin").text
    assert "<script>" not in page and "style=" not in page and " on" + "click" not in page


def test_pages_need_a_person_and_audit_pages_an_auditor(sidecar, console):
    client = browser(console)
    answer = client.get("/inbox")
    assert answer.status_code == 303 and answer.headers["location"] == "/signin"
    sign_in(client, "bob")
    for path in ("/audit", "/audit/call?id=toolu_1", "/status"):
        assert client.get(path).status_code == 403, path
    assert post_form(client, "/inbox", "/audit/verify").status_code == 403
    auditor = browser(console)
    sign_in(auditor, "erin", groups="auditors")
    assert auditor.get("/audit").status_code == 200
    assert 'id="nav-audit"' in auditor.get("/inbox").text


def test_a_tampered_session_cookie_signs_nobody_in(console):
    client = browser(console)
    sign_in(client, "bob")
    cookie = client.cookies[COOKIE]
    client.cookies.clear()
    body, _, signature = cookie.rpartition(".")
    client.cookies.set(COOKIE, body[:-2] + "xx." + signature, domain="localhost")
    assert client.get("/inbox").status_code == 303


def test_the_console_refuses_a_host_that_is_not_loopback_on_a_loopback_listener(console):
    # A page on a DNS name rebound to 127.0.0.1 must not reach the development sign-in.
    client = browser(console, host="evil.example")
    answer = client.get("/signin")
    assert answer.status_code == 403 and "loopback host" in answer.text


def test_grpc_and_console_see_the_same_approval(sidecar, console, channel):
    _, result = propose(sidecar)
    client = browser(console)
    sign_in(client, "bob")
    page = f"/approvals/{result.approval_id}"
    assert post_form(client, page, f"{page}/decide", verdict="APPROVE").status_code == 303
    shown = apb_grpc.ApprovalsStub(channel).GetApproval(apb.GetApprovalRequest(approval_id=result.approval_id))
    assert shown.status == apb.APPROVED and shown.approver.id == "bob"
    with pytest.raises(grpc.RpcError) as refused:
        apb_grpc.ApprovalsStub(channel).DecideApproval(apb.DecideApprovalRequest(
            approval_id=result.approval_id, verdict=apb.REJECT,
            approver=pb.TrustedContext(tenant="acme", principal=pb.Principal(type="User", id="bob"))))
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_serve_runs_the_console_beside_its_grpc_listener(sidecar):
    import urllib.request

    from toolauthz.server.build import create_server

    sidecar.settings = sidecar.settings.model_copy(update={"console_listen": "127.0.0.1:0"})
    srv, _port = create_server(sidecar, "127.0.0.1:0")
    try:
        assert srv.console_port
        with urllib.request.urlopen(f"http://127.0.0.1:{srv.console_port}/signin", timeout=GENEROUS) as answer:
            assert answer.status == 200 and answer.headers["content-security-policy"] == CSP
            assert 'id="signin-form"' in answer.read().decode()
    finally:
        srv.stop(None)
    assert (sidecar.settings.data_dir / "console-secret").stat().st_mode & 0o077 == 0


def test_an_oversized_form_is_refused_as_a_bad_request(sidecar, console):
    client = browser(console)
    token = csrf_of(client.get("/signin").text)
    fields = {f"f{i}": "x" for i in range(40)}
    answer = client.post("/signin", data={"csrf_token": token, **fields})
    assert answer.status_code == 400
