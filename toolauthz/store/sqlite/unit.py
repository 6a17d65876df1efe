"""The SQLite backend: one file holds the call ledger, the approvals and the audit trail.

Connections: one per thread, created on first use and all closed by `close()`. The
connection of a thread that has ended is closed when the next one is opened: a thread
started per task (the health checks' store read, every second) would otherwise leave an
open connection, its file descriptor and its page cache behind each time. With WAL,
readers see a snapshot and never wait for the writer. Writers take the process's
WriteLock (threads and processes sharing the file), then BEGIN IMMEDIATE, so the chains'
heads and the run counts read in a transaction are those its commit leaves behind (one
writer: `Transaction.lock` has nothing to add); the log is synced after the lock is
released. The audit chains are those of every store (`store/chains.py`), verified alike.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from toolauthz.audit.checkpoint import Checkpoint
from toolauthz.audit.merkle import ChainHead
from toolauthz.audit.records import DEFAULT_CHAINS, GENESIS_HASH, AuditEvent, AuditRecord
from toolauthz.audit.store import AuditQuery
from toolauthz.errors import StoreUnavailable
from toolauthz.store.bundle_floor import SCHEMA as FLOOR_SCHEMA
from toolauthz.store.deliveries import SCHEMA as DELIVERY_SCHEMA
from toolauthz.store.ledger import CallEntry, Standing
from toolauthz.store.rules import Store
from toolauthz.store.sqlite.audit_sql import (
    audit_columns_added_later,
    audit_schema,
    chains_migration,
)
from toolauthz.store.sqlite.base import WriteLock, sync_log
from toolauthz.store.sqlite.ledger_sql import ADDED_COLUMNS, LEDGER_SCHEMA
from toolauthz.store.sqlite.transaction import SqliteTransaction
from toolauthz.store.usage_rows import SCHEMA as USAGE_SCHEMA

SCHEMA_VERSION = 2  # 2: several audit chains (audit_sql.chains_migration)

class SqliteUnit:
    def __init__(self, path: str, *, busy_timeout: float = 10.0, chains: int = DEFAULT_CHAINS):
        self.path = str(path)
        self.chains = chains
        self.label = f"database `{self.path}`"
        self._busy_timeout = busy_timeout
        self._local = threading.local()
        self._lock = threading.Lock()
        self._connections: list[tuple[threading.Thread, sqlite3.Connection]] = []  # owner, connection
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
                schema = LEDGER_SCHEMA + DELIVERY_SCHEMA + USAGE_SCHEMA + FLOOR_SCHEMA + audit_schema()
                for statement in _statements(schema):
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
                ended = [c for owner, c in self._connections if not owner.is_alive()]
                self._connections = [(owner, c) for owner, c in self._connections if owner.is_alive()]
                self._connections.append((threading.current_thread(), conn))
            for orphan in ended:  # no thread can use it any more: its thread has ended
                orphan.close()
            self._local.conn = conn
        return conn

    @contextmanager
    def transaction(self, *, foreseen: bool = False) -> Iterator[SqliteTransaction]:
        # `foreseen` is moot: reads under the write lock cost no round trip.
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

    def foreseen_standing(self, entries: Sequence[CallEntry]) -> list[Standing] | None:
        return None  # read: a local read is cheaper than a decision made again

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
        for _, conn in connections:
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
