"""`toolauthz test`: the security team's loop of editing a policy, running the suites,
and reading a failing case's diff."""

from __future__ import annotations

import argparse
import shutil
import textwrap
import xml.etree.ElementTree as ET

import pytest
from conftest import EXAMPLE_BUNDLE

from toolauthz.bundle import load_bundle
from toolauthz.cli.policytest import add_test_command, main

ALLOW_CASE = """\
  - name: {name}
    tenant: acme
    principal: {principal}
    tool: lookup_order
    input: {{order_id: ord_alice1}}
    entities: [alice_order]
    expect: {{decision: {decision}}}
"""


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def bare_bundle(bundle_dir):
    """The example bundle without its suites, for a test to add its own."""
    shutil.rmtree(bundle_dir / "tests")
    (bundle_dir / "tests").mkdir()
    return bundle_dir


def write(path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))


def test_the_example_suites_pass_and_cover_every_tool_policy_and_tool(capsys):
    code, out, err = run(capsys, EXAMPLE_BUNDLE, "--strict-coverage")
    lines = out.splitlines()
    assert code == 0, out + err
    assert "PASS refunds.yaml :: small refund of own order is allowed" in lines
    summary = [line for line in lines if line.endswith(" failed")]
    assert summary == [f"{len(lines) - 2} passed, 0 failed"] and lines[-2] == summary[0]
    assert lines[-1] == "coverage: 7 of 7 policies reached"
    assert "uncovered" not in out and err == ""


def test_the_suites_do_not_change_the_policy_version(bundle_dir):
    before = load_bundle(bundle_dir).version
    suite = bundle_dir / "tests" / "refunds.yaml"
    suite.write_text("# edited\n" + suite.read_text())
    assert load_bundle(bundle_dir).version == before


def test_editing_a_policy_makes_a_case_fail_with_a_readable_diff(capsys, bundle_dir):
    refunds = bundle_dir / "refunds.cedar"
    refunds.write_text(refunds.read_text().replace("<= 5000\n", "<= 7000\n").replace("> 5000\n", "> 7000\n"))
    code, out, _ = run(capsys, bundle_dir)
    assert code == 1
    assert "FAIL refunds.yaml :: refund of 6000 needs finance approval" in out
    block = out.split("FAIL refunds.yaml :: refund of 6000 needs finance approval\n", 1)[1]
    header, decision, reasons, errors, group = block.splitlines()[1:6]
    assert header.split() == ["expected", "actual"]
    assert decision.split() == ["!", "decision", "APPROVAL_REQUIRED", "ALLOW"]
    assert reasons.split() == ["!", "reasons", "refund-own-order-large-needs-finance", "refund-own-order-small"]
    assert group.split() == ["!", "approval_group", "finance", "(none)"]
    assert not errors.lstrip().startswith("!")
    assert out.splitlines()[out.splitlines().index(f"{out.count('PASS ')} passed, 1 failed") + 1:] == \
        ["uncovered: approver policy `finance-approves-refunds` (no `may_approve` or `may_not_approve` case "
         "reaches it)",  # the case that asked bob no longer reaches an approval
         "uncovered: policy `refund-own-order-large-needs-finance`", "coverage: 5 of 7 policies reached"]


def test_a_wrong_expectation_fails_and_names_expected_and_actual(capsys, bare_bundle):
    write(bare_bundle / "tests" / "orders.yaml", """\
        cases:
          - name: another customer's order
            tenant: acme
            principal: {type: User, id: carol}
            tool: lookup_order
            input: {order_id: ord_1}
            entities:
              - - uid: {type: Order, id: ord_1}
                  attrs: {owner: {__entity: {type: User, id: alice}}, refundable_cents: 0}
            expect: {decision: ALLOW, reasons: [lookup-own-order]}
        """)
    code, out, _ = run(capsys, bare_bundle)
    assert code == 1
    assert "FAIL orders.yaml :: another customer's order" in out and "at tests/orders.yaml:2" in out
    assert "expected" in out and "actual" in out
    assert "policy_denied (no policy permits this call)" in out
    assert "0 passed, 1 failed" in out.splitlines()


