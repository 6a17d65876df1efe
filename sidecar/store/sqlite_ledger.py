"""SQLite call ledger: every read-modify-write in one BEGIN IMMEDIATE transaction."""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from sidecar.display import shown
from sidecar.errors import ConflictError, ForbiddenError, NotFoundError, StoreUnavailable
from sidecar.store.group_commit import GroupCommit, ItemFailed
from sidecar.store.ledger import (
    AppendAudit,
    CallEntry,
    ConsumeToken,
    Decide,
    LedgerOp,
    RecordedDecision,
    RecordOutcome,
    Reservation,
    ReserveCall,
    only_result,
)
from sidecar.store.sqlite_base import SqliteDatabase, require_same_file

if TYPE_CHECKING:
    from sidecar.audit.records import AuditEvent
    from sidecar.audit.sqlite import SqliteAuditLog
    from sidecar.store.sqlite_approvals import SqliteApprovals

_SCHEMA = """
CREATE TABLE IF NOT EXISTS calls (
    tenant TEXT NOT NULL,
    call_id TEXT NOT NULL,
    request_id TEXT NOT NULL,
    tool TEXT NOT NULL,
    digest TEXT NOT NULL,
    principal TEXT NOT NULL,
    created_at REAL NOT NULL,
    decision TEXT NOT NULL DEFAULT '',
    decision_id TEXT NOT NULL DEFAULT '',
    policy_version TEXT NOT NULL DEFAULT '',
    reasons TEXT NOT NULL DEFAULT '[]',
    errors TEXT NOT NULL DEFAULT '[]',
    approval_id TEXT NOT NULL DEFAULT '',
    verified_jti TEXT NOT NULL DEFAULT '',
    verified_at REAL,
    outcome TEXT NOT NULL DEFAULT '',
    outcome_at REAL,
    extra TEXT NOT NULL DEFAULT '{}',
    PRIMARY KEY (tenant, call_id)
);
CREATE INDEX IF NOT EXISTS calls_by_run ON calls (tenant, request_id, tool);
CREATE TABLE IF NOT EXISTS consumed_tokens (
    jti TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    call_id TEXT NOT NULL,
    consumed_at REAL NOT NULL
);
"""
_COLUMNS = ("tenant, call_id, request_id, tool, digest, principal, created_at, decision, decision_id, "
            "policy_version, reasons, errors, approval_id, verified_jti, verified_at, outcome, outcome_at, extra")


def _json_columns(reasons: tuple[str, ...], errors: tuple[tuple[str, str], ...]) -> tuple[str, str]:
    """The `reasons` and `errors` columns, as `_get` reads them back."""
    return json.dumps(list(reasons)), json.dumps([list(e) for e in errors])


