"""One call, one answer: Cedar returns the policies behind a decision in no fixed order,
and the sidecar must not pass that order on (responses, audit records, shadow checks)."""

from __future__ import annotations

import pytest

import toolauthz.engine as engine
from toolauthz.bundle import load_bundle
from toolauthz.model import Decision, Principal, ProposedCall, TrustedContext

TWO_FORBIDS = """
@id("forbid-b") forbid (principal, action == Action::"tool:measure_runtime", resource)
when { context.input.prototype == "B" };
@id("forbid-all") forbid (principal, action == Action::"tool:measure_runtime", resource);
"""
# Changes nothing about the answer above: both forbids still fire.
AGREEING_SHADOW = """
@id("shadow-permit-a") @shadow
permit (principal, action == Action::"tool:measure_runtime", resource)
when { context.input.prototype == "A" };
"""
CALL = b'{"prototype":"B","metric":"runtime","unit":"hours"}'


@pytest.fixture
def bundle(bundle_dir):
    (bundle_dir / "forbids.cedar").write_text(TWO_FORBIDS)
    (bundle_dir / "shadow.cedar").write_text(AGREEING_SHADOW)
    return load_bundle(bundle_dir)


def test_a_deny_names_its_policies_in_one_order_every_time(bundle):
    ctx = TrustedContext("acme", Principal("User", "alice"), "run")
    # In Cedar's own order about half of these come back ("forbid-b", "forbid-all").
    verdicts = [engine.decide(bundle, ctx, ProposedCall(f"c{i}", "measure_runtime", CALL)) for i in range(40)]
    assert {v.decision for v in verdicts} == {Decision.DENY}
    assert {v.reasons for v in verdicts} == {("forbid-all", "forbid-b")}


def test_a_shadow_set_that_agrees_is_never_reported(bundle):
    ctx = TrustedContext("acme", Principal("User", "alice"), "run")
    verdicts = [engine.decide(bundle, ctx, ProposedCall(f"c{i}", "measure_runtime", CALL)) for i in range(40)]
    assert [v for v in verdicts if "shadow" in v.detail] == []
