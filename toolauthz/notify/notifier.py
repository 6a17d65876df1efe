"""The notifier: sends approval events to the sinks, off the decision path.

Every `poll_seconds` (a thread of its own; `run_once` is one pass, for tests) it reads
the approvals of the last `horizon_seconds`, derives their due events
(notify/events.py), claims the ones no sender has claimed (store/deliveries.py: one
insert wins across the fleet), takes over retries that are due and sends whose sender
died (its lease ran out), sends each outside any transaction, and records the result:
delivered, skipped (no longer news), tried again after a backoff (1 s doubling up to
`max_backoff_seconds`), or dead after `max_attempts` or a final refusal. Dead letters
are bounded (`keep_dead`) and shown in metrics and on the console's status page.

Delivery is at least once: a sender killed between its POST and its record leaves the
event to be sent again under the same `webhook-id`. A restart, a reload or another
replica never sends an event twice otherwise. Nothing here ever blocks or fails a
decision: a store or sink failure is logged and the next pass tries again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from toolauthz.clock import Clock
from toolauthz.errors import StoreUnavailable
from toolauthz.notify.events import ApprovalEvent, FieldsOf, events_of, parse_event_id, payload, still_news
from toolauthz.notify.sinks import Sent, Sink
from toolauthz.store.approvals import ApprovalRecord
from toolauthz.store.deliveries import DEAD, DELIVERED, RETRY, SKIPPED, Delivery
from toolauthz.store.unit import UnitOfWork
from toolauthz.telemetry.metrics import NOTIFICATIONS, NOTIFICATIONS_DEAD

log = logging.getLogger("toolauthz.notify")

MAX_APPROVALS_PER_PASS = 500
MAX_DUE_PER_PASS = 100


@dataclass(frozen=True)
class NotifierOptions:
    console_url: str = ""
    warning_seconds: float = 120.0
    poll_seconds: float = 1.0
    horizon_seconds: float = 3600.0
    lease_seconds: float = 30.0
    max_attempts: int = 8
    max_backoff_seconds: float = 300.0
    keep_dead: int = 100
    keep_delivered_seconds: float = 7 * 24 * 3600.0


@dataclass(frozen=True)
class _Job:
    event: ApprovalEvent
    sink: Sink
    attempts: int  # attempts made before this one


class Notifier:
    def __init__(self, unit: UnitOfWork, sinks: Sequence[Sink], clock: Clock, fields_of: FieldsOf,
                 options: NotifierOptions = NotifierOptions()):
        if len({s.name for s in sinks}) != len(sinks):
            raise ValueError("notification sinks need distinct names")
        self._unit = unit
        self._sinks = {s.name: s for s in sinks}
        self._clock = clock
        self._fields_of = fields_of
        self.options = options
        self._known: dict[tuple[str, str], float] = {}  # (event id, sink) this process saw claimed -> when
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._passes = 0

    # -- one pass ----------------------------------------------------------------------

    def run_once(self) -> int:
        """Claims and sends what is due now; the number of deliveries attempted."""
        now = self._clock.now()
        opts = self.options
        with self._unit.reading() as reads:
            records = {r.approval_id: r for r in reads.recent_approvals(now - opts.horizon_seconds,
                                                                       MAX_APPROVALS_PER_PASS)}
            due = reads.due_deliveries(now, MAX_DUE_PER_PASS)
        jobs = self._claim_new(records.values(), now) + self._retake(due, now)
        for job in jobs:
            self._send(job, records, now)
        self._passes += 1
        if self._passes % 60 == 1:
            self._prune(now)
        return len(jobs)

    def _claim_new(self, records: Iterable[ApprovalRecord], now: float) -> list[_Job]:
        wanted = [(ev, sink) for record in records
                  for ev in events_of(record, now, self.options.warning_seconds)
                  for sink in self._sinks.values() if (ev.event_id, sink.name) not in self._known]
        if not wanted:
            return []
        lease = now + self.options.lease_seconds
        jobs = []
        with self._unit.transaction() as tx:
            for ev, sink in wanted:
                if tx.claim_delivery(ev.event_id, sink.name, now, lease):
                    jobs.append(_Job(ev, sink, 0))
        for ev, sink in wanted:
            self._known[(ev.event_id, sink.name)] = now
        return jobs

    def _retake(self, due: Sequence[Delivery], now: float) -> list[_Job]:
        jobs = []
        lease = now + self.options.lease_seconds
        for delivery in due:
            ev = parse_event_id(delivery.event_id)
            sink = self._sinks.get(delivery.sink)
            if ev is None or sink is None:
                continue  # another configuration's sink or event: its own sender's business
            with self._unit.transaction() as tx:
                if tx.retake_delivery(delivery, now, lease):
                    jobs.append(_Job(ev, sink, delivery.attempts))
        return jobs

    def _send(self, job: _Job, records: dict[str, ApprovalRecord], now: float) -> None:
        record = records.get(job.event.approval_id)
        if record is None:
            with self._unit.reading() as reads:
                record = reads.get_approval(job.event.approval_id)
        if record is None:
            self._settle(job, DEAD, now, error="the approval is gone")
            return
        if not still_news(job.event.type, record, now):
            self._settle(job, SKIPPED, now)
            return
        body = payload(job.event, record, now=now, console_url=self.options.console_url, fields_of=self._fields_of)
        try:
            sent = job.sink.deliver(job.event.event_id, body, now)
        except Exception as exc:  # a sink's bug must not stop the notifier
            log.exception("notification sink %s failed", job.sink.name)
            sent = Sent(False, retry=True, error=type(exc).__name__)
        attempts = job.attempts + 1
        if sent.ok:
            self._settle(job, DELIVERED, now, attempts=attempts)
        elif sent.retry and attempts < self.options.max_attempts:
            backoff = min(2.0 ** (attempts - 1), self.options.max_backoff_seconds)
            self._settle(job, RETRY, now, attempts=attempts, next_at=now + backoff, error=sent.error)
        else:
            self._settle(job, DEAD, now, attempts=attempts, error=sent.error)
            log.warning("notification %s to sink %s is dead after %d attempts: %s", job.event.event_id,
                        job.sink.name, attempts, sent.error)

    def _settle(self, job: _Job, status: str, now: float, *, attempts: int | None = None,
                next_at: float | None = None, error: str = "") -> None:
        with self._unit.transaction() as tx:
            tx.settle_delivery(job.event.event_id, job.sink.name, status=status,
                               attempts=job.attempts if attempts is None else attempts,
                               next_at=now if next_at is None else next_at, now=now, error=error)
        NOTIFICATIONS.labels(job.sink.kind, job.event.type, status).inc()

    def _prune(self, now: float) -> None:
        with self._unit.transaction() as tx:
            tx.prune_deliveries(now - self.options.keep_delivered_seconds, self.options.keep_dead)
        with self._unit.reading() as reads:
            NOTIFICATIONS_DEAD.set(len(reads.list_deliveries(DEAD, self.options.keep_dead + 1)))
        horizon = now - self.options.horizon_seconds - self.options.lease_seconds
        self._known = {k: v for k, v in self._known.items() if v >= horizon}

    # -- the thread --------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="toolauthz-notifier", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.options.poll_seconds):
            try:
                self.run_once()
            except StoreUnavailable as exc:  # the next pass tries again
                log.warning("notifier pass failed: %s", exc)
            except Exception:
                log.exception("notifier pass failed")

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
