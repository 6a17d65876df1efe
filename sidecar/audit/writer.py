"""Background threads in front of an AuditLog: group commit, and periodic checkpoints.

Every decision waits for its audit record to be durable before the response leaves the
process. One transaction (and one fsync) per decision would cap throughput at the disk's
fsync rate, so a single writer thread commits whatever is queued as one `append` and then
wakes each caller with its own record, or with StoreUnavailable for the whole batch.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from typing import Any

from sidecar.audit.checkpoint import Checkpoint, sign_checkpoint
from sidecar.audit.records import AuditEvent, AuditRecord
from sidecar.audit.store import AuditLog
from sidecar.clock import Clock
from sidecar.errors import StoreUnavailable

log = logging.getLogger(__name__)


class _Pending:
    __slots__ = ("event", "done", "record", "error")

    def __init__(self, event: AuditEvent):
        self.event = event
        self.done = threading.Event()
        self.record: AuditRecord | None = None
        self.error: BaseException | None = None

    def settle(self, record: AuditRecord | None, error: BaseException | None) -> None:
        self.record, self.error = record, error
        self.done.set()


class AuditWriter:
    """Owns a thread, not the log: close the writer first, then the log."""

    def __init__(self, log: AuditLog, *, max_batch: int = 256):
        self._log = log
        self._max_batch = max_batch
        self._queue: deque[_Pending] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="audit-writer", daemon=True)
        self._thread.start()

    def write(self, event: AuditEvent, timeout: float | None = None) -> AuditRecord:
        """Block until `event` is committed; raise StoreUnavailable if it was not. After a
        timeout the record may still be committed later: the log may then show a decision
        that was denied for want of its record, never a decision without one."""
        if not isinstance(event, AuditEvent):  # one bad item must not fail a batch
            raise TypeError("audit writer takes an AuditEvent")
        pending = _Pending(event)
        with self._cond:
            if self._closed:
                raise StoreUnavailable("audit writer is closed")
            self._queue.append(pending)
            self._cond.notify_all()
        if not pending.done.wait(timeout):
            raise StoreUnavailable(f"audit record not committed within {timeout}s")
        if pending.error is not None:
            # A new exception per caller: one instance raised in many threads would
            # share (and garble) a traceback.
            raise StoreUnavailable(str(pending.error)) from pending.error
        assert pending.record is not None
        return pending.record

    def close(self) -> None:
        """Commit what is queued, then stop; later writes raise StoreUnavailable."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    while not self._queue and not self._closed:
                        self._cond.wait()
                    if not self._queue:
                        return  # closed and drained
                    count = min(len(self._queue), self._max_batch)
                    batch = [self._queue.popleft() for _ in range(count)]
                self._commit(batch)
        finally:
            # Should this thread ever die, no caller may wait forever for it.
            with self._cond:
                self._closed = True
                left, self._queue = list(self._queue), deque()
            for pending in left:
                pending.settle(None, StoreUnavailable("audit writer stopped"))

    def _commit(self, batch: list[_Pending]) -> None:
        try:
            records = self._log.append([p.event for p in batch])
            if len(records) != len(batch):
                raise StoreUnavailable(
                    f"audit log returned {len(records)} records for {len(batch)} events")
        except BaseException as exc:
            for pending in batch:
                pending.settle(None, exc)
            if not isinstance(exc, Exception):
                raise
            return
        for pending, record in zip(batch, records):
            pending.settle(record, None)


class Checkpointer:
    """Signs the log's head every `interval` seconds, and once more at close."""

    def __init__(self, log: AuditLog, private_key: Any, kid: str, clock: Clock, *,
                 interval: float):
        self._log, self._key, self._kid, self._clock = log, private_key, kid, clock
        self._interval = interval
        self._lock = threading.Lock()  # the timer thread and close() both checkpoint
        self._last_count = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="audit-checkpointer",
                                        daemon=True)
        self._thread.start()

    def checkpoint(self) -> Checkpoint | None:
        """Sign and store the current head; None when nothing was added since the last."""
        with self._lock:
            count, head_hash = self._log.head()
            if count == self._last_count:
                return None
            cp = sign_checkpoint(count, head_hash, self._clock.now(), self._key, self._kid)
            self._log.add_checkpoint(cp.token, cp)
            self._last_count = count
            return cp

    def close(self) -> Checkpoint | None:
        """Stop the timer and sign the final head (close the AuditWriter first)."""
        self._stop.set()
        self._thread.join()
        return self.checkpoint()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.checkpoint()
            except StoreUnavailable as exc:
                # Records are still chained; the next interval signs a later head.
                log.warning("audit checkpoint failed: %s", exc)
