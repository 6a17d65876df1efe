"""The policy test suite format: `BUNDLE/tests/*.yaml`, read with line numbers and
validated whole before anything runs. See docs/policy-testing.md.

    BUNDLE/tests/*.yaml                     `cases:`, optional `principals:`, `entities:`
    BUNDLE/tests/testdata/principals.yaml   shared: name -> {type, id}
    BUNDLE/tests/testdata/entities.yaml     shared: name -> [Cedar entities, JSON format]

A name (principal or entity set) is defined once across the shared files and a suite:
a suite cannot shadow a shared name. Problems read `tests/<file>:<line>: message`.
What a case expects is read by `expect.py`.
"""

from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass

from toolauthz.cli.policytest.expect import Approver, Expect, parse_expect
from toolauthz.cli.policytest.yamlfile import SuiteFile, YamlMap, YamlSeq
from toolauthz.engine import RunCounts
from toolauthz.model import Decision, Principal, Verdict
from toolauthz.usage.charges import CEILING

# (required, optional) keys of each mapping
SUITE_KEYS = ({"cases"}, {"description", "principals", "entities"})
CASE_KEYS = ({"name", "tenant", "principal", "tool", "expect"},
             {"input", "input_json", "entities", "run", "usage", "description"})
RUN_KEYS: tuple[set[str], set[str]] = (set(), {"calls", "tool_calls"})


@dataclass(frozen=True)
class Case:
    suite: str  # file name, e.g. `refunds.yaml`
    name: str
    line: int
    tenant: str
    principal: Principal
    tool: str
    input_json: bytes
    entities: tuple[dict, ...]
    run: RunCounts
    expect: Expect
    # The tool's usage meters' values before the call, by name (absent: 0).
    usage: tuple[tuple[str, int], ...] = ()

    @property
    def title(self) -> str:
        return f"{self.suite} :: {self.name}"


def load_suites(root: str | pathlib.Path) -> tuple[list[Case], list[str]]:
    """Every case of `root/tests/*.yaml`, and every problem found (nothing may run if any)."""
    root = pathlib.Path(root)
    tests, problems = root / "tests", list[tuple[str, int, str]]()
    shared: dict[str, dict] = {"principals": {}, "entities": {}}
    where: dict[tuple[str, str], str] = {}  # ("principals", "alice") -> "tests/testdata/principals.yaml:3"
    for kind, table in shared.items():
        path = tests / "testdata" / f"{kind}.yaml"
        f = SuiteFile(root, path, problems) if path.exists() else None
        if f is not None and f.data is not None:
            f.define(f.data, 1, kind, table, where)
    suites = sorted(tests.glob("*.yaml"))
    if not suites:
        problems.append(("tests", 0, "no test suites (`*.yaml`) found"))
    cases: list[Case] = []
    for path in suites:
        tables = {kind: dict(table) for kind, table in shared.items()}
        cases.extend(_suite(SuiteFile(root, path, problems), path.name, tables, dict(where)))
    return cases, [f"{file}:{line}: {msg}" if line else f"{file}: {msg}" for file, line, msg in sorted(problems)]


def _suite(f: SuiteFile, suite: str, tables: dict[str, dict], where: dict) -> list[Case]:
    if f.data is None or not f.mapping(f.data, 1, "a suite", SUITE_KEYS):
        return []
    for kind in ("principals", "entities"):
        if kind in f.data:
            f.define(f.data[kind], f.data.at(kind), kind, tables[kind], where)
    raw_cases = f.data.get("cases")
    if "cases" not in f.data:
        return []
    if not isinstance(raw_cases, YamlSeq) or not raw_cases:
        f.error(f.data.at("cases"), "`cases` must be a non-empty list")
        return []
    cases, names = [], set()
    for i, raw in enumerate(raw_cases):
        case = _case(f, suite, raw, raw_cases.at(i), tables["principals"], tables["entities"])
        if case is not None and case.name in names:
            f.error(case.line, f"case name `{case.name}` is used twice in this suite")
        elif case is not None:
            names.add(case.name)
            cases.append(case)
    return cases


