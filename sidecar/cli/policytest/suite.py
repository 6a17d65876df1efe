"""The policy test suite format: `BUNDLE/tests/*.yaml`, read with line numbers and
validated whole before anything runs. See docs/policy-testing.md.

    BUNDLE/tests/*.yaml                     `cases:`, optional `principals:`, `entities:`
    BUNDLE/tests/testdata/principals.yaml   shared: name -> {type, id}
    BUNDLE/tests/testdata/entities.yaml     shared: name -> [Cedar entities, JSON format]

A name (principal or entity set) is defined once across the shared files and a suite:
a suite cannot shadow a shared name. Problems read `tests/<file>:<line>: message`.
"""

from __future__ import annotations

import difflib
import json
import pathlib
from dataclasses import dataclass
from typing import Any

import yaml

from sidecar.engine import RunCounts
from sidecar.model import Decision, Principal, Verdict

# (required, optional) keys of each mapping
SUITE_KEYS = ({"cases"}, {"description", "principals", "entities"})
CASE_KEYS = ({"name", "tenant", "principal", "tool", "expect"},
             {"input", "input_json", "entities", "run", "description"})
EXPECT_KEYS = ({"decision"}, {"reasons", "error", "approval_group"})
RUN_KEYS: tuple[set[str], set[str]] = (set(), {"calls", "tool_calls"})
PRINCIPAL_KEYS: tuple[set[str], set[str]] = ({"type", "id"}, set())


@dataclass(frozen=True)
class Expect:
    decision: Decision
    reasons: frozenset[str] | None = None  # None: not checked; else compared as a set
    error: str | None = None  # this code must be among the verdict's error codes
    approval_group: str | None = None


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

    @property
    def title(self) -> str:
        return f"{self.suite} :: {self.name}"


# --- YAML that remembers lines ----------------------------------------------------------

class _Map(dict[Any, Any]):
    line: int = 0  # the mapping's line
    lines: dict[Any, int] = {}  # each key's line, set per instance by the loader

    def at(self, key: Any) -> int:
        return self.lines.get(key, self.line)


class _Seq(list[Any]):
    line: int = 0  # the sequence's line
    lines: list[int] = []  # each item's line, set per instance by the loader

    def at(self, index: int) -> int:
        return self.lines[index] if index < len(self.lines) else self.line


class _Loader(yaml.SafeLoader):
    pass


def _construct_map(loader: _Loader, node: yaml.MappingNode) -> _Map:
    own = sum(1 for key_node, _ in node.value if key_node.tag != "tag:yaml.org,2002:merge")
    loader.flatten_mapping(node)  # `<<: *anchor` pairs come first; the mapping's own keys override them
    out, explicit = _Map(), set()
    out.line, out.lines = node.start_mark.line + 1, {}
    for i, (key_node, value_node) in enumerate(node.value):
        key = loader.construct_object(key_node, deep=True)
        if isinstance(key, (dict, list)) or key in explicit:
            problem = "a mapping key must be a scalar" if isinstance(key, (dict, list)) else f"duplicate key `{key}`"
            raise yaml.constructor.ConstructorError(None, None, problem, key_node.start_mark)
        if i >= len(node.value) - own:
            explicit.add(key)
        out[key] = loader.construct_object(value_node, deep=True)
        out.lines[key] = key_node.start_mark.line + 1
    return out


def _construct_seq(loader: _Loader, node: yaml.SequenceNode) -> _Seq:
    out = _Seq(loader.construct_object(child, deep=True) for child in node.value)
    out.line, out.lines = node.start_mark.line + 1, [child.start_mark.line + 1 for child in node.value]
    return out


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_map)
_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_seq)


# --- validation -------------------------------------------------------------------------

