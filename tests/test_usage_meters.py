"""Usage meters (`usage:` in a tool file, `context.usage` in policies): what a call
charges, who it charges, for how long, what gives a share back, and that a budget is
never overspent, on one sidecar of each store and on a fleet of three on PostgreSQL."""

from __future__ import annotations

import json
import threading

import pytest
from conftest import replicas_of

from toolauthz.audit.store import AuditQuery
from toolauthz.bundle import load_bundle
from toolauthz.errors import BundleError
from toolauthz.model import Principal, ProposedCall, TrustedContext
from toolauthz.store.ledger import Standing
from toolauthz.store.usage_rows import APPROVAL_HOLD_GRACE
from toolauthz.usage.charges import CEILING

BUDGET = 50_000
WAIT = 30.0

SPEND_TOOL = {
    "name": "spend",
    "description": "Spend from a shared budget.",
    "side_effect": "purchase",
    "input_schema": {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": {"amount": {"type": "integer", "minimum": 0},
                       "vendor": {"type": "string", "pattern": "^[a-z]{1,16}$"}},
        "required": ["amount", "vendor"],
        "additionalProperties": False,
    },
    "usage": {
        "spent_24h": {"sum": "/amount", "per": ["principal"], "window": "24h"},
        "vendor_calls_1h": {"count": True, "per": ["principal", "/vendor"], "window": "1h"},
    },
}
# alice spends directly, carol with finance's approval; both within the budget only.
SPEND_POLICIES = f"""
@id("spend-within-budget")
permit (principal == User::"alice", action == Action::"tool:spend", resource)
when {{ context.usage.spent_24h + context.input.amount <= {BUDGET} }};

@id("spend-with-approval")
@approval("finance")
permit (principal == User::"carol", action == Action::"tool:spend", resource)
when {{ context.usage.spent_24h + context.input.amount <= {BUDGET} }};

@id("finance-approves-spending")
permit (principal in Group::"finance", action == Action::"approve", resource is Approval)
when {{ resource.group == "finance" && resource.tool == "spend" }};

@id("at-most-three-calls-per-vendor-an-hour")
forbid (principal, action == Action::"tool:spend", resource)
when {{ context.usage.vendor_calls_1h >= 3 }};
"""


@pytest.fixture
def bundle_dir(bundle_dir):
    (bundle_dir / "tools" / "spend.json").write_text(json.dumps(SPEND_TOOL))
    (bundle_dir / "spend.cedar").write_text(SPEND_POLICIES)
    return bundle_dir


def ctx(principal: str = "alice", tenant: str = "acme", run: str = "run-1") -> TrustedContext:
    return TrustedContext(tenant, Principal("User", principal), run)


def spend(call_id: str, amount: int, vendor: str = "acme") -> ProposedCall:
    return ProposedCall(call_id, "spend", json.dumps({"amount": amount, "vendor": vendor}).encode())


def codes(result) -> list[str]:
    return [e.code for e in result.errors]


# -- the tool file --

def problems_of(bundle_dir) -> list[str]:
    with pytest.raises(BundleError) as info:
        load_bundle(bundle_dir)
    return [str(p) for p in info.value.problems]


def tool_problems(bundle_dir, usage) -> list[str]:
    (bundle_dir / "tools" / "spend.json").write_text(json.dumps({**SPEND_TOOL, "usage": usage}))
    (bundle_dir / "spend.cedar").write_text('permit (principal, action == Action::"tool:spend", resource);')
    return problems_of(bundle_dir)


