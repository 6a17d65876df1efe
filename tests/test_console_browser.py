"""The console in a real browser: Debian's Chromium, driven by Playwright, against a real
sidecar serving the console on port 0 (FrozenClock; the browser's clock is set to it).

One browser for the module; each test a fresh context (no cookies) on a fresh sidecar.
Nothing sleeps: Playwright waits for the page's elements, the Guard's wait ends on an
event. Under CI=true a missing browser fails these tests; elsewhere it skips them.
`pytest tests/test_console_browser.py --console-screenshots` also writes the README's
screenshots to docs/console/.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import threading

import pytest
from conftest import make_request, order_entity, verify_request

try:
    from playwright.sync_api import expect, sync_playwright
except ImportError:  # the browser fixture then fails (CI) or skips, saying why
    expect = sync_playwright = None

from toolauthz.client import AuthzClient, Guard, Principal, ProposedCall, ToolSet, TrustedContext, load_output_schemas
from toolauthz.proto.toolauthz.v1 import approvals_pb2 as apb
from toolauthz.proto.toolauthz.v1 import approvals_pb2_grpc as apb_grpc
from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb

CHROMIUM = os.environ.get("TOOLAUTHZ_CHROMIUM", "/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SHOTS = pathlib.Path(__file__).resolve().parent.parent / "docs" / "console"
BOB = pb.TrustedContext(tenant="acme", principal=pb.Principal(type="User", id="bob"), request_id="ui")
SCRIPT = "<script>alert(1)</script>"
IMG = '"><img src=x onerror=alert(1)>'
ODD_ORDER = "ord_\x1b[31mred\nline"  # ANSI escape and newline in a resource id


def _no_browser(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason}: CI installs chromium (.ci/run); the browser tests must run there", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser():
    if sync_playwright is None:
        _no_browser("playwright is not installed")
    if not shutil.which(CHROMIUM):
        _no_browser(f"no Chromium at {CHROMIUM} (apt-get install chromium chromium-driver)")
    with sync_playwright() as playwright:
        # Playwright gives the browser a fresh temporary profile (user-data dir) of its own.
        launched = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        yield launched
        launched.close()


# -- the sidecar: the example bundle plus a second approver group and looser order ids --

LEGAL_POLICIES = """
@id("sealed-order-lookup-needs-legal")
@approval("legal")
permit (principal, action == Action::"tool:lookup_order", resource)
when { resource == Order::"ord_sealed" };

@id("legal-approves-sealed-lookups")
permit (principal in Group::"legal", action == Action::"approve", resource is Approval)
when { resource.group == "legal" && resource.tool == "lookup_order" };
"""


@pytest.fixture
def bundle_dir(bundle_dir):
    """The example bundle, and: a `legal` group (lena) approving sealed order lookups;
    refund order ids that may hold any character; the refund's reason shown to approvers."""
    (bundle_dir / "legal.cedar").write_text(LEGAL_POLICIES)
    entities = json.loads((bundle_dir / "entities.json").read_text())
    entities += [{"uid": {"type": "Group", "id": "legal"}, "attrs": {}, "parents": []},
                 {"uid": {"type": "User", "id": "lena"}, "attrs": {},
                  "parents": [{"type": "Group", "id": "legal"}, {"type": "Tenant", "id": "acme"}]}]
    (bundle_dir / "entities.json").write_text(json.dumps(entities))
    refund = bundle_dir / "tools" / "issue_refund.yaml"
    text = refund.read_text()
    for old, new in (('pattern: "^ord_[A-Za-z0-9]{1,32}$"', 'pattern: "^ord_[\\\\s\\\\S]{1,32}$"'),
                     ("record: [/order_id, /amount_cents]", "record: [/order_id, /amount_cents, /reason]")):
        assert old in text
        text = text.replace(old, new)
    text += """  /reason: {label: "Model's reason"}\n"""  # the display block ends the file
    refund.write_text(text)
    return bundle_dir


@pytest.fixture
def settings(settings):
    return settings.model_copy(update={"console_listen": "127.0.0.1:0"})


@pytest.fixture
def console(server):
    srv, _port = server
    assert srv.console_port
    return f"http://127.0.0.1:{srv.console_port}"


@pytest.fixture
def open_page(browser, clock, console):
    """`open_page()`: a page in a fresh context (its own cookies), its clock the sidecar's;
    any dialog a page opens (an alert from injected script) is recorded in `page.dialogs`."""
    contexts = []

    def make():
        context = browser.new_context(base_url=console)
        contexts.append(context)
        context.clock.set_fixed_time(clock.now())
        page = context.new_page()
        page.dialogs = []
        page.on("dialog", lambda dialog: (page.dialogs.append(dialog.message), dialog.dismiss()))
        return page

    yield make
    for context in contexts:
        context.close()


