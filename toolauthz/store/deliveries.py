"""Notification deliveries: which approval event went to which sink, claimed once per
fleet.

An event (an approval created, about to expire, decided) is derived from the approvals
table; this table only records its delivery to each sink. A sender claims an event by
inserting its row (`INSERT ... ON CONFLICT DO NOTHING` on the primary key): one insert
wins across every process and replica, so one sender sends it. A row is `sending` (its
`next_at` the end of the sender's lease), `retry` (`next_at` when to try again),
`delivered`, `skipped` (nothing left to say: the approval was decided before its expiry
warning went out) or `dead` (attempts exhausted, or refused for good by the receiver).
A sender that died mid-send leaves a `sending` row whose lease runs out; another sender
takes it over (`retake`), with the same event id, so a receiver can drop the duplicate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from toolauthz.store.approvals import ApprovalRecord
from toolauthz.store.backend_rows import BackendRows
from toolauthz.store.rows import APPROVAL_COLUMNS, approval_of

SENDING, RETRY, DELIVERED, SKIPPED, DEAD = "sending", "retry", "delivered", "skipped", "dead"
DELIVERY_TABLE = "notification_deliveries"
MAX_ERROR_CHARS = 300

SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {DELIVERY_TABLE} (
    event_id TEXT NOT NULL,
    sink TEXT NOT NULL,
    status TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    next_at DOUBLE PRECISION NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL,
    last_error TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (event_id, sink)
);
CREATE INDEX IF NOT EXISTS {DELIVERY_TABLE}_due ON {DELIVERY_TABLE} (status, next_at);
"""

_COLUMNS = "event_id, sink, status, attempts, next_at, created_at, updated_at, last_error"


@dataclass(frozen=True)
class Delivery:
    event_id: str  # "<approval id>.<event>": the webhook id, the same on every retry
    sink: str
    status: str
    attempts: int
    next_at: float
    created_at: float
    updated_at: float
    last_error: str = ""


def delivery_of(row: tuple[Any, ...]) -> Delivery:
    return Delivery(str(row[0]), str(row[1]), str(row[2]), int(row[3]), float(row[4]), float(row[5]),
                    float(row[6]), str(row[7]))


@dataclass(frozen=True)
class DeliverySql:
    """The statements, with the backend's placeholder."""

    claim: str
    retake: str
    settle: str
    due: str
    listed: str
    prune_done: str
    prune_dead: str
    recent_approvals: str

    @classmethod
    def with_mark(cls, m: str) -> DeliverySql:
        return cls(
            claim=(f"INSERT INTO {DELIVERY_TABLE} ({_COLUMNS}) VALUES ({m}, {m}, '{SENDING}', 0, {m}, {m}, {m}, '') "
                   "ON CONFLICT DO NOTHING"),
            retake=(f"UPDATE {DELIVERY_TABLE} SET status = '{SENDING}', next_at = {m}, updated_at = {m} "
                    f"WHERE event_id = {m} AND sink = {m} AND attempts = {m} AND status IN ('{SENDING}', '{RETRY}') "
                    f"AND next_at <= {m}"),
            settle=(f"UPDATE {DELIVERY_TABLE} SET status = {m}, attempts = {m}, next_at = {m}, updated_at = {m}, "
                    f"last_error = {m} WHERE event_id = {m} AND sink = {m} AND status = '{SENDING}'"),
            due=(f"SELECT {_COLUMNS} FROM {DELIVERY_TABLE} WHERE status IN ('{SENDING}', '{RETRY}') "
                 f"AND next_at <= {m} ORDER BY next_at LIMIT {m}"),
            listed=f"SELECT {_COLUMNS} FROM {DELIVERY_TABLE} WHERE status = {m} ORDER BY updated_at DESC LIMIT {m}",
            prune_done=(f"DELETE FROM {DELIVERY_TABLE} WHERE status IN ('{DELIVERED}', '{SKIPPED}') "
                        f"AND updated_at < {m}"),
            # The dead letters are bounded: only the newest `keep` stay.
            prune_dead=(f"DELETE FROM {DELIVERY_TABLE} WHERE status = '{DEAD}' AND event_id || ' ' || sink NOT IN "
                        f"(SELECT event_id || ' ' || sink FROM {DELIVERY_TABLE} WHERE status = '{DEAD}' "
                        f"ORDER BY updated_at DESC LIMIT {m})"),
            recent_approvals=(f"SELECT {APPROVAL_COLUMNS} FROM approvals WHERE created_at >= {m} OR decided_at >= {m} "
                              f"OR expires_at >= {m} ORDER BY created_at, approval_id LIMIT {m}"),
        )


class DeliveryRows(BackendRows):
    """The deliveries' reads and writes over a backend's `_rows` and `_write` (a mixin of
    each backend's transaction, which sets `_delivery_sql`)."""

    _delivery_sql: DeliverySql

    def recent_approvals(self, since: float, limit: int) -> list[ApprovalRecord]:
        """Approvals created, decided or expiring at or after `since`, oldest first."""
        return [approval_of(r) for r in self._rows(self._delivery_sql.recent_approvals, (since, since, since, limit))]

    def claim_delivery(self, event_id: str, sink: str, now: float, lease_until: float) -> bool:
        """True for the one sender whose insert created the row."""
        return self._write(self._delivery_sql.claim, (event_id, sink, lease_until, now, now)) == 1

    def retake_delivery(self, delivery: Delivery, now: float, lease_until: float) -> bool:
        """Takes over a due retry, or a send whose lease ran out, unless another sender did."""
        return self._write(self._delivery_sql.retake, (lease_until, now, delivery.event_id, delivery.sink,
                                                       delivery.attempts, now)) == 1

    def settle_delivery(self, event_id: str, sink: str, *, status: str, attempts: int, next_at: float, now: float,
                        error: str = "") -> None:
        self._write(self._delivery_sql.settle, (status, attempts, next_at, now, error[:MAX_ERROR_CHARS], event_id,
                                                sink))

    def due_deliveries(self, now: float, limit: int) -> list[Delivery]:
        return [delivery_of(r) for r in self._rows(self._delivery_sql.due, (now, limit))]

    def list_deliveries(self, status: str, limit: int) -> list[Delivery]:
        return [delivery_of(r) for r in self._rows(self._delivery_sql.listed, (status, limit))]

    def prune_deliveries(self, done_before: float, keep_dead: int) -> None:
        self._write(self._delivery_sql.prune_done, (done_before,))
        self._write(self._delivery_sql.prune_dead, (keep_dead,))
