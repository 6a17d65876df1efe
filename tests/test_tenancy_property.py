"""Property: nothing of tenant A decides a call of tenant B. Two tenants share principal
ids (u0-u2), order ids and group names; A's static entities (users, their groups and
attributes, A's own group and orders) and the policies that are only about A are drawn at
random, twice. Every request of B (static, built and runtime-described principals, with
and without a described order, every tool) is decided the same under both draws.

B's runtime names only the shared group the bundle opens to it (g2) as a parent: naming a
static entity of any tenant as a parent is refused by design, whoever defines it."""

from __future__ import annotations

import itertools
import json
import pathlib
import shutil
import tempfile

from conftest import EXAMPLE_BUNDLE
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import toolauthz.engine as engine
from toolauthz.bundle import load_bundle
from toolauthz.errors import RequestError
from toolauthz.model import Principal, ProposedCall, TrustedContext

SCHEMA = """
entity Tenant;
entity Group in [Group, Tenant];
entity User in [Tenant, Group] { level?: Long, buddy?: User };
entity Tool in [Tenant];
entity Order in [Tenant] { owner: User, refundable_cents: Long };
"""
SHARED_POLICIES = """
@id("g0-looks-up") permit (principal in Group::"g0", action == Action::"tool:lookup_order", resource);
@id("owner-looks-up") permit (principal, action == Action::"tool:lookup_order", resource)
when { resource has owner && resource.owner == principal };
@id("level-measures") permit (principal, action == Action::"tool:measure_runtime", resource)
when { principal has level && principal.level > 2 };
@id("buddy-of-g0-measures") permit (principal, action == Action::"tool:measure_runtime", resource)
when { principal has buddy && principal.buddy in Group::"g0" };
@id("g1-never-measures") forbid (principal in Group::"g1", action == Action::"tool:measure_runtime", resource);
@id("small-refunds") permit (principal, action == Action::"tool:issue_refund", resource)
when { resource has owner && resource.owner == principal && context.input.amount_cents <= 5000 };
@id("g2-big-refunds") @approval("finance") permit (principal in Group::"g2", action == Action::"tool:issue_refund",
  resource) when { context.input.amount_cents > 5000 };
@id("g0-approves-finance") permit (principal in Group::"g0", action == Action::"approve", resource is Approval)
when { resource.group == "finance" };
"""
# Policies only about A: each holds only for a principal or resource inside Tenant::"A".
A_POLICIES = [
    '@id("a-forbids-everything") forbid (principal, action, resource) when { principal in Tenant::"A" };',
    '@id("a-orders-closed") forbid (principal, action == Action::"tool:lookup_order", resource)\n'
    'when { resource in Tenant::"A" };',
    '@id("a-g2-looks-up") permit (principal in Group::"g2", action == Action::"tool:lookup_order", resource)\n'
    'when { principal in Tenant::"A" };',
    '@id("a-level-measures") permit (principal, action == Action::"tool:measure_runtime", resource)\n'
    'when { principal in Tenant::"A" && principal has level && principal.level > 0 };',
    '@id("a-users-refund") permit (principal, action == Action::"tool:issue_refund", resource)\n'
    'when { principal in Tenant::"A" && resource in Tenant::"A" };',
]
USERS = ["u0", "u1", "u2"]
ORDERS = ["ord_1", "ord_2"]


def ref(kind: str, name: str) -> dict:
    return {"type": kind, "id": name}


def fixed_entities() -> list[dict]:
    """Shared groups (g1 below g0), both tenants, and B's static user b0."""
    return [
        {"uid": ref("Tenant", "A"), "attrs": {}, "parents": []},
        {"uid": ref("Tenant", "B"), "attrs": {}, "parents": []},
        {"uid": ref("Group", "g0"), "attrs": {}, "parents": []},
        {"uid": ref("Group", "g1"), "attrs": {}, "parents": [ref("Group", "g0")]},
        {"uid": ref("Group", "g2"), "attrs": {}, "parents": []},
        {"uid": ref("User", "b0"), "attrs": {"level": 1}, "parents": [ref("Tenant", "B"), ref("Group", "g0")]},
    ]