def sign_in(page, principal: str, tenant: str = "acme", groups: str = ""):
    page.goto("/signin")
    page.fill("#principal", principal)
    page.fill("#tenant", tenant)
    page.fill("#groups", groups)
    page.click("#signin")
    page.wait_for_url("**/inbox")
    assert page.inner_text("#signed-in-as") == f'User::"{principal}"'
    assert page.is_visible("#dev-banner")  # the development sign-in says so on every page


def screenshot(request, page, name: str) -> None:
    if request.config.getoption("--console-screenshots"):
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / name), full_page=True)


def refund(call_id: str, amount: int = 7000, order: str = "ord_1", reason: str = "parcel lost",
           tenant: str = "acme", principal: str = "alice") -> pb.AuthorizeRequest:
    return make_request(call_id=call_id, args={"order_id": order, "amount_cents": amount, "reason": reason},
                        tenant=tenant, principal=principal, entities=[order_entity(order, principal)])


def pending(stub, request: pb.AuthorizeRequest) -> str:
    answer = stub.Authorize(request)
    assert answer.decision == pb.APPROVAL_REQUIRED, answer
    return answer.approval_id


# -- the flows --------------------------------------------------------------------------


def test_an_approver_sees_only_their_approvals_and_the_waiting_guard_gets_the_token(
        request, open_page, stub, server, bundle_dir, sidecar):
    legal = pending(stub, make_request(tool="lookup_order", args={"order_id": "ord_sealed"}, call_id="call_legal",
                                       entities=[order_entity("ord_sealed", "alice")]))
    globex = pending(stub, refund("call_globex", tenant="globex", principal="gus"))

    # The runtime: alice's Guard proposes a large refund and waits for a person.
    runs: list[str] = []
    tools = ToolSet(output_schemas=load_output_schemas(bundle_dir))
    tools.register("issue_refund", lambda args, call: runs.append(call.call_id) or {"refund_id": "rf_1"})
    waiting, results = threading.Event(), []

    def observer(event):
        if event.kind == "approval" and event.data["status"] == "PENDING":
            waiting.set()

    def entities(call: ProposedCall):
        return [order_entity("ord_1", "alice")]

    client = AuthzClient(f"127.0.0.1:{server[1]}", timeout=10)
    guard = Guard(client, TrustedContext("acme", Principal("User", "alice"), "run-1", entities=entities), tools,
                  approval_wait=60, observer=observer)
    runtime = threading.Thread(target=lambda: results.append(guard.run(
        "call_guarded", "issue_refund", json.dumps({"order_id": "ord_1", "amount_cents": 7000}))))
    runtime.start()
    try:
        assert waiting.wait(30), "the Guard never started waiting for approval"
        page = open_page()
        sign_in(page, "bob")
        rows = page.locator("[data-testid=approval-row]")
        assert rows.count() == 1  # not legal's lookup, not globex's refund
        ids = rows.evaluate_all("rows => rows.map(r => r.dataset.approvalId)")
        assert legal not in ids and globex not in ids
        assert "Order::\"ord_1\"" in rows.first.inner_text()
        screenshot(request, page, "inbox.png")
        rows.first.locator("[data-testid=approval-link]").click()
        assert page.inner_text("#approval-status") == "pending"
        assert page.inner_text("#approval-policy") == "refund-own-order-large-needs-finance"
        assert "70.00 EUR" in page.inner_text("#approval-arguments")  # the display hint: money, EUR
        # The deferred script fills it once the page has loaded: wait for that, not a moment.
        expect(page.locator("#countdown")).to_have_text(re.compile(r"^expires in 15m"))
        page.fill("#reason", "checked the parcel tracking")
        screenshot(request, page, "approval.png")
        page.click("#approve")
        expect(page.locator("#approval-status")).to_have_text("approved")  # waits for the page after the POST
        runtime.join(30)
        assert not runtime.is_alive()
        [result] = results
        assert (result.status, result.decision) == ("completed", "APPROVAL_REQUIRED") and runs == ["call_guarded"]

        lena = open_page()
        sign_in(lena, "lena")
        assert lena.locator("[data-testid=approval-row]").evaluate_all(
            "rows => rows.map(r => r.dataset.approvalId)") == [legal]
        # Another tenant's approval does not exist for bob, even by its id.
        assert page.goto(f"/approvals/{globex}").status == 404
    finally:
        runtime.join(30)
        client.close()


