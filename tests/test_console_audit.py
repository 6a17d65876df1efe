"""The console's audit pages: the explorer's filters (validated), pagination and
resource column, a call's timeline, the chain's verification and the policy status."""

from __future__ import annotations

import json
import re

import pytest
from console_pages import browser, console_for, post_form, propose, sign_in

from toolauthz.model import ProposedCall
from toolauthz.store.ledger import CallOwner

ORDER = {"order_id": "ord_777", "amount_cents": 6000}


@pytest.fixture
def console(sidecar):
    return console_for(sidecar, sign_in="dev")


@pytest.fixture
def auditor(console):
    client = browser(console)
    sign_in(client, "erin", groups="auditors")
    return client


def refund_that_ran(sidecar, console) -> str:
    """ord_777's refund: asked, approved by bob in the console, verified, completed."""
    ctx, result = propose(sidecar, call_id="toolu_777", args=ORDER)
    bob = browser(console)
    sign_in(bob, "bob")
    page = f"/approvals/{result.approval_id}"
    assert post_form(bob, page, f"{page}/decide", verdict="APPROVE", reason="customer called").status_code == 303
    token = sidecar.approvals.get(result.approval_id, CallOwner("acme", "", str(ctx.principal), ctx.request_id)).token
    call = ProposedCall("toolu_777", "issue_refund", json.dumps(ORDER).encode())
    assert sidecar.authorizer.verify(token, ctx, call).valid
    sidecar.authorizer.report_outcome(ctx, "toolu_777", "completed")
    return result.approval_id


def rows(html: str) -> list[str]:
    return re.findall(r'data-testid="audit-row" data-seq="(\d+)"', html)


def test_an_auditor_finds_who_approved_a_refund_and_whether_it_ran_in_two_clicks(sidecar, console, auditor):
    refund_that_ran(sidecar, console)
    propose(sidecar, call_id="toolu_other")  # another order's call: not found by the filter
    found = auditor.get("/audit", params={"resource": "Order::ord_777"})
    assert found.status_code == 200
    # The decision and the approval name the resource (verify and outcome records name the call).
    assert len(rows(found.text)) == 2
    assert 'data-testid="audit-resource">Order::&#34;ord_777&#34;<' in found.text.replace("<wbr>", "")
    link = re.search(r'data-testid="call-link" href="([^"]+)"', found.text)
    assert link and link.group(1) == "/audit/call?id=toolu_777"
    story = auditor.get(link.group(1)).text
    assert re.findall(r'data-stage="(\w+)"', story) == ["decision", "approval", "verification", "outcome"]
    for fragment in ('data-testid="summary-verdict">APPROVE<', 'data-testid="summary-approver">User::&#34;bob&#34;<',
                     'data-testid="summary-reason">customer called<', 'data-testid="summary-verified">yes<',
                     'data-testid="summary-outcome">completed<'):
        assert fragment in story, fragment


def test_the_timeline_is_in_the_order_things_happened(sidecar, console, auditor, clock):
    ctx, result = propose(sidecar, call_id="toolu_777", args=ORDER)
    clock.advance(3)
    bob = browser(console)
    sign_in(bob, "bob")
    page = f"/approvals/{result.approval_id}"
    assert post_form(bob, page, f"{page}/decide", verdict="REJECT", reason="wrong order").status_code == 303
    story = auditor.get("/audit/call", params={"id": "toolu_777"}).text
    seqs = [int(s) for s in re.findall(r'data-testid="timeline-step" data-stage="\w+" data-seq="(\d+)"', story)]
    assert seqs == sorted(seqs) and len(seqs) == 2
    assert 'data-testid="summary-verdict">REJECT<' in story and "wrong order" in story
    assert 'data-testid="summary-verified">no<' in story


@pytest.mark.parametrize("params, problem", [
    ({"result": "allowed"}, "result must be one of ALLOW, DENY"),
    ({"kind": "approvals"}, "kind must be one of authorize, verify, approval, outcome"),
    ({"principal": "alice"}, "principal must look like"),
    ({"approver": 'User::"bob smith"'}, "approver must be a Cedar uid"),
    ({"resource": "ord_777"}, "resource must look like"),
    ({"since": "yesterday"}, "`since` must be an ISO 8601 time"),
    ({"limit": "0"}, "`limit` must be a whole number from 1 to 500"),
    ({"after_seq": "-1"}, "`after_seq` must be a whole number"),
    ({"tenant": "globex"}, "unknown filter `tenant`"),
])
def test_a_filter_no_record_can_match_is_an_error_on_the_page(auditor, params, problem):
    answer = auditor.get("/audit", params=params)
    assert answer.status_code == 400
    assert problem in answer.text.replace("&#96;", "`")


