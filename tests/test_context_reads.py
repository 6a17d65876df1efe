"""Cedar is handed only the parts of the context a tool's policies can read: the reads
are found right, and leaving the rest out never changes a decision."""

from __future__ import annotations

import dataclasses
import itertools
import json

import cedarpy
import pytest

import toolauthz.engine as engine
from toolauthz.bundle import load_bundle
from toolauthz.bundle.cedar_schema import context_type, tool_context_type
from toolauthz.bundle.context_reads import context_reads, narrowed
from toolauthz.engine import RunCounts
from toolauthz.model import Principal, ProposedCall, TrustedContext


def reads_of(*conditions: str):
    policies = "\n".join(f'@id("p{i}") permit (principal, action, resource) when {{ {c} }};'
                         for i, c in enumerate(conditions))
    est = json.loads(cedarpy.policies_to_json_str(policies))
    return context_reads(est["staticPolicies"].values())


@pytest.mark.parametrize("conditions, expected", [
    (["true"], {}),
    (["context.input.qty > 3"], {"input": {"qty": None}}),
    (['context["tenant"] == "acme"'], {"tenant": None}),
    (["context has run && context.run.calls < 2"], {"run": {"calls": None}}),
    (['context.input has note && context.input.note like "*x*"'], {"input": {"note": None}}),
    # `has` asks only whether a value is there: a record is kept, emptied of what no one reads.
    (["context has input.note"], {"input": {"note": {}}}),
    (["context has run", "context.run.calls > 0"], {"run": {"calls": None}}),
    (["context.run.calls > 0", "context has run"], {"run": {"calls": None}}),
    (["context.run == {}", "context has run"], {"run": None}),
    (["context.input.qty > 3", 'context.input.region == "r0"', "context.run.tool_calls < 5"],
     {"input": {"qty": None, "region": None}, "run": {"tool_calls": None}}),
    # A part used as a whole value is kept whole, and covers reads below it.
    (['context.input == {"qty": 1}', "context.input.qty > 0"], {"input": None}),
    (["context.input.tags.contains(1)"], {"input": {"tags": None}}),
    # `context` itself as a value: everything.
    (["context == {}"], None),
    (["[context].contains({})"], None),
    (["context.input.qty > 0", "context != {}"], None),
])
def test_reads_are_found(conditions, expected):
    assert reads_of(*conditions) == expected


def test_narrowing_keeps_only_what_is_read():
    full = context_type(("Record", {"qty": ("Long", True), "region": ("String", True), "note": ("String", False)}))
    t = narrowed(full, {"input": {"qty": None}, "run": {"calls": None}})
    assert t == ("Record", {"input": (("Record", {"qty": ("Long", True)}), True),
                            "run": (("Record", {"calls": ("Long", True)}), True)})
    assert narrowed(full, None) == full
    assert narrowed(full, {}) == ("Record", {})
    assert narrowed(full, {"run": {}, "input": {"note": {}}}) == (
        "Record", {"input": (("Record", {"note": ("String", False)}), True), "run": (("Record", {}), True)})
    # A read below a value that is not a record (a policy the validator would refuse)
    # keeps that value whole.
    assert narrowed(full, {"tenant": {"x": None}})[1]["tenant"] == ("String", True)


MIXED = """
@id("refund-fraud-note") forbid (principal, action == Action::"tool:issue_refund", resource)
when { context.input has reason && context.input.reason like "*fraud*" };

@id("refund-third-in-run") forbid (principal, action == Action::"tool:issue_refund", resource)
when { context.run.tool_calls >= 2 };

@id("blocked-run") forbid (principal, action, resource)
when { context has request_id && context.request_id == "run-blocked" };

@id("measure-needs-a-run") forbid (principal, action == Action::"tool:measure_runtime", resource)
unless { context has run && context.input has prototype };

@id("shadow-purchase-outside-acme") @shadow
forbid (principal, action == Action::"tool:issue_refund", resource)
when { context.side_effect == "purchase" && context.tenant != "acme" };
"""


