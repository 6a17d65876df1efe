"""GroupCommit, and the ledger's batched writes: batching must never change an answer."""

from __future__ import annotations

import threading

import pytest

from toolauthz.audit.store import AuditQuery
from toolauthz.errors import StoreUnavailable
from toolauthz.store.group_commit import GroupCommit, ItemFailed
from toolauthz.store.ledger import CallEntry, RecordedDecision, ReserveCall, Standing

WAIT = 30  # seconds; only reached if the code under test hangs


def in_threads(count: int, target, *, first_gate: threading.Event, group: GroupCommit):
    """Run target(i) on `count` threads; the first one's batch is held until the others
    are queued behind it, so they form the next batch together."""
    results: dict[int, object] = {}

    def run(i):
        try:
            results[i] = target(i)
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    threads[0].start()
    assert first_gate.wait(WAIT)
    for t in threads[1:]:
        t.start()
    return threads, results


class HeldBatches:
    """run_batch for GroupCommit: doubles numbers, fails on 'bad' items alone, fails the
    whole batch on 'boom', and holds the first batch until released."""

    def __init__(self):
        self.batches: list[list] = []
        self.entered, self.release = threading.Event(), threading.Event()

    def __call__(self, items):
        self.batches.append(list(items))
        if len(self.batches) == 1:
            self.entered.set()
            assert self.release.wait(WAIT)
        if "boom" in items:
            raise OSError("disk gone")
        return [ItemFailed(ValueError(f"bad item {i}")) if i == "bad" else i * 2 for i in items]


def test_one_failed_item_fails_only_its_caller():
    run = HeldBatches()
    group = GroupCommit(run)
    items = [1, 2, "bad", 4, 5]
    threads, results = in_threads(5, lambda i: group.submit(items[i]), first_gate=run.entered, group=group)
    assert group.wait_until_queued(4, WAIT)
    run.release.set()
    for t in threads:
        t.join(WAIT)
    assert run.batches == [[1], [2, "bad", 4, 5]]
    assert [results[i] for i in (0, 1, 3, 4)] == [2, 4, 8, 10]
    assert isinstance(results[2], ValueError) and str(results[2]) == "bad item bad"
    group.close()


def test_a_failed_batch_fails_every_caller_in_it_with_its_own_exception():
    run = HeldBatches()
    group = GroupCommit(run, name="test store")
    items = [1, 2, "boom", 4]
    threads, results = in_threads(4, lambda i: group.submit(items[i]), first_gate=run.entered, group=group)
    assert group.wait_until_queued(3, WAIT)
    run.release.set()
    for t in threads:
        t.join(WAIT)
    assert results[0] == 2  # the first batch was committed alone
    errors = [results[i] for i in (1, 2, 3)]
    assert all(isinstance(e, StoreUnavailable) and isinstance(e.__cause__, OSError) for e in errors)
    assert len({id(e) for e in errors}) == 3
    assert group.submit(7) == 14  # the group survives a failed batch
    group.close()
    with pytest.raises(StoreUnavailable, match="closed"):
        group.submit(1)


def test_submit_many_returns_each_result_or_its_exception_in_order_across_batches():
    """More items than a batch holds, queued behind another caller's batch and ahead of a
    third's: the caller leads again whenever its own item heads the queue."""
    run = HeldBatches()
    group = GroupCommit(run, max_batch=3)
    many: dict = {}
    first = threading.Thread(target=lambda: many.setdefault("first", group.submit(100)))
    first.start()
    assert run.entered.wait(WAIT)
    submitter = threading.Thread(target=lambda: many.setdefault("many", group.submit_many([1, "bad", 3, 4, 5])))
    submitter.start()
    assert group.wait_until_queued(5, WAIT)
    last = threading.Thread(target=lambda: many.setdefault("last", group.submit(6)))
    last.start()
    assert group.wait_until_queued(6, WAIT)
    run.release.set()
    for t in (first, submitter, last):
        t.join(WAIT)
    assert run.batches == [[100], [1, "bad", 3], [4, 5, 6]]
    results = many["many"]
    assert [results[i] for i in (0, 2, 3, 4)] == [2, 6, 8, 10] and isinstance(results[1], ValueError)
    assert many["first"] == 200 and many["last"] == 12
    assert group.submit_many([]) == []
    group.close()
    with pytest.raises(StoreUnavailable, match="closed"):
        group.submit_many([1])


