"""GroupCommit, and the ledger's batched writes: batching must never change an answer."""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from sidecar.audit.store import AuditQuery
from sidecar.errors import StoreUnavailable
from sidecar.store import SqliteLedger
from sidecar.store.group_commit import GroupCommit, ItemFailed
from sidecar.store.ledger import CallEntry, RecordedDecision

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
def ledger(tmp_path):
    ledger = SqliteLedger(str(tmp_path / "ledger.db"))
    yield ledger
    ledger.close()


def test_calls_of_one_run_batched_together_see_each_other(ledger):
    """Loop limits depend on it: each call of a run is decided after counting the ones
    reserved before it, also inside one batch."""
    entered, release = threading.Event(), threading.Event()
    seen: dict[str, tuple[int, int]] = {}
    asked: Counter = Counter()

    def decide_for(call_id):
        def decide(calls, tool_calls):
            asked[call_id, calls, tool_calls] += 1
            seen[call_id] = (calls, tool_calls)
            if call_id == "c0#0":
                entered.set()
                assert release.wait(WAIT)
            if call_id == "c3#3":
                raise RuntimeError("this call's own failure")
            return RecordedDecision("ALLOW", f"d-{call_id}", "v1")
        return decide

    def reserve(i):
        call_id = "c1" if i == 5 else f"c{i}"  # a duplicate of c1 in the same batch
        return ledger.reserve(entry(call_id, tool="t" if i % 2 else "u"), decide_for(f"{call_id}#{i}"))

    threads, results = in_threads(6, reserve, first_gate=entered, group=ledger._writes)
    assert ledger._writes.wait_until_queued(5, WAIT)
    release.set()
    for t in threads:
        t.join(WAIT)
    decided = {key.split("#")[0]: count for key, (count, _tools) in seen.items() if not key.startswith("c3")}
    # Each stored call counted the ones stored before it, whatever the order in the batch;
    # c3 failed alone and is neither stored nor counted by later calls.
    assert sorted(decided.values()) == [0, 1, 2, 3] and set(decided) == {"c0", "c1", "c2", "c4"}
    assert isinstance(results[3], RuntimeError) and ledger.get("acme", "c3") is None
    first, duplicate = sorted((results[1], results[5]), key=lambda r: r.existing is not None)
    assert first.existing is None and duplicate.existing.decision_id == ledger.get("acme", "c1").decision_id
    assert len([key for key in seen if key.startswith("c1")]) == 1  # the duplicate was never decided
    # Drafted before the transaction on predicted counts (those in the table plus the
    # calls ahead in the batch), asked again in it with the same counts: Cedar would
    # run once per call.
    assert {n for (key, *_), n in asked.items() if not key.startswith("c3")} == {2}
    for i in (0, 2, 4):
        assert results[i].existing is None and ledger.get("acme", f"c{i}").decision == "ALLOW"


def test_concurrent_consumes_of_one_call_let_exactly_one_through(ledger):
    ledger.reserve(entry("c1"), lambda calls, tool_calls: RecordedDecision("ALLOW", "d1", "v1"))
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


def test_apply_runs_mixed_operations_in_order_and_fails_misuse_alone(tmp_path):
    from sidecar.audit.records import AuditEvent
    from sidecar.audit.sqlite import SqliteAuditLog
    from sidecar.store.ledger import AppendAudit, ConsumeToken, ReserveCall

    path = str(tmp_path / "one.db")
    audit = SqliteAuditLog(path)
    ledger = SqliteLedger(path, audit=audit)
    bare = SqliteLedger(str(tmp_path / "bare.db"))  # no audit log: audited operations fail alone
    event = AuditEvent(kind="verify", time=1.0, call_id="c1", result="bad_signature")
    try:
        results = ledger.apply([
            ReserveCall(entry("c1"), lambda calls, tool_calls: RecordedDecision("ALLOW", "d1", "v1")),
            ConsumeToken("acme", "c1", "jti-1", 2.0),
            "not an operation",
            ConsumeToken("acme", "c1", "jti-2", 3.0),
            AppendAudit(event),
        ])
        assert results[0].existing is None and results[1] == "ok" and results[3] == "already_used"
        assert isinstance(results[2], TypeError) and results[4] is None
        assert [r.event.result for r in audit.query(AuditQuery(), limit=10)] == ["bad_signature"]
        bare_results = bare.apply([AppendAudit(event), ReserveCall(entry("c2"))])
        assert isinstance(bare_results[0], RuntimeError) and bare_results[1].existing is None
    finally:
        ledger.close()
        audit.close()
        bare.close()


def test_a_recorded_outcome_returns_the_row_as_stored(ledger):
    ledger.reserve(entry("c1"))
    returned = ledger.record_outcome("acme", "c1", "failed", "E_TIMEOUT", "ab" * 32, 12.5)
    assert returned == ledger.get("acme", "c1")
    assert (returned.outcome, returned.outcome_at, returned.extra) == (
        "failed", 12.5, {"error_code": "E_TIMEOUT", "output_digest": "ab" * 32})
