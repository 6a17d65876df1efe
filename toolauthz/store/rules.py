"""The store's rules, written once over a backend's transactions (`store/unit.py`).

`Store` is one database seen three ways: the call ledger (here), the approvals and the
audit log (`store/faces.py`). Whatever one request writes goes through one transaction of
that database; many requests' writes share a transaction (and its fsync) through the
group commit.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import Any

from toolauthz.audit.records import AuditEvent
from toolauthz.display.escape import shown
from toolauthz.errors import ConflictError, ForbiddenError, NotFoundError, StoreUnavailable
from toolauthz.store.faces import Approvals, AuditLogOf, BundleFloor
from toolauthz.store.group_commit import GroupCommit, ItemFailed
from toolauthz.store.ledger import (
    AppendAudit,
    CallEntry,
    CallOwner,
    ConsumeToken,
    LedgerOp,
    RecordedDecision,
    RecordOutcome,
    Reservation,
    ReserveCall,
    Standing,
    only_result,
)
from toolauthz.store.unit import Transaction, Unforeseen, UnitOfWork
from toolauthz.store.usage_rows import APPROVAL_HOLD_GRACE


def reserve(tx: Transaction, op: ReserveCall) -> Reservation:
    existing = tx.get_call(op.entry.tenant, op.entry.call_id)
    if existing is not None:
        return Reservation(existing)
    if op.standing is not None:
        standing = Standing(*tx.run_counts(op.entry), tx.meter_values(op.entry))
        if standing != op.standing:
            return Reservation(None, moved=standing)
    decided = op.decision or RecordedDecision("", "", "")
    tx.insert_call(op.entry, decided)
    if decided.uses_run_budget and op.entry.charges:
        # An allowed call's charges hold for good; a pending approval's until it could
        # no longer be granted (usage_rows.py).
        hold = None if decided.approval is None else decided.approval.expires_at + APPROVAL_HOLD_GRACE
        tx.insert_charges(op.entry, hold)
    if decided.approval is not None:
        tx.erase_expired_inputs(decided.approval.created_at)
        tx.create_approval(decided.approval)
    if decided.audit is not None:
        tx.append_audit([decided.audit])
    return Reservation(None)


def consume(tx: Transaction, op: ConsumeToken) -> str | ItemFailed:
    entry = tx.get_call(op.tenant, op.call_id)
    if entry is not None and (refusal := _unless_owner(tx, entry, op.owner, op.refused)) is not None:
        return refusal
    code = _consume_code(tx, op, entry)
    if op.audit is not None:
        tx.append_audit([op.audit(code)])
    return code


def _consume_code(tx: Transaction, op: ConsumeToken, entry: CallEntry | None) -> str:
    if entry is None:
        return "unknown_call"
    if entry.outcome and not entry.verified_jti:
        return "call_closed"  # reported as ended (e.g. cancelled) before it ran
    # One execution per call, whichever of its tokens comes first.
    return "ok" if tx.consume_token(op.tenant, op.call_id, op.jti, op.now) else "already_used"


def _unless_owner(tx: Transaction, entry: CallEntry, owner: CallOwner | None,
                  refused: Callable[[CallEntry], AuditEvent] | None) -> ItemFailed | None:
    """None when `owner` (None: not checked) owns the call of `entry`; else the refusal,
    its audit record (`refused`) appended: nothing else of the call changes."""
    if owner is None or entry.owner == owner:
        return None
    if refused is not None:
        tx.append_audit([refused(entry)])
    return ItemFailed(ForbiddenError(f"call `{shown(entry.call_id)}` belongs to another caller, principal or run; "
                                     "only they may act on it"))


def record_outcome(tx: Transaction, op: RecordOutcome) -> CallEntry | ItemFailed:
    entry = tx.get_call(op.tenant, op.call_id)
    if entry is None:
        return ItemFailed(NotFoundError(f"no call `{shown(op.call_id)}` in tenant `{shown(op.tenant)}`"))
    if (refusal := _unless_owner(tx, entry, op.owner, op.refused)) is not None:
        return refusal
    if entry.outcome:
        if (entry.outcome, entry.extra.get("error_code", ""), entry.extra.get("output_digest", "")) == \
                (op.status, op.error_code, op.output_digest):
            return entry  # a retry of the report that set it: its answer again, recorded once
        return ItemFailed(ConflictError(f"call `{shown(op.call_id)}` already has the outcome `{entry.outcome}`"))
    extra = {**entry.extra, "error_code": op.error_code, "output_digest": op.output_digest}
    entry = replace(entry, outcome=op.status, outcome_at=op.now, extra=extra)
    tx.set_outcome(entry)
    if op.status == "cancelled" and not entry.verified_jti:
        tx.release_charges(entry)  # never ran, and now never can (`call_closed`)
    if op.audit is not None:
        tx.append_audit([op.audit(entry)])
    return entry


def call_key(tenant: str, call_id: str) -> str:
    """The lock key of a call's rows (its call row, its tokens, its approval)."""
    return f"call\x00{tenant}\x00{call_id}"