@pytest.mark.parametrize("usage, message", [
    ({"m": {"sum": "/vendor", "per": ["principal"], "window": "1h"}}, "must be an integer property"),
    ({"m": {"sum": "/nope", "per": ["principal"], "window": "1h"}}, "cannot produce `/nope`"),
    ({"m": {"count": True, "per": ["principal"], "window": "forever"}}, "window must be a duration"),
    ({"m": {"count": True, "per": ["principal"], "window": "91d"}}, "at most 90d"),
    ({"m": {"count": True, "sum": "/amount", "per": ["principal"], "window": "1h"}}, "exactly one of"),
    ({"m": {"count": True, "per": [], "window": "1h"}}, "per must be a non-empty list"),
    ({"m": {"count": True, "per": ["everyone"], "window": "1h"}}, "is not `principal`"),
    ({"m": {"count": True, "per": ["principal", "principal"], "window": "1h"}}, "names each key once"),
    ({"m": {"count": True, "per": ["principal"], "window": "1h", "fixed": True}}, "unknown meter field"),
    ({"Bad-Name": {"count": True, "per": ["principal"], "window": "1h"}}, "a meter name must match"),
    ({f"m{i}": {"count": True, "per": ["principal"], "window": "1h"} for i in range(9)}, "at most 8 meters"),
])
def test_a_meter_the_loader_cannot_trust_is_refused(bundle_dir, usage, message):
    assert any(message in p for p in tool_problems(bundle_dir, usage)), tool_problems(bundle_dir, usage)


def test_a_summed_argument_must_be_kept_non_negative_by_the_schema(bundle_dir):
    """A negative charge would refund the budget: the schema must forbid one."""
    tool = json.loads(json.dumps(SPEND_TOOL))
    del tool["input_schema"]["properties"]["amount"]["minimum"]
    (bundle_dir / "tools" / "spend.json").write_text(json.dumps(tool))
    assert any("must declare `minimum: 0`" in p for p in problems_of(bundle_dir))


def test_a_meter_key_from_an_unpinned_argument_is_refused(bundle_dir):
    """A model that could choose any key would open a fresh budget per call."""
    tool = json.loads(json.dumps(SPEND_TOOL))
    del tool["input_schema"]["properties"]["vendor"]["pattern"]
    (bundle_dir / "tools" / "spend.json").write_text(json.dumps(tool))
    assert any("/usage/vendor_calls_1h/per/1" in p and "without a `pattern`" in p for p in problems_of(bundle_dir))


def test_context_usage_is_typed_per_tool(bundle_dir):
    """A policy reading a meter its tool does not have fails validation at load time."""
    (bundle_dir / "spend.cedar").write_text(SPEND_POLICIES + """
@id("reads-another-tools-meter")
forbid (principal, action == Action::"tool:spend", resource) when { context.usage.refund_cents_24h > 0 };
""")
    assert any("refund_cents_24h" in p for p in problems_of(bundle_dir))
    (bundle_dir / "spend.cedar").write_text(SPEND_POLICIES)
    bundle = load_bundle(bundle_dir)
    assert '"spent_24h": Long' in bundle.schema_text


# -- one sidecar --

@pytest.mark.both_stores
def test_allowed_calls_consume_denied_ones_do_not_and_the_audit_shows_what_was_seen(sidecar):
    auth = sidecar.authorizer
    assert auth.authorize(ctx(), spend("c1", 30_000)).decision.value == "ALLOW"
    assert auth.authorize(ctx(), spend("c2", 30_000, "bcme")).decision.value == "DENY"  # 60,000 > budget
    third = auth.authorize(ctx(), spend("c3", 20_000, "ccme"))  # the denial took nothing
    assert third.decision.value == "ALLOW"
    assert auth.authorize(ctx(), spend("c4", 1, "dcme")).decision.value == "DENY"
    [record] = sidecar.audit_log.query(AuditQuery(call_id="c3"), limit=5)
    assert record.event.detail["usage"] == {"spent_24h": 30_000, "vendor_calls_1h": 0}
    [record] = sidecar.audit_log.query(AuditQuery(call_id="c4"), limit=5)
    assert record.event.detail["usage"]["spent_24h"] == BUDGET


