"""In front of an AuditLog: group commit, and periodic checkpoints on a thread.

Every decision waits for its audit record to be durable before the response leaves the
process. One transaction (and one fsync) per decision would cap throughput at the disk's
fsync rate, so one caller at a time commits whatever is queued as one `append`, and each
caller gets its own record, or StoreUnavailable for the whole batch.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from toolauthz.audit.checkpoint import Checkpoint, sign_heads
from toolauthz.audit.merkle import records_in
from toolauthz.audit.records import AuditEvent, AuditRecord
from toolauthz.audit.store import AuditLog
from toolauthz.clock import Clock
from toolauthz.errors import StoreUnavailable
from toolauthz.store.group_commit import GroupCommit
from toolauthz.telemetry import metrics

log = logging.getLogger(__name__)


class AuditWriter:
    """Group commit of audit records (group_commit.py): one `append`, one
    transaction and one fsync for whatever is queued."""

    def __init__(self, log: AuditLog, *, max_batch: int = 256):
        self._log = log
        self._group: GroupCommit[AuditEvent, AuditRecord] = GroupCommit(
            log.append, max_batch=max_batch, name="audit writer")

    def write(self, event: AuditEvent, timeout: float | None = None) -> AuditRecord:
        """Block until `event` is committed; raise StoreUnavailable if it was not. After
        a timeout the record may still be committed (when a commit had already taken
        it): the log may then show a decision that was denied for want of its record,
        never a decision without one."""
        if not isinstance(event, AuditEvent):  # one bad item must not fail a batch
            raise TypeError("audit writer takes an AuditEvent")
        try:
            with metrics.timed(metrics.AUDIT_WRITE_SECONDS):
                return self._group.submit(event, timeout)
        except StoreUnavailable:
            metrics.AUDIT_WRITE_FAILURES.inc()
            raise

    def close(self) -> None:
        """Refuse new writes; return once everything queued is committed."""
        self._group.close()


class Checkpointer:
    """Signs every chain's head (one Merkle root over them) every `interval` seconds,
    and once more at close."""

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
        """Sign and store the current heads; None when nothing was added since the last."""
        with self._lock:
            heads = self._log.heads()  # one read: every head as of one moment
            count = records_in(heads)
            if count == self._last_count:
                return None
            cp = sign_heads(heads, self._clock.now(), self._key, self._kid)
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
