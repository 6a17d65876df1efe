"""The SQLite backend: one file holds the call ledger, the approvals and the audit trail.

Connections: one per thread, created on first use and all closed by `close()` (meant
for a bounded thread pool). With WAL, readers see a snapshot and never wait for the
writer. Writers take the process's WriteLock (threads and processes sharing the file),
then BEGIN IMMEDIATE, so the chains' heads and the run counts read in a transaction are
those its commit leaves behind (one writer: `Transaction.lock` has nothing to add); the
log is synced after the lock is released. The audit chains are those of every store
(`store/chains.py`), verified alike.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from sidecar.audit.checkpoint import Checkpoint
from sidecar.audit.merkle import ChainHead
from sidecar.audit.records import DEFAULT_CHAINS, GENESIS_HASH, AuditEvent, AuditRecord
from sidecar.audit.store import AuditQuery
from sidecar.errors import StoreUnavailable
from sidecar.store.approvals import ApprovalRecord, approvals_filter
from sidecar.store.audit_rows import (
    CHAIN_NAMES,
    CHECKPOINTS_IN_ORDER,
    HEADS_SELECT,
    LAST_CHECKPOINT,
    checkpoint_of,
    from_row,
    heads_text,
    to_row,
)
from sidecar.store.chains import ChainedAppends
from sidecar.store.deliveries import SCHEMA as DELIVERY_SCHEMA
from sidecar.store.deliveries import DeliveryRows, DeliverySql
from sidecar.store.ledger import CallEntry, RecordedDecision
from sidecar.store.rows import (
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
from sidecar.store.rules import Store
from sidecar.store.sqlite.audit_sql import (
    INSERT,
    SELECT,
    audit_columns_added_later,
    audit_schema,
    build_query,
    chains_migration,
)
from sidecar.store.sqlite.base import WriteLock, sync_log
from sidecar.store.sqlite.ledger_sql import ADDED_COLUMNS, LEDGER_SCHEMA
from sidecar.store.unit import ApprovalVerdict
from sidecar.store.usage_rows import SCHEMA as USAGE_SCHEMA
from sidecar.store.usage_rows import UsageRows, UsageSql

SCHEMA_VERSION = 2  # 2: several audit chains (audit_sql.chains_migration)

_INSERT_CALL = insert_call_sql("?")
_INSERT_APPROVAL = insert_approval_sql("?")
_CONSUME_TOKEN, _MARK_VERIFIED = consume_token_sql("?")
# A call's budget share is held while it is allowed, or its approval is pending (not yet
# expired at the new call's time) or approved.
_RUN_COUNTS = (
    "SELECT count(*), coalesce(sum(tool = ?), 0) FROM calls WHERE tenant = ? AND request_id = ? "
    "AND (decision = 'ALLOW' OR EXISTS (SELECT 1 FROM approvals a WHERE a.approval_id = calls.approval_id "
    "AND (a.status = 'approved' OR (a.status = 'pending' AND a.expires_at >= ?))))")
_LAST_SEQ = "SELECT coalesce(max(seq), 0) FROM audit_record"
# Calls that ended: their outcome was reported, or they were denied (never executable).
_ENDED = ("SELECT tenant, call_id, approval_id FROM calls WHERE (outcome != '' AND outcome_at < ?) "
          "OR (decision = 'DENY' AND created_at < ?) LIMIT ?")


class SqliteTransaction(ChainedAppends, DeliveryRows, UsageRows):
    """The backend's reads and writes on one connection (inside BEGIN IMMEDIATE for a
    transaction, in autocommit for reads)."""

    _delivery_sql = DeliverySql.with_mark("?")
    _usage_sql = UsageSql.with_mark("?")

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
        # between this read and the commit.
        marks = ", ".join("?" * len(chains))
        rows = self._db.execute(f"SELECT chain, seq, hash FROM audit_head WHERE chain IN ({marks})", chains)
        heads = {str(c): (int(n), str(h)) for c, n, h in rows.fetchall()}
        last = int(self._db.execute(_LAST_SEQ).fetchone()[0])
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


class SqliteUnit:
    def __init__(self, path: str, *, busy_timeout: float = 10.0, chains: int = DEFAULT_CHAINS):
        self.path = str(path)
        self.chains = chains
        self.label = f"database `{self.path}`"
        self._busy_timeout = busy_timeout
        self._local = threading.local()
        self._lock = threading.Lock()
        self._connections: list[sqlite3.Connection] = []
        self._closed = False
        self._write_lock = WriteLock.for_database(self.path)
        try:
            with self._errors("open"):
                self._create_schema(self._conn())
        except BaseException:
            self.close()
            raise

    def _create_schema(self, conn: sqlite3.Connection) -> None:
        if conn.execute("PRAGMA journal_mode = WAL").fetchone()[0] != "wal":
            raise sqlite3.OperationalError("cannot switch to WAL mode")
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise sqlite3.DatabaseError(f"schema version {version} is newer than this code")
        # Under the write lock, so replicas starting together create it once.
        with self._write_lock.held(self._busy_timeout):
            conn.execute("BEGIN IMMEDIATE")
            try:
                logged = {row[1] for row in conn.execute("PRAGMA table_info(audit_record)")}
                for statement in chains_migration(logged):
                    conn.execute(statement)
                for statement in _statements(LEDGER_SCHEMA + DELIVERY_SCHEMA + USAGE_SCHEMA + audit_schema()):
                    conn.execute(statement)
                for table, added in ADDED_COLUMNS.items():
                    present = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
                    for name, definition in added.items():
                        if name not in present:
                            conn.execute(f"ALTER TABLE {table} ADD COLUMN {name} {definition}")
                # An audit log created before a later AuditEvent field (`caller`) gets its
                # column, empty for the old rows: an empty field is left out of a record's
                # hash, so those rows still verify.
                logged = {row[1] for row in conn.execute("PRAGMA table_info(audit_record)")}
                for name in audit_columns_added_later(logged):
                    conn.execute(f"ALTER TABLE audit_record ADD COLUMN {name} TEXT NOT NULL DEFAULT ''")
                # Every chain this store appends to has a head row: appending only locks rows.
                conn.executemany("INSERT OR IGNORE INTO audit_head (chain, seq, hash) VALUES (?, 0, ?)",
                                 [(str(n), GENESIS_HASH) for n in range(self.chains)])
                conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise

    @contextmanager
    def _errors(self, action: str) -> Iterator[None]:
        # The one place where sqlite3's errors become ours: the caller denies, and the
        # operator reads the cause in the message.
        try:
            yield
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"{self.label}: {action} failed: {exc}") from exc

    def _conn(self) -> sqlite3.Connection:
        if self._closed:
            raise StoreUnavailable(f"{self.label} is closed")
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=self._busy_timeout, isolation_level=None,
                                   check_same_thread=False)
            # NORMAL: no fsync at COMMIT, under the write lock; `transaction` syncs the
            # log after releasing it (see sync_log).
            conn.execute("PRAGMA synchronous = NORMAL")
            with self._lock:
                if self._closed:
                    conn.close()
                    raise StoreUnavailable(f"{self.label} is closed")
                self._connections.append(conn)
            self._local.conn = conn
        return conn

    @contextmanager
    def transaction(self) -> Iterator[SqliteTransaction]:
        with self._errors("write"):
            with self._write_lock.held(self._busy_timeout):
                conn = self._conn()
                conn.execute("BEGIN IMMEDIATE")
                try:
                    tx = SqliteTransaction(conn, self.chains)
                    yield tx
                    tx.flush_audit()
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
                conn.execute("COMMIT")
        sync_log(self.path, self.label)  # committed: durable before anyone is answered

    @contextmanager
    def reading(self) -> Iterator[SqliteTransaction]:
        with self._errors("read"):
            yield SqliteTransaction(self._conn())

    def listen(self, on_approval: Callable[[str], None]) -> None:
        """SQLite has no notifications between processes: watchers look again."""

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            connections, self._connections = self._connections, []
        for conn in connections:
            conn.close()
        self._write_lock.release_user()


def _statements(script: str) -> list[str]:
    """The statements of a schema script, each run on its own inside the caller's
    transaction (executescript would commit it)."""
    statements, current = [], ""
    for line in script.splitlines(keepends=True):
        current += line
        if sqlite3.complete_statement(current):
            statements.append(current.strip())
            current = ""
    return [s for s in statements if s]


class SqliteStore(Store):
    """The store in one SQLite file."""

    def __init__(self, path: str, *, busy_timeout: float = 10.0, chains: int = DEFAULT_CHAINS):
        self.path = str(path)
        super().__init__(SqliteUnit(self.path, busy_timeout=busy_timeout, chains=chains))


class SqliteAuditLog(SqliteStore):
    """The store of a SQLite file, opened for its audit log (`toolauthz audit`, tools)."""

    def append(self, events: Sequence[AuditEvent]) -> list[AuditRecord]:
        return self.audit_log.append(events)

    def query(self, filters: AuditQuery, *, limit: int, after_seq: int = 0) -> list[AuditRecord]:
        return self.audit_log.query(filters, limit=limit, after_seq=after_seq)

    def iter_records(self, from_seq: int = 1) -> Iterator[AuditRecord]:
        return self.audit_log.iter_records(from_seq)

    def iter_chains(self) -> Iterator[AuditRecord]:
        return self.audit_log.iter_chains()

    def heads(self) -> list[ChainHead]:
        return self.audit_log.heads()

    def head(self) -> tuple[int, str]:
        return self.audit_log.head()

    def add_checkpoint(self, token: str, checkpoint: Checkpoint) -> None:
        self.audit_log.add_checkpoint(token, checkpoint)

    def checkpoints(self) -> list[Checkpoint]:
        return self.audit_log.checkpoints()

    def last_checkpoint(self) -> Checkpoint | None:
        return self.audit_log.last_checkpoint()
