"""Every string a model or runtime supplied is escaped on every console page: HTML
(Jinja2 autoescape) and, before that, control characters made visible (display.py).

The bundle here lets an order id hold anything after `ord_` and shows the refund's reason to the
approver (`audit.record`), so that model-chosen text reaches every page."""

from __future__ import annotations

import pytest
from console_pages import browser, console_for, post_form, propose, sign_in

SCRIPT = "<script>alert(1)</script>"
IMG = '"><img src=x onerror=alert(1)>'
ANSI_ORDER = "ord_\x1b[31mred\nforged line"


@pytest.fixture
def bundle_dir(bundle_dir):
    tool = bundle_dir / "tools" / "issue_refund.yaml"
    text = tool.read_text()
    text = text.replace('pattern: "^ord_[A-Za-z0-9]{1,32}$"', 'pattern: "^ord_"')
    tool.write_text(text.replace("record: [/order_id, /amount_cents]", "record: [/order_id, /amount_cents, /reason]"))
    return bundle_dir


@pytest.fixture
def shown(sidecar) -> dict[str, str]:
    """Every page showing the two calls, by name."""
    console = console_for(sidecar, sign_in="dev")
    approvals = []
    for i, (order, reason) in enumerate(((ANSI_ORDER, SCRIPT), ("ord_2", IMG))):
        _, result = propose(sidecar, call_id=f"toolu_{i}",
                            args={"order_id": order, "amount_cents": 6000, "reason": reason})
        approvals.append(result.approval_id)
    bob = browser(console)
    sign_in(bob, "bob")
    page = f"/approvals/{approvals[0]}"
    assert post_form(bob, page, f"{page}/decide", verdict="REJECT", reason=SCRIPT + IMG).status_code == 303
    auditor = browser(console)
    sign_in(auditor, "erin", groups="auditors")
    return {"inbox": bob.get("/inbox").text,
            "script approval": bob.get(f"/approvals/{approvals[0]}").text,
            "img approval": bob.get(f"/approvals/{approvals[1]}").text,
            "explorer": auditor.get("/audit").text,
            "explorer by resource": auditor.get("/audit", params={"resource": f'Order::"{ANSI_ORDER}"'}).text,
            "timeline": auditor.get("/audit/call", params={"id": "toolu_0"}).text}


def test_markup_from_the_model_is_text_on_every_page(shown):
    for name, html in shown.items():
        assert "<script>alert" not in html and "<img" not in html, name
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in shown["script approval"]
    assert "&#34;&gt;&lt;img src=x onerror=alert(1)&gt;" in shown["img approval"]
    # The approver's reason is the approver's text: escaped the same way in the timeline.
    assert "&lt;script&gt;alert(1)&lt;/script&gt;&#34;&gt;&lt;img src=x" in shown["timeline"]


def test_ansi_escapes_and_newlines_in_a_resource_id_are_shown_not_obeyed(shown):
    escaped = "ord_\\x1b[31mred\\nforged line"
    for name in ("script approval", "explorer", "explorer by resource", "timeline"):
        # The filter form holds what the auditor typed, as typed (to search again with it).
        before, _, rest = shown[name].partition('id="audit-filters"')
        html = (before + rest.partition("</form>")[2]).replace("<wbr>", "")  # ids offer line breaks
        assert "\x1b" not in html, name
        assert escaped in html, name
        assert "red\nforged" not in html, name
    assert 'data-testid="audit-row"' in shown["explorer by resource"]
