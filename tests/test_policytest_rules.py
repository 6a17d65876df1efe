"""`toolauthz test` reaches every rule: approver policies through approval cases
(`may_approve`, `may_not_approve`, put through DecideApproval's own check) and `@shadow`
policies through shadow cases (`expect.shadow`); coverage counts all of them."""

from __future__ import annotations

import shutil
import textwrap
import xml.etree.ElementTree as ET

import pytest

from toolauthz.cli.policytest import main

SHADOW_FORBID = """
@id("no-refund-over-3000-soon")
@shadow
forbid (principal, action == Action::"tool:issue_refund", resource)
when { context.input.amount_cents > 3000 };
"""

LARGE_REFUND = """\
  - name: refund of 6000 needs finance
    tenant: acme
    principal: alice
    tool: issue_refund
    input: {{order_id: ord_alice1, amount_cents: 6000}}
    entities: [alice_order]
    expect:
      decision: APPROVAL_REQUIRED
      approval_group: finance
{extra}"""


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def rules_bundle(bundle_dir):
    """The example bundle (an approver policy) plus a @shadow forbid, with suites that
    leave both out: only the refund suite's large-refund case is rewritten per test."""
    (bundle_dir / "refunds.cedar").write_text((bundle_dir / "refunds.cedar").read_text() + SHADOW_FORBID)
    refunds = bundle_dir / "tests" / "refunds.yaml"
    text = refunds.read_text()
    start = text.index("  - name: refund of 6000 needs finance approval")
    end = text.index("  - name: refund above refundable_cents is denied")
    refunds.write_text(text[:start] + text[end:])
    return bundle_dir


def add_case(bundle, extra: str) -> None:
    path = bundle / "tests" / "large.yaml"
    path.write_text("cases:\n" + LARGE_REFUND.format(extra=textwrap.indent(textwrap.dedent(extra), " " * 6)))


def test_full_coverage_needs_an_approval_case_and_a_shadow_case(capsys, rules_bundle, tmp_path):
    add_case(rules_bundle, "")
    report = tmp_path / "junit.xml"
    code, out, _ = run(capsys, rules_bundle, "--strict-coverage", "--junit", report)
    assert code == 1
    uncovered = [line for line in out.splitlines() if line.startswith("uncovered: ")]
    assert uncovered == [
        "uncovered: approver policy `finance-approves-refunds` (no `may_approve` or `may_not_approve` case "
        "reaches it)",
        "uncovered: shadow policy `no-refund-over-3000-soon` (no case with `expect.shadow` sees it disagree)",
    ]
    assert out.splitlines()[-1] == "coverage: 6 of 8 policies reached"
    names = {c.get("name") for c in ET.parse(report).getroot().iter("testcase") if c.get("classname") == "coverage"}
    assert names == {item.removeprefix("uncovered: ") for item in uncovered}

    add_case(rules_bundle, "may_approve: [bob]\n")  # the approval case alone
    code, out, _ = run(capsys, rules_bundle, "--strict-coverage")
    assert code == 1 and "approver policy" not in out and "uncovered: shadow policy" in out

    add_case(rules_bundle, "may_approve: [bob]\nshadow: [no-refund-over-3000-soon]\n")
    code, out, err = run(capsys, rules_bundle, "--strict-coverage")
    assert code == 0, out + err
    assert "uncovered" not in out and out.splitlines()[-1] == "coverage: 8 of 8 policies reached"


def test_a_shadow_policy_a_case_meets_without_expecting_it_stays_uncovered(capsys, rules_bundle):
    # The case's call does meet the shadow forbid, but it does not state `expect.shadow`.
    add_case(rules_bundle, "may_approve: [bob]\n")
    code, out, _ = run(capsys, rules_bundle)
    assert code == 0 and "uncovered: shadow policy `no-refund-over-3000-soon`" in out