def test_a_reject_with_a_reason_shows_in_the_audit_timeline(request, open_page, stub):
    approval_id = pending(stub, refund("call_rejected"))
    page = open_page()
    sign_in(page, "bob")
    page.goto(f"/approvals/{approval_id}")
    page.fill("#reason", "duplicate of <b>an earlier</b> refund")
    page.click("#reject")
    expect(page.locator("#approval-status")).to_have_text("rejected")
    assert page.inner_text("#approval-reason") == "duplicate of <b>an earlier</b> refund"

    auditor = open_page()
    sign_in(auditor, "carol", groups="auditors")
    auditor.goto(f"/approvals/{approval_id}")
    auditor.click("#timeline-link")
    assert auditor.inner_text("#summary-verdict") == "REJECT"
    assert auditor.inner_text("#summary-approver") == 'User::"bob"'
    assert auditor.inner_text("#summary-reason") == "duplicate of <b>an earlier</b> refund"
    stages = auditor.locator("[data-testid=timeline-step]").evaluate_all("steps => steps.map(s => s.dataset.stage)")
    assert stages == ["decision", "approval"]


def test_an_expired_approval_is_shown_expired_and_cannot_be_approved(open_page, stub, sidecar, clock):
    approval_id = pending(stub, refund("call_late"))
    clock.advance(sidecar.settings.approvals.ttl_seconds + 1)
    page = open_page()
    page.context.clock.set_fixed_time(clock.now())
    sign_in(page, "bob")
    assert page.locator("[data-testid=approval-row]").count() == 0
    page.goto(f"/approvals/{approval_id}")
    assert page.inner_text("#approval-status") == "expired"
    assert page.is_visible("#expired-notice") and page.locator("#decide-form").count() == 0
    assert page.locator("#countdown").count() == 0  # nothing counts down on an ended approval
    assert page.inner_text("#approval-heading") == "issue_refund: expired"
    # Posting the decision anyway (with the session's CSRF token) is refused by the desk.
    token = page.context.cookies()
    assert token  # signed in
    answer = page.request.post(f"/approvals/{approval_id}/decide", form={
        "csrf_token": _csrf_of(page), "verdict": "APPROVE", "reason": "late"})
    assert answer.status in (409, 412) and "expired" in answer.text()
    assert sidecar.approvals.get(approval_id).status == "expired"


def _csrf_of(page) -> str:
    """The session's CSRF token, as the sign-out form (on every signed-in page) carries it."""
    return page.locator("#signout-form input[name=csrf_token]").get_attribute("value")


def test_an_auditor_finds_the_call_by_resource_and_sees_its_timeline_in_two_clicks(
        request, open_page, stub, channel, clock):
    call = refund("call_777", order="ord_777")
    approval_id = pending(stub, call)
    clock.advance(95)  # a person takes a while; the runtime then runs the call at once
    approvals = apb_grpc.ApprovalsStub(channel)
    approvals.DecideApproval(apb.DecideApprovalRequest(approval_id=approval_id, verdict=apb.APPROVE,
                                                       reason="customer called", approver=BOB))
    token = approvals.GetApproval(apb.GetApprovalRequest(approval_id=approval_id, context=call.context)).token
    clock.advance(2)
    assert stub.Verify(verify_request(call, token)).valid
    clock.advance(3)
    stub.ReportOutcome(pb.ReportOutcomeRequest(context=call.context, call_id="call_777", status=pb.COMPLETED))
    stub.Authorize(refund("call_other", amount=1000))  # another order's call: not found by the filter

    page = open_page()
    sign_in(page, "carol", groups="auditors")
    page.click("#nav-audit")
    page.fill("#filter-resource", 'Order::"ord_777"')
    page.click("#search")  # first click
    page.wait_for_url("**/audit?*resource=*")
    links = page.locator("[data-testid=call-link]")
    assert set(links.all_inner_texts()) == {"call_777"}
    links.first.click()  # second click
    assert page.inner_text("#timeline-call-id") == "call_777"
    assert page.inner_text("#summary-verdict") == "APPROVE"
    assert page.inner_text("#summary-approver") == 'User::"bob"'
    assert page.inner_text("#summary-reason") == "customer called"
    assert page.inner_text("#summary-verified") == "yes"
    assert page.inner_text("#summary-outcome") == "completed"
    stages = page.locator("[data-testid=timeline-step]").evaluate_all("steps => steps.map(s => s.dataset.stage)")
    assert stages == ["decision", "approval", "verification", "outcome"]
    decided = page.inner_text("[data-testid=decided-by]")
    assert 'principal User::"alice", Tenant::"acme"' in decided
    assert 'supplied Order::"ord_777" {"/owner": {"__entity": {"id": "alice", "type": "User"}}, ' \
           '"/refundable_cents": 10000}' in " ".join(decided.split())
    screenshot(request, page, "timeline.png")


