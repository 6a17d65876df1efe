"""A request is evaluated with the static entities it can reach, not a copy of all of
entities.json: the same answers, from a set whose size does not grow with the file."""

from __future__ import annotations

import itertools
import json

import pytest

import toolauthz.engine as engine
from toolauthz.bundle import load_bundle
from toolauthz.bundle.entity_graph import StaticGraph, references
from toolauthz.model import Decision, Principal, ProposedCall, TrustedContext

SCHEMA = """
entity Tenant;
entity Group in [Group, Tenant];
entity Dept { budget: Long, head: User };
entity User in [Group, Tenant] { dept?: Dept, manager?: User };
entity Tool in [Tenant];
entity Flag { on: Bool };
entity Order in [Tenant] { owner: User, refundable_cents: Long };
"""
POLICIES = """
@id("root-group-looks-up") permit (principal in Group::"root", action == Action::"tool:lookup_order", resource);

@id("owner-in-finance") permit (principal, action == Action::"tool:lookup_order", resource)
when { resource.owner in Group::"finance" };

@id("never-the-owners-dept-head") forbid (principal, action == Action::"tool:lookup_order", resource)
when { resource.owner has dept && resource.owner.dept.head == principal };

@id("managers-with-budget-measure") permit (principal, action == Action::"tool:measure_runtime", resource)
when { principal has manager && principal.manager has dept && principal.manager.dept.budget > 100 };

@id("g1-frozen-by-flag") forbid (principal, action == Action::"tool:measure_runtime", resource)
when { Flag::"g1-frozen".on && principal in Group::"g1" };
"""
UNRELATED = 3000


def user(i: int) -> dict:
    parents = [{"type": "Tenant", "id": "acme"}, {"type": "Group", "id": ["g1", "g2", "finance", "solo"][i % 4]}]
    attrs = {"dept": {"__entity": {"type": "Dept", "id": f"d{i % 3}"}}} if i % 2 else {}
    if i % 3:
        attrs["manager"] = {"__entity": {"type": "User", "id": f"u{(i + 1) % 12}"}}
    return {"uid": {"type": "User", "id": f"u{i}"}, "attrs": attrs, "parents": parents}


def entities() -> list[dict]:
    groups = [("g1", "g2"), ("g2", "root"), ("root", None), ("finance", None), ("solo", None)]
    out = [{"uid": {"type": "Tenant", "id": "acme"}, "attrs": {}, "parents": []},
           {"uid": {"type": "Flag", "id": "g1-frozen"}, "attrs": {"on": True}, "parents": []}]
    out += [{"uid": {"type": "Group", "id": g}, "attrs": {},
             "parents": [{"type": "Group", "id": p}] if p else []} for g, p in groups]
    out += [{"uid": {"type": "Dept", "id": f"d{i}"}, "attrs": {"budget": 50 + 100 * i,
                                                               "head": {"__entity": {"type": "User", "id": f"u{i}"}}},
             "parents": []} for i in range(3)]
    out += [user(i) for i in range(12)]
    out += [{"uid": {"type": "Group", "id": f"unrelated{i}"}, "attrs": {}, "parents": []} for i in range(UNRELATED)]
    return out


@pytest.fixture
def bundle(bundle_dir):
    (bundle_dir / "schema.cedarschema").write_text(SCHEMA)
    (bundle_dir / "entities.json").write_text(json.dumps(entities()))
    (bundle_dir / "graph.cedar").write_text(POLICIES)
    # SUPPLIED joins a static group: the bundle has to open that group to the runtime.
    (bundle_dir / "bundle.yaml").write_text('principal_types: [User]\nruntime_groups: [Group::"g1"]\n')
    return load_bundle(bundle_dir)


def order(owner: str) -> list[dict]:
    return [{"uid": {"type": "Order", "id": "ord_1"}, "parents": [],
             "attrs": {"owner": {"__entity": {"type": "User", "id": owner}}, "refundable_cents": 100}}]


# A principal the runtime describes itself, in a static group, managed by a static user.
SUPPLIED = {"uid": {"type": "User", "id": "sup"}, "parents": [{"type": "Group", "id": "g1"}],
            "attrs": {"manager": {"__entity": {"type": "User", "id": "u5"}}}}
CALLS = {"lookup_order": b'{"order_id":"ord_1"}',
         "measure_runtime": b'{"prototype":"A","metric":"runtime","unit":"hours"}'}