def test_the_approver_rules_of_decide_approval_hold_in_a_case(capsys, rules_bundle):
    # Each expectation below is wrong: each check must fail, with why in the diff.
    add_case(rules_bundle, """\
        may_approve:
          - alice
          - carol
          - {principal: gina, tenant: globex}
          - principal: dave
            entities: [[{uid: {type: User, id: dave}, attrs: {}, parents: [{type: Group, id: finance}]}]]
        may_not_approve: [bob]
        """)
    code, out, _ = run(capsys, rules_bundle)
    assert code == 1
    row = next(line for line in out.splitlines() if line.lstrip().startswith("! approvers"))
    expected, actual = row.split(", bob may not  ")  # the expected column ends with bob
    assert expected.split("approvers", 1)[1].split(", ")[0].strip() == "alice may"
    assert actual.split(", ") == ["alice may not (self_approval)", "carol may not (policy_denied)",
                                  "gina of globex may not (cross_tenant)", "dave may not (invalid_entities)", "bob may"]


def test_correct_approver_expectations_pass(capsys, rules_bundle):
    add_case(rules_bundle, """\
        may_approve: [bob, {principal: {type: User, id: zed}, groups: [finance]}]
        may_not_approve: [alice, carol, {principal: gina, tenant: globex}]
        shadow: [no-refund-over-3000-soon]
        """)
    code, out, err = run(capsys, rules_bundle, "--filter", "large.yaml")
    assert code == 0, out + err
    assert out.splitlines() == ["PASS large.yaml :: refund of 6000 needs finance", "1 passed, 0 failed"]


def test_a_wrong_shadow_expectation_fails_with_both_sides(capsys, rules_bundle):
    add_case(rules_bundle, "shadow: []\n")
    code, out, _ = run(capsys, rules_bundle, "--filter", "large.yaml")
    assert code == 1
    row = next(line for line in out.splitlines() if line.lstrip().startswith("! shadow"))
    assert row.split() == ["!", "shadow", "(none)", "no-refund-over-3000-soon"]


def test_a_shadow_policy_that_agrees_is_not_a_disagreement(capsys, rules_bundle):
    # 1500 is under the shadow forbid's 3000: it says nothing, so `shadow: []` holds.
    suite = rules_bundle / "tests" / "small.yaml"
    suite.write_text(textwrap.dedent("""\
        cases:
          - name: small
            tenant: acme
            principal: alice
            tool: issue_refund
            input: {order_id: ord_alice1, amount_cents: 1500}
            entities: [alice_order]
            expect: {decision: ALLOW, shadow: []}
        """))
    code, out, _ = run(capsys, rules_bundle, "--filter", "small.yaml")
    assert code == 0, out


@pytest.mark.parametrize("expect, message", [
    ("{decision: ALLOW, may_approve: [bob]}", "`expect.may_approve` of case `x` needs `decision: APPROVAL_REQUIRED`"),
    ("{decision: APPROVAL_REQUIRED, may_approve: []}", "must be a non-empty list of approvers"),
    ("{decision: APPROVAL_REQUIRED, may_approve: [bobb]}", "unknown principal `bobb`"),
    ("{decision: APPROVAL_REQUIRED, may_not_approve: [{principal: bob, tenat: x}]}", "unknown key `tenat`"),
    ("{decision: APPROVAL_REQUIRED, may_approve: [{principal: bob, groups: finance}]}", "must be a list of group"),
    ("{decision: DENY, shadow: nope}", "`expect.shadow` of case `x` must be a list of policy ids"),
])
def test_bad_approval_and_shadow_expectations_are_located(capsys, bundle_dir, expect, message):
    shutil.rmtree(bundle_dir / "tests" / "testdata")
    (bundle_dir / "tests" / "zz.yaml").write_text(textwrap.dedent(f"""\
        principals:
          alice: {{type: User, id: alice}}
          bob: {{type: User, id: bob}}
        cases:
          - name: x
            tenant: acme
            principal: alice
            tool: lookup_order
            input: {{order_id: ord_1}}
            expect: {expect}
        """))
    code, out, err = run(capsys, bundle_dir)
    assert code == 1 and out == ""
    assert any(line.startswith("tests/zz.yaml:10: ") and message in line for line in err.splitlines()), err
