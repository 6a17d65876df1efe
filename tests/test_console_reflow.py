"""The console on a phone and from a keyboard, in a real browser (Debian's Chromium).

An approver often opens the console from a Slack link on a phone: every page reflows at
320 and 390 px with no horizontal scrolling of the page (WCAG 1.4.10; a wide table scrolls
inside its own labelled region), and axe-core, run inside the page, finds no WCAG 2.1 A
or AA violation at either width. What axe cannot see is tested here too: an approval that
expires on an open page hides its form and says so once, the title says the result after
a decision, a skip link comes first and the focus ring is visible.
"""

from __future__ import annotations

import pathlib
import re

import pytest
import test_console_browser as browser_tests
from test_console_browser import pending, refund, sign_in

# The browser tests' fixtures (one Chromium, the example bundle with an approver group,
# the console on port 0, a fresh context per page), found by pytest under these names.
browser, bundle_dir, settings, console, open_page = (
    browser_tests.browser, browser_tests.bundle_dir, browser_tests.settings, browser_tests.console,
    browser_tests.open_page)

try:
    from playwright.sync_api import expect
except ImportError:  # the browser fixture fails (CI) or skips first
    expect = None

try:
    import axe_playwright_python
    AXE_SCRIPT = pathlib.Path(axe_playwright_python.__file__).with_name("axe.min.js")
except ImportError:
    AXE_SCRIPT = None

WCAG_21_AA = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"]
AXE = """async tags => {
  const result = await axe.run(document, {runOnly: {type: "tag", values: tags}});
  return result.violations.map(v => v.id + ": " + v.nodes.map(n => n.target.join(" ")).join(", "));
}"""

# Where a `.label` of the inbox's details wraps inside a word ("Amou/nt").
LABEL_BREAKS = """root => {
  const inside = [];
  for (const label of root.querySelectorAll(".field .label")) {
    const walker = document.createTreeWalker(label, NodeFilter.SHOW_TEXT);
    let node;
    while ((node = walker.nextNode())) {
      let lastTop = null;
      for (let i = 0; i < node.textContent.length; i++) {
        const range = document.createRange();
        range.setStart(node, i);
        range.setEnd(node, i + 1);
        const rects = range.getClientRects();
        if (!rects.length) continue;
        const top = Math.round(rects[0].top);
        const text = node.textContent;
        if (lastTop !== null && top > lastTop + 2 && text[i - 1] !== " " && text[i] !== " ") {
          inside.push(text.slice(0, i) + "/" + text.slice(i));
        }
        lastTop = top;
      }
    }
  }
  return inside;
}"""


def axe_violations(page) -> list[str]:
    if AXE_SCRIPT is None:
        pytest.fail("axe-playwright-python (axe-core) is not installed: scripts/setup.sh --dev installs it")
    # Evaluated over the DevTools protocol: the console's CSP (script-src 'self') refuses
    # an injected <script>, and rightly so.
    page.evaluate(AXE_SCRIPT.read_text() + "\n;undefined")
    return page.evaluate(AXE, WCAG_21_AA)


def assert_reflows(page, width: int, path: str) -> None:
    page.goto(path)
    assert page.evaluate("document.documentElement.scrollWidth") <= width, f"{path} scrolls sideways at {width}px"
    for element in page.locator("header a, header button, header span").all():
        box = element.bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= width, (path, element.inner_text())
    assert axe_violations(page) == [], path


@pytest.mark.parametrize("width", [320, 390])
def test_every_page_reflows_on_a_phone_with_no_axe_violation(open_page, stub, width):
    approval_id = pending(stub, refund("call_phone", amount=7550, reason="parcel lost in transit " + "W" * 80))
    approver = open_page()
    approver.set_viewport_size({"width": width, "height": 740})
    sign_in(approver, "bob")
    assert_reflows(approver, width, "/inbox")
    assert approver.locator("#inbox").evaluate(LABEL_BREAKS) == []
    assert approver.locator(".table-scroll[role=region][aria-label]").count() >= 1
    assert_reflows(approver, width, f"/approvals/{approval_id}")

    auditor = open_page()
    auditor.set_viewport_size({"width": width, "height": 740})
    sign_in(auditor, "carol", groups="auditors")
    for path in ("/audit", "/audit/call?id=call_phone", "/status"):
        assert_reflows(auditor, width, path)


def test_an_approval_that_expires_on_an_open_page_hides_its_form_and_says_so_once(open_page, stub, sidecar, clock):
    approval_id = pending(stub, refund("call_expiring"))
    page = open_page()
    sign_in(page, "bob")
    page.goto(f"/approvals/{approval_id}")
    expect(page.locator("#approve")).to_be_visible()
    assert page.inner_text("#expiry-status") == ""
    page.clock.set_fixed_time(clock.now() + sidecar.settings.approvals.ttl_seconds + 1)
    expect(page.locator("#decide-form")).to_be_hidden()
    expect(page.locator("#approve")).to_be_hidden()
    expect(page.locator("#reject")).to_be_hidden()
    status = page.locator("[role=status]")
    expect(status).to_have_text(re.compile(r"^This approval has expired"))
    assert status.count() == 1


def test_the_title_says_the_result_after_a_decision(open_page, stub):
    approval_id = pending(stub, refund("call_title"))
    page = open_page()
    sign_in(page, "bob")
    page.goto(f"/approvals/{approval_id}")
    assert re.match(r"^Approve issue_refund\? · approval [A-Z0-9-]+ · toolauthz console$", page.title())
    page.click("#reject")
    expect(page.locator("#approval-heading")).to_have_text(re.compile("rejected"))
    assert re.match(r"^Rejected: issue_refund · approval [A-Z0-9-]+ · toolauthz console$", page.title())


def _luminance(rgb: tuple[int, ...]) -> float:
    def channel(c: int) -> float:
        s = c / 255
        return s / 12.92 if s <= 0.03928 else ((s + 0.055) / 1.055) ** 2.4
    r, g, b = (channel(c) for c in rgb[:3])
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def _rgb(css: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", css)[:3])


def test_a_skip_link_comes_first_and_the_focus_ring_is_visible(open_page, stub):
    approval_id = pending(stub, refund("call_keys"))
    page = open_page()
    sign_in(page, "bob")
    page.goto(f"/approvals/{approval_id}")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.id") == "skip-link"
    expect(page.locator("#skip-link")).to_be_in_viewport()
    page.keyboard.press("Enter")
    assert page.evaluate("document.activeElement.id") == "main"

    page.focus("#reason")
    page.keyboard.press("Tab")  # to Approve, then Reject: keyboard focus shows the ring
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.id") == "reject"
    ring = page.evaluate("""() => {
      const s = getComputedStyle(document.activeElement);
      return [s.outlineStyle, s.outlineWidth, s.outlineColor, getComputedStyle(document.body).backgroundColor];
    }""")
    style, width, color, background = ring
    assert style == "solid" and float(width.removesuffix("px")) >= 2
    lighter, darker = sorted((_luminance(_rgb(color)), _luminance(_rgb(background))), reverse=True)
    assert (lighter + 0.05) / (darker + 0.05) >= 3.0  # WCAG 2.4.7/1.4.11: the ring against the page
