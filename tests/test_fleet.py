"""Two sidecars (A and B) in this process on one PostgreSQL database and one keys
directory: single use, call-id reuse, run limits, approvals and the audit trail hold
across them. (Fleets of `toolauthz serve` processes: tests/test_fleet_processes.py.)"""

from __future__ import annotations

import json
import threading

import pytest
from conftest import order_entity, replicas_of

from toolauthz.audit import verify_chain
from toolauthz.model import Principal, ProposedCall, TrustedContext
from toolauthz.store.ledger import CallOwner

SMALL = b'{"order_id": "ord_1", "amount_cents": 1500}'
LARGE = b'{"order_id": "ord_1", "amount_cents": 6000}'
WAIT = 20.0


@pytest.fixture
def fleet(settings, clock, postgres_url):
    yield from replicas_of(settings, clock, postgres_url, 2)


def context(principal: str = "alice", run: str = "run-1") -> TrustedContext:
    return TrustedContext("acme", Principal("User", principal), run,
                          json.dumps([order_entity("ord_1", "alice")]).encode())


def call(call_id: str, arguments: bytes = SMALL) -> ProposedCall:
    return ProposedCall(call_id, "issue_refund", arguments)


def test_a_token_issued_by_one_replica_verifies_once_on_any(fleet):
    a, b = fleet
    result = a.authorizer.authorize(context(), call("c1"))
    assert result.token is not None
    codes: list[str] = []
    barrier = threading.Barrier(20)

    def verify(i: int) -> None:
        barrier.wait(WAIT)
        codes.append((a, b)[i % 2].authorizer.verify(result.token.token, context(), call("c1")).code)

    threads = [threading.Thread(target=verify, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    assert sorted(codes) == ["already_used"] * 19 + ["ok"]


def test_one_call_id_with_other_arguments_on_another_replica_is_refused(fleet):
    a, b = fleet
    first = a.authorizer.authorize(context(), call("c1", SMALL))
    second = b.authorizer.authorize(context(), call("c1", b'{"order_id": "ord_1", "amount_cents": 1400}'))
    assert first.decision.value == "ALLOW" and second.decision.value == "DENY"
    assert [e.code for e in second.errors] == ["call_id_reused"] and second.token is None


def test_a_run_limit_is_counted_across_replicas(fleet):
    a, b = fleet  # the example bundle allows five refunds per run
    results = [(a, b)[i % 2].authorizer.authorize(context(), call(f"c{i}")) for i in range(6)]
    assert [r.decision.value for r in results] == ["ALLOW"] * 5 + ["DENY"]
    assert [e.code for e in results[5].errors] == ["limit_exceeded"]


def test_a_decision_on_one_replica_wakes_a_watch_on_the_other(fleet):
    """LISTEN/NOTIFY, not polling: the only way A's desk hears of B's decision, which A's
    watches wait on (toolauthz/service/watching.py), is the notification."""
    a, b = fleet
    asked = a.authorizer.authorize(context(), call("c1", LARGE))
    assert asked.decision.value == "APPROVAL_REQUIRED"
    heard = threading.Event()

    class Listener:
        def changed(self, approval_id: str | None) -> None:
            if approval_id in (None, asked.approval_id):
                heard.set()

    listener = Listener()
    a.approvals.subscribe(listener)
    try:
        b.approvals.decide(asked.approval_id, TrustedContext("acme", Principal("User", "bob"), ""), "APPROVE", "ok")
        assert heard.wait(WAIT), "A's desk did not hear of B's decision"
    finally:
        a.approvals.unsubscribe(listener)
    requester = context()
    owner = CallOwner(requester.tenant, "", str(requester.principal), requester.request_id)  # the call's owner
    token = a.approvals.get(asked.approval_id, owner).token
    assert a.approvals.get(asked.approval_id, owner).status == "approved"
    assert b.authorizer.verify(token, context(), call("c1", LARGE)).code == "ok"


def test_every_replica_sees_every_record_of_one_chain(fleet):
    a, b = fleet
    for i in range(4):
        (a, b)[i % 2].authorizer.authorize(context(), call(f"c{i}"))
    records = list(a.audit_log.iter_records())
    # first the two replicas' start-up records (kind `bundle`), then the calls
    assert [(r.event.kind, r.event.call_id) for r in records] == [("bundle", ""), ("bundle", ""),
                                                                    *(("authorize", f"c{i}") for i in range(4))]
    assert list(b.audit_log.iter_records()) == records
    assert verify_chain(records, [], a.audit_key.public_key) == []