class SqliteLedger(SqliteDatabase):
    """`audit`: the audit log in the same database file, for the decisions and
    verifications whose audit record commits with their ledger write; `approvals`: the
    approval store in that file, for the approvals opened by the decisions asking for
    them."""

    def __init__(self, path: str, audit: SqliteAuditLog | None = None, approvals: SqliteApprovals | None = None):
        require_same_file(path, audit, "audit log")
        require_same_file(path, approvals, "approval store")
        super().__init__(path, _SCHEMA, label="ledger")
        self._audit = audit
        self._approvals = approvals
        # The writes every decision and every verification make: concurrent ones share a
        # transaction (group_commit.py) rather than queue on the write lock one by one.
        self._writes: GroupCommit[Callable[[sqlite3.Connection], Any], Any] = GroupCommit(
            self._run_writes, name="ledger")

    def _run_writes(self, writes: Sequence[Callable[[sqlite3.Connection], Any]]) -> list[Any]:
        failed = self._draft(writes)
        with self.transaction() as db:
            return [failed.get(i) or write(db) for i, write in enumerate(writes)]

    def _draft(self, writes: Sequence[Callable[[sqlite3.Connection], Any]]) -> dict[int, ItemFailed]:
        """Before the write lock, on this (the leader's) thread, one after the other: each
        reservation decided on the run's counts as read now plus the reservations ahead
        of it in this batch. Every process's writes queue on that lock, and 32 threads
        each running Cedar would contend for the interpreter lock instead (measured: 4x
        the context switches and 1.6x the CPU per call); the transaction decides again
        only where this guess was wrong."""
        failed: dict[int, ItemFailed] = {}
        ahead: Counter[tuple[str, ...]] = Counter()
        calls_seen: set[tuple[str, str]] = set()
        for i, write in enumerate(writes):
            if not isinstance(write, _Reserve) or write.decide is None:
                continue
            key = (write.entry.tenant, write.entry.call_id)
            if key in calls_seen:
                continue  # a second reservation of one call in this batch finds the first
            calls_seen.add(key)
            run = (write.entry.tenant, write.entry.request_id)
            try:
                calls, tool_calls = self.read(self._run_counts_of(write.entry))
                drafted = write.decide(calls + ahead[run], tool_calls + ahead[(*run, write.entry.tool)])
            except StoreUnavailable:
                continue  # the transaction reads again (or fails the batch)
            except Exception as exc:  # noqa: BLE001 - this call's failure alone: nothing of it is written
                failed[i] = ItemFailed(exc)
                continue
            if drafted is not None and drafted.uses_run_budget:
                ahead[run] += 1
                ahead[(*run, write.entry.tool)] += 1
        return failed

    def close(self) -> None:
        self._writes.close()
        super().close()

    def apply(self, ops: Sequence[LedgerOp]) -> list[Any]:
        return self._writes.submit_many([self._write_for(op) for op in ops])

    def _write_for(self, op: LedgerOp) -> Callable[[sqlite3.Connection], Any]:
        """The batch item of one operation; a misuse fails that operation alone."""
        if isinstance(op, ReserveCall):
            return _Reserve(self, op.entry, op.decide)
        if not isinstance(op, (ConsumeToken, RecordOutcome, AppendAudit)):
            return lambda db: ItemFailed(TypeError(f"not a ledger operation: {op!r}"))
        if self._audit is None and (isinstance(op, AppendAudit) or op.audit is not None
                                    or (isinstance(op, RecordOutcome) and op.refused is not None)):
            return lambda db: ItemFailed(RuntimeError("an audit record needs a ledger with an audit log"))
        if isinstance(op, ConsumeToken):
            return lambda db: self._consume(db, op)
        if isinstance(op, RecordOutcome):
            return lambda db: self._record_outcome(db, op)

        def append(db: sqlite3.Connection) -> None:
            self._append(db, [op.event])
        return append

    def reserve(self, entry: CallEntry, decide: Decide | None = None) -> Reservation:
        reservation: Reservation = only_result(self.apply([ReserveCall(entry, decide)]))
        return reservation

    def _reserve(self, db: sqlite3.Connection, entry: CallEntry, decide: Decide | None) -> Reservation | ItemFailed:
        existing = self._get(db, entry.tenant, entry.call_id)
        if existing is not None:
            return Reservation(existing)
        calls, tool_calls = self._run_counts_of(entry)(db)
        try:
            decided = decide(calls, tool_calls) if decide is not None else None
        except Exception as exc:  # noqa: BLE001 - this call's failure alone: nothing of it is written
            return ItemFailed(exc)
        if decided is None:
            decided = RecordedDecision("", "", "")
        if decided.audit is not None and self._audit is None:
            return ItemFailed(RuntimeError("a decision with an audit record needs a ledger with an audit log"))
        if decided.approval is not None and self._approvals is None:
            return ItemFailed(RuntimeError("a decision opening an approval needs a ledger with an approval store"))
        db.execute(
            "INSERT INTO calls (tenant, call_id, request_id, tool, digest, principal, created_at, decision, "
            "decision_id, policy_version, reasons, errors, approval_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (entry.tenant, entry.call_id, entry.request_id, entry.tool, entry.digest, entry.principal,
             entry.created_at, decided.decision, decided.decision_id, decided.policy_version,
             *_json_columns(decided.reasons, decided.errors),
             decided.approval.approval_id if decided.approval is not None else ""))
        if decided.approval is not None:
            self._approvals.create_in(db, decided.approval)  # type: ignore[union-attr]  # checked above
        if decided.audit is not None:
            self._append(db, [decided.audit])
        return Reservation(None)

    def _run_counts_of(self, entry: CallEntry) -> Callable[[sqlite3.Connection], tuple[int, int]]:
        return lambda db: self._run_counts(db, entry, self._approvals is not None)

    @staticmethod
    def _run_counts(db: sqlite3.Connection, entry: CallEntry, with_approvals: bool) -> tuple[int, int]:
        """The run's calls that hold a share of its budget, of all tools and of the entry's
        tool: those allowed, and those whose approval is pending (not yet expired at the
        entry's time) or approved. Without an approval store in this file every call that
        asked for approval counts: it may still be approved."""
        held = ("decision = 'ALLOW' OR EXISTS (SELECT 1 FROM approvals a WHERE a.approval_id = calls.approval_id"
                " AND (a.status = 'approved' OR (a.status = 'pending' AND a.expires_at >= ?)))") \
            if with_approvals else "decision IN ('ALLOW', 'APPROVAL_REQUIRED')"
        args = (entry.created_at,) if with_approvals else ()
        calls, tool_calls = db.execute(
            "SELECT count(*), coalesce(sum(tool = ?), 0) FROM calls WHERE tenant = ? AND request_id = ? "
            f"AND ({held})", (entry.tool, entry.tenant, entry.request_id, *args)).fetchone()
        return int(calls), int(tool_calls)

    def get(self, tenant: str, call_id: str) -> CallEntry | None:
        return self.read(lambda db: self._get(db, tenant, call_id))

    def consume(self, tenant: str, call_id: str, jti: str, now: float,
                audit: Callable[[str], AuditEvent] | None = None) -> str:
        code: str = only_result(self.apply([ConsumeToken(tenant, call_id, jti, now, audit)]))
        return code

    def _consume(self, db: sqlite3.Connection, op: ConsumeToken) -> str:
        code = self._consume_code(db, op.tenant, op.call_id, op.jti, op.now)
        if op.audit is not None:
            self._append(db, [op.audit(code)])
        return code

    def _consume_code(self, db: sqlite3.Connection, tenant: str, call_id: str, jti: str, now: float) -> str:
        entry = self._get(db, tenant, call_id)
        if entry is None:
            return "unknown_call"
        if entry.outcome and not entry.verified_jti:
            return "call_closed"  # reported as ended (e.g. cancelled) before it ran
        inserted = db.execute(
            "INSERT INTO consumed_tokens (jti, tenant, call_id, consumed_at) VALUES (?, ?, ?, ?) "
            "ON CONFLICT DO NOTHING", (jti, tenant, call_id, now)).rowcount
        # One execution per call, whichever of its tokens comes first.
        updated = db.execute(
            "UPDATE calls SET verified_jti = ?, verified_at = ? WHERE tenant = ? AND call_id = ? AND verified_jti = ''",
            (jti, now, tenant, call_id)).rowcount
        return "ok" if inserted and updated else "already_used"

    def record_outcome(self, tenant: str, call_id: str, status: str, error_code: str, output_digest: str,
                       now: float) -> CallEntry:
        entry: CallEntry = only_result(self.apply([RecordOutcome(tenant, call_id, status, error_code, output_digest,
                                                                 now)]))
        return entry

    def _append(self, db: sqlite3.Connection, events: list[AuditEvent]) -> None:
        """Audit records in this transaction; `_write_for` refuses any operation that
        carries one when the ledger has no audit log, so this never finds it missing."""
        if self._audit is None:
            raise RuntimeError("an audit record needs a ledger with an audit log")
        self._audit.append_in(db, events)

    def _record_outcome(self, db: sqlite3.Connection, op: RecordOutcome) -> CallEntry | ItemFailed:
        entry = self._get(db, op.tenant, op.call_id)
        if entry is None:
            return ItemFailed(NotFoundError(f"no call `{shown(op.call_id)}` in tenant `{shown(op.tenant)}`"))
        if op.caller is not None and (entry.principal, entry.request_id) != (op.caller.principal,
                                                                            op.caller.request_id):
            if op.refused is not None:
                self._append(db, [op.refused(entry)])
            return ItemFailed(ForbiddenError(
                f"call `{shown(op.call_id)}` was decided for another principal or run; only they report its outcome"))
        if entry.outcome:
            if (entry.outcome, entry.extra.get("error_code", ""), entry.extra.get("output_digest", "")) == \
                    (op.status, op.error_code, op.output_digest):
                return entry  # a retry of the report that set it: its answer again, recorded once
            return ItemFailed(ConflictError(f"call `{shown(op.call_id)}` already has the outcome `{entry.outcome}`"))
        extra = {**entry.extra, "error_code": op.error_code, "output_digest": op.output_digest}
        db.execute("UPDATE calls SET outcome = ?, outcome_at = ?, extra = ? WHERE tenant = ? AND call_id = ?",
                   (op.status, op.now, json.dumps(extra), op.tenant, op.call_id))
        # What that row now holds, without reading it back.
        entry = replace(entry, outcome=op.status, outcome_at=op.now, extra=extra)
        if op.audit is not None:
            self._append(db, [op.audit(entry)])
        return entry

    @staticmethod
    def _get(db: sqlite3.Connection, tenant: str, call_id: str) -> CallEntry | None:
        row = db.execute(f"SELECT {_COLUMNS} FROM calls WHERE tenant = ? AND call_id = ?", (tenant, call_id)).fetchone()
        if row is None:
            return None
        (tenant, call_id, request_id, tool, digest, principal, created_at, decision, decision_id, version,
         reasons, errors, approval_id, verified_jti, verified_at, outcome, outcome_at, extra) = row
        return CallEntry(tenant, call_id, request_id, tool, digest, principal, created_at, decision, decision_id,
                         version, tuple(json.loads(reasons)), tuple(tuple(e) for e in json.loads(errors)),
                         approval_id, verified_jti, verified_at, outcome, outcome_at, json.loads(extra))


class _Reserve:
    """A reservation as an item of a write batch (`_draft` looks for these)."""

    __slots__ = ("ledger", "entry", "decide")

    def __init__(self, ledger: SqliteLedger, entry: CallEntry, decide: Decide | None):
        self.ledger, self.entry, self.decide = ledger, entry, decide

    def __call__(self, db: sqlite3.Connection) -> Reservation | ItemFailed:
        return self.ledger._reserve(db, self.entry, self.decide)