def test_submit_many_of_a_failed_batch_gives_each_item_its_own_store_error():
    group = GroupCommit(lambda items: (_ for _ in ()).throw(OSError("disk gone")))
    errors = group.submit_many([1, 2, 3])
    assert all(isinstance(e, StoreUnavailable) and isinstance(e.__cause__, OSError) for e in errors)
    assert len({id(e) for e in errors}) == 3
    group.close()


def entry(call_id: str, request_id: str = "run-1", tool: str = "t") -> CallEntry:
    return CallEntry("acme", call_id, request_id, tool, "d" * 64, 'User::"a"', 0.0)


@pytest.fixture
def ledger(store):
    return store.ledger


def allow(decision_id: str) -> RecordedDecision:
    return RecordedDecision("ALLOW", decision_id, "v1")


def test_a_decision_is_recorded_only_on_the_counts_it_was_made_on(ledger):
    """Storage runs no policy: a reservation carries its decision as a value with the
    run's counts it was made on, and one whose counts moved writes nothing and says what
    they are now. Reservations of one batch see those ahead of them."""
    results = ledger.apply([
        ReserveCall(entry("c0", tool="u"), allow("d0"), Standing(0, 0)),
        ReserveCall(entry("c1"), allow("d1"), Standing(1, 0)),
        ReserveCall(entry("c2"), allow("d2"), Standing(1, 0)),  # made before c1 was recorded
        ReserveCall(entry("c1"), allow("d1-again"), Standing(2, 1)),  # a duplicate finds the first
        ReserveCall(entry("c3", request_id="run-2"), RecordedDecision("DENY", "d3", "v1"), Standing(0, 0)),
        ReserveCall(entry("c4", request_id="run-2"), allow("d4"), Standing(0, 0)),  # a denial takes no budget
    ])
    assert [r.moved for r in results] == [None, None, Standing(2, 1), None, None, None]
    assert ledger.get("acme", "c2") is None
    assert results[3].existing.decision_id == "d1"
    assert [ledger.get("acme", c).decision_id for c in ("c0", "c1", "c3", "c4")] == ["d0", "d1", "d3", "d4"]
    assert ledger.standing([entry("c9"), entry("c9", tool="u"), entry("c9", request_id="run-2")]) == \
        [Standing(2, 1), Standing(2, 1), Standing(1, 1)]


def test_reservations_batched_together_share_one_transaction(ledger):
    entered, release = threading.Event(), threading.Event()
    real = ledger._run_batch

    def held(ops):
        entered.set()
        assert release.wait(WAIT)
        return real(ops)

    ledger._writes._run_batch = held
    threads, results = in_threads(4, lambda i: ledger.reserve(entry(f"c{i}"), allow(f"d{i}"), Standing(0, 0)),
                                  first_gate=entered, group=ledger._writes)
    assert ledger._writes.wait_until_queued(3, WAIT)
    release.set()
    for t in threads:
        t.join(WAIT)
    moved = sorted((r.moved for r in results.values()), key=str)
    # The first alone, then the other three in one batch, decided on counts the first moved.
    assert moved == [None, Standing(1, 1), Standing(1, 1), Standing(1, 1)]