class _File:
    """One YAML file being read; collects its problems as (file, line, message)."""

    def __init__(self, root: pathlib.Path, path: pathlib.Path, problems: list):
        self.rel, self.problems, self.data = path.relative_to(root).as_posix(), problems, None
        try:
            self.data = yaml.load(path.read_text(encoding="utf-8"), Loader=_Loader)
            if self.data is None:
                self.error(0, "the file is empty")
        except (OSError, UnicodeDecodeError) as exc:
            self.error(0, f"cannot read file: {exc}")
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            self.error(mark.line + 1 if mark else 0, f"invalid YAML: {getattr(exc, 'problem', None) or exc}")

    def error(self, line: int, message: str) -> None:
        self.problems.append((self.rel, line, message))

    def mapping(self, value, line: int, what: str, keys: tuple[set, set] | None = None) -> bool:
        """Is `value` a mapping? Also reports missing and unknown `keys` (required, optional)."""
        if not isinstance(value, _Map):
            self.error(line, f"{what} must be a mapping")
            return False
        required, optional = keys if keys is not None else (set(), None)
        if optional is None:
            return True
        for key in value:
            if key not in required | optional:
                close = difflib.get_close_matches(str(key), sorted(required | optional), n=1)
                hint = f"did you mean `{close[0]}`?" if close else \
                    "expected one of " + ", ".join(f"`{k}`" for k in sorted(required | optional))
                self.error(value.at(key), f"unknown key `{key}` in {what}; {hint}")
        for key in sorted(required - set(value)):
            self.error(value.line, f"{what} is missing `{key}`")
        return True

    def string(self, m: _Map, key: str, what: str) -> str | None:
        value = m.get(key)
        if value is not None and (not isinstance(value, str) or not value):
            self.error(m.at(key), f"`{key}` of {what} must be a non-empty string")
            return None
        return value

    def principal(self, value, line: int, what: str) -> Principal | None:
        if not self.mapping(value, line, what, PRINCIPAL_KEYS):
            return None
        ptype, pid = self.string(value, "type", what), self.string(value, "id", what)
        return Principal(ptype, pid) if ptype and pid else None

    def entity_list(self, value, line: int, what: str) -> tuple[dict, ...] | None:
        if not isinstance(value, _Seq) or not all(isinstance(e, _Map) for e in value):
            self.error(line, f"{what} must be a list of Cedar entities (`uid`, `attrs`, `parents`)")
            return None
        return tuple(value)

    def define(self, section, line: int, kind: str, table: dict, where: dict) -> None:
        """Add the named principals or entity sets of `section` to `table`."""
        if not self.mapping(section, line, f"`{kind}`"):
            return
        label = "principal" if kind == "principals" else "entity set"
        for name, value in section.items():
            key, what = (kind, str(name)), f"{label} `{name}`"
            if key in where:
                self.error(section.at(name), f"{what} is already defined in {where[key]}")
                continue
            where[key] = f"{self.rel}:{section.at(name)}"
            parse = self.principal if kind == "principals" else self.entity_list
            parsed = parse(value, section.at(name), what)
            if parsed is not None:
                table[str(name)] = parsed


def load_suites(root: str | pathlib.Path) -> tuple[list[Case], list[str]]:
    """Every case of `root/tests/*.yaml`, and every problem found (nothing may run if any)."""
    root = pathlib.Path(root)
    tests, problems = root / "tests", list[tuple[str, int, str]]()
    shared: dict[str, dict] = {"principals": {}, "entities": {}}
    where: dict[tuple[str, str], str] = {}  # ("principals", "alice") -> "tests/testdata/principals.yaml:3"
    for kind, table in shared.items():
        path = tests / "testdata" / f"{kind}.yaml"
        f = _File(root, path, problems) if path.exists() else None
        if f is not None and f.data is not None:
            f.define(f.data, 1, kind, table, where)
    suites = sorted(tests.glob("*.yaml"))
    if not suites:
        problems.append(("tests", 0, "no test suites (`*.yaml`) found"))
    cases: list[Case] = []
    for path in suites:
        tables = {kind: dict(table) for kind, table in shared.items()}
        cases.extend(_suite(_File(root, path, problems), path.name, tables, dict(where)))
    return cases, [f"{file}:{line}: {msg}" if line else f"{file}: {msg}" for file, line, msg in sorted(problems)]