def decisions(bundle) -> list[tuple]:
    out = []
    principals = [f"u{i}" for i in range(12)] + ["newcomer", "sup"]
    for principal, owner, tool in itertools.product(principals, ["u0", "u1", "u2", "u3", "sup"], CALLS):
        supplied = order(owner) + ([SUPPLIED] if "sup" in (principal, owner) else [])
        ctx = TrustedContext("acme", Principal("User", principal), "run", json.dumps(supplied).encode())
        verdict = engine.decide(bundle, ctx, ProposedCall("c1", tool, CALLS[tool]))
        out.append((principal, owner, tool, verdict.decision, verdict.reasons, verdict.errors))
    return out


def test_reached_entities_decide_as_all_of_them(bundle, monkeypatch):
    reached = decisions(bundle)
    # Every static entity (every static entity here is acme's or shared).
    monkeypatch.setattr(StaticGraph, "reach", lambda self, base, seeds, tenant: self.uids)
    bundle.anchored_entities.clear()
    assert reached == decisions(bundle)
    assert {d for *_, d, _r, _e in reached} == {Decision.ALLOW, Decision.DENY}
    assert {r for *_, reasons, _e in reached for r in reasons} >= {
        "root-group-looks-up", "owner-in-finance", "never-the-owners-dept-head", "managers-with-budget-measure",
        "g1-frozen-by-flag"}


def test_a_request_gets_what_it_reaches_and_not_the_whole_file(bundle):
    ctx = TrustedContext("acme", Principal("User", "u3"), "run", json.dumps(order("u1")).encode())
    prepared = engine.prepare(bundle, ctx, ProposedCall("c1", "lookup_order", CALLS["lookup_order"]))
    given = engine.request_entities(bundle, ctx, prepared, engine.supplied_entities(ctx.entities_json))
    assert len(bundle.static_graph) > UNRELATED
    # u3 -> g2 -> root, its manager u4 -> g1 (-> g2), u1's dept d1 -> head u1; the tenant,
    # the order, the policies' own Group::"root" and Group::"finance"; Action::"approve".
    assert len(given) < 30
    reach = bundle.tools["lookup_order"].policy_reach
    assert {("Group", "root"), ("Group", "finance")} <= reach and ("Group", "unrelated1") not in reach


def test_the_closure_follows_parents_attributes_and_tags():
    graph = StaticGraph([
        {"uid": {"type": "A", "id": "a"}, "attrs": {"to": {"__entity": {"type": "B", "id": "b"}}}, "parents": []},
        {"uid": {"type": "B", "id": "b"}, "attrs": {}, "parents": [{"type": "C", "id": "c"}]},
        {"uid": {"type": "C", "id": "c"}, "attrs": {}, "parents": [],
         "tags": {"t": {"__entity": {"type": "D", "id": "d"}}}},
        {"uid": {"type": "D", "id": "d"}, "attrs": {"set": [{"type": "E", "id": "e"}]}, "parents": []},
        {"uid": {"type": "E", "id": "e"}, "attrs": {}, "parents": [{"type": "A", "id": "a"}]},  # a cycle back
        {"uid": {"type": "F", "id": "f"}, "attrs": {}, "parents": []},
    ])
    everything_but_f = {("A", "a"), ("B", "b"), ("C", "c"), ("D", "d"), ("E", "e")}
    assert graph.closure([("A", "a"), ("Z", "not-static")]) == everything_but_f
    assert graph.closure([("D", "d")]) == everything_but_f
    assert graph.closure([("F", "f")]) == {("F", "f")}
    assert graph.closure([]) == frozenset()


def test_reach_adds_the_closure_of_static_seeds_to_a_closed_base():
    graph = StaticGraph([
        {"uid": {"type": "G", "id": "a"}, "attrs": {}, "parents": [{"type": "G", "id": "b"}]},
        {"uid": {"type": "G", "id": "b"}, "attrs": {}, "parents": []},
        {"uid": {"type": "G", "id": "c"}, "attrs": {}, "parents": []},
    ])
    base = graph.closure([("G", "c")])
    assert graph.reach(base, [("U", "not-static"), ("G", "c")], "acme") == base
    assert graph.reach(base, [("G", "a")], "acme") == {("G", "a"), ("G", "b"), ("G", "c")}
    assert graph.reach(base, [("G", "a")], "acme") is graph.reach(base, [("G", "a")], "acme")  # cached
    assert graph.reach(frozenset(), [], "acme") == frozenset()


def test_references_find_every_entity_a_value_names():
    est = {"principal": {"op": "in", "entity": {"type": "Group", "id": "g"}},
           "conditions": [{"body": {"==": {"left": {"Value": {"__entity": {"type": "Flag", "id": "f"}}},
                                           "right": {"Set": [{"Value": {"__entity": {"type": "U", "id": "u"}}}]}}}}]}
    assert set(references(est)) == {("Group", "g"), ("Flag", "f"), ("U", "u")}
