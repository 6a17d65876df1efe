"""What `toolauthz test` prints and writes: one line per case, a diff for each failure,
the summary line, coverage, and JUnit XML."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Sequence

from toolauthz.bundle import Bundle
from toolauthz.cli.policytest.suite import Result
from toolauthz.model import Decision, Verdict

_ANY = "(any)"
_NONE = "(none)"


def print_results(results: list[Result], out) -> int:
    """Print every case and the summary line `N passed, M failed`; return M."""
    failed = 0
    for result in results:
        print(f"{'PASS' if result.passed else 'FAIL'} {result.case.title}", file=out)
        if not result.passed:
            failed += 1
            print(diff(result), file=out)
    print(f"{len(results) - failed} passed, {failed} failed", file=out)
    return failed


def diff(result: Result) -> str:
    """Expected against actual, one row per field; `!` marks the rows that differ."""
    lines = [f"    at tests/{result.case.suite}:{result.case.line}"]
    if result.verdict is None:
        return "\n".join(lines + [f"    ! request failed: {result.error}"])
    rows, bad = _rows(result), set(result.mismatches)
    width = max(len(r[1]) for r in rows + [("", "expected", "")])
    lines.append(f"      {'':15} {'expected':{width}}  actual")
    for name, expected, actual in rows:
        mark = "!" if name in bad else " "
        lines.append(f"    {mark} {name:15} {expected:{width}}  {actual}")
    return "\n".join(lines)


def summary(result: Result) -> str:
    """One line for a failure: what differs, expected against actual."""
    if result.verdict is None:
        return f"request failed: {result.error}"
    return "; ".join(f"{name}: expected {expected}, actual {actual}"
                     for name, expected, actual in _rows(result) if name in result.mismatches)


def _rows(result: Result) -> list[tuple[str, str, str]]:
    e, v = result.case.expect, result.verdict
    if v is None:  # the request was refused: there is no verdict to compare
        return []
    return [
        ("decision", e.decision.value, v.decision.value),
        ("reasons", _ANY if e.reasons is None else _list(sorted(e.reasons)), _list(sorted(v.reasons))),
        ("errors", _ANY if e.error is None else f"includes {e.error}",
         _list(f"{x.code} ({x.message})" for x in v.errors)),
        ("approval_group", _ANY if e.approval_group is None else e.approval_group, v.approval_group or _NONE),
        ("approvers", _list(_approver(a.label, ok) for a, ok in e.approvers) if e.approvers else _ANY,
         _list(_approver(c.approver.label, c.allowed, c.verdict) for c in result.approvals)),
        ("shadow", _ANY if e.shadow is None else _list(sorted(e.shadow)), _list(sorted(result.shadow))),
    ]


def _approver(label: str, allowed: bool, verdict: Verdict | None = None) -> str:
    """`bob may`, or `alice may not`, with why not (the refusal code or the reasons)."""
    if allowed:
        return f"{label} may"
    why = [x.code for x in verdict.errors] + list(verdict.reasons) if verdict is not None else []
    return f"{label} may not" + (f" ({', '.join(why)})" if why else "")


def _list(items) -> str:
    items = list(items)
    return ", ".join(items) if items else _NONE


def coverage(bundle: Bundle, results: list[Result]) -> tuple[list[str], int]:
    """What no case reaches, and how many policies there are. A policy is reached when
    it is among a verdict's reasons: a tool call's, or an approver check's (`may_approve`
    and `may_not_approve` cases) for an `Action::"approve"` policy. A `@shadow` policy is
    reached only by a case that states `expect.shadow` and saw it disagree. A tool is
    covered with both a permitting (ALLOW or APPROVAL_REQUIRED) and a DENY expectation."""
    seen = {reason for r in results if r.verdict is not None for reason in r.verdict.reasons}
    seen |= {reason for r in results for check in r.approvals for reason in check.verdict.reasons}
    shadowed = {pid for r in results if r.case.expect.shadow is not None for pid in r.shadow}
    out = []
    for pid, info in sorted(bundle.policies.items()):
        if info.shadow and pid not in shadowed:
            out.append(f"shadow policy `{pid}` (no case with `expect.shadow` sees it disagree)")
        elif not info.shadow and pid not in seen:
            approver = info.actions is not None and all(not a.startswith("tool:") for a in info.actions)
            out.append(f"approver policy `{pid}` (no `may_approve` or `may_not_approve` case reaches it)"
                       if approver else f"policy `{pid}`")
    for tool in sorted(bundle.tools):
        expected = {r.case.expect.decision for r in results if r.case.tool == tool}
        missing = [label for label, ok in (
            ("ALLOW or APPROVAL_REQUIRED", expected & {Decision.ALLOW, Decision.APPROVAL_REQUIRED}),
            ("DENY", Decision.DENY in expected)) if not ok]
        if missing:
            out.append(f"tool `{tool}` has no {' and no '.join(missing)} case")
    return out, len(bundle.policies)


def write_junit(path: str, results: list[Result], *, problems: Sequence[str] = (),
                uncovered: Sequence[str] = ()) -> None:
    """One <testsuite> per suite file, one <testcase> per case. Load problems become a
    `load` suite with an error; uncovered items (with --strict-coverage) a `coverage` suite."""
    root = ET.Element("testsuites", name="toolauthz")
    suites: dict[str, ET.Element] = {}
    for result in results:
        case = result.case
        suite = suites.get(case.suite)
        if suite is None:
            suite = suites[case.suite] = ET.SubElement(root, "testsuite", name=case.suite)
        testcase = ET.SubElement(suite, "testcase", name=case.name, classname=case.suite.removesuffix(".yaml"),
                                 file=f"tests/{case.suite}", line=str(case.line), time=f"{result.seconds:.6f}")
        if not result.passed:
            failure = ET.SubElement(testcase, "failure", message=summary(result),
                                    type="request_error" if result.verdict is None else "mismatch")
            failure.text = diff(result)
    if problems:
        suite = ET.SubElement(root, "testsuite", name="load")
        error = ET.SubElement(ET.SubElement(suite, "testcase", name="load bundle and suites", classname="load"),
                              "error", message=f"{len(problems)} problem(s); no case was run", type="load_error")
        error.text = "\n".join(problems)
    if uncovered:
        suite = ET.SubElement(root, "testsuite", name="coverage")
        for item in uncovered:
            testcase = ET.SubElement(suite, "testcase", name=item, classname="coverage")
            ET.SubElement(testcase, "failure", message=f"uncovered: {item}", type="uncovered")
    for element in [root, *root]:
        cases = element.iter("testcase")
        counts = {"tests": 0, "failures": 0, "errors": 0}
        for testcase in cases:
            counts["tests"] += 1
            counts["failures"] += testcase.find("failure") is not None
            counts["errors"] += testcase.find("error") is not None
        element.attrib.update({k: str(n) for k, n in counts.items()})
    ET.indent(root)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)
