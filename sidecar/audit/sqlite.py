"""The SQLite audit log: one file, several threads and processes, one chain.

Connections: one per thread, created on first use and all closed by `close()` (meant
for a bounded thread pool: a thread that ends leaves its connection open until then).
Group commits (led by whichever thread commits: the decision pump, a handler) append
while other threads query and a verifier streams the log; with WAL, readers see a
snapshot and never wait for the writer, and no Python lock serializes a slow query
against the appends that every decision waits on.
Appends from other processes are serialized by SQLite's write lock (BEGIN IMMEDIATE is
taken before the head is read).

The columns are plain (TEXT, REAL, JSON text), so an auditor can read the file with the
sqlite3 command-line tool and recompute the chain without this code.
"""

from __future__ import annotations

import contextlib
import json
import math
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from dataclasses import fields as dataclass_fields
from typing import Any

from sidecar.audit.checkpoint import Checkpoint
from sidecar.audit.records import GENESIS_HASH, KINDS, AuditEvent, AuditRecord, chain
from sidecar.audit.store import AuditQuery, check_page
from sidecar.errors import StoreUnavailable
from sidecar.store.sqlite_base import WriteLock, sync_log

SCHEMA_VERSION = 1
_EVENT_COLUMNS = tuple(f.name for f in dataclass_fields(AuditEvent))
_JSON_COLUMNS = ("reasons", "error_codes", "fields", "detail")
_COLUMNS = ("seq", *_EVENT_COLUMNS, "prev_hash", "hash")
_SELECT = f"SELECT {', '.join(_COLUMNS)} FROM audit_record"
_INSERT = (f"INSERT INTO audit_record ({', '.join(_COLUMNS)}) "
           f"VALUES ({', '.join('?' * len(_COLUMNS))})")
_EQUALITY_FILTERS = ("tenant", "principal", "tool", "call_id", "request_id", "result", "kind")
_PAGE = 1000  # rows per read while streaming: bounded memory, short read transactions


def _schema() -> str:
    def column(name: str) -> str:
        if name == "time":
            return "time REAL NOT NULL"
        if name == "kind":
            return f"kind TEXT NOT NULL CHECK (kind IN ({', '.join(map(repr, KINDS))}))"
        if name in _JSON_COLUMNS:
            return f"{name} TEXT NOT NULL CHECK (json_valid({name}))"
        return f"{name} TEXT NOT NULL"

    # seq is the rowid, and every SQLite index ends with the rowid: an index on (x)
    # is really (x, seq), so `x = ? AND seq > ? ORDER BY seq LIMIT n` reads n index
    # entries and never sorts, however many rows match. A time window is read from
    # (tenant, time) or (time) and its matches sorted by seq: fast for the windows an
    # auditor asks for (an hour, a day); a whole-log export is `iter_records`' job.
    indexes = [("tenant_time", "tenant, time"), ("time", "time")]
    indexes += [(name, name) for name in _EQUALITY_FILTERS]
    return "\n".join([
        "CREATE TABLE IF NOT EXISTS audit_record (",
        "    seq INTEGER PRIMARY KEY CHECK (seq >= 1),",
        *(f"    {column(name)}," for name in _EVENT_COLUMNS),
        "    prev_hash TEXT NOT NULL,",
        "    hash TEXT NOT NULL",
        ") STRICT;",
        *(f"CREATE INDEX IF NOT EXISTS audit_record_{name} ON audit_record ({cols});"
          for name, cols in indexes),
        # Stops mistakes, not attackers (they can drop a trigger): the chain does that.
        *(f"CREATE TRIGGER IF NOT EXISTS audit_record_no_{op} BEFORE {op.upper()} ON "
          f"audit_record BEGIN SELECT RAISE(ABORT, 'audit records are append-only'); END;"
          for op in ("update", "delete")),
        "CREATE TABLE IF NOT EXISTS audit_checkpoint (",
        "    id INTEGER PRIMARY KEY,",
        "    count INTEGER NOT NULL,",
        "    head_hash TEXT NOT NULL,",
        "    time REAL NOT NULL,",
        "    kid TEXT NOT NULL,",
        "    token TEXT NOT NULL",
        ") STRICT;",
        f"PRAGMA user_version = {SCHEMA_VERSION};",
        _PLANNER_STATS,
    ])