@pytest.mark.both_stores
def test_one_authorize_batch_of_calls_on_one_meter_never_overspends(sidecar):
    """An attacker's model turn: eight parallel calls in one AuthorizeBatch, 140,000
    asked against 50,000 left, and one more call on the same meter. The batch's calls
    share one transaction, each decided on what the calls ahead of it took: exactly the
    first two fit, asking again replays the same answers and charges nothing more, and
    the meter is left at what was allowed."""
    from toolauthz.batch import DEFAULT_LIMITS, BatchCall, plan_batch

    auth = sidecar.authorizer
    amounts = [20_000] * 4 + [15_000] * 4
    calls = [BatchCall(spend(f"b{i}", amount, f"v{chr(ord('a') + i)}")) for i, amount in enumerate(amounts)]
    first = auth.run_many(plan_batch(auth, ctx(), calls, DEFAULT_LIMITS))
    assert [r.decision.value for r in first] == ["ALLOW", "ALLOW"] + ["DENY"] * 6
    assert all(r.token for r in first[:2]) and not any(r.token for r in first[2:])
    again = auth.run_many(plan_batch(auth, ctx(), calls, DEFAULT_LIMITS))
    assert [r.decision_id for r in again] == [r.decision_id for r in first] and all(r.replayed for r in again)
    assert auth.authorize(ctx(), spend("after", BUDGET - 40_000, "zz")).decision.value == "ALLOW"
    assert auth.authorize(ctx(), spend("over", 1, "zy")).decision.value == "DENY"


@pytest.mark.both_stores
def test_meters_are_kept_per_principal_tenant_and_pinned_argument(sidecar):
    auth = sidecar.authorizer
    assert auth.authorize(ctx(), spend("c1", BUDGET)).decision.value == "ALLOW"
    assert auth.authorize(ctx(), spend("c2", 1)).decision.value == "DENY"
    # Another tenant's alice has a budget of her own; so would another principal.
    assert auth.authorize(ctx(tenant="globex"), spend("c1", BUDGET)).decision.value == "ALLOW"
    for i in range(3):  # the count meter: three calls a vendor an hour, then the forbid
        assert auth.authorize(ctx(tenant="initech"), spend(f"v{i}", 1, "shop")).decision.value == "ALLOW"
    fourth = auth.authorize(ctx(tenant="initech"), spend("v3", 1, "shop"))
    assert fourth.decision.value == "DENY" and fourth.reasons == ("at-most-three-calls-per-vendor-an-hour",)
    assert auth.authorize(ctx(tenant="initech"), spend("v4", 1, "other")).decision.value == "ALLOW"


@pytest.mark.both_stores
def test_the_window_slides(sidecar, clock):
    auth = sidecar.authorizer
    assert auth.authorize(ctx(), spend("c1", 40_000)).decision.value == "ALLOW"
    clock.advance(12 * 3600)
    assert auth.authorize(ctx(), spend("c2", 10_000, "bcme")).decision.value == "ALLOW"
    clock.advance(12 * 3600 - 1)  # c1 is 24 h - 1 s old: still counted
    assert auth.authorize(ctx(), spend("c3", 1, "ccme")).decision.value == "DENY"
    clock.advance(1)  # c1 has left the window, c2 has not
    assert auth.authorize(ctx(), spend("c4", 40_000, "dcme")).decision.value == "ALLOW"
    assert auth.authorize(ctx(), spend("c5", 1, "ecme")).decision.value == "DENY"


@pytest.mark.both_stores
def test_a_pending_approval_holds_its_share_and_a_rejection_gives_it_back(sidecar):
    auth, desk = sidecar.authorizer, sidecar.approvals
    bob = TrustedContext("acme", Principal("User", "bob"), "")
    first = auth.authorize(ctx("carol"), spend("c1", 30_000))
    assert first.decision.value == "APPROVAL_REQUIRED"
    # While it waits, its 30,000 count: a second of 30,000 is over the budget.
    assert auth.authorize(ctx("carol"), spend("c2", 30_000, "bcme")).decision.value == "DENY"
    desk.decide(first.approval_id, bob, "REJECT", "no")
    again = auth.authorize(ctx("carol"), spend("c3", 30_000, "ccme"))
    assert again.decision.value == "APPROVAL_REQUIRED"
    desk.decide(again.approval_id, bob, "APPROVE", "ok")
    assert auth.authorize(ctx("carol"), spend("c4", 30_000, "dcme")).decision.value == "DENY"
    assert auth.authorize(ctx("carol"), spend("c5", 20_000, "ecme")).decision.value == "APPROVAL_REQUIRED"