@pytest.fixture
def bundle(bundle_dir):
    (bundle_dir / "mixed.cedar").write_text(MIXED)
    return load_bundle(bundle_dir)


def test_a_slice_sends_what_its_policies_read_and_no_more(bundle):
    refund = bundle.tools["issue_refund"].context_type
    assert refund == ("Record", {
        "input": (("Record", {"amount_cents": ("Long", True), "reason": ("String", False)}), True),
        "tenant": ("String", True), "side_effect": ("String", True), "request_id": ("String", True),
        "run": (("Record", {"tool_calls": ("Long", True)}), True),
        "usage": (("Record", {"refund_cents_24h": ("Long", True)}), True)})
    # lookup_order's own policy reads no context; the unscoped `blocked-run` does.
    assert bundle.tools["lookup_order"].context_type == ("Record", {"request_id": ("String", True)})
    # Only asked whether they are there: the record `run` is sent empty, a string whole.
    assert bundle.tools["measure_runtime"].context_type == ("Record", {
        "input": (("Record", {"prototype": ("String", True)}), True), "request_id": ("String", True),
        "run": (("Record", {}), True)})


MEASURE = b'{"prototype": "A", "metric": "runtime", "unit": "hours"}'


def with_full_context(prepared: engine.PreparedCall) -> engine.PreparedCall:
    whole = tool_context_type(prepared.slice.tool)
    return dataclasses.replace(prepared, slice=dataclasses.replace(prepared.slice, context_type=whole))


def test_a_narrowed_context_decides_as_the_whole_one(bundle):
    seen = set()
    cases = itertools.product(
        ["acme", "globex"], ["run-1", "run-blocked"], [1, 4000, 9000, 200000],
        [None, "damaged", "fraud suspected"], [0, 1, 2, 3], ["alice", "bob"], [0, 499_999])
    for tenant, request_id, amount, reason, tool_calls, principal, spent in cases:
        args = {"order_id": "ord_1", "amount_cents": amount, **({"reason": reason} if reason else {})}
        entities = [{"uid": {"type": "Order", "id": "ord_1"},
                     "attrs": {"owner": {"__entity": {"type": "User", "id": "alice"}}, "refundable_cents": 10_000},
                     "parents": []}]
        ctx = TrustedContext(tenant, Principal("User", principal), request_id, json.dumps(entities).encode())
        prepared = engine.prepare(bundle, ctx, ProposedCall("c1", "issue_refund", json.dumps(args).encode()))
        ents = engine.request_entities(bundle, ctx, prepared, engine.supplied_entities(ctx.entities_json))
        run = RunCounts(tool_calls, tool_calls)
        usage = {"refund_cents_24h": spent}
        narrow = engine.evaluate(bundle, ctx, prepared, run, ents, usage)
        assert narrow == engine.evaluate(bundle, ctx, with_full_context(prepared), run, ents, usage)
        seen.add((narrow.decision, narrow.reasons, "shadow" in narrow.detail))
        ctx = TrustedContext(tenant, Principal("User", principal), request_id)
        prepared = engine.prepare(bundle, ctx, ProposedCall("c2", "measure_runtime", MEASURE))
        ents = engine.request_entities(bundle, ctx, prepared, engine.supplied_entities(ctx.entities_json))
        usage = {"refund_cents_24h": spent}
        narrow = engine.evaluate(bundle, ctx, prepared, run, ents, usage)
        assert narrow == engine.evaluate(bundle, ctx, with_full_context(prepared), run, ents, usage)
        seen.add((narrow.decision, narrow.reasons, "shadow" in narrow.detail))
    # The cases reach every kind of answer, the shadow policy's disagreement included.
    decisions = {d for d, _, _ in seen}
    assert {d.value for d in decisions} == {"ALLOW", "DENY", "APPROVAL_REQUIRED"}
    assert any(shadowed for _, _, shadowed in seen)
    assert {r for _, reasons, _ in seen for r in reasons} >= {
        "refund-fraud-note", "refund-third-in-run", "blocked-run", "refund-own-order-small", "measure-any-user"}