# Fixed planner statistics for the shape the indexes are designed for (a million records,
# near-unique call and request ids, a few hundred records per principal, many per tenant,
# tool, kind and result). Measured statistics of a young or skewed log would pick other
# indexes as it grows; fixed ones keep every query's plan the same from the first record
# on (a technique the SQLite docs describe for sqlite_stat1). Statistics an operator
# gathers with ANALYZE are kept.
_STATS = {"tenant_time": "100000 1", "time": "1", "tenant": "100000", "principal": "100",
          "tool": "5000", "call_id": "2", "request_id": "2", "result": "300000",
          "kind": "300000"}
_PLANNER_STATS = "\n".join([
    "ANALYZE sqlite_master;",  # creates sqlite_stat1 without scanning anything
    "INSERT INTO sqlite_stat1 (tbl, idx, stat) SELECT * FROM (VALUES",
    ",\n".join([f"    ('audit_record', 'audit_record_{name}', '1000000 {stat}')"
                for name, stat in _STATS.items()]
               + ["    ('audit_record', NULL, '1000000')"]),
    ") WHERE NOT EXISTS (SELECT 1 FROM sqlite_stat1 WHERE tbl = 'audit_record');",
    "ANALYZE sqlite_master;",  # reloads the statistics into this connection
])


def build_query(filters: AuditQuery, after_seq: int, limit: int) -> tuple[str, list[Any]]:
    """The SELECT for `query`; column names come from a fixed list, values are bound."""
    clauses = ["seq > ?"]
    params: list[object] = [after_seq]
    for name in _EQUALITY_FILTERS:
        value = getattr(filters, name)
        if value is not None:
            clauses.append(f"{name} = ?")
            params.append(value)
    if filters.time_from is not None or filters.time_to is not None:
        # Always both bounds: the planner then treats the window as narrow and reads it
        # from the (tenant, time) or (time) index, instead of walking seq from the start
        # of the log until it reaches, say, the last hour.
        clauses.append("time >= ? AND time < ?")
        params += [_or(filters.time_from, -math.inf), _or(filters.time_to, math.inf)]
    # The limit is inlined (a checked int): with `LIMIT ?` the planner cannot see that
    # a page is small and walks seq order rather than read a time window by its index.
    where = " AND ".join(clauses)
    return f"{_SELECT} WHERE {where} ORDER BY seq LIMIT {int(limit)}", params


def _or(value: float | None, default: float) -> float:
    return default if value is None else value


