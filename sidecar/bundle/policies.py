"""Cedar policy files: split into located policies, parsed, validated, and indexed.

cedarpy reports errors without source positions, so each file is split into its
policies here (a small scanner that respects strings and comments), which gives every
policy a file:line:col and lets validation errors point at the offending text.
Policies get stable ids: their `@id` annotation, else `<file>:<line>`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import cedarpy

from sidecar.errors import Problem


@dataclass(frozen=True)
class PolicyInfo:
    policy_id: str
    effect: str  # "permit" | "forbid"
    annotations: dict[str, str]
    file: str
    line: int
    actions: frozenset[str] | None  # action ids in scope; None = applies to every action
    est: dict[str, Any] = field(repr=False, compare=False)

    @property
    def approval_group(self) -> str | None:
        return self.annotations.get("approval")

    @property
    def shadow(self) -> bool:
        return "shadow" in self.annotations


@dataclass(frozen=True)
class SourcePolicy:
    text: str
    offset: int  # in the file
    line: int
    col: int


def split_policies(source: str) -> list[SourcePolicy]:
    """Top-level `;` ends a policy; brackets, strings and comments are skipped."""
    out, depth, i, start = [], 0, 0, None
    n = len(source)
    while i < n:
        ch = source[i]
        if ch == "/" and source.startswith("//", i):
            nl = source.find("\n", i)
            i = n if nl < 0 else nl + 1
            continue
        if ch.isspace():
            i += 1
            continue
        if start is None:
            start = i
        if ch == '"':
            i += 1
            while i < n and source[i] != '"':
                i += 2 if source[i] == "\\" else 1
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == ";" and depth == 0:
            out.append(_located(source, start, i + 1))
            start = None
        i += 1
    if start is not None:  # trailing text without `;`: let Cedar report it
        out.append(_located(source, start, n))
    return out


def _located(source: str, start: int, end: int) -> SourcePolicy:
    line = source.count("\n", 0, start) + 1
    col = start - (source.rfind("\n", 0, start) + 1) + 1
    return SourcePolicy(source[start:end], start, line, col)


_BACKTICKED = re.compile(r"`([^`]+)`")


def locate(policy: SourcePolicy, message: str) -> tuple[int, int]:
    """Best position for an error inside one policy: the first backticked fragment of the
    message (or its last dotted component) found in the policy text, else its start."""
    for fragment in _BACKTICKED.findall(message):
        # The last dotted component first: for `input.amout_cents` point at the typo.
        for candidate in (fragment.split(".")[-1], fragment, fragment.split("::")[-1].strip('"')):
            at = policy.text.find(candidate) if candidate else -1
            if at >= 0:
                absolute = policy.text[:at]
                line = policy.line + absolute.count("\n")
                col = (at - absolute.rfind("\n")) if "\n" in absolute else policy.col + at
                return line, col
    return policy.line, policy.col


def parse_file(rel: str, source: str, problems: list[Problem]) -> list[tuple[SourcePolicy, dict]]:
    """Each policy with its EST (Cedar's JSON form); parse errors become problems."""
    parsed = []
    for policy in split_policies(source):
        try:
            est = json.loads(cedarpy.policies_to_json_str(policy.text))
        except ValueError as exc:
            line, col = locate(policy, str(exc))
            problems.append(Problem(rel, f"cannot parse policy: {exc}", line, col))
            continue
        statics = list(est.get("staticPolicies", {}).values())
        if est.get("templates") or len(statics) != 1:
            problems.append(Problem(rel, "expected exactly one static policy here (templates are not supported)", policy.line, policy.col))
            continue
        parsed.append((policy, statics[0]))
    return parsed


def scope_actions(est: dict) -> frozenset[str] | None:
    scope = est.get("action", {})
    op = scope.get("op")
    if op == "==":
        return frozenset([scope["entity"]["id"]])
    if op == "in" and "entities" in scope:
        return frozenset(e["id"] for e in scope["entities"])
    if op == "in" and "entity" in scope:
        return frozenset([scope["entity"]["id"]])
    return None  # `action` unconstrained: the policy applies everywhere


def build_infos(rel: str, parsed: list[tuple[SourcePolicy, dict]], problems: list[Problem],
                seen: dict[str, str]) -> list[PolicyInfo]:
    infos = []
    for policy, est in parsed:
        annotations = {k: (v if v is not None else "") for k, v in est.get("annotations", {}).items()}
        policy_id = annotations.get("id") or f"{rel}:{policy.line}"
        if policy_id in seen:
            problems.append(Problem(rel, f"duplicate policy id `{policy_id}` (also at {seen[policy_id]})", policy.line, policy.col))
            continue
        seen[policy_id] = f"{rel}:{policy.line}"
        if "approval" in annotations and (est["effect"] != "permit" or not annotations["approval"]):
            problems.append(Problem(rel, "`@approval(\"<group>\")` needs a group name and belongs on a permit", policy.line, policy.col))
            continue
        infos.append(PolicyInfo(policy_id, est["effect"], annotations, rel, policy.line, scope_actions(est), est))
    return infos


def policy_set(infos: list[PolicyInfo]) -> cedarpy.PolicySet:
    body = {"staticPolicies": {i.policy_id: i.est for i in infos}, "templates": {}, "templateLinks": []}
    return cedarpy.PolicySet.from_json_str(json.dumps(body))
