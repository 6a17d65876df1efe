"""`toolauthz test [BUNDLE] [--junit FILE] [--filter SUBSTRING] [--strict-coverage]`:
run a bundle's policy test suites in CI, the way `opa test` does for Rego.

Loads the bundle and every suite (`toolauthz.cli.policytest.suite`); if either has a problem,
prints them all and runs nothing. Otherwise decides each case with `engine.decide`,
exactly as the sidecar would, and compares the verdict with the case's `expect`. The
report, coverage and JUnit XML are in `toolauthz.cli.policytest.report`. Exit code 1 when
anything failed. See docs/policy-testing.md.
"""

from __future__ import annotations

import argparse
import io
import json
import pathlib
import sys
import time

from toolauthz.bundle import Bundle, load_bundle
from toolauthz.cli.output import add_output_option
from toolauthz.cli.policytest import report
from toolauthz.cli.policytest.expect import Approver, name_problems
from toolauthz.cli.policytest.suite import ApprovalCheck, Case, Result, load_suites
from toolauthz.engine import ApprovalSubject, approver_verdict, decide
from toolauthz.errors import BundleError, RequestError
from toolauthz.model import Decision, ErrorDetail, ProposedCall, TrustedContext, Verdict


def run_case(bundle: Bundle, case: Case, index: int = 1) -> Result:
    start = time.perf_counter()
    entities = json.dumps(list(case.entities)).encode() if case.entities else b""
    ctx = TrustedContext(case.tenant, case.principal, "policytest", entities)
    call = ProposedCall(f"policytest-{index}", case.tool, case.input_json)
    slice_ = bundle.tools.get(case.tool)
    meters = {meter.name for meter in slice_.tool.meters} if slice_ is not None else set()
    unknown = sorted(name for name, _ in case.usage if name not in meters)
    if unknown:
        return Result(case, None, f"`usage.{unknown[0]}`: tool `{case.tool}` has no meter `{unknown[0]}`",
                      time.perf_counter() - start)
    try:
        ctx.check()
        call.check()
        verdict = decide(bundle, ctx, call, run=case.run, usage=dict(case.usage))
    except RequestError as exc:
        return Result(case, None, str(exc), time.perf_counter() - start)
    approvals: tuple[ApprovalCheck, ...] = ()
    if verdict.decision is Decision.APPROVAL_REQUIRED:
        subject = ApprovalSubject(f"policytest-{index}", case.tenant, case.tool, verdict.approval_group,
                                  str(case.principal))
        approvals = tuple(ApprovalCheck(approver, expected, _approver_verdict(bundle, case, approver, subject))
                          for approver, expected in case.expect.approvers)
    return Result(case, verdict, "", time.perf_counter() - start, approvals, shadow_disagreements(bundle, verdict))


def _approver_verdict(bundle: Bundle, case: Case, approver: Approver, subject: ApprovalSubject) -> Verdict:
    """What DecideApproval's check says of `approver` (engine.approver_verdict). A request
    it refuses outright (malformed, or entities that break a rule) is refused approval."""
    entities = json.dumps(list(approver.entities)).encode() if approver.entities else b""
    ctx = TrustedContext(approver.tenant or case.tenant, approver.principal, "", entities)
    try:
        ctx.check(require_request_id=False)
        return approver_verdict(bundle, ctx, subject, case.principal, approver.groups)
    except RequestError as exc:
        return Verdict(Decision.DENY, errors=(ErrorDetail("invalid_entities", str(exc)),))


def shadow_disagreements(bundle: Bundle, verdict: Verdict) -> frozenset[str]:
    """The @shadow policies among the reasons of the shadow evaluation, when it disagreed
    with the enforced one (engine.evaluate records it as `detail.shadow`)."""
    shadow = verdict.detail.get("shadow") or {}
    return frozenset(pid for pid in shadow.get("reasons", ()) if pid in bundle.policies and bundle.policies[pid].shadow)


def run(bundle_dir: str | pathlib.Path = "policies", *, filter: str = "", strict_coverage: bool = False,
        junit: str | None = None, out=None, err=None, output: str = "text") -> int:
    """The whole command; returns its exit code. `output="json"`: one JSON document on
    `out` instead of the lines (the problems still go to `err` as well)."""
    out, err = out or sys.stdout, err or sys.stderr
    problems: list[str] = []
    try:
        bundle = load_bundle(bundle_dir)
    except BundleError as exc:
        problems += [p.render() for p in exc.problems]
    cases, suite_problems = load_suites(bundle_dir)
    problems += suite_problems
    if not problems:
        problems += [p for case in cases for p in name_problems(bundle, case.suite, f"case `{case.name}`", case.expect)]
    if problems:
        for problem in problems:
            print(problem, file=err)
        print(f"{len(problems)} problem(s); no case was run", file=err)
        if junit:
            report.write_junit(junit, [], problems=problems)
        if output == "json":
            print(json.dumps({"problems": problems, "passed": 0, "failed": 0, "cases": []}, indent=2), file=out)
        return 1
    selected = [case for case in cases if filter in case.title]
    results = [run_case(bundle, case, i) for i, case in enumerate(selected, 1)]
    shown = io.StringIO() if output == "json" else out  # the lines, unless JSON says it all
    failed = report.print_results(results, shown)
    if filter and not selected:
        print(f"no case matches `{filter}`", file=err)
    # Coverage only means something over every case: a filtered run skips it.
    uncovered: list[str] = []
    if not filter:
        uncovered, policies = report.coverage(bundle, results)
        for item in uncovered:
            print(f"uncovered: {item}", file=shown)
        unreached = sum(1 for item in uncovered if "policy `" in item)
        print(f"coverage: {policies - unreached} of {policies} policies reached", file=shown)
    if junit:
        report.write_junit(junit, results, uncovered=uncovered if strict_coverage else [])
    if output == "json":
        print(json.dumps({"problems": [], "passed": len(results) - failed, "failed": failed, "uncovered": uncovered,
                          "cases": [{"case": r.case.title, "passed": r.passed,
                                     **({} if r.passed else {"differs": report.summary(r)})} for r in results]},
                         indent=2), file=out)
    return 1 if failed or not selected or (strict_coverage and uncovered) else 0


def add_test_command(subparsers) -> argparse.ArgumentParser:
    """Register `toolauthz test` on the CLI's `add_subparsers()` object."""
    parser = subparsers.add_parser("test", help="run the bundle's policy test suites (tests/*.yaml)",
                                   description=__doc__.split("\n\n")[0])
    _arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry point: `python -m toolauthz.cli.policytest [BUNDLE] ...`."""
    parser = argparse.ArgumentParser(prog="toolauthz test")
    _arguments(parser)
    args = parser.parse_args(argv)
    return args.func(args)


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("bundle", nargs="?", default="policies", help="the bundle directory (default `policies`)")
    parser.add_argument("--junit", metavar="FILE", help="also write the results as JUnit XML")
    parser.add_argument("--filter", metavar="SUBSTRING", default="",
                        help="run only the cases whose `<file> :: <name>` contains SUBSTRING (skips coverage)")
    parser.add_argument("--strict-coverage", action="store_true",
                        help="fail when a tool policy or a tool is not covered")
    add_output_option(parser)
    parser.set_defaults(func=_command)


def _command(args: argparse.Namespace) -> int:
    return run(args.bundle, filter=args.filter, strict_coverage=args.strict_coverage, junit=args.junit,
               output=args.output)


if __name__ == "__main__":
    sys.exit(main())