def test_a_typo_in_a_key_is_reported_with_file_and_line_and_nothing_runs(capsys, bundle_dir):
    suite = bundle_dir / "tests" / "orders.yaml"
    suite.write_text(suite.read_text().replace("expect: {decision: DENY, reasons: [], error: policy_denied}",
                                               "expct: {decision: DENY, reasons: [], error: policy_denied}"))
    line = next(i for i, text in enumerate(suite.read_text().splitlines(), 1) if "expct" in text)
    code, out, err = run(capsys, bundle_dir)
    assert code == 1 and out == ""
    assert f"tests/orders.yaml:{line}: unknown key `expct` in case `another customer's order is denied`; " \
           "did you mean `expect`?" in err.splitlines()


def test_unknown_names_and_bad_decisions_are_located(capsys, bundle_dir):
    write(bundle_dir / "tests" / "zz.yaml", """\
        cases:
          - name: x
            tenant: acme
            principal: alicee
            tool: lookup_order
            input: {order_id: ord_1}
            entities: [alice_order, no_such_set]
            expect: {decision: allow}
        """)
    code, _, err = run(capsys, bundle_dir)
    assert code == 1
    assert "tests/zz.yaml:4: unknown principal `alicee`" in err
    assert "tests/zz.yaml:7: unknown entity set `no_such_set`" in err
    assert "tests/zz.yaml:8: decision `allow` is not one of ALLOW, DENY, APPROVAL_REQUIRED" in err


def test_a_suite_may_not_redefine_a_shared_name(capsys, bundle_dir):
    write(bundle_dir / "tests" / "zz.yaml", """\
        principals:
          alice: {type: User, id: someone-else}
        cases: []
        """)
    code, _, err = run(capsys, bundle_dir)
    assert code == 1
    assert "tests/zz.yaml:2: principal `alice` is already defined in tests/testdata/principals.yaml:" in err


def test_shared_principals_and_entities_work_across_suites(capsys, bare_bundle):
    write(bare_bundle / "tests" / "testdata" / "principals.yaml", "alice: {type: User, id: alice}\n")
    write(bare_bundle / "tests" / "testdata" / "entities.yaml", """\
        alice_order:
          - uid: {type: Order, id: ord_alice1}
            attrs: {owner: {__entity: {type: User, id: alice}}, refundable_cents: 100}
        """)
    write(bare_bundle / "tests" / "a.yaml",
          "cases:\n" + ALLOW_CASE.format(name="a", principal="alice", decision="ALLOW"))
    write(bare_bundle / "tests" / "b.yaml", "principals:\n  eve: {type: User, id: eve}\ncases:\n"
          + ALLOW_CASE.format(name="b1", principal="alice", decision="ALLOW")
          + ALLOW_CASE.format(name="b2", principal="eve", decision="DENY"))
    code, out, err = run(capsys, bare_bundle)
    assert code == 0, out + err
    assert out.splitlines()[:4] == ["PASS a.yaml :: a", "PASS b.yaml :: b1", "PASS b.yaml :: b2", "3 passed, 0 failed"]
    # b.yaml's own principal is not visible from a.yaml
    write(bare_bundle / "tests" / "a.yaml", "cases:\n" + ALLOW_CASE.format(name="a", principal="eve", decision="DENY"))
    code, _, err = run(capsys, bare_bundle)
    assert code == 1 and "tests/a.yaml:4: unknown principal `eve`" in err