@st.composite
def tenant_a(draw) -> tuple[list[dict], list[str]]:
    """A's static entities and the policies only about A."""
    entities = [{"uid": ref("Group", "ga"), "attrs": {},
                 "parents": [ref("Tenant", "A")] + draw(st.sampled_from([[], [ref("Group", "g0")]]))}]
    for user in USERS:
        if draw(st.booleans()):
            groups = draw(st.lists(st.sampled_from(["g0", "g1", "g2", "ga"]), unique=True))
            attrs = {}
            if draw(st.booleans()):
                attrs["level"] = draw(st.integers(0, 5))
            if draw(st.booleans()):
                attrs["buddy"] = {"__entity": ref("User", draw(st.sampled_from(USERS + ["b0"])))}
            entities.append({"uid": ref("User", user), "attrs": attrs,
                             "parents": [ref("Tenant", "A")] + [ref("Group", g) for g in groups]})
    for order in ORDERS:
        if draw(st.booleans()):
            owner = draw(st.sampled_from(USERS))
            entities.append({"uid": ref("Order", order), "parents": [ref("Tenant", "A")],
                             "attrs": {"owner": {"__entity": ref("User", owner)}, "refundable_cents": 10_000}})
    policies = draw(st.lists(st.sampled_from(A_POLICIES), unique=True))
    return entities, policies


def write_bundle(root: pathlib.Path, a_entities: list[dict], a_policies: list[str]) -> pathlib.Path:
    shutil.copytree(EXAMPLE_BUNDLE, root, ignore=shutil.ignore_patterns("tests", "*.cedar"))
    (root / "schema.cedarschema").write_text(SCHEMA)
    (root / "bundle.yaml").write_text('principal_types: [User]\nruntime_groups: [Group::"g2"]\n')
    (root / "entities.json").write_text(json.dumps(fixed_entities() + a_entities))
    (root / "shared.cedar").write_text(SHARED_POLICIES)
    (root / "only_a.cedar").write_text("\n".join(a_policies) + "\n")
    return root


CALLS = {
    "lookup_order": lambda order: {"order_id": order},
    "measure_runtime": lambda order: {"prototype": "A", "metric": "runtime", "unit": "hours"},
    "issue_refund": lambda order: {"order_id": order, "amount_cents": 6000},
}


def b_requests() -> list[tuple[str, str, str, bytes]]:
    """(principal, tool, order, entities_json) for tenant B."""
    out = []
    for principal, tool, order, described in itertools.product(
            USERS + ["b0", "stranger"], CALLS, ORDERS, ["nothing", "principal", "order", "both"]):
        entities = []
        if described in ("principal", "both") and principal != "b0":
            entities.append({"uid": ref("User", principal), "attrs": {"level": 3},
                             "parents": [ref("Group", "g2"), ref("Tenant", "B")]})
        if described in ("order", "both"):
            entities.append({"uid": ref("Order", order), "parents": [],
                             "attrs": {"owner": {"__entity": ref("User", principal)}, "refundable_cents": 9000}})
        out.append((principal, tool, order, json.dumps(entities).encode()))
    return out


B_REQUESTS = b_requests()


def decisions(bundle, tenant: str, requests) -> list[tuple]:
    out = []
    for principal, tool, order, entities_json in requests:
        ctx = TrustedContext(tenant, Principal("User", principal), "run", entities_json)
        call = ProposedCall("c1", tool, json.dumps(CALLS[tool](order)).encode())
        try:
            verdict = engine.decide(bundle, ctx, call)
        except RequestError as exc:
            out.append(("refused", str(exc)))
        else:
            out.append((verdict.decision, verdict.reasons, tuple(e.code for e in verdict.errors)))
    return out


@settings(derandomize=True, database=None, max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(first=tenant_a(), second=tenant_a())
def test_no_decision_of_b_depends_on_a(first, second):
    with tempfile.TemporaryDirectory() as tmp:
        seen = []
        for index, (a_entities, a_policies) in enumerate((first, second)):
            bundle = load_bundle(write_bundle(pathlib.Path(tmp) / str(index), a_entities, a_policies))
            # A's requests first, with the same principal and order ids: their entity sets
            # are cached on the bundle before B's are built.
            decisions(bundle, "A", [(p, t, o, b"") for p, t, o, _ in B_REQUESTS[::4]])
            seen.append(decisions(bundle, "B", B_REQUESTS))
        assert seen[0] == seen[1]


def test_what_a_changes_does_change_as_decisions():
    """The draws above matter to A: the property is not true because A's entities or
    policies are never read."""
    member = {"uid": ref("User", "u0"), "attrs": {"level": 4}, "parents": [ref("Tenant", "A"), ref("Group", "g0")]}
    requests = [("u0", "lookup_order", "ord_1", b""), ("u0", "measure_runtime", "ord_1", b"")]
    with tempfile.TemporaryDirectory() as tmp:
        plain = load_bundle(write_bundle(pathlib.Path(tmp) / "plain", [], []))
        changed = load_bundle(write_bundle(pathlib.Path(tmp) / "changed", [member], [A_POLICIES[3]]))
        assert decisions(plain, "A", requests) != decisions(changed, "A", requests)
        assert decisions(plain, "B", requests) == decisions(changed, "B", requests)
