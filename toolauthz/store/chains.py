"""Appending to the audit chains, for every backend: what a transaction's audit records
are queued as, and how they are chained at its end.

A transaction queues its events as it goes (`append_audit`) and chains them last
(`flush_audit`, which the backend calls before it commits): it locks the heads of the
chains they go to, in one order (chain names sorted), numbers and links each event after
its chain's head, writes the records and the new heads. So the heads are held only for
the end of a transaction, and two transactions that append to different chains never
wait for each other (PostgreSQL; SQLite has one writer anyway).
"""

from __future__ import annotations

from collections.abc import Sequence

from toolauthz.audit.merkle import ChainHead
from toolauthz.audit.records import AuditEvent, AuditRecord, canonical_body, chain_of, record_hash
from toolauthz.errors import StoreUnavailable


class ChainedAppends:
    """The audit half of a backend's transaction. A backend implements `_lock_heads`
    and `_write_records`."""

    def __init__(self, chains: int):
        self._chains = chains
        self._queued: list[AuditEvent] = []

    def append_audit(self, events: Sequence[AuditEvent]) -> None:
        """Queues `events`, chained when the transaction ends (or at `flush_audit`)."""
        self._queued.extend(events)

    def flush_audit(self) -> list[AuditRecord]:
        """Chains and writes what is queued; the records, in the order queued."""
        events, self._queued = self._queued, []
        if not events:
            return []
        names = [chain_of(event, self._chains) for event in events]
        wanted = sorted(set(names))
        heads, seqs = self._lock_heads(wanted, len(events))
        missing = [name for name in wanted if name not in heads]
        if missing:
            raise StoreUnavailable(f"the audit trail has no head for chain `{missing[0]}`: its heads were deleted")
        records = []
        for i, (event, name) in enumerate(zip(events, names, strict=True)):
            seq, prev = heads[name]
            seq += 1
            digest = record_hash(prev, canonical_body(seq, event, name))
            records.append(AuditRecord(seqs[i], event, prev, digest, name, seq))
            heads[name] = (seq, digest)
        self._write_records(records, [ChainHead(name, *heads[name]) for name in wanted])
        return records

    def _lock_heads(self, chains: list[str], count: int) -> tuple[dict[str, tuple[int, str]], list[int]]:
        """Locks the heads of `chains` (sorted) until the transaction ends and returns
        them, with `count` increasing cursors (`seq`) for the records, drawn once the
        heads are locked (so that seq increases along each chain)."""
        raise NotImplementedError

    def _write_records(self, records: list[AuditRecord], heads: list[ChainHead]) -> None:
        raise NotImplementedError