def lock_keys(ops: Sequence[object]) -> list[str]:
    """What a batch of operations writes under (`Transaction.lock`): each call's key,
    and for a reservation its run's and its meters', whose values the reservation checks
    and adds to."""
    keys = []
    for op in ops:
        if isinstance(op, ReserveCall):
            keys.append(call_key(op.entry.tenant, op.entry.call_id))
            keys.append(f"run\x00{op.entry.tenant}\x00{op.entry.request_id}")
            keys.extend(f"meter\x00{op.entry.tenant}\x00{charge.lock_key}" for charge in op.entry.charges)
        elif isinstance(op, (ConsumeToken, RecordOutcome)):
            keys.append(call_key(op.tenant, op.call_id))
    return keys


def batch_deadline(ops: Sequence[object]) -> float | None:
    """When the last caller of a batch of reservations stops waiting (None: one waits
    for ever, or the batch has other operations, whose callers set no deadline)."""
    deadlines = [op.deadline if isinstance(op, ReserveCall) else None for op in ops]
    if not deadlines or None in deadlines:
        return None
    return max(d for d in deadlines if d is not None)


def call_of_op(op: ReserveCall | ConsumeToken | RecordOutcome) -> tuple[str, str]:
    """The call (tenant, call_id) an operation reads first."""
    if isinstance(op, ReserveCall):
        return op.entry.tenant, op.entry.call_id
    return op.tenant, op.call_id


def apply_op(tx: Transaction, op: object) -> Any:
    """One operation in a transaction; a misuse fails that operation alone."""
    if isinstance(op, ReserveCall):
        return reserve(tx, op)
    if isinstance(op, ConsumeToken):
        return consume(tx, op)
    if isinstance(op, RecordOutcome):
        return record_outcome(tx, op)
    if isinstance(op, AppendAudit):
        tx.append_audit([op.event])
        return None
    return ItemFailed(TypeError(f"not a ledger operation: {op!r}"))


