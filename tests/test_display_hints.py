"""Display hints of a tool file (toolauthz/display/hints.py): checked at load like every
other field, rendered one way for the console, the CLI and notifications, and the
policy comparisons an approval page shows (console/approval_view.py)."""

from __future__ import annotations

import pytest

from toolauthz.bundle.loader import load_bundle
from toolauthz.console.approval_view import thresholds
from toolauthz.display.hints import DisplayHint, labelled, money, shown_value
from toolauthz.errors import BundleError
from toolauthz.store.approvals import ApprovalRecord


def with_display(bundle_dir, block: str) -> None:
    refund = bundle_dir / "tools" / "issue_refund.yaml"
    text = refund.read_text()
    refund.write_text(text[:text.index("display:")] + block)


@pytest.mark.parametrize(("block", "message"), [
    ("display:\n  /amount: {money: EUR}\n", "the input schema has no property at `/amount`"),
    ("display:\n  /reason: {money: EUR}\n", "money needs an integer property"),
    ("display:\n  /amount_cents: {money: euro}\n", "money must be an ISO 4217 currency code"),
    ("display:\n  /amount_cents: {minor_units: 7}\n", "minor_units must be an integer from 0 to 4"),
    ("display:\n  /reason: {show: yes please}\n", "show must be true or false"),
    ("display:\n  /reason: {colour: red}\n", "unknown display key `colour`"),
    ("display:\n  /reason: {label: \"line\\nbreak\"}\n", "label must be printable text"),
    ("display: [/reason]\n", "display must map JSON pointers"),
])
def test_a_bad_hint_fails_the_load_naming_its_pointer(bundle_dir, block, message):
    with_display(bundle_dir, block)
    with pytest.raises(BundleError) as failed:
        load_bundle(bundle_dir)
    assert message in str(failed.value) and "tools/issue_refund.yaml" in str(failed.value)


def test_show_allow_lists_a_field_for_approvers_only(bundle_dir):
    with_display(bundle_dir, "display:\n  /reason: {label: \"Model's reason\", show: true}\n")
    tool = load_bundle(bundle_dir).tools["issue_refund"].tool
    assert tool.approver_fields == ("/order_id", "/amount_cents", "/reason")
    assert tool.audit_fields == ("/order_id", "/amount_cents")  # the audit keeps what it kept


def test_values_render_one_way():
    eur = DisplayHint("Amount", "EUR", 2)
    assert [money(v, "EUR", 2) for v in (7550, 5, -1234567, 0)] == ["75.50 EUR", "0.05 EUR", "-12,345.67 EUR",
                                                                    "0.00 EUR"]
    assert money(1500, "JPY", 0) == "1,500 JPY"
    assert shown_value(7550, eur) == "75.50 EUR" and shown_value(True, eur) == "true"
    assert shown_value("a\x1b[31mred\nline", None) == "a\\x1b[31mred\\nline"
    assert shown_value({"b": 1, "a": [1, 2]}, None) == '{"a":[1,2],"b":1}'
    assert shown_value("W" * 600, None).endswith("…") and len(shown_value("W" * 600, None)) == 513
    hints = {"/b": DisplayHint("Bee"), "/a": DisplayHint("Ay")}
    assert list(labelled({"/a": 1, "/b": 2, "/c": 3}, hints).items()) == [("Bee", "2"), ("Ay", "1"), ("/c", "3")]


def approval(fields: dict, policy_id: str = "refund-own-order-large-needs-finance") -> ApprovalRecord:
    return ApprovalRecord("a1", "acme", "c1", "r1", "User", "alice", "issue_refund", 'Order::"ord_1"', "finance",
                          policy_id, "d" * 64, "ABCD-1234", "dec", "v1", 0.0, 900.0, fields=fields)


def test_the_asking_policys_comparisons_are_shown_beside_visible_fields(bundle_dir):
    (bundle_dir / "extra.cedar").write_text(
        '@id("big-or-odd")\n@approval("finance")\n'
        'permit (principal, action == Action::"tool:issue_refund", resource)\n'
        'when { 100000 <= context.input.amount_cents || context.input.amount_cents == 4242 }\n'
        'unless { context.input.amount_cents > 900000 };\n')
    bundle = load_bundle(bundle_dir)
    [big] = thresholds(approval({"/amount_cents": 6000}), bundle)
    assert (big.label, big.op, big.literal, big.value, big.holds) == ("Amount", ">", "50.00 EUR", "60.00 EUR", True)
    shown = thresholds(approval({"/amount_cents": 6000}, "big-or-odd"), bundle)
    assert [(t.op, t.literal, t.holds) for t in shown] == [
        ("≥", "1,000.00 EUR", False), ("=", "42.42 EUR", False), (">", "9,000.00 EUR", True)]  # unless: negated
    assert thresholds(approval({}), bundle) == []  # a field approvers cannot see is never compared aloud
    assert thresholds(approval({"/amount_cents": 6000}, "no-such-policy"), bundle) == []