def test_a_post_without_the_csrf_token_is_refused(open_page, stub, sidecar):
    approval_id = pending(stub, refund("call_csrf"))
    page = open_page()
    sign_in(page, "bob")
    answer = page.request.post(f"/approvals/{approval_id}/decide", form={"verdict": "APPROVE", "reason": "x"})
    assert answer.status == 403 and "CSRF" in answer.text()
    wrong = page.request.post(f"/approvals/{approval_id}/decide",
                              form={"csrf_token": "not-the-token", "verdict": "APPROVE"})
    assert wrong.status == 403
    # The real form, its hidden token taken out, is refused the same way.
    page.goto(f"/approvals/{approval_id}")
    page.locator("#decide-form input[name=csrf_token]").evaluate("input => input.remove()")
    page.click("#approve")
    assert "CSRF" in page.inner_text("#error")
    assert sidecar.approvals.get(approval_id).status == "pending"


def test_model_supplied_strings_are_shown_as_text(open_page, stub):
    script = pending(stub, refund("call_script", reason=SCRIPT))
    img = pending(stub, refund("call_img", reason=IMG))
    odd = pending(stub, refund("call_odd", order=ODD_ORDER, reason="odd id"))
    page = open_page()
    sign_in(page, "bob", groups="auditors")
    assert page.locator("[data-testid=approval-row]").count() == 3
    assert "ord_\\x1b[31mred\\nline" in page.inner_text("#inbox")
    for approval_id, shown in ((script, SCRIPT), (img, IMG)):
        page.goto(f"/approvals/{approval_id}")
        assert shown in page.inner_text("#approval-arguments")
        assert page.locator("main img").count() == 0 and page.locator("main script").count() == 0
    page.goto(f"/approvals/{odd}")
    assert page.inner_text("#approval-resource") == 'Order::"ord_\\x1b[31mred\\nline"'
    page.goto("/audit?tool=issue_refund")
    assert "ord_\\x1b[31mred\\nline" in page.inner_text("#audit-results")
    page.goto("/audit/call?id=call_img")
    assert page.locator("main img").count() == 0
    page.goto("/audit/call?id=call_odd")
    assert 'resource Order::"ord_\\x1b[31mred\\nline"' in page.inner_text("[data-testid=decided-by]")
    assert page.dialogs == []


def test_the_browser_tests_would_see_a_dialog(open_page):
    """The XSS test's `dialogs == []` can fail: a page that does run script opens one."""
    page = open_page()
    page.set_content("<button id=b onclick=\"alert('hi')\">b</button>")
    page.click("#b")
    assert page.dialogs == ["hi"]


def test_a_long_unbroken_value_wraps_instead_of_widening_the_page(open_page, stub):
    # A model chooses the refund's reason: 500 characters with no space must not push the
    # Approve button and the rest of the page off to the side.
    approval_id = pending(stub, refund("call_wide", reason="W" * 500))
    page = open_page()
    page.set_viewport_size({"width": 1280, "height": 800})
    sign_in(page, "bob")
    for path in ("/inbox", f"/approvals/{approval_id}"):
        page.goto(path)
        assert page.evaluate("document.documentElement.scrollWidth") <= 1280, path
    auditor = open_page()
    auditor.set_viewport_size({"width": 1280, "height": 800})
    sign_in(auditor, "carol", groups="auditors")
    auditor.goto("/audit/call?id=call_wide")
    assert auditor.evaluate("document.documentElement.scrollWidth") <= 1280


WRAPS = """root => {
  // Where each text node of the table's cells wraps: a line starting inside a text node
  // (not at a <wbr>, which splits nodes) is a break inside a word unless a space ends the
  // line before it. Returns [mid-word breaks, breaks at separators].
  const inside = [];
  let between = 0;
  for (const td of root.querySelectorAll("td")) {
    const walker = document.createTreeWalker(td, NodeFilter.SHOW_TEXT);
    let node, lastTop = null;
    while ((node = walker.nextNode())) {
      const text = node.textContent;
      for (let i = 0; i < text.length; i++) {
        const range = document.createRange();
        range.setStart(node, i);
        range.setEnd(node, i + 1);
        const rects = range.getClientRects();
        if (!rects.length) continue;
        const top = Math.round(rects[0].top);
        if (lastTop !== null && top > lastTop + 2) {
          if (i > 0 && text[i - 1] !== " " && text[i] !== " ") inside.push(text.slice(0, i) + "/" + text.slice(i));
          else between++;
        }
        lastTop = top;
      }
    }
  }
  return [inside, between];
}"""