@pytest.mark.both_stores
def test_an_expired_approval_gives_its_share_back_after_the_grace(sidecar, clock):
    auth = sidecar.authorizer
    first = auth.authorize(ctx("carol"), spend("c1", 30_000))
    assert first.decision.value == "APPROVAL_REQUIRED"
    clock.set(first.approval_expires_at + APPROVAL_HOLD_GRACE)  # still held: clocks differ
    assert auth.authorize(ctx("carol"), spend("c2", 30_000, "bcme")).decision.value == "DENY"
    clock.advance(1)
    assert auth.authorize(ctx("carol"), spend("c3", 30_000, "ccme")).decision.value == "APPROVAL_REQUIRED"


@pytest.mark.both_stores
def test_a_call_cancelled_before_it_ran_gives_its_share_back(sidecar):
    auth = sidecar.authorizer
    first = auth.authorize(ctx(), spend("c1", BUDGET))
    assert first.decision.value == "ALLOW"
    auth.report_outcome(ctx(), "c1", "cancelled")
    assert auth.verify(first.token.token, ctx(), spend("c1", BUDGET)).code == "call_closed"
    second = auth.authorize(ctx(), spend("c2", BUDGET, "bcme"))
    assert second.decision.value == "ALLOW"
    # One that ran and then failed keeps its share: the side effect may have happened.
    assert auth.verify(second.token.token, ctx(), spend("c2", BUDGET, "bcme")).code == "ok"
    auth.report_outcome(ctx(), "c2", "failed", "E")
    assert auth.authorize(ctx(), spend("c4", 1, "dcme")).decision.value == "DENY"


@pytest.mark.both_stores
def test_a_decision_made_on_a_meter_that_moved_is_made_again(sidecar, monkeypatch):
    """Cedar runs before the ledger's transaction, on the meters as read then; a charge
    recorded in between must not let the stale draft through."""
    auth = sidecar.authorizer
    assert auth.authorize(ctx(), spend("c1", 40_000)).decision.value == "ALLOW"
    monkeypatch.setattr(sidecar.ledger, "standing",
                        lambda entries: [Standing(0, 0, tuple(0 for _ in e.charges)) for e in entries])
    stale = auth.authorize(ctx(), spend("c2", 20_000, "bcme"))
    assert stale.decision.value == "DENY" and stale.token is None
    [record] = sidecar.audit_log.query(AuditQuery(call_id="c2"), limit=5)
    assert record.event.result == "DENY" and record.event.detail["usage"]["spent_24h"] == 40_000


def test_an_amount_past_the_ceiling_is_invalid_input(sidecar):
    result = sidecar.authorizer.authorize(ctx(), spend("c1", CEILING + 1))
    assert result.decision.value == "DENY" and codes(result) == ["invalid_input"] and result.token is None


def test_a_meter_at_its_ceiling_saturates_and_denies(bundle_dir):
    """Even a policy that would permit anything never sees a sum past the ceiling."""
    from toolauthz.engine import decide

    (bundle_dir / "spend.cedar").write_text('permit (principal, action == Action::"tool:spend", resource);')
    bundle = load_bundle(bundle_dir)
    assert decide(bundle, ctx(), spend("c1", 1), usage={"spent_24h": CEILING - 1}).decision.value == "ALLOW"
    over = decide(bundle, ctx(), spend("c1", 2), usage={"spent_24h": CEILING - 1})
    assert over.decision.value == "DENY" and [e.code for e in over.errors] == ["usage_overflow"]


# -- a fleet of three on one PostgreSQL --

@pytest.fixture
def fleet(settings, clock, postgres_url):
    yield from replicas_of(settings, clock, postgres_url, 3)


