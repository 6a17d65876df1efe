"""SQLite call ledger. WAL mode, one connection per thread, BEGIN IMMEDIATE for every
read-modify-write so that several processes sharing the file stay consistent."""

from __future__ import annotations

import json
import sqlite3
import threading
from contextlib import contextmanager
from typing import Iterator

from sidecar.errors import ConflictError, NotFoundError, StoreUnavailable
from sidecar.store.ledger import CallEntry, Reservation

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


class SqliteLedger:
    def __init__(self, path: str):
        self._path = path
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._all_lock = threading.Lock()
        try:
            self._conn().executescript(_SCHEMA)
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"ledger `{path}`: {exc}") from exc

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self._path, isolation_level=None, timeout=10.0, check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA busy_timeout=10000")
            self._local.conn = conn
            with self._all_lock:
                self._all.append(conn)
        return conn

    @contextmanager
    def _tx(self, immediate: bool = True) -> Iterator[sqlite3.Connection]:
        try:
            conn = self._conn()
            conn.execute("BEGIN IMMEDIATE" if immediate else "BEGIN")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"ledger `{self._path}`: {exc}") from exc

    def reserve(self, entry: CallEntry) -> Reservation:
        with self._tx() as db:
            existing = self._get(db, entry.tenant, entry.call_id)
            if existing is not None:
                return Reservation(existing)
            calls, tool_calls = db.execute(
                "SELECT count(*), coalesce(sum(tool = ?), 0) FROM calls WHERE tenant = ? AND request_id = ?",
                (entry.tool, entry.tenant, entry.request_id)).fetchone()
            db.execute(
                "INSERT INTO calls (tenant, call_id, request_id, tool, digest, principal, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (entry.tenant, entry.call_id, entry.request_id, entry.tool, entry.digest, entry.principal, entry.created_at))
            return Reservation(None, calls, tool_calls)

    def complete(self, tenant, call_id, *, decision, decision_id, policy_version, reasons, errors, approval_id=""):
        with self._tx() as db:
            db.execute(
                "UPDATE calls SET decision = ?, decision_id = ?, policy_version = ?, reasons = ?, errors = ?, "
                "approval_id = ? WHERE tenant = ? AND call_id = ? AND decision = ''",
                (decision, decision_id, policy_version, json.dumps(list(reasons)), json.dumps([list(e) for e in errors]),
                 approval_id, tenant, call_id))

    def get(self, tenant: str, call_id: str) -> CallEntry | None:
        with self._tx(immediate=False) as db:
            return self._get(db, tenant, call_id)

    def consume(self, tenant: str, call_id: str, jti: str, now: float) -> str:
        with self._tx() as db:
            if self._get(db, tenant, call_id) is None:
                return "unknown_call"
            inserted = db.execute(
                "INSERT INTO consumed_tokens (jti, tenant, call_id, consumed_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT DO NOTHING", (jti, tenant, call_id, now)).rowcount
            # One execution per call, whichever of its tokens comes first.
            updated = db.execute(
                "UPDATE calls SET verified_jti = ?, verified_at = ? WHERE tenant = ? AND call_id = ? AND verified_jti = ''",
                (jti, now, tenant, call_id)).rowcount
            return "ok" if inserted and updated else "already_used"

    def record_outcome(self, tenant, call_id, status, error_code, output_digest, now) -> CallEntry:
        with self._tx() as db:
            entry = self._get(db, tenant, call_id)
            if entry is None:
                raise NotFoundError(f"no call `{call_id}` in tenant `{tenant}`")
            if entry.outcome:
                raise ConflictError(f"call `{call_id}` already has the outcome `{entry.outcome}`")
            extra = {**entry.extra, "error_code": error_code, "output_digest": output_digest}
            db.execute("UPDATE calls SET outcome = ?, outcome_at = ?, extra = ? WHERE tenant = ? AND call_id = ?",
                       (status, now, json.dumps(extra), tenant, call_id))
        return self.get(tenant, call_id)

    def close(self) -> None:
        with self._all_lock:
            for conn in self._all:
                conn.close()
            self._all.clear()
        self._local = threading.local()

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
