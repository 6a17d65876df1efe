"""Group commit: every caller gets its own committed record, or StoreUnavailable."""

from __future__ import annotations

import threading

import pytest
from conftest import key_pair

from toolauthz.audit import AuditEvent, AuditQuery, verify_chain, verify_checkpoint
from toolauthz.clock import FrozenClock
from toolauthz.errors import StoreUnavailable
from toolauthz.store import SqliteAuditLog
from toolauthz.store.audit_writer import AuditWriter, Checkpointer

T0 = 1_800_000_000.0
THREADS = 16
WAIT = 30  # seconds; only reached if the code under test hangs


def event(i: int) -> AuditEvent:
    return AuditEvent(kind="authorize", time=T0 + i, call_id=f"c-{i}", tenant="acme",
                      principal='User::"alice"', tool="refund", result="ALLOW")


class GatedLog:
    """Wraps a log: counts appends, holds the first one until released, can fail them."""

    def __init__(self, log, *, fail_with: BaseException | None = None):
        self.log, self.fail_with = log, fail_with
        self.batches: list[int] = []
        self.first_entered, self.release = threading.Event(), threading.Event()

    def append(self, events):
        self.batches.append(len(events))
        if len(self.batches) == 1:
            self.first_entered.set()
            assert self.release.wait(WAIT)
        if self.fail_with is not None:
            raise self.fail_with
        return self.log.append(events)

    def __getattr__(self, name):
        return getattr(self.log, name)


@pytest.fixture
def log(tmp_path):
    log = SqliteAuditLog(tmp_path / "audit.db")
    yield log
    log.close()


def run_writers(writer: AuditWriter, gated: GatedLog, count: int = THREADS):
    """Start `count` writers; the first append is held until all others are queued, so
    they must be committed as one batch."""
    results: dict[int, object] = {}

    def write(i):
        try:
            results[i] = writer.write(event(i))
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            results[i] = exc

    threads = [threading.Thread(target=write, args=(i,)) for i in range(count)]
    threads[0].start()
    assert gated.first_entered.wait(WAIT)
    for t in threads[1:]:
        t.start()
    assert writer._group.wait_until_queued(count - 1, WAIT)  # no sleeping: woken by every enqueue
    gated.release.set()
    for t in threads:
        t.join(WAIT)
    return results


def test_concurrent_writes_are_batched_and_each_gets_its_own_record(log):
    gated = GatedLog(log)
    writer = AuditWriter(gated)
    results = run_writers(writer, gated)
    writer.close()

    assert gated.batches == [1, THREADS - 1]  # 16 writes, 2 transactions
    assert sorted(r.seq for r in results.values()) == list(range(1, THREADS + 1))
    for i, record in results.items():
        assert record.event == event(i)
        (stored,) = log.query(AuditQuery(call_id=f"c-{i}"), limit=2)
        assert stored == record
    assert verify_chain(log.iter_records(), [], key_pair()[1]) == []


@pytest.mark.parametrize("failure", [StoreUnavailable("disk full"), RuntimeError("bug")])
def test_failed_append_fails_every_waiting_writer(log, failure):
    gated = GatedLog(log, fail_with=failure)
    writer = AuditWriter(gated)
    results = run_writers(writer, gated)

    assert len(results) == THREADS
    assert all(isinstance(r, StoreUnavailable) for r in results.values())
    assert all(str(failure) in str(r) for r in results.values())
    assert log.head()[0] == 0  # nothing was written, and nothing reported as written
    gated.fail_with = None
    assert writer.write(event(99)).seq == 1  # the writer survives a failed batch
    writer.close()


def test_batches_are_capped(log):
    gated = GatedLog(log)
    writer = AuditWriter(gated, max_batch=5)
    results = run_writers(writer, gated, count=12)
    writer.close()
    assert gated.batches == [1, 5, 5, 1]
    assert sorted(r.seq for r in results.values()) == list(range(1, 13))


def test_close_commits_what_is_queued_then_refuses(log):
    gated = GatedLog(log)
    writer = AuditWriter(gated)
    first = threading.Thread(target=writer.write, args=(event(1),))
    first.start()
    assert gated.first_entered.wait(WAIT)
    second = threading.Thread(target=writer.write, args=(event(2),))
    second.start()
    assert writer._group.wait_until_queued(1, WAIT)
    closer = threading.Thread(target=writer.close)
    closer.start()
    gated.release.set()
    for t in (first, second, closer):
        t.join(WAIT)
    assert log.head()[0] == 2
    with pytest.raises(StoreUnavailable, match="closed"):
        writer.write(event(3))


def test_write_times_out_as_store_unavailable_and_is_never_committed(log):
    gated = GatedLog(log)
    writer = AuditWriter(gated)
    leader = threading.Thread(target=writer.write, args=(event(1),))
    leader.start()
    assert gated.first_entered.wait(WAIT)  # the first write is committing, and stuck
    with pytest.raises(StoreUnavailable, match="not done within"):
        writer.write(event(2), timeout=0.01)
    gated.release.set()
    leader.join(WAIT)
    writer.close()
    assert [r.event.call_id for r in log.iter_records()] == ["c-1"]  # the timed-out one is dropped


def test_one_writer_commits_on_its_own_thread(log):
    threads = []

    class ThreadRecordingLog:
        def append(self, events):
            threads.append(threading.get_ident())
            return log.append(events)

    writer = AuditWriter(ThreadRecordingLog())
    assert writer.write(event(1)).seq == 1
    assert threads == [threading.get_ident()]  # no hand-off to another thread
    writer.close()


class RecordingLog:
    def __init__(self, log):
        self.log, self.added = log, threading.Event()

    def add_checkpoint(self, token, checkpoint):
        self.log.add_checkpoint(token, checkpoint)
        self.added.set()

    def __getattr__(self, name):
        return getattr(self.log, name)


def test_checkpointer_signs_the_head_periodically_and_at_close(log):
    private, public = key_pair()
    recording = RecordingLog(log)
    writer = AuditWriter(log)
    writer.write(event(1))
    checkpointer = Checkpointer(recording, private, "audit-1", FrozenClock(T0), interval=0.01)
    assert recording.added.wait(WAIT)
    (periodic,) = log.checkpoints()
    assert verify_checkpoint(periodic.token, public, periodic.heads).count == 1

    writer.write(event(2))
    writer.close()
    checkpointer.close()  # signs the final head, unless the timer just did
    newest = log.checkpoints()[-1]
    assert (newest.count, newest.head_hash) == log.head()
    assert verify_checkpoint(newest.token, public, newest.heads) == newest
    assert checkpointer.checkpoint() is None  # nothing new to sign
    assert verify_chain(log.iter_records(), log.checkpoints(), public) == []