def all_at_once(fleet, principal: str, amounts: list[int], wave: int) -> list:
    """Each amount asked at once, spread over the replicas; the results in order."""
    results: list = [None] * len(amounts)
    barrier = threading.Barrier(len(amounts))

    def ask(i: int) -> None:
        barrier.wait(WAIT)
        results[i] = fleet[i % len(fleet)].authorizer.authorize(
            ctx(principal, run=f"run-{wave}-{i}"),
            spend(f"w{wave}-c{i}", amounts[i], vendor=chr(97 + wave % 26) + chr(97 + i % 26)))

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(amounts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    assert all(r is not None for r in results)
    return results


def test_no_overspend_with_32_concurrent_calls_on_three_replicas(fleet, clock):
    """Waves of 32 calls at once, each worth 40% of what is left of the budget: without
    the meter's lock and the decision made again, every replica would see the same
    remainder and allow several; with them the allowed sum never passes the budget."""
    spent, waves = 0, 0
    while BUDGET - spent >= 3 and waves < 8:
        amount = (BUDGET - spent) * 4 // 10
        results = all_at_once(fleet, "alice", [amount] * 32, waves)
        allowed = [r for r in results if r.decision.value == "ALLOW"]
        # As many as fit in what is left (2 x 40%, a third never), and no fewer.
        assert len(allowed) == min(32, (BUDGET - spent) // amount)
        assert all(r.decision.value in ("ALLOW", "DENY") and (r.token is None) == (r.decision.value == "DENY")
                   for r in results)
        spent += amount * len(allowed)
        assert spent <= BUDGET
        waves += 1
    assert waves >= 5
    ledger_value = fleet[0].ledger.standing([_entry_of(fleet[0], "alice", clock.now())])[0].usage[0]
    assert ledger_value == spent


def test_no_overspend_with_approvals_pending_then_approved(fleet):
    bob = TrustedContext("acme", Principal("User", "bob"), "")
    approved, waves = 0, 0
    while BUDGET - approved >= 3 and waves < 6:
        amount = (BUDGET - approved) * 4 // 10
        results = all_at_once(fleet, "carol", [amount] * 32, waves)
        pending = [r for r in results if r.decision.value == "APPROVAL_REQUIRED"]
        assert len(pending) == min(32, (BUDGET - approved) // amount) and all(r.token is None for r in results)
        for i, r in enumerate(pending):  # approved on any replica
            fleet[i % 3].approvals.decide(r.approval_id, bob, "APPROVE", "ok")
        approved += amount * len(pending)
        assert approved <= BUDGET
        waves += 1
    assert waves >= 4


def _entry_of(car, principal: str, now: float):
    """A probe entry charging alice's spend meters (never written)."""
    from toolauthz.engine import prepare
    from toolauthz.store.ledger import CallEntry

    prepared = prepare(car.bundles.current, ctx(principal), spend("probe", 0))
    return CallEntry("acme", "probe", "probe", "spend", prepared.digest, f'User::"{principal}"',
                     now, charges=prepared.charges[:1])


@pytest.mark.both_stores
def test_pruning_the_ledger_never_refunds_a_budget(sidecar, clock):
    """`store prune` removes ended calls' rows; their charges stay until no window (at
    most 90 days) could count them, and a pruned call id used again charges beside them."""
    auth = sidecar.authorizer
    first = auth.authorize(ctx(), spend("c1", 30_000))
    assert auth.verify(first.token.token, ctx(), spend("c1", 30_000)).code == "ok"
    auth.report_outcome(ctx(), "c1", "completed")
    clock.advance(60)
    assert sidecar.store.prune(clock.now()) == 1 and sidecar.ledger.get("acme", "c1") is None
    again = auth.authorize(ctx(), spend("c1", 20_000))  # the id is new again: a new call
    assert again.decision.value == "ALLOW" and not again.replayed
    assert auth.authorize(ctx(), spend("c2", 1, "bcme")).decision.value == "DENY"  # 50,000 spent
    clock.advance(86_400)  # both left the 24 h window; their rows are still there
    assert auth.authorize(ctx(), spend("c3", BUDGET, "ccme")).decision.value == "ALLOW"
    assert charge_rows(sidecar) == 3
    sidecar.store.prune(clock.now() + 30 * 86_400)  # c1's charges could still be in a 90-day window
    assert charge_rows(sidecar) == 3
    sidecar.store.prune(clock.now() + 91 * 86_400)  # now every charge is older than any window
    assert charge_rows(sidecar) == 0
    clock.advance(91 * 86_400)
    assert auth.authorize(ctx(), spend("c4", BUDGET, "dcme")).decision.value == "ALLOW"


def charge_rows(car) -> int:
    with car.store.unit.reading() as reads:
        return int(reads._rows("SELECT count(*) FROM usage_charges WHERE meter = 'spent_24h'", ())[0][0])