def test_concurrent_consumes_of_one_call_let_exactly_one_through(ledger):
    ledger.reserve(entry("c1"), allow("d1"))
    barrier = threading.Barrier(8)
    codes: list[str] = []

    def consume(i):
        barrier.wait(WAIT)
        codes.append(ledger.consume("acme", "c1", f"jti-{i % 2}", 1.0))

    threads = [threading.Thread(target=consume, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    assert sorted(codes) == ["already_used"] * 7 + ["ok"]


def test_apply_runs_mixed_operations_in_order_and_fails_misuse_alone(store):
    from toolauthz.audit.records import AuditEvent
    from toolauthz.store.ledger import AppendAudit, ConsumeToken

    event = AuditEvent(kind="verify", time=1.0, call_id="c1", result="bad_signature")
    results = store.ledger.apply([
        ReserveCall(entry("c1"), allow("d1"), Standing(0, 0)),
        ConsumeToken("acme", "c1", "jti-1", 2.0),
        "not an operation",
        ConsumeToken("acme", "c1", "jti-2", 3.0),
        AppendAudit(event),
    ])
    assert results[0].existing is None and results[1] == "ok" and results[3] == "already_used"
    assert isinstance(results[2], TypeError) and results[4] is None
    assert [r.event.result for r in store.audit_log.query(AuditQuery(), limit=10)] == ["bad_signature"]


def test_a_recorded_outcome_returns_the_row_as_stored(ledger):
    ledger.reserve(entry("c1"))
    returned = ledger.record_outcome("acme", "c1", "failed", "E_TIMEOUT", "ab" * 32, 12.5)
    assert returned == ledger.get("acme", "c1")
    assert (returned.outcome, returned.outcome_at, returned.extra) == (
        "failed", 12.5, {"error_code": "E_TIMEOUT", "output_digest": "ab" * 32})


def test_prune_removes_the_rows_of_ended_calls_in_batches_and_keeps_the_trail(store):
    from toolauthz.audit.records import AuditEvent

    ledger = store.ledger
    for i in range(5):
        ledger.reserve(entry(f"done{i}"), allow(f"d{i}"))
        assert ledger.consume("acme", f"done{i}", f"jti-{i}", 1.0) == "ok"
        ledger.record_outcome("acme", f"done{i}", "completed", "", "", 10.0 + i)
    ledger.reserve(entry("denied"), RecordedDecision("DENY", "dd", "v1"))
    ledger.reserve(entry("running"), allow("dr"))  # allowed, no outcome yet: kept
    ledger.reserve(entry("late"), allow("dl"))
    ledger.record_outcome("acme", "late", "completed", "", "", 99.0)  # ended after the date: kept
    store.audit_log.append([AuditEvent(kind="outcome", time=1.0, call_id="done0", result="completed")])
    assert store.prune(50.0, batch=2) == 6
    assert [c for c in ("done0", "done4", "denied", "running", "late") if ledger.get("acme", c)] == \
        ["running", "late"]
    assert store.audit_log.head()[0] == 1
    # The consumed token went with its call: the call id is new again, and its token too.
    ledger.reserve(entry("done0"), allow("again"))
    assert ledger.consume("acme", "done0", "jti-0", 2.0) == "ok"
    assert store.prune(50.0) == 0



def test_a_sqlite_transaction_reads_the_chains_heads_and_the_last_seq_in_one_statement(tmp_path):
    """The audit append's read under the write lock is one statement, however many
    records and chains a batch appends to; the records still chain and verify."""
    from toolauthz.audit.records import AuditEvent
    from toolauthz.audit.verify import verify_chain
    from toolauthz.store.ledger import AppendAudit
    from toolauthz.store.sqlite import SqliteStore

    with SqliteStore(str(tmp_path / "heads.db"), chains=4) as store:
        statements: list[str] = []
        store.unit._conn().set_trace_callback(statements.append)  # the batch runs on this thread
        events = [AuditEvent(kind="authorize", time=1.0, tenant=f"t{i}", call_id=f"c{i}", result="ALLOW")
                  for i in range(12)]
        store.ledger.apply([AppendAudit(event) for event in events])
        reads = [s for s in statements if s.lstrip().upper().startswith("SELECT") and "audit_" in s]
        assert len(reads) == 1, reads
        records = list(store.audit_log.iter_chains())
        assert sorted(r.seq for r in records) == list(range(1, 13)) and len({r.chain for r in records}) > 1
        assert verify_chain(records, [], [], heads=store.audit_log.heads()) == []
