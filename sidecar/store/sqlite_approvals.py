"""SQLite approvals, in the same database file as the call ledger."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sidecar.store.approvals import EXPIRED, PENDING, ApprovalRecord
from sidecar.store.sqlite_base import SqliteDatabase, require_same_file

if TYPE_CHECKING:
    from sidecar.audit.records import AuditEvent
    from sidecar.audit.sqlite import SqliteAuditLog

_SCHEMA = """
CREATE TABLE IF NOT EXISTS approvals (
    approval_id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    call_id TEXT NOT NULL,
    request_id TEXT NOT NULL,
    requester_type TEXT NOT NULL,
    requester_id TEXT NOT NULL,
    tool TEXT NOT NULL,
    resource TEXT NOT NULL,
    group_name TEXT NOT NULL,
    policy_id TEXT NOT NULL,
    digest TEXT NOT NULL,
    short_code TEXT NOT NULL,
    decision_id TEXT NOT NULL,
    policy_version TEXT NOT NULL,
    created_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    fields TEXT NOT NULL,
    status TEXT NOT NULL,
    decided_at REAL,
    approver TEXT NOT NULL DEFAULT '',
    reason TEXT NOT NULL DEFAULT '',
    token TEXT NOT NULL DEFAULT '',
    token_jti TEXT NOT NULL DEFAULT '',
    token_expires_at REAL,
    call_input BLOB NOT NULL DEFAULT x'',
    call_entities BLOB NOT NULL DEFAULT x'',
    run_calls INTEGER NOT NULL DEFAULT 0,
    run_tool_calls INTEGER NOT NULL DEFAULT 0,
    approved_version TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS approvals_by_tenant ON approvals (tenant, status, group_name);
"""
_COLUMNS = ("approval_id, tenant, call_id, request_id, requester_type, requester_id, tool, resource, group_name, "
            "policy_id, digest, short_code, decision_id, policy_version, created_at, expires_at, fields, status, "
            "decided_at, approver, reason, token, token_jti, token_expires_at, call_input, call_entities, run_calls, "
            "run_tool_calls, approved_version")
# Columns added after the table's first version, with their definitions: a database
# file created before them gets them when it is opened.
_ADDED_COLUMNS = {"call_input": "BLOB NOT NULL DEFAULT x''", "call_entities": "BLOB NOT NULL DEFAULT x''",
                  "run_calls": "INTEGER NOT NULL DEFAULT 0", "run_tool_calls": "INTEGER NOT NULL DEFAULT 0",
                  "approved_version": "TEXT NOT NULL DEFAULT ''"}
# The arguments of a call are kept only while its approval can still be decided.
_ERASE_EXPIRED_INPUTS = ("UPDATE approvals SET call_input = x'', call_entities = x'' "
                         "WHERE status = 'pending' AND expires_at < ? AND (call_input != x'' OR call_entities != x'')")


class SqliteApprovals(SqliteDatabase):
    """`audit`: the audit log in the same database file, for the decisions on approvals
    whose record commits with them."""

    def __init__(self, path: str, audit: SqliteAuditLog | None = None):
        require_same_file(path, audit, "audit log")
        super().__init__(path, _SCHEMA, label="approvals")
        self._audit = audit
        self._add_missing_columns()

    def _add_missing_columns(self) -> None:
        with self.transaction() as db:
            present = {row[1] for row in db.execute("PRAGMA table_info(approvals)")}
            for name, definition in _ADDED_COLUMNS.items():
                if name not in present:
                    db.execute(f"ALTER TABLE approvals ADD COLUMN {name} {definition}")

    def create(self, r: ApprovalRecord) -> None:
        with self.transaction() as db:
            self.create_in(db, r)

    @staticmethod
    def create_in(db: sqlite3.Connection, r: ApprovalRecord) -> None:
        """Insert inside a write transaction the caller holds on this database: how the
        call ledger stores an approval with the decision that asks for it."""
        db.execute(_ERASE_EXPIRED_INPUTS, (r.created_at,))
        db.execute(f"INSERT INTO approvals ({_COLUMNS}) VALUES ({', '.join('?' * 29)})",
                   (r.approval_id, r.tenant, r.call_id, r.request_id, r.requester_type, r.requester_id, r.tool,
                    r.resource, r.group, r.policy_id, r.digest, r.short_code, r.decision_id, r.policy_version,
                    r.created_at, r.expires_at, json.dumps(r.fields), r.status, r.decided_at, r.approver,
                    r.reason, r.token, r.token_jti, r.token_expires_at, r.call_input, r.call_entities,
                    r.run_calls, r.run_tool_calls, r.approved_version))

    def get(self, approval_id: str) -> ApprovalRecord | None:
        row = self.read(lambda db: db.execute(
            f"SELECT {_COLUMNS} FROM approvals WHERE approval_id = ?", (approval_id,)).fetchone())
        return _record(row) if row else None

    def list(self, *, tenant: str = "", status: str = "", group: str = "", now: float,
             limit: int = 100) -> list[ApprovalRecord]:
        where: list[str] = []
        args: list[object] = []
        if tenant:
            where.append("tenant = ?")
            args.append(tenant)
        if group:
            where.append("group_name = ?")
            args.append(group)
        if status == EXPIRED:
            where.append("status = 'pending' AND expires_at < ?")
            args.append(now)
        elif status == PENDING:
            where.append("status = 'pending' AND expires_at >= ?")
            args.append(now)
        elif status:
            where.append("status = ?")
            args.append(status)
        sql = f"SELECT {_COLUMNS} FROM approvals {'WHERE ' + ' AND '.join(where) if where else ''} " \
              "ORDER BY approval_id DESC LIMIT ?"
        rows = self.read(lambda db: db.execute(sql, (*args, limit)).fetchall())
        return [_record(r).as_of(now) for r in rows]

    def count_pending(self, now: float) -> int:
        """Approvals waiting for a decision and not yet expired (for the metrics)."""
        row = self.read(lambda db: db.execute(
            "SELECT count(*) FROM approvals WHERE status = 'pending' AND expires_at >= ?", (now,)).fetchone())
        return int(row[0])

    def decide(self, approval_id: str, *, status: str, approver: str, reason: str, now: float, token: str = "",
               token_jti: str = "", token_expires_at: float | None = None, approved_version: str = "",
               audit: Callable[[bool], AuditEvent] | None = None) -> bool:
        if audit is not None and self._audit is None:
            raise RuntimeError("an audited approval decision needs an approval store with an audit log")
        with self.transaction() as db:
            won = db.execute(
                "UPDATE approvals SET status = ?, approver = ?, reason = ?, decided_at = ?, token = ?, token_jti = ?, "
                "token_expires_at = ?, approved_version = ?, call_input = x'', call_entities = x'' "
                "WHERE approval_id = ? AND status = 'pending' AND expires_at >= ?",
                (status, approver, reason, now, token, token_jti, token_expires_at, approved_version, approval_id,
                 now)).rowcount == 1
            db.execute(_ERASE_EXPIRED_INPUTS, (now,))
            if audit is not None:
                self._audit.append_in(db, [audit(won)])  # type: ignore[union-attr]  # checked on entry
        return won


def _record(row: sqlite3.Row | tuple[Any, ...]) -> ApprovalRecord:
    values = list(row)
    values[16] = json.loads(values[16])
    values[24], values[25] = bytes(values[24]), bytes(values[25])
    return ApprovalRecord(*values)