def test_filters_are_read_as_records_spell_them_and_pages_follow_on(sidecar, console, auditor):
    refund_that_ran(sidecar, console)
    assert len(rows(auditor.get("/audit", params={"result": "approve"}).text)) == 1
    assert len(rows(auditor.get("/audit", params={"approver": "User::bob"}).text)) == 1
    assert len(rows(auditor.get("/audit", params={"policy": "refund-own-order-large-needs-finance"}).text)) == 1
    assert len(rows(auditor.get("/audit", params={"caller": "console:dev"}).text)) == 1
    # Record 1 is the bundle loaded at start-up: the refund's records are 2 to 5.
    for order, expected in (("newest", ["5", "4", "3", "2"]), ("oldest", ["2", "3", "4", "5"])):
        seen, page = [], auditor.get("/audit", params={"limit": "3", "tool": "issue_refund", "order": order}).text
        while True:
            seen += rows(page)
            following = re.search(r'id="next-page" data-testid="next-page" href="([^"]+)"', page)
            if not following:
                break
            page = auditor.get(following.group(1).replace("&amp;", "&")).text
        assert seen == expected, order
    assert rows(auditor.get("/audit", params={"tool": "issue_refund"}).text) == ["5", "4", "3", "2"]  # the default


def test_an_auditor_sees_only_their_tenant(sidecar, console):
    propose(sidecar, call_id="toolu_globex", principal="gail", tenant="globex")
    acme = browser(console)
    sign_in(acme, "erin", groups="auditors")
    assert rows(acme.get("/audit").text) == []
    assert acme.get("/audit/call", params={"id": "toolu_globex"}).status_code == 404
    globex = browser(console)
    sign_in(globex, "gus", "globex", groups="auditors")
    assert len(rows(globex.get("/audit").text)) == 1


def test_the_chain_is_verified_on_demand_with_its_last_checkpoint(sidecar, console, auditor):
    refund_that_ran(sidecar, console)
    assert 'data-testid="last-checkpoint">No checkpoint yet.<' in auditor.get("/audit").text
    assert sidecar.checkpointer.checkpoint() is not None
    explorer = auditor.get("/audit").text
    # The refund's 4 records and the bundle loaded at start-up.
    assert 'data-testid="last-checkpoint">5\n  records at 2027-01-15T08:00:00Z<' in explorer
    assert 'id="verify-chain"' in explorer
    verified = post_form(auditor, "/audit", "/audit/verify")
    assert verified.status_code == 200 and "Intact: 5 records" in verified.text
    assert "Last verified at" in auditor.get("/audit").text


def test_the_policy_status_shows_the_version_and_the_last_reload_error(sidecar, auditor, bundle_dir):
    page = auditor.get("/status").text
    assert f'data-testid="policy-version" class="code">{sidecar.bundles.current.version}<' in page
    assert 'data-testid="reload-error">none<' in page
    (bundle_dir / "broken.cedar").write_text("permit (principal, action, resource) when { <script> };")
    assert not sidecar.reloader.reload()
    page = auditor.get("/status").text
    assert 'data-testid="reload-error">none<' not in page and "broken.cedar" in page
    assert "<script>" not in page


def test_a_rewritten_record_shows_as_a_finding(sidecar, console, auditor):
    import sqlite3

    refund_that_ran(sidecar, console)
    conn = sqlite3.connect(sidecar.settings.database_path)
    conn.execute("DROP TRIGGER audit_record_no_update")
    conn.execute("UPDATE audit_record SET result = 'REJECT' WHERE kind = 'approval'")
    conn.commit()
    conn.close()
    verified = post_form(auditor, "/audit", "/audit/verify")
    assert verified.status_code == 200 and "The audit trail was altered" in verified.text
    assert 'id="findings"' in verified.text
