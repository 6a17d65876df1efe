"""The per-bundle cache of synthesized anchor entities must never change a decision."""

from __future__ import annotations

import shutil

import pytest
from conftest import EXAMPLE_BUNDLE

import toolauthz.engine as engine
from toolauthz.bundle import load_bundle
from toolauthz.model import Decision, Principal, ProposedCall, TrustedContext

SAME_TENANT = ('@id("same-tenant") permit (principal, action == Action::"tool:lookup_order", resource)\n'
               'when { resource in Tenant::"acme" && principal in Tenant::"acme" };\n')


@pytest.fixture
def bundle(tmp_path):
    target = tmp_path / "bundle"
    shutil.copytree(EXAMPLE_BUNDLE, target)
    (target / "orders.cedar").write_text(SAME_TENANT)
    return load_bundle(target)


def lookup(bundle, tenant: str, principal: str = "alice", order: str = "ord_77") -> Decision:
    ctx = TrustedContext(tenant, Principal("User", principal), "run")
    call = ProposedCall("c1", "lookup_order", f'{{"order_id":"{order}"}}'.encode())
    return engine.decide(bundle, ctx, call).decision


@pytest.mark.parametrize("order", [("acme", "globex"), ("globex", "acme")])
def test_cached_anchors_stay_in_their_own_tenant(bundle, order):
    expected = {"acme": Decision.ALLOW, "globex": Decision.DENY}
    for _round in range(2):  # the second round is answered from the cache
        for tenant in order:
            assert lookup(bundle, tenant) is expected[tenant]
    assert set(key[0] for key in bundle.anchored_entities) == {"acme", "globex"}


def test_cached_and_fresh_entities_decide_alike(bundle):
    first = [lookup(bundle, "acme", p, o) for p in ("alice", "dave") for o in ("ord_1", "ord_2")]
    assert len(bundle.anchored_entities) == 4
    cached = [lookup(bundle, "acme", p, o) for p in ("alice", "dave") for o in ("ord_1", "ord_2")]
    bundle.anchored_entities.clear()
    fresh = [lookup(bundle, "acme", p, o) for p in ("alice", "dave") for o in ("ord_1", "ord_2")]
    assert first == cached == fresh == [Decision.ALLOW] * 4


def test_static_principals_are_not_synthesized(bundle):
    lookup(bundle, "acme", "bob")  # bob is in entities.json
    [(tenant, uids, _reach)] = bundle.anchored_entities
    assert uids == (("Order", "ord_77"),)


def test_the_cache_is_bounded(bundle, monkeypatch):
    monkeypatch.setattr(engine, "MAX_ANCHORED", 3)
    for i in range(10):
        assert lookup(bundle, "acme", f"user{i}") is Decision.ALLOW
        assert len(bundle.anchored_entities) <= 3
