"""A SQLite transaction: the backend's reads and writes on one connection (inside BEGIN
IMMEDIATE for a write transaction, in autocommit for reads). Each operation reads its
own rows: a batch's reads in one statement each cost more instructions here than one
statement per read (docs/performance.md, the storage levers), unlike on PostgreSQL,
where each read is a round trip.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Any

from toolauthz.audit.checkpoint import Checkpoint
from toolauthz.audit.merkle import ChainHead
from toolauthz.audit.records import DEFAULT_CHAINS, AuditRecord
from toolauthz.audit.store import AuditQuery
from toolauthz.store.approvals import ApprovalRecord, approvals_filter
from toolauthz.store.audit_rows import (
    CHAIN_NAMES,
    CHECKPOINTS_IN_ORDER,
    HEADS_SELECT,
    LAST_CHECKPOINT,
    checkpoint_of,
    from_row,
    heads_text,
    to_row,
)
from toolauthz.store.bundle_floor import FloorRows, FloorSql
from toolauthz.store.chains import ChainedAppends
from toolauthz.store.deliveries import DeliveryRows, DeliverySql
from toolauthz.store.ledger import CallEntry, RecordedDecision
from toolauthz.store.rows import (
    APPROVAL_COLUMNS,
    CALL_COLUMNS,
    approval_of,
    approval_values,
    call_of,
    call_values,
    consume_token_sql,
    insert_approval_sql,
    insert_call_sql,
)
from toolauthz.store.sqlite.audit_sql import (
    INSERT,
    SELECT,
    build_query,
)
from toolauthz.store.unit import ApprovalVerdict
from toolauthz.store.usage_rows import UsageRows, UsageSql

_INSERT_CALL = insert_call_sql("?")
_INSERT_APPROVAL = insert_approval_sql("?")
_CONSUME_TOKEN, _MARK_VERIFIED = consume_token_sql("?")
# A call's budget share is held while it is allowed, or its approval is pending (not yet
# expired at the new call's time) or approved.
_RUN_COUNTS = (
    "SELECT count(*), coalesce(sum(tool = ?), 0) FROM calls WHERE tenant = ? AND request_id = ? "
    "AND (decision = 'ALLOW' OR EXISTS (SELECT 1 FROM approvals a WHERE a.approval_id = calls.approval_id "
    "AND (a.status = 'approved' OR (a.status = 'pending' AND a.expires_at >= ?))))")
# The last seq (chain NULL), then the heads a WHERE clause appended names.
_HEADS_AND_LAST_SEQ = ("SELECT NULL, coalesce(max(seq), 0), NULL FROM audit_record UNION ALL "
                       "SELECT chain, seq, hash FROM audit_head")
# Calls that ended: their outcome was reported, or they were denied (never executable).
_ENDED = ("SELECT tenant, call_id, approval_id FROM calls WHERE (outcome != '' AND outcome_at < ?) "
          "OR (decision = 'DENY' AND created_at < ?) LIMIT ?")


class SqliteTransaction(ChainedAppends, DeliveryRows, UsageRows, FloorRows):
    """The backend's reads and writes on one connection (inside BEGIN IMMEDIATE for a
    transaction, in autocommit for reads)."""

    _delivery_sql = DeliverySql.with_mark("?")
    _usage_sql = UsageSql.with_mark("?")
    _floor_sql = FloorSql.with_mark("?")

    def __init__(self, db: sqlite3.Connection, chains: int = DEFAULT_CHAINS):
        super().__init__(chains)
        self._db = db

    def _rows(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        return list(self._db.execute(sql, params).fetchall())

    def _write(self, sql: str, params: Sequence[Any]) -> int:
        return int(self._db.execute(sql, params).rowcount)

    def _send(self, sql: str, params: Sequence[Any]) -> None:
        self._db.execute(sql, params)

    def get_call(self, tenant: str, call_id: str) -> CallEntry | None:
        row = self._db.execute(f"SELECT {CALL_COLUMNS} FROM calls WHERE tenant = ? AND call_id = ?",
                               (tenant, call_id)).fetchone()
        return call_of(row) if row is not None else None

    def run_counts(self, entry: CallEntry) -> tuple[int, int]:
        calls, tool_calls = self._db.execute(
            _RUN_COUNTS, (entry.tool, entry.tenant, entry.request_id, entry.created_at)).fetchone()
        return int(calls), int(tool_calls)

    def run_counts_of(self, entries: Sequence[CallEntry]) -> list[tuple[int, int]]:
        return [self.run_counts(entry) for entry in entries]

    def read_ahead(self, calls: Sequence[tuple[str, str]], runs: Sequence[CallEntry]) -> None:
        """Nothing: a read of the file costs no round trip."""

    def get_approval(self, approval_id: str) -> ApprovalRecord | None:
        row = self._db.execute(f"SELECT {APPROVAL_COLUMNS} FROM approvals WHERE approval_id = ?",
                               (approval_id,)).fetchone()
        return approval_of(row) if row else None

    def count_pending_approvals(self, now: float) -> int:
        row = self._db.execute("SELECT count(*) FROM approvals WHERE status = 'pending' AND expires_at >= ?",
                               (now,)).fetchone()
        return int(row[0])

    def list_approvals(self, *, tenant: str, status: str, group: str, now: float,
                       limit: int) -> list[ApprovalRecord]:
        where, args = approvals_filter(tenant=tenant, status=status, group=group, now=now, mark="?")
        sql = f"SELECT {APPROVAL_COLUMNS} FROM approvals {where} ORDER BY approval_id DESC LIMIT ?"
        return [approval_of(r) for r in self._db.execute(sql, (*args, limit)).fetchall()]

    def audit_query(self, filters: AuditQuery, *, limit: int, after_seq: int) -> list[AuditRecord]:
        sql, params = build_query(filters, after_seq, limit)
        return [from_row(row) for row in self._db.execute(sql, params).fetchall()]

    def audit_page(self, after_seq: int, limit: int) -> list[AuditRecord]:
        rows = self._db.execute(f"{SELECT} WHERE seq > ? ORDER BY seq LIMIT ?", (after_seq, limit)).fetchall()
        return [from_row(row) for row in rows]

    def audit_chain_page(self, chain: str, after: int, limit: int) -> list[AuditRecord]:
        rows = self._db.execute(f"{SELECT} WHERE chain = ? AND chain_seq > ? ORDER BY chain_seq LIMIT ?",
                                (chain, after, limit)).fetchall()
        return [from_row(row) for row in rows]

    def audit_chain_names(self) -> list[str]:
        return [str(row[0]) for row in self._db.execute(CHAIN_NAMES).fetchall()]

    def audit_heads(self) -> list[ChainHead]:
        return [ChainHead(str(c), int(n), str(h)) for c, n, h in self._db.execute(HEADS_SELECT).fetchall()]

    def checkpoints(self) -> list[Checkpoint]:
        return [checkpoint_of(row) for row in self._db.execute(CHECKPOINTS_IN_ORDER).fetchall()]

    def last_checkpoint(self) -> Checkpoint | None:
        row = self._db.execute(LAST_CHECKPOINT).fetchone()
        return checkpoint_of(row) if row else None

    # -- writes --

    def bound(self, seconds: float) -> None:
        """Nothing to bound: the file's one writer already holds it, and a local write
        takes what the disk takes (the write lock's wait is bounded by busy_timeout)."""

    def lock(self, keys: Sequence[str]) -> None:
        """Nothing to add: this transaction is the file's one writer."""

    def insert_call(self, entry: CallEntry, decided: RecordedDecision) -> None:
        self._db.execute(_INSERT_CALL, call_values(entry, decided))

    def consume_token(self, tenant: str, call_id: str, jti: str, now: float) -> bool:
        inserted = self._db.execute(_CONSUME_TOKEN, (jti, tenant, call_id, now)).rowcount
        updated = self._db.execute(_MARK_VERIFIED, (jti, now, tenant, call_id)).rowcount
        return bool(inserted and updated)

    def set_outcome(self, entry: CallEntry) -> None:
        self._db.execute("UPDATE calls SET outcome = ?, outcome_at = ?, extra = ? WHERE tenant = ? AND call_id = ?",
                         (entry.outcome, entry.outcome_at, json.dumps(entry.extra), entry.tenant, entry.call_id))

    def create_approval(self, r: ApprovalRecord) -> None:
        self._db.execute(_INSERT_APPROVAL, approval_values(r))

    def decide_approval(self, v: ApprovalVerdict) -> bool:
        return bool(self._db.execute(
            "UPDATE approvals SET status = ?, approver = ?, reason = ?, decided_at = ?, token = ?, token_jti = ?, "
            "token_expires_at = ?, approved_version = ?, call_input = x'', call_entities = x'' "
            "WHERE approval_id = ? AND status = 'pending' AND expires_at >= ?",
            (v.status, v.approver, v.reason, v.now, v.token, v.token_jti, v.token_expires_at, v.approved_version,
             v.approval_id, v.now)).rowcount == 1)

    def erase_expired_inputs(self, now: float) -> None:
        self._db.execute("UPDATE approvals SET call_input = x'', call_entities = x'' WHERE status = 'pending' "
                         "AND expires_at < ? AND (call_input != x'' OR call_entities != x'')", (now,))

    def _lock_heads(self, chains: list[str], count: int) -> tuple[dict[str, tuple[int, str]], list[int]]:
        # Read under the write lock this transaction holds: no other writer can append
        # between this read and the commit. The heads and the last seq in one statement.
        marks = ", ".join("?" * len(chains))
        heads: dict[str, tuple[int, str]] = {}
        last = 0
        for chain, seq, hash_ in self._db.execute(f"{_HEADS_AND_LAST_SEQ} WHERE chain IN ({marks})", chains):
            if chain is None:
                last = int(seq)
            else:
                heads[str(chain)] = (int(seq), str(hash_))
        return heads, list(range(last + 1, last + 1 + count))

    def _write_records(self, records: list[AuditRecord], heads: list[ChainHead]) -> None:
        self._db.executemany(INSERT, [to_row(r) for r in records])
        self._db.executemany("UPDATE audit_head SET seq = ?, hash = ? WHERE chain = ?",
                             [(h.seq, h.hash, h.chain) for h in heads])

    def ended_calls(self, before: float, limit: int) -> list[tuple[str, str, str]]:
        rows = self._db.execute(_ENDED, (before, before, limit)).fetchall()
        return [(str(t), str(c), str(a)) for t, c, a in rows]

    def delete_calls(self, calls: Sequence[tuple[str, str, str]]) -> None:
        self._db.executemany("DELETE FROM consumed_tokens WHERE tenant = ? AND call_id = ?",
                            [(t, c) for t, c, _ in calls])
        self._db.executemany("DELETE FROM approvals WHERE approval_id = ?", [(a,) for _, _, a in calls if a])
        self._db.executemany("DELETE FROM calls WHERE tenant = ? AND call_id = ?", [(t, c) for t, c, _ in calls])

    def notify_approval(self, approval_id: str) -> None:
        """Processes sharing a file learn of decisions by looking again (MAX_WATCH_WAIT)."""

    def add_checkpoint(self, token: str, checkpoint: Checkpoint) -> None:
        self._db.execute("INSERT INTO audit_checkpoint (count, head_hash, time, kid, token, heads) "
                         "VALUES (?, ?, ?, ?, ?, ?)", (checkpoint.count, checkpoint.head_hash, checkpoint.time,
                                                       checkpoint.kid, token, heads_text(checkpoint)))

