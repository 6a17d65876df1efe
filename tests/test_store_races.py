"""Concurrent writers on one PostgreSQL database with no lock over the whole database:
two stores stand for two replicas. One row per call id, a run's limit, single use and
every audit chain hold through row-key locks and unique keys; transactions that share
no key or chain do not wait for each other; transactions that share keys in opposite
orders never deadlock."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from toolauthz.audit import AuditEvent, chain_of, verify_chain
from toolauthz.audit.records import DEFAULT_CHAINS
from toolauthz.store.ledger import CallEntry, ConsumeToken, RecordedDecision, ReserveCall, Standing
from toolauthz.store.open import open_store
from toolauthz.store.rules import lock_keys

T0 = 1_800_000_000.0
WAIT = 60.0  # a bound on liveness only: a waiter that never wakes fails rather than hangs


@pytest.fixture
def replicas(postgres_url):
    from toolauthz.store.postgres import migrate

    migrate(postgres_url)
    stores = [open_store(postgres_url, pool_size=4) for _ in range(2)]
    yield stores
    for store in stores:
        store.close()


def entry(call_id: str, run: str = "run-1", tenant: str = "acme") -> CallEntry:
    return CallEntry(tenant, call_id, run, "issue_refund", "ab" * 32, 'User::"alice"', T0)


def allowed(call_id: str, tenant: str = "acme") -> RecordedDecision:
    event = AuditEvent(kind="authorize", time=T0, call_id=call_id, tenant=tenant, result="ALLOW")
    return RecordedDecision("ALLOW", f"d-{call_id}", "v1", audit=event)


def together(count: int, work) -> list:
    """`work(i)` on `count` threads released at once."""
    start = threading.Barrier(count)

    def run(i: int):
        start.wait(WAIT)
        return work(i)

    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(run, range(count), timeout=WAIT))


def test_one_call_id_reserved_on_two_replicas_at_once_is_written_once(replicas):
    for round_ in range(20):
        call_id = f"same-{round_}"
        results = together(2, lambda i, c=call_id: replicas[i].ledger.reserve(entry(c), allowed(c)))
        assert sorted(r.existing is None for r in results) == [False, True]  # one wrote, one found it
    for store in replicas:
        assert store.ledger.get("acme", "same-0") is not None


def test_a_run_limit_decided_on_two_replicas_at_once_admits_one_call(replicas):
    """Each replica decided its call on the run's counts (0, 0) (a limit of one call per
    run): only one reservation may commit on them; the other is told the counts moved."""
    for round_ in range(20):
        run = f"run-{round_}"
        results = together(4, lambda i, run=run: replicas[i % 2].ledger.reserve(
            entry(f"{run}-c{i}", run), allowed(f"{run}-c{i}"), standing=Standing(0, 0)))
        assert sum(r.existing is None and r.moved is None for r in results) == 1
        assert [r.moved for r in results if r.moved is not None] == [Standing(1, 1)] * 3
        assert replicas[0].ledger.standing([entry("x", run)]) == [Standing(1, 1)]


def test_a_token_presented_to_two_replicas_at_once_is_consumed_once(replicas):
    for round_ in range(20):
        call_id = f"tok-{round_}"
        replicas[0].ledger.reserve(entry(call_id), allowed(call_id))
        codes = together(2, lambda i, c=call_id, jti=f"jti-{round_}": replicas[i].ledger.consume(
            "acme", c, jti, T0 + 1))
        assert sorted(codes) == ["already_used", "ok"]
        # Another token of the same call, after: one execution per call.
        assert replicas[1].ledger.consume("acme", call_id, f"jti-{round_}-b", T0 + 2) == "already_used"


def test_batches_sharing_keys_in_opposite_orders_never_deadlock(replicas):
    """Each replica writes the same calls and runs, in the reverse order of the other's,
    many times: with keys taken in one order, neither waits for the other in a cycle
    (PostgreSQL would abort one with a deadlock: a StoreUnavailable here)."""
    calls = [f"k{i}" for i in range(8)]
    for round_ in range(15):
        def batch(i: int, round_: int = round_) -> list:
            order = calls if i == 0 else list(reversed(calls))
            ops = [ReserveCall(entry(f"{c}-{round_}", f"run-{c}"), allowed(f"{c}-{round_}")) for c in order]
            ops += [ConsumeToken("acme", f"{c}-{round_}", f"j-{c}-{round_}-{i}", T0) for c in order]
            return replicas[i].ledger.apply(ops)

        results = together(2, batch)
        for answers in results:
            assert not any(isinstance(a, BaseException) for a in answers), answers
        codes = [a for answers in results for a in answers if isinstance(a, str)]
        assert sorted(codes) == ["already_used"] * len(calls) + ["ok"] * len(calls)
    heads = replicas[0].audit_log.heads()
    assert verify_chain(replicas[1].audit_log.iter_chains(), [], None, heads=heads) == []


def test_writers_of_other_keys_and_chains_do_not_wait_for_an_open_transaction(replicas):
    """Replica A holds a transaction open after taking its keys and appending to its
    chain: replica B reserves another call, whose record goes to another chain, and
    commits meanwhile. (With a lock over the database, B would wait for A.)"""
    mine = "held"
    other = next(f"free-{i}" for i in range(100)
                 if chain_of(allowed(f"free-{i}").audit, DEFAULT_CHAINS) !=  # type: ignore[arg-type]
                 chain_of(allowed(mine).audit, DEFAULT_CHAINS))  # type: ignore[arg-type]
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with replicas[0].unit.transaction() as tx:
            op = ReserveCall(entry(mine, "run-a"), allowed(mine))
            tx.lock(lock_keys([op]))
            tx.insert_call(op.entry, op.decision)  # type: ignore[arg-type]
            tx.append_audit([op.decision.audit])  # type: ignore[union-attr, list-item]
            tx.flush_audit()  # its chain's head is locked now, until the commit
            holding.set()
            assert release.wait(WAIT)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert holding.wait(WAIT)
        done = []
        writer = threading.Thread(target=lambda: done.append(
            replicas[1].ledger.reserve(entry(other, "run-b"), allowed(other))))
        writer.start()
        writer.join(WAIT)
        assert done and done[0].existing is None  # committed while A still holds its transaction
        assert replicas[1].ledger.get("acme", mine) is None  # A has not committed
    finally:
        release.set()
        holder.join(WAIT)
    assert replicas[1].ledger.get("acme", mine) is not None


def test_concurrent_appends_from_two_replicas_leave_every_chain_intact(replicas):
    def write(i: int) -> None:
        for n in range(40):
            replicas[i % 2].audit_log.append([AuditEvent(kind="authorize", time=T0, tenant=f"t{n % 3}",
                                                         call_id=f"w{i}-{n}", result="ALLOW")])

    together(4, write)
    heads = replicas[0].audit_log.heads()
    assert sum(h.seq for h in heads) == 160
    assert verify_chain(replicas[1].audit_log.iter_chains(), [], None, heads=heads) == []
    seqs = sorted(r.seq for r in replicas[0].audit_log.iter_records())
    assert len(set(seqs)) == 160
    for head in heads:  # along a chain, the log's cursor increases too
        chain = [r for r in replicas[0].audit_log.iter_chains() if r.chain == head.chain]
        assert [r.seq for r in chain] == sorted(r.seq for r in chain)