def _case(f: SuiteFile, suite: str, raw, line: int, principals: dict, entity_sets: dict) -> Case | None:
    before = len(f.problems)
    what = f"case `{raw['name']}`" if isinstance(raw, YamlMap) and isinstance(raw.get("name"), str) else "a case"
    if not f.mapping(raw, line, what, CASE_KEYS):
        return None
    name, tenant, tool = (f.string(raw, k, what) for k in ("name", "tenant", "tool"))

    principal = f.named_principal(raw.get("principal"), raw.at("principal"), what, principals)

    input_json = b""
    if ("input" in raw) == ("input_json" in raw):
        f.error(raw.line, f"{what} needs exactly one of `input` and `input_json`")
    elif "input" in raw and not isinstance(raw["input"], YamlMap):
        f.error(raw.at("input"), f"`input` of {what} must be a mapping (use `input_json` for anything else)")
    elif "input" in raw:
        try:
            input_json = json.dumps(raw["input"], default=_not_json).encode()
        except TypeError as exc:
            f.error(raw.at("input"), f"`input` of {what} holds a YAML `{exc}`, which is not JSON; quote it")
    elif not isinstance(raw["input_json"], str):
        f.error(raw.at("input_json"), f"`input_json` of {what} must be a string")
    else:  # surrogatepass: a lone surrogate written as "\ud800" reaches the strict parser as such
        input_json = raw["input_json"].encode("utf-8", "surrogatepass")

    entities = f.entity_refs(raw.get("entities", YamlSeq()), raw.at("entities"), what, entity_sets)

    run = raw.get("run", YamlMap())
    if f.mapping(run, raw.at("run"), f"`run` of {what}", RUN_KEYS):
        for key, value in run.items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                f.error(run.at(key), f"`run.{key}` of {what} must be a non-negative integer")

    usage = raw.get("usage", YamlMap())
    if not isinstance(usage, YamlMap):
        f.error(raw.at("usage"), f"`usage` of {what} must map meter names to values")
    else:
        for key, value in usage.items():
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= CEILING:
                f.error(usage.at(key), f"`usage.{key}` of {what} must be an integer from 0 to {CEILING}")

    expect = parse_expect(f, raw.get("expect"), raw.at("expect"), what, principals, entity_sets)
    if len(f.problems) > before or name is None or tenant is None or tool is None or principal is None \
            or expect is None:
        return None
    return Case(suite, name, line, tenant, principal, tool, input_json, tuple(entities),
                RunCounts(run.get("calls", 0), run.get("tool_calls", 0)), expect,
                tuple((str(k), v) for k, v in usage.items()) if isinstance(usage, YamlMap) else ())


def _not_json(value):
    raise TypeError(type(value).__name__)


@dataclass(frozen=True)
class ApprovalCheck:
    """One approver of a case, put through DecideApproval's check (engine.approver_verdict)."""

    approver: Approver
    expected: bool  # may approve
    verdict: Verdict  # ALLOW or DENY; a refused request is a DENY with `invalid_entities`

    @property
    def allowed(self) -> bool:
        return self.verdict.decision is Decision.ALLOW


@dataclass(frozen=True)
class Result:
    case: Case
    verdict: Verdict | None  # None when the request itself was refused (RequestError)
    error: str = ""
    seconds: float = 0.0
    approvals: tuple[ApprovalCheck, ...] = ()
    shadow: frozenset[str] = frozenset()  # the @shadow policies that disagreed with the verdict

    @property
    def mismatches(self) -> tuple[str, ...]:
        """The fields of `expect` that the verdict does not meet."""
        if self.verdict is None:
            return ("request",)
        e, v = self.case.expect, self.verdict
        return tuple(name for name, bad in (
            ("decision", e.decision != v.decision),
            ("reasons", e.reasons is not None and e.reasons != set(v.reasons)),
            ("errors", e.error is not None and e.error not in {x.code for x in v.errors}),
            ("approval_group", e.approval_group is not None and e.approval_group != v.approval_group),
            ("approvers", bool(e.approvers) and (len(self.approvals) != len(e.approvers) or
                                                 any(c.allowed != c.expected for c in self.approvals))),
            ("shadow", e.shadow is not None and e.shadow != self.shadow),
        ) if bad)

    @property
    def passed(self) -> bool:
        return not self.mismatches
