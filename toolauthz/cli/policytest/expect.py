"""What a case expects (`expect:` of a suite case), read and checked with line numbers.

    expect:
      decision: APPROVAL_REQUIRED        ALLOW | DENY | APPROVAL_REQUIRED
      reasons: [policy-id, ...]          compared as a set
      error: invalid_input               must be among the verdict's error codes
      approval_group: finance
      may_approve: [bob, ...]            APPROVAL_REQUIRED only: approvers DecideApproval lets through
      may_not_approve: [alice, ...]      ... and approvers it refuses (self-approval, tenant, policy)
      shadow: [policy-id, ...]           the @shadow policies that disagree with the decision

An approver is a principal name, an inline `{type, id}`, or `{principal, tenant,
entities, groups}`: another tenant (default the case's), the approver's own trusted
entities, or the groups an ID token proves (then no entities, as DecideApproval requires).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from toolauthz.bundle import Bundle
from toolauthz.bundle.suggest import did_you_mean
from toolauthz.cli.policytest.yamlfile import SuiteFile, YamlMap, YamlSeq
from toolauthz.model import Decision, Principal

EXPECT_KEYS = ({"decision"}, {"reasons", "error", "approval_group", "may_approve", "may_not_approve", "shadow"})
APPROVER_KEYS = ({"principal"}, {"tenant", "entities", "groups"})


@dataclass(frozen=True)
class Approver:
    label: str  # as the suite names it, for the report
    principal: Principal
    tenant: str | None = None  # None: the case's tenant
    entities: tuple[dict[str, Any], ...] = ()
    groups: tuple[str, ...] | None = None  # proven by an ID token; None: the bundle's groups


@dataclass(frozen=True)
class Expect:
    decision: Decision
    reasons: frozenset[str] | None = None  # None: not checked; else compared as a set
    error: str | None = None  # this code must be among the verdict's error codes
    approval_group: str | None = None
    may_approve: tuple[Approver, ...] = ()
    may_not_approve: tuple[Approver, ...] = ()
    shadow: frozenset[str] | None = None  # None: not checked; else the disagreeing @shadow policies
    line: int = 0  # of `expect:`, for problems found once the bundle is known

    @property
    def approvers(self) -> tuple[tuple[Approver, bool], ...]:
        """Every approver the case names, with whether it may approve."""
        return tuple((a, True) for a in self.may_approve) + tuple((a, False) for a in self.may_not_approve)


def parse_expect(f: SuiteFile, raw: Any, line: int, what: str, principals: dict[str, Principal],
                 entity_sets: dict[str, tuple[dict[str, Any], ...]]) -> Expect | None:
    if raw is None or not f.mapping(raw, line, f"`expect` of {what}", EXPECT_KEYS):
        return None
    before = len(f.problems)
    decisions = [d.value for d in Decision]
    if "decision" not in raw:  # a misspelled `decision` is also reported as an unknown key, with a suggestion
        f.error(line, f"`expect` of {what} needs `decision` (one of {', '.join(decisions)})")
    elif raw["decision"] not in decisions:
        f.error(raw.at("decision"), f"decision `{raw['decision']}` is not one of {', '.join(decisions)}")
    reasons, shadow = (_ids(f, raw, key, what) for key in ("reasons", "shadow"))
    error, group = f.string(raw, "error", what), f.string(raw, "approval_group", what)
    approvers: dict[str, tuple[Approver, ...]] = {}
    for key in ("may_approve", "may_not_approve"):
        if key not in raw:
            continue
        if raw.get("decision") != Decision.APPROVAL_REQUIRED.value:
            f.error(raw.at(key), f"`expect.{key}` of {what} needs `decision: APPROVAL_REQUIRED`")
        approvers[key] = _approvers(f, raw[key], raw.at(key), f"`expect.{key}` of {what}", principals, entity_sets)
    if len(f.problems) > before:
        return None
    return Expect(Decision(raw["decision"]), reasons, error, group, approvers.get("may_approve", ()),
                  approvers.get("may_not_approve", ()), shadow, raw.line)


def _ids(f: SuiteFile, raw: Any, key: str, what: str) -> frozenset[str] | None:
    value = raw.get(key)
    if value is not None and not (isinstance(value, list) and all(isinstance(r, str) for r in value)):
        f.error(raw.at(key), f"`expect.{key}` of {what} must be a list of policy ids")
        return None
    return None if value is None else frozenset(value)


def _approvers(f: SuiteFile, raw: Any, line: int, what: str, principals: dict[str, Principal],
               entity_sets: dict[str, tuple[dict[str, Any], ...]]) -> tuple[Approver, ...]:
    if not isinstance(raw, YamlSeq) or not raw:
        f.error(line, f"{what} must be a non-empty list of approvers (principal names or mappings)")
        return ()
    out = []
    for i, item in enumerate(raw):
        at = raw.at(i)
        if isinstance(item, YamlMap) and "principal" in item:
            if not f.mapping(item, at, f"an approver of {what}", APPROVER_KEYS):
                continue
            principal = f.named_principal(item["principal"], item.at("principal"), f"an approver of {what}",
                                          principals)
            tenant = f.string(item, "tenant", f"an approver of {what}")
            entities = f.entity_refs(item.get("entities", YamlSeq()), item.at("entities"), f"an approver of {what}",
                                     entity_sets)
            groups = item.get("groups")
            if groups is not None and not (isinstance(groups, list) and all(isinstance(g, str) for g in groups)):
                f.error(item.at("groups"), f"`groups` of an approver of {what} must be a list of group names")
                groups = None
            label = _label(item["principal"], principal)
            if tenant:
                label += f" of {tenant}"
            if principal is not None:
                out.append(Approver(label, principal, tenant, tuple(entities),
                                    None if groups is None else tuple(groups)))
        else:
            principal = f.named_principal(item, at, f"an approver of {what}", principals)
            if principal is not None:
                out.append(Approver(_label(item, principal), principal))
    return tuple(out)


def _label(written: Any, principal: Principal | None) -> str:
    return written if isinstance(written, str) else str(principal)


def name_problems(bundle: Bundle, case_file: str, what: str, expect: Expect) -> list[str]:
    """The names `expect` gives that the bundle does not define (policy ids in `reasons`
    and `shadow`, the `approval_group`), each with the closest one the bundle does."""
    where = f"tests/{case_file}:{expect.line}"
    problems = []
    for key, ids, known in (("reasons", expect.reasons, [p for p, i in bundle.policies.items() if not i.shadow]),
                            ("shadow", expect.shadow, [p for p, i in bundle.policies.items() if i.shadow])):
        for pid in sorted(set(ids or ()) - set(known)):
            problems.append(f"{where}: `expect.{key}` of {what} names `{pid}`, which is no "
                            f"{'@shadow ' if key == 'shadow' else ''}policy of the bundle{did_you_mean(pid, known)}")
    groups = {i.approval_group for i in bundle.policies.values() if i.approval_group}
    if expect.approval_group is not None and expect.approval_group not in groups:
        problems.append(f"{where}: `expect.approval_group` of {what} is `{expect.approval_group}`, which no "
                        f"`@approval` of the bundle names{did_you_mean(expect.approval_group, groups)}")
    return problems
