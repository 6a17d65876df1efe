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

from toolauthz.audit.checkpoint import Checkpoint
from toolauthz.audit.merkle import ChainHead
from toolauthz.audit.records import AuditEvent, AuditRecord
from toolauthz.audit.store import AuditQuery
from toolauthz.store.approvals import ApprovalRecord
from toolauthz.store.bundle_floor import Floor
from toolauthz.store.deliveries import Delivery
from toolauthz.store.ledger import CallEntry, RecordedDecision, Standing


class Unforeseen(Exception):
    """A foreseen transaction (`UnitOfWork.transaction(foreseen=True)`) found that a row
    it predicted did not stand so, and wrote nothing. `learned`: the backend has since
    read how those rows stand, so the batch may be foreseen again; otherwise it is run
    unforeseen."""

    def __init__(self, message: str, *, learned: bool = False):
        super().__init__(message)
        self.learned = learned


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

    def bundle_floor(self) -> Floor | None: ...

    def get_call(self, tenant: str, call_id: str) -> CallEntry | None: ...

    def run_counts(self, entry: CallEntry) -> tuple[int, int]:
        """The calls of entry's run (tenant, request_id) that hold a share of its budget,
        of all tools and of entry's tool: those allowed, and those whose approval is
        pending (not expired at entry.created_at) or approved."""

    def run_counts_of(self, entries: Sequence[CallEntry]) -> list[tuple[int, int]]:
        """`run_counts` of each entry, in one read."""

    def meter_values(self, entry: CallEntry) -> tuple[int, ...]:
        """The value of each meter entry charges (`CallEntry.charges`, in order) at
        entry.created_at: the sum of the charges that count then (usage_rows.py)."""

    def meter_values_of(self, entries: Sequence[CallEntry]) -> list[tuple[int, ...]]:
        """`meter_values` of each entry, in one read."""

    def standing_of(self, entries: Sequence[CallEntry]) -> list[Standing]:
        """Each entry's run counts and meter values together, in one round trip."""

    def get_approval(self, approval_id: str) -> ApprovalRecord | None: ...

    def list_approvals(self, *, tenant: str, status: str, group: str, now: float,
                       limit: int) -> list[ApprovalRecord]: ...

    def count_pending_approvals(self, now: float) -> int: ...

    def audit_query(self, filters: AuditQuery, *, limit: int, after_seq: int) -> list[AuditRecord]: ...

    def audit_page(self, after_seq: int, limit: int) -> list[AuditRecord]: ...

    def audit_chain_page(self, chain: str, after: int, limit: int) -> list[AuditRecord]:
        """Up to `limit` records of one chain with chain_seq > `after`, in its order."""

    def audit_chain_names(self) -> list[str]:
        """Every chain that holds a record or has a head."""

    def audit_heads(self) -> list[ChainHead]:
        """The stored head of every chain, by name."""

    def checkpoints(self) -> list[Checkpoint]: ...

    def last_checkpoint(self) -> Checkpoint | None: ...


class Transaction(Reads, Protocol):
    """Writes inside one transaction; reads in it see its writes. Two transactions that
    `lock` a common key run one after the other (across every process and replica
    sharing the database), so the rows a key names, read after locking it, are those
    the commit leaves behind; audit records are chained at the end under their chains'
    heads (`store/chains.py`). SQLite runs every write transaction alone (its write
    lock); PostgreSQL only those that share a key or a chain."""

    def bound(self, seconds: float) -> None:
        """No statement of this transaction may run longer than `seconds` from now (its
        callers' deadline): past it, the server gives the statement up, and the
        transaction fails with nothing written, rather than running for no one."""

    def lock(self, keys: Sequence[str]) -> None:
        """Holds `keys` (names of rows: a call, a run, a token) until the transaction
        ends; call it once, before the first write, with every key it will write under: the
        keys are taken in one order, so two transactions never wait for each other in a
        cycle."""

    def read_ahead(self, calls: Sequence[tuple[str, str]], runs: Sequence[CallEntry]) -> None:
        """Reads at once the calls (tenant, call_id), and the run counts and meter
        values (of these entries), the operations ahead will ask for, after `lock`:
        they are then answered without a round trip each. A backend whose reads are
        cheap does nothing."""

    def insert_call(self, entry: CallEntry, decided: RecordedDecision) -> None: ...

    def insert_charges(self, entry: CallEntry, hold_until: float | None) -> None:
        """entry's charges, counted until `hold_until` (None: for their whole window)."""

    def settle_charges(self, approval_id: str, approved: bool) -> None:
        """The held charges of an approval's call: kept for good, or given back."""

    def release_charges(self, entry: CallEntry) -> None:
        """Gives back the charges of entry's call (it will never run)."""

    def prune_charges(self, before: float) -> None:
        """Removes the charges whose window ended before `before`."""

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

    def append_audit(self, events: Sequence[AuditEvent]) -> None:
        """Queues `events`, chained and written at the end of the transaction."""

    def flush_audit(self) -> list[AuditRecord]:
        """Chains and writes the queued events now, under their chains' heads (locked
        until the transaction ends); the backend calls it before committing."""

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

    # The bundle revision floor (store/bundle_floor.py): one for every process sharing the store.
    def lift_bundle_floor(self, revision: int, digest: str, now: float) -> Floor:
        """Raises the floor to `revision` unless it is higher; the floor as it then stands."""

    def lower_bundle_floor(self, revision: int, now: float) -> None: ...


class UnitOfWork(Protocol):
    """One database. `transaction()` commits on a clean exit (durably, before it
    returns) and rolls back on an exception; `reading()` is for reads that need not
    agree with each other."""

    label: str

    def transaction(self, *, foreseen: bool = False) -> AbstractContextManager[Transaction]:
        """`foreseen`: the backend may answer the reads of a batch of reservations from what
        it expects and have the database check them with the writes (one round trip on a
        network); it raises Unforeseen, having written nothing, where they did not hold.
        A backend without predictions ignores it."""

    def foreseen_standing(self, entries: Sequence[CallEntry]) -> list[Standing] | None:
        """How each entry's run and meters are expected to stand without reading them, for
        a decision whose foreseen transaction checks them; None: read them."""

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


def iter_chains(unit: UnitOfWork, page: int) -> Iterator[AuditRecord]:
    """Every record, chain by chain (by name), each in its order, a page per read. Safe
    while others append: a chain's records commit in its order, so no page of a chain
    can miss a record that commits later (reading by `seq` could, across chains)."""
    with unit.reading() as reads:
        names = sorted(reads.audit_chain_names())
    for name in names:
        after = 0
        while True:
            with unit.reading() as reads:
                records = reads.audit_chain_page(name, after, page)
            yield from records
            if len(records) < page:
                break
            after = records[-1].chain_seq