def test_a_request_error_fails_the_case_instead_of_crashing(capsys, bare_bundle):
    write(bare_bundle / "tests" / "a.yaml", """\
        cases:
          - name: a tenant entity from the runtime
            tenant: acme
            principal: {type: User, id: alice}
            tool: lookup_order
            input: {order_id: ord_1}
            entities: [[{uid: {type: Tenant, id: acme}}]]
            expect: {decision: DENY}
          - name: still runs
            tenant: acme
            principal: {type: User, id: alice}
            tool: nope
            input: {}
            expect: {decision: DENY, error: unknown_tool}
        """)
    code, out, _ = run(capsys, bare_bundle)
    assert code == 1
    assert "request failed: entity `Tenant::\"acme\"` may not be supplied by the runtime" in out
    assert "PASS a.yaml :: still runs" in out and "1 passed, 1 failed" in out.splitlines()


def test_junit_xml_counts_tests_and_failures(capsys, bundle_dir, tmp_path):
    refunds = bundle_dir / "refunds.cedar"
    refunds.write_text(refunds.read_text().replace("<= 5000\n", "<= 7000\n").replace("> 5000\n", "> 7000\n"))
    report = tmp_path / "junit.xml"
    code, out, _ = run(capsys, bundle_dir, "--junit", report)
    assert code == 1
    root = ET.parse(report).getroot()
    total = out.count("PASS ") + out.count("FAIL ")
    assert root.tag == "testsuites" and (root.get("tests"), root.get("failures")) == (str(total), "1")
    suites = {s.get("name"): s for s in root.iter("testsuite")}
    assert set(suites) == {p.name for p in (bundle_dir / "tests").glob("*.yaml")}
    assert (suites["refunds.yaml"].get("failures"), len(suites["refunds.yaml"].findall("testcase"))) == \
        ("1", int(suites["refunds.yaml"].get("tests")))
    failure = root.find(".//testcase[@name='refund of 6000 needs finance approval']/failure")
    assert failure.get("message").startswith("decision: expected APPROVAL_REQUIRED, actual ALLOW")


def test_junit_with_strict_coverage_and_load_problems(capsys, bundle_dir, tmp_path):
    report = tmp_path / "junit.xml"
    (bundle_dir / "tests" / "measurements.yaml").unlink()
    code, out, _ = run(capsys, bundle_dir, "--strict-coverage", "--junit", report)
    assert code == 1 and "uncovered: policy `measure-any-user`" in out
    assert "uncovered: tool `measure_runtime` has no ALLOW or APPROVAL_REQUIRED and no DENY case" in out
    coverage = ET.parse(report).getroot().find("testsuite[@name='coverage']")
    assert coverage.get("failures") == "2"
    # a bundle that does not load: its problems, no case run, exit 1
    (bundle_dir / "orders.cedar").write_text('@id("x")\npermit (principal, action, resource) when { nope };\n')
    code, out, err = run(capsys, bundle_dir, "--junit", report)
    assert code == 1 and out == "" and "orders.cedar:" in err and "no case was run" in err
    assert ET.parse(report).getroot().get("errors") == "1"


def test_coverage_warnings_do_not_fail_without_strict(capsys, bundle_dir):
    (bundle_dir / "tests" / "measurements.yaml").unlink()
    code, out, _ = run(capsys, bundle_dir)
    assert code == 0 and "uncovered: policy `measure-any-user`" in out


def test_filter_runs_matching_cases_and_skips_coverage(capsys):
    code, out, _ = run(capsys, EXAMPLE_BUNDLE, "--filter", "measurements.yaml ::")
    assert code == 0 and out.splitlines()[-1] == "4 passed, 0 failed"  # no coverage line
    code, out, err = run(capsys, EXAMPLE_BUNDLE, "--filter", "no such case")
    assert code == 1 and "0 passed, 0 failed" in out and "no case matches" in err


def test_add_test_command_registers_the_subcommand(capsys):
    parser = argparse.ArgumentParser(prog="toolauthz")
    add_test_command(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["test", str(EXAMPLE_BUNDLE), "--filter", "catalog.yaml"])
    assert args.func(args) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "2 passed, 0 failed"
    assert parser.parse_args(["test"]).bundle == "policies"