def test_the_inbox_shows_amounts_and_counts_down_and_a_decided_page_stops(request, open_page, stub, clock):
    approval_id = pending(stub, refund("call_amount", amount=7550, reason="parcel lost in transit"))
    page = open_page()
    sign_in(page, "bob")
    row = page.locator(f"[data-approval-id='{approval_id}']")
    assert row.locator("[data-testid=inbox-fields]").inner_text().split() == [
        "Order", "ord_1", "Amount", "75.50", "EUR", "Model's", "reason", "parcel", "lost", "in", "transit"]
    countdown = row.locator("[data-testid=inbox-countdown]")
    expect(countdown).to_have_text(re.compile(r"^expires in 15m"))
    page.clock.set_fixed_time(clock.now() + 61)  # a minute on: the script counts, no reload
    expect(countdown).to_have_text(re.compile(r"^expires in 13m 59s"))
    screenshot(request, page, "inbox.png")

    row.locator("[data-testid=approval-link]").click()
    expect(page.locator("#approval-heading")).to_have_text(re.compile(r"^Approve issue_refund\?"))
    amount = page.locator("[data-testid=argument-row]", has_text="Amount")
    assert amount.locator("[data-testid=argument-value]").inner_text() == "75.50 EUR"
    assert amount.locator("[data-testid=argument-threshold]").inner_text().strip() == "> 50.00 EUR"
    page.fill("#reason", "tracking shows lost")
    page.click("#approve")
    expect(page.locator("#approval-heading")).to_have_text('issue_refund: approved by User::"bob"')
    assert "receives the token for exactly this call" in page.inner_text("#decided-notice")
    assert page.locator("#countdown").count() == 0 and page.locator("#decide-form").count() == 0
    screenshot(request, page, "decided.png")


def test_an_approval_page_shows_the_requesters_recent_calls(open_page, stub):
    for n, amount in enumerate((1200, 2500)):
        assert stub.Authorize(refund(f"call_small_{n}", amount=amount)).decision == pb.ALLOW
    approval_id = pending(stub, refund("call_big", amount=9000))
    page = open_page()
    sign_in(page, "bob")
    page.goto(f"/approvals/{approval_id}")
    rows = page.locator("[data-testid=history-row]")
    expect(rows).to_have_count(2)
    texts = rows.all_inner_texts()
    assert "25.00 EUR" in texts[0] and "12.00 EUR" in texts[1]  # newest first; not this call itself
    assert all("ALLOW" in t for t in texts)


def test_the_explorer_lists_newest_first_groups_its_filters_and_wraps_ids_only_at_separators(
        request, open_page, stub):
    principal = "alice.of_the_support_desk-emea"
    for n in range(3):
        stub.Authorize(make_request(call_id=f"call_{n}_of_a_long_running_support_conversation", principal=principal,
                                    args={"order_id": f"ord_{n}_replacement_parcel", "amount_cents": 100},
                                    entities=[order_entity(f"ord_{n}_replacement_parcel", principal)]))
    page = open_page()
    page.set_viewport_size({"width": 1280, "height": 800})
    sign_in(page, "carol", groups="auditors")
    page.goto("/audit")
    seqs = [int(s) for s in page.locator("[data-testid=audit-row]").evaluate_all("r => r.map(x => x.dataset.seq)")]
    assert len(seqs) >= 3 and seqs == sorted(seqs, reverse=True)
    assert page.locator("[data-testid=filter-group] legend").all_inner_texts() == ["Who", "What", "When", "Outcome"]
    inside, between = page.locator("#audit-results").evaluate(WRAPS)
    assert inside == [] and between > 0  # ids did wrap, and only between their parts
    screenshot(request, page, "explorer.png")
    page.select_option("#filter-order", "oldest")
    page.click("#search")
    page.wait_for_url("**order=oldest**")
    seqs = [int(s) for s in page.locator("[data-testid=audit-row]").evaluate_all("r => r.map(x => x.dataset.seq)")]
    assert seqs == sorted(seqs)
