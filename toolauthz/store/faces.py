"""The approvals, the audit log and the bundle floor over any backend (`store/unit.py`):
each operation one transaction or one read of the database the ledger shares
(`store/rules.py` Store)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from toolauthz.audit.checkpoint import Checkpoint
from toolauthz.audit.merkle import ChainHead, heads_root, records_in
from toolauthz.audit.records import AuditEvent, AuditRecord
from toolauthz.audit.store import AuditQuery, check_page
from toolauthz.store.approvals import APPROVED, ApprovalRecord
from toolauthz.store.bundle_floor import Floor
from toolauthz.store.unit import ApprovalVerdict, UnitOfWork, iter_audit, iter_chains

AUDIT_PAGE = 1000  # records per read while streaming: bounded memory, short reads


class Approvals:
    """The approval store (`store/approvals.py` ApprovalStore) over any backend."""

    def __init__(self, unit: UnitOfWork):
        self._unit = unit

    def create(self, record: ApprovalRecord) -> None:
        with self._unit.transaction() as tx:
            tx.erase_expired_inputs(record.created_at)
            tx.create_approval(record)

    def get(self, approval_id: str) -> ApprovalRecord | None:
        with self._unit.reading() as reads:
            return reads.get_approval(approval_id)

    def list(self, *, tenant: str = "", status: str = "", group: str = "", now: float,
             limit: int = 100) -> list[ApprovalRecord]:
        with self._unit.reading() as reads:
            records = reads.list_approvals(tenant=tenant, status=status, group=group, now=now, limit=limit)
        return [r.as_of(now) for r in records]

    def count_pending(self, now: float) -> int:
        """Approvals waiting for a decision and not yet expired (for the metrics)."""
        with self._unit.reading() as reads:
            return reads.count_pending_approvals(now)

    def decide(self, approval_id: str, *, status: str, approver: str, reason: str, now: float,
               token: str = "", token_jti: str = "", token_expires_at: float | None = None,
               approved_version: str = "", audit: Callable[[bool], AuditEvent] | None = None) -> bool:
        verdict = ApprovalVerdict(approval_id, status, approver, reason, now, token, token_jti,
                                  token_expires_at, approved_version)
        with self._unit.transaction() as tx:
            won = tx.decide_approval(verdict)
            if won:
                tx.settle_charges(approval_id, approved=status == APPROVED)
                tx.notify_approval(approval_id)
            tx.erase_expired_inputs(now)
            if audit is not None:
                tx.append_audit([audit(won)])
        return won


class AuditLogOf:
    """The audit log (`audit/store.py` AuditLog) over any backend."""

    def __init__(self, unit: UnitOfWork):
        self._unit = unit

    def append(self, events: Sequence[AuditEvent]) -> list[AuditRecord]:
        if not events:
            return []
        with self._unit.transaction() as tx:
            tx.append_audit(events)
            return tx.flush_audit()

    def query(self, filters: AuditQuery, *, limit: int, after_seq: int = 0) -> list[AuditRecord]:
        check_page(limit, after_seq)
        with self._unit.reading() as reads:
            return reads.audit_query(filters, limit=limit, after_seq=after_seq)

    def iter_records(self, from_seq: int = 1) -> Iterator[AuditRecord]:
        return iter_audit(self._unit, from_seq, AUDIT_PAGE)

    def iter_chains(self) -> Iterator[AuditRecord]:
        return iter_chains(self._unit, AUDIT_PAGE)

    def heads(self) -> list[ChainHead]:
        with self._unit.reading() as reads:
            return reads.audit_heads()

    def head(self) -> tuple[int, str]:
        heads = self.heads()
        return records_in(heads), heads_root(heads)

    def add_checkpoint(self, token: str, checkpoint: Checkpoint) -> None:
        with self._unit.transaction() as tx:
            tx.add_checkpoint(token, checkpoint)

    def checkpoints(self) -> list[Checkpoint]:
        with self._unit.reading() as reads:
            return reads.checkpoints()

    def last_checkpoint(self) -> Checkpoint | None:
        with self._unit.reading() as reads:
            return reads.last_checkpoint()

    def close(self) -> None:
        self._unit.close()


class BundleFloor:
    """The revision floor of the bundles every process sharing the database may activate
    (store/bundle_floor.py)."""

    def __init__(self, unit: UnitOfWork):
        self._unit = unit

    def current(self) -> Floor | None:
        with self._unit.reading() as reads:
            return reads.bundle_floor()

    def lift(self, revision: int, digest: str, now: float) -> Floor:
        """Raises the floor to `revision` unless it is higher: the floor as it then stands
        (above `revision`: another process activated a newer bundle first)."""
        with self._unit.transaction() as tx:
            return tx.lift_bundle_floor(revision, digest, now)

    def lower(self, revision: int, now: float, record: AuditEvent) -> None:
        """Sets the floor to `revision` (an operator's rollback), with its audit record in
        the same transaction: no rollback without its record."""
        with self._unit.transaction() as tx:
            tx.lower_bundle_floor(revision, now)
            tx.append_audit([record])
