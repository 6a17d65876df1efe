"""What a storage backend implements: one database, and transactions over it.

A `Transaction` is the unit of work: whatever one decision writes (its call row, the
token it consumes, the approval it opens or decides, its audit records) is written
through one transaction and committed together or not at all. The rules (what a
reservation or a consumption means: `store/rules.py`) are written once over this
interface; a backend only knows how to read and write rows, in SQL of its dialect.

Every storage error leaves a backend as StoreUnavailable: the caller then denies.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

from sidecar.audit.checkpoint import Checkpoint
from sidecar.audit.records import AuditEvent, AuditRecord
from sidecar.audit.store import AuditQuery
from sidecar.store.approvals import ApprovalRecord
from sidecar.store.deliveries import Delivery
from sidecar.store.ledger import CallEntry, RecordedDecision


@dataclass(frozen=True)
class ApprovalVerdict:
    """What deciding a pending approval writes."""

    approval_id: str
    status: str
    approver: str
    reason: str
    now: float
    token: str = ""
    token_jti: str = ""
    token_expires_at: float | None = None
    approved_version: str = ""


class Reads(Protocol):
    """Reads that need no write transaction."""

    def recent_approvals(self, since: float, limit: int) -> list[ApprovalRecord]: ...

    def due_deliveries(self, now: float, limit: int) -> list[Delivery]: ...

    def list_deliveries(self, status: str, limit: int) -> list[Delivery]: ...

    def get_call(self, tenant: str, call_id: str) -> CallEntry | None: ...

    def run_counts(self, entry: CallEntry) -> tuple[int, int]:
        """The calls of entry's run (tenant, request_id) that hold a share of its budget,
        of all tools and of entry's tool: those allowed, and those whose approval is
        pending (not expired at entry.created_at) or approved."""

    def get_approval(self, approval_id: str) -> ApprovalRecord | None: ...

    def list_approvals(self, *, tenant: str, status: str, group: str, now: float,
                       limit: int) -> list[ApprovalRecord]: ...

    def count_pending_approvals(self, now: float) -> int: ...

    def audit_query(self, filters: AuditQuery, *, limit: int, after_seq: int) -> list[AuditRecord]: ...

    def audit_page(self, after_seq: int, limit: int) -> list[AuditRecord]: ...

    def audit_head(self) -> tuple[int, str]: ...

    def checkpoints(self) -> list[Checkpoint]: ...

    def last_checkpoint(self) -> Checkpoint | None: ...


class Transaction(Reads, Protocol):
    """Writes inside one transaction; reads in it see its writes. A backend runs write
    transactions one at a time, across every process and replica sharing the database
    (SQLite: its write lock; PostgreSQL: a lock taken at the start of each one), since
    each may append to the one audit chain: the audit head and the run's counts read in
    a transaction are those its commit leaves behind."""

    def insert_call(self, entry: CallEntry, decided: RecordedDecision) -> None: ...

    def consume_token(self, tenant: str, call_id: str, jti: str, now: float) -> bool:
        """Marks the token and the call as used; True when neither had been."""

    def set_outcome(self, entry: CallEntry) -> None:
        """Stores entry's outcome, outcome_at and extra."""

    def create_approval(self, record: ApprovalRecord) -> None: ...

    def decide_approval(self, verdict: ApprovalVerdict) -> bool:
        """Moves a pending, unexpired approval to the verdict's status, erasing its
        kept arguments; False when it was no longer pending."""

    def erase_expired_inputs(self, now: float) -> None:
        """The kept arguments of every approval that can no longer be decided."""

    def append_audit(self, events: Sequence[AuditEvent]) -> list[AuditRecord]:
        """Chains `events` after the head, serialized against every other appender."""

    def ended_calls(self, before: float, limit: int) -> list[tuple[str, str, str]]:
        """Up to `limit` calls that ended before `before`, as (tenant, call_id,
        approval_id): an outcome was reported, or the call was denied."""

    def delete_calls(self, calls: Sequence[tuple[str, str, str]]) -> None:
        """The rows of these calls: the call, its consumed tokens, its approval."""

    def notify_approval(self, approval_id: str) -> None:
        """Tells the watchers of other processes sharing the database, once this
        transaction commits, that the approval changed (see `UnitOfWork.listen`)."""

    def add_checkpoint(self, token: str, checkpoint: Checkpoint) -> None: ...

    # Notification deliveries (store/deliveries.py): claimed once per fleet.
    def claim_delivery(self, event_id: str, sink: str, now: float, lease_until: float) -> bool: ...

    def retake_delivery(self, delivery: Delivery, now: float, lease_until: float) -> bool: ...

    def settle_delivery(self, event_id: str, sink: str, *, status: str, attempts: int, next_at: float, now: float,
                        error: str = "") -> None: ...

    def prune_deliveries(self, done_before: float, keep_dead: int) -> None: ...


class UnitOfWork(Protocol):
    """One database. `transaction()` commits on a clean exit (durably, before it
    returns) and rolls back on an exception; `reading()` is for reads that need not
    agree with each other."""

    label: str

    def transaction(self) -> AbstractContextManager[Transaction]: ...

    def reading(self) -> AbstractContextManager[Reads]: ...

    def listen(self, on_approval: Callable[[str], None]) -> None:
        """Calls `on_approval(approval_id)`, from a thread of the backend's, for every
        approval another process decides (a backend that cannot tell does nothing: its
        watchers look at the store again every MAX_WATCH_WAIT)."""

    def close(self) -> None: ...


def iter_audit(unit: UnitOfWork, from_seq: int, page: int) -> Iterator[AuditRecord]:
    """Every record from `from_seq` on, a page per read: no statement stays open across
    a yield, and no read transaction pins the database while a slow consumer verifies."""
    after = from_seq - 1
    while True:
        with unit.reading() as reads:
            records = reads.audit_page(after, page)
        yield from records
        if len(records) < page:
            return
        after = records[-1].seq