class Ledger:
    """The call ledger (`store/ledger.py` CallLedger) over any backend."""

    def __init__(self, unit: UnitOfWork):
        self._unit = unit
        # The writes every decision and every verification make: concurrent ones share a
        # transaction (group_commit.py) rather than queue on the write lock one by one.
        self._writes: GroupCommit[LedgerOp, Any] = GroupCommit(self._run_batch, name=f"{unit.label} ledger")

    def _run_batch(self, ops: Sequence[LedgerOp]) -> list[Any]:
        # New calls' reservations (and bare audit records) read only what the backend can
        # foresee: their call is new, their run and meters stand as they were last seen.
        if all(isinstance(op, (ReserveCall, AppendAudit)) for op in ops):
            try:
                return self._run_in(self._unit.transaction(foreseen=True), ops)
            except Unforeseen as missed:
                if missed.learned:  # another replica wrote a run, a meter or a chain meanwhile
                    return self._again(ops)
        return self._run_in(self._unit.transaction(), ops)  # the long way, whose reads are the truth

    def _again(self, ops: Sequence[LedgerOp]) -> list[Any]:
        """After a foreseen batch missed, with what it read now foreseen: a reservation
        decided on other counts or meters is answered `moved` at once (decided again, its
        next transaction checks it), the others are tried foreseen once more, then the
        long way."""
        deciding = [(i, op) for i, op in enumerate(ops) if isinstance(op, ReserveCall) and op.standing is not None]
        stands = self._unit.foreseen_standing([op.entry for _, op in deciding]) or []
        moved = {i: now for (i, op), now in zip(deciding, stands, strict=False) if now != op.standing}
        rest = [op for i, op in enumerate(ops) if i not in moved]
        written: Iterator[Any] = iter(())
        if rest:
            try:
                written = iter(self._run_in(self._unit.transaction(foreseen=True), rest))
            except Unforeseen:
                written = iter(self._run_in(self._unit.transaction(), rest))
        return [Reservation(None, moved=moved[i]) if i in moved else next(written) for i in range(len(ops))]

    @staticmethod
    def _run_in(transaction: AbstractContextManager[Transaction], ops: Sequence[LedgerOp]) -> list[Any]:
        with transaction as tx:
            deadline = batch_deadline(ops)
            if deadline is not None:
                tx.bound(deadline - time.monotonic())
            tx.lock(lock_keys(ops))
            tx.read_ahead([call_of_op(op) for op in ops if isinstance(op, (ReserveCall, ConsumeToken, RecordOutcome))],
                          [op.entry for op in ops if isinstance(op, ReserveCall) and op.standing is not None])
            return [apply_op(tx, op) for op in ops]

    def apply(self, ops: Sequence[LedgerOp]) -> list[Any]:
        return self._writes.submit_many(list(ops))

    def reserve(self, entry: CallEntry, decision: RecordedDecision | None = None,
                standing: Standing | None = None) -> Reservation:
        reservation: Reservation = only_result(self.apply([ReserveCall(entry, decision, standing)]))
        return reservation

    def standing(self, entries: Sequence[CallEntry]) -> list[Standing]:
        with self._unit.reading() as reads:
            return reads.standing_of(entries)

    def expected_standing(self, entries: Sequence[CallEntry]) -> list[Standing]:
        foreseen = self._unit.foreseen_standing(entries)
        if foreseen is not None:
            return foreseen  # checked by the transaction that records the decision
        return self.standing(entries)

    def get(self, tenant: str, call_id: str) -> CallEntry | None:
        with self._unit.reading() as reads:
            return reads.get_call(tenant, call_id)

    def consume(self, tenant: str, call_id: str, jti: str, now: float,
                audit: Callable[[str], AuditEvent] | None = None) -> str:
        code: str = only_result(self.apply([ConsumeToken(tenant, call_id, jti, now, audit)]))
        return code

    def record_outcome(self, tenant: str, call_id: str, status: str, error_code: str, output_digest: str,
                       now: float) -> CallEntry:
        entry: CallEntry = only_result(self.apply([RecordOutcome(tenant, call_id, status, error_code,
                                                                 output_digest, now)]))
        return entry

    def close(self) -> None:
        self._writes.close()


class Store:
    """One database: the call ledger, the approvals and the audit log, whose writes
    share transactions."""

    def __init__(self, unit: UnitOfWork):
        self.unit = unit
        self.ledger = Ledger(unit)
        self.approvals = Approvals(unit)
        self.audit_log = AuditLogOf(unit)
        self.bundle_floor = BundleFloor(unit)

    def available(self) -> bool:
        """One read reaches the database now (for health checks)."""
        try:
            with self.unit.reading() as reads:
                reads.audit_heads()
        except StoreUnavailable:
            return False
        return True

    def prune(self, before: float, *, batch: int = 1000) -> int:
        """Removes the ledger rows (call, consumed tokens, approval) of calls that ended
        before `before`, `batch` calls per transaction so that serving replicas wait
        for no long one; never an audit record. Returns how many calls were removed.
        A pruned call id is forgotten: reused, it is a new call."""
        if batch < 1:
            raise ValueError("batch must be at least 1")
        removed = 0
        while True:
            with self.unit.transaction() as tx:
                calls = tx.ended_calls(before, batch)
                tx.lock([call_key(tenant, call_id) for tenant, call_id, _ in calls])
                tx.delete_calls(calls)
                if len(calls) < batch:
                    tx.prune_charges(before)
            removed += len(calls)
            if len(calls) < batch:
                return removed

    def listen_for_approvals(self, on_approval: Callable[[str], None]) -> None:
        """`on_approval(approval_id)` for each approval decided by another process."""
        self.unit.listen(on_approval)

    def close(self) -> None:
        """Runs what is queued, then closes the database; later calls raise StoreUnavailable."""
        self.ledger.close()
        self.unit.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