class SqliteAuditLog:
    def __init__(self, path: str, *, busy_timeout: float = 5.0):
        self.path = str(path)
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

    @staticmethod
    def _create_schema(conn: sqlite3.Connection) -> None:
        if conn.execute("PRAGMA journal_mode = WAL").fetchone()[0] != "wal":
            raise sqlite3.OperationalError("cannot switch to WAL mode")
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise sqlite3.DatabaseError(f"schema version {version} is newer than this code")
        # Under the write lock, so replicas starting together create it once.
        conn.executescript(f"BEGIN IMMEDIATE;\n{_schema()}\nCOMMIT;")
        SqliteAuditLog._add_later_columns(conn)

    @staticmethod
    def _add_later_columns(conn: sqlite3.Connection) -> None:
        """A log created before `caller` existed gets the column, empty for its rows (an
        empty `caller` is left out of a record's hash, so those rows still verify)."""
        conn.execute("BEGIN IMMEDIATE")  # replicas starting together: one adds it
        try:
            present = {row[1] for row in conn.execute("PRAGMA table_info(audit_record)")}
            if "caller" not in present:
                conn.execute("ALTER TABLE audit_record ADD COLUMN caller TEXT NOT NULL DEFAULT ''")
            conn.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise

    @contextlib.contextmanager
    def _errors(self, action: str) -> Iterator[None]:
        # The one place where sqlite3's errors become ours: the caller denies, and the
        # operator reads the cause in the message.
        try:
            yield
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"audit log `{self.path}`: {action} failed: {exc}") from exc

    def _conn(self) -> sqlite3.Connection:
        if self._closed:
            raise StoreUnavailable(f"audit log `{self.path}` is closed")
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=self._busy_timeout,
                                   isolation_level=None, check_same_thread=False)
            # NORMAL, and sync_log after each write once the write lock is released: a
            # record reported committed survives a power cut, and other processes need
            # not wait for this one's fsync (sidecar/store/sqlite_base.py).
            conn.execute("PRAGMA synchronous = NORMAL")
            with self._lock:
                if self._closed:
                    conn.close()
                    raise StoreUnavailable(f"audit log `{self.path}` is closed")
                self._connections.append(conn)
            self._local.conn = conn
        return conn

    def append(self, events: Sequence[AuditEvent]) -> list[AuditRecord]:
        if not events:
            return []
        with self._errors("append"), self._write_lock.held(self._busy_timeout):
            conn = self._conn()
            # IMMEDIATE takes the write lock before the head is read, so no other
            # process can append between reading the head and committing after it.
            conn.execute("BEGIN IMMEDIATE")
            try:
                records = self.append_in(conn, events)
                conn.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(sqlite3.Error):  # report the first error
                    conn.execute("ROLLBACK")
                raise
        sync_log(self.path, "audit log")
        return records

    @staticmethod
    def append_in(conn: sqlite3.Connection, events: Sequence[AuditEvent]) -> list[AuditRecord]:
        """Chain and insert `events` inside a write transaction the caller holds on this
        database (BEGIN IMMEDIATE, so that no other writer can append after the head read
        here): how the call ledger commits a decision's record with its row."""
        row = conn.execute("SELECT seq, hash FROM audit_record ORDER BY seq DESC LIMIT 1").fetchone()
        records = chain(list(events), *(row or (0, GENESIS_HASH)))
        conn.executemany(_INSERT, [_to_row(r) for r in records])
        return records

    def query(self, filters: AuditQuery, *, limit: int, after_seq: int = 0) -> list[AuditRecord]:
        check_page(limit, after_seq)
        sql, params = build_query(filters, after_seq, limit)
        with self._errors("query"):
            return [_from_row(row) for row in self._conn().execute(sql, params).fetchall()]

    def iter_records(self, from_seq: int = 1) -> Iterator[AuditRecord]:
        # Page by seq instead of holding one cursor open: no statement stays open across
        # a yield, and no read transaction pins the WAL while a slow consumer verifies.
        after = from_seq - 1
        while True:
            with self._errors("read"):
                rows = self._conn().execute(
                    f"{_SELECT} WHERE seq > ? ORDER BY seq LIMIT ?", (after, _PAGE)).fetchall()
            yield from (_from_row(row) for row in rows)
            if len(rows) < _PAGE:
                return
            after = rows[-1][0]

    def head(self) -> tuple[int, str]:
        with self._errors("read head"):
            row = self._conn().execute(
                "SELECT seq, hash FROM audit_record ORDER BY seq DESC LIMIT 1").fetchone()
        return (row[0], row[1]) if row else (0, GENESIS_HASH)

    def add_checkpoint(self, token: str, checkpoint: Checkpoint) -> None:
        with self._errors("add checkpoint"):
            self._conn().execute(
                "INSERT INTO audit_checkpoint (count, head_hash, time, kid, token) "
                "VALUES (?, ?, ?, ?, ?)",
                (checkpoint.count, checkpoint.head_hash, checkpoint.time, checkpoint.kid, token))
        sync_log(self.path, "audit log")

    def checkpoints(self) -> list[Checkpoint]:
        with self._errors("read checkpoints"):
            rows = self._conn().execute(
                "SELECT count, head_hash, time, kid, token FROM audit_checkpoint "
                "ORDER BY count, id").fetchall()
        return [Checkpoint(*row) for row in rows]

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            connections, self._connections = self._connections, []
        for conn in connections:
            conn.close()
        self._write_lock.release_user()


def _to_row(record: AuditRecord) -> tuple[Any, ...]:
    event = record.event
    values = [getattr(event, name) for name in _EVENT_COLUMNS]
    for i, name in enumerate(_EVENT_COLUMNS):
        if name in _JSON_COLUMNS:
            # Plain JSON is enough here: the hash covers the canonical body recomputed
            # from the values, and these values (already canonical copies) read back equal.
            values[i] = _json_text(values[i])
    return (record.seq, *values, record.prev_hash, record.hash)


def _json_text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True,
                      allow_nan=False)


def _from_row(row: Sequence[Any]) -> AuditRecord:
    values = dict(zip(_COLUMNS, row, strict=True))
    for name in _JSON_COLUMNS:
        try:
            value = json.loads(values[name])
        except (TypeError, ValueError):
            continue  # a tampered cell: keep the raw text, the hash will not match it
        values[name] = tuple(value) if name in ("reasons", "error_codes") and \
            isinstance(value, list) else value
    seq, prev_hash, hash_ = values.pop("seq"), values.pop("prev_hash"), values.pop("hash")
    return AuditRecord(seq, AuditEvent.from_storage(**values), prev_hash, hash_)