def _suite(f: _File, suite: str, tables: dict[str, dict], where: dict) -> list[Case]:
    if f.data is None or not f.mapping(f.data, 1, "a suite", SUITE_KEYS):
        return []
    for kind in ("principals", "entities"):
        if kind in f.data:
            f.define(f.data[kind], f.data.at(kind), kind, tables[kind], where)
    raw_cases = f.data.get("cases")
    if "cases" not in f.data:
        return []
    if not isinstance(raw_cases, _Seq) or not raw_cases:
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


def _case(f: _File, suite: str, raw, line: int, principals: dict, entity_sets: dict) -> Case | None:
    before = len(f.problems)
    what = f"case `{raw['name']}`" if isinstance(raw, _Map) and isinstance(raw.get("name"), str) else "a case"
    if not f.mapping(raw, line, what, CASE_KEYS):
        return None
    name, tenant, tool = (f.string(raw, k, what) for k in ("name", "tenant", "tool"))

    principal = raw.get("principal")
    if isinstance(principal, str):
        if principal not in principals:
            f.error(raw.at("principal"), f"unknown principal `{principal}`")
        principal = principals.get(principal)
    elif principal is not None:
        principal = f.principal(principal, raw.at("principal"), f"`principal` of {what}")

    input_json = b""
    if ("input" in raw) == ("input_json" in raw):
        f.error(raw.line, f"{what} needs exactly one of `input` and `input_json`")
    elif "input" in raw and not isinstance(raw["input"], _Map):
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

    entities: list[dict] = []
    refs = raw.get("entities", _Seq())
    if not isinstance(refs, _Seq):
        f.error(raw.at("entities"), f"`entities` of {what} must be a list of entity set names and entity lists")
        refs = _Seq()
    for i, ref in enumerate(refs):
        if isinstance(ref, str) and ref not in entity_sets:
            f.error(refs.at(i), f"unknown entity set `{ref}`")
        found = entity_sets.get(ref, ()) if isinstance(ref, str) else f.entity_list(
            ref if isinstance(ref, _Seq) else _Seq([ref]), refs.at(i), f"an inline entry of `entities` of {what}")
        entities.extend(e for e in found or () if e not in entities)

    run = raw.get("run", _Map())
    if f.mapping(run, raw.at("run"), f"`run` of {what}", RUN_KEYS):
        for key, value in run.items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                f.error(run.at(key), f"`run.{key}` of {what} must be a non-negative integer")

    expect = _expect(f, raw.get("expect"), raw.at("expect"), what)
    if len(f.problems) > before or name is None or tenant is None or tool is None or principal is None \
            or expect is None:
        return None
    return Case(suite, name, line, tenant, principal, tool, input_json, tuple(entities),
                RunCounts(run.get("calls", 0), run.get("tool_calls", 0)), expect)


def _not_json(value):
    raise TypeError(type(value).__name__)


def _expect(f: _File, raw, line: int, what: str) -> Expect | None:
    if raw is None or not f.mapping(raw, line, f"`expect` of {what}", EXPECT_KEYS):
        return None
    before = len(f.problems)
    decisions = [d.value for d in Decision]
    if "decision" in raw and raw["decision"] not in decisions:
        f.error(raw.at("decision"), f"decision `{raw['decision']}` is not one of {', '.join(decisions)}")
    reasons = raw.get("reasons")
    if reasons is not None and not (isinstance(reasons, list) and all(isinstance(r, str) for r in reasons)):
        f.error(raw.at("reasons"), f"`expect.reasons` of {what} must be a list of policy ids")
    error, group = f.string(raw, "error", what), f.string(raw, "approval_group", what)
    if len(f.problems) > before:
        return None
    return Expect(Decision(raw["decision"]), None if reasons is None else frozenset(reasons), error, group)


@dataclass(frozen=True)
class Result:
    case: Case
    verdict: Verdict | None  # None when the request itself was refused (RequestError)
    error: str = ""
    seconds: float = 0.0

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
        ) if bad)

    @property
    def passed(self) -> bool:
        return not self.mismatches
