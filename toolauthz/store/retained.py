"""The retained inputs table (`audit.retain_input`): sealed calls kept for replay, in the
store's database beside the ledger, with a connection of their own.

Only the sealed body (audit/retention.py) holds the input, entities and principal; the
row's other columns are what the audit trail shows anyway. A row is deleted once its
retention ends (`purge`, run as rows are written, and never read past its end). Reads
stream in pages by key, so a replay over a million rows holds one page at a time.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from toolauthz.errors import StoreUnavailable
from toolauthz.store.open import SQLITE, parse_store_url

PAGE = 1000
_COLUMNS = "tenant, call_id, tool, decided_at, expires_at, policy_version, sealed"
_SQLITE_SCHEMA = """
CREATE TABLE IF NOT EXISTS retained_inputs (
    tenant TEXT NOT NULL,
    call_id TEXT NOT NULL,
    tool TEXT NOT NULL,
    decided_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    policy_version TEXT NOT NULL,
    sealed BLOB NOT NULL,
    PRIMARY KEY (tenant, call_id)
);
CREATE INDEX IF NOT EXISTS retained_inputs_by_time ON retained_inputs (decided_at, tenant, call_id);
CREATE INDEX IF NOT EXISTS retained_inputs_by_expiry ON retained_inputs (expires_at);
"""
# PostgreSQL: the same table, created by migration 2 (store/postgres/schema.py).


@dataclass(frozen=True)
class RetainedRow:
    tenant: str
    call_id: str
    tool: str
    decided_at: float
    expires_at: float
    policy_version: str
    sealed: bytes


class RetainedInputs:
    """Put, stream and purge retained rows, in SQLite or PostgreSQL by store URL."""

    def __init__(self, url: str, *, timeout: float = 5.0):
        parsed = parse_store_url(url)
        self._sqlite = parsed.backend == SQLITE
        self._lock = threading.Lock()
        self._mark = "?" if self._sqlite else "%s"
        try:
            if self._sqlite:
                self._conn: Any = sqlite3.connect(parsed.path, timeout=timeout, check_same_thread=False,
                                                  isolation_level=None)
                # WAL without a sync per commit: a retained input lost in a crash costs a
                # replay one call, and a sync per decided call would cost every call.
                self._conn.execute("PRAGMA journal_mode=WAL")
                self._conn.execute("PRAGMA synchronous=NORMAL")
                self._conn.executescript(_SQLITE_SCHEMA)
            else:
                import psycopg

                self._conn = psycopg.connect(url, autocommit=True, connect_timeout=max(1, int(timeout)))
        except (sqlite3.Error, OSError) as exc:
            raise StoreUnavailable(f"retained inputs: {exc}") from exc
        except Exception as exc:
            raise StoreUnavailable(f"retained inputs: {type(exc).__name__}") from exc

    def _run(self, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        statement = statement.replace("?", self._mark)
        with self._lock:
            try:
                cursor = self._conn.execute(statement, params)
                return list(cursor.fetchall()) if cursor.description else []
            except Exception as exc:
                raise StoreUnavailable(f"retained inputs: {type(exc).__name__}: {exc}") from exc

    def put(self, row: RetainedRow) -> None:
        """Keep `row`; the first decision of a call is the one kept (a replay adds none)."""
        self.put_many([row])

    def put_many(self, rows: list[RetainedRow]) -> None:
        """Keep `rows` in one transaction (an import, a benchmark's fill)."""
        statement = (f"INSERT INTO retained_inputs ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?) "
                     "ON CONFLICT (tenant, call_id) DO NOTHING").replace("?", self._mark)
        values = [(r.tenant, r.call_id, r.tool, r.decided_at, r.expires_at, r.policy_version, r.sealed) for r in rows]
        with self._lock:
            try:
                if self._sqlite:
                    with self._conn:  # sqlite3: one BEGIN ... COMMIT
                        self._conn.execute("BEGIN")
                        self._conn.executemany(statement, values)
                else:
                    with self._conn.transaction(), self._conn.cursor() as cursor:
                        cursor.executemany(statement, values)
            except Exception as exc:
                raise StoreUnavailable(f"retained inputs: {type(exc).__name__}: {exc}") from exc

    def purge(self, now: float, *, batch: int = 1000) -> int:
        """Delete the rows whose retention has ended; returns how many."""
        removed = 0
        while True:
            done = self._run("DELETE FROM retained_inputs WHERE (tenant, call_id) IN (SELECT tenant, call_id FROM "
                             "retained_inputs WHERE expires_at <= ? LIMIT ?) RETURNING 1", (now, batch))
            removed += len(done)
            if len(done) < batch:
                return removed

    def stream(self, *, since: float, now: float, tenant: str | None = None) -> Iterator[RetainedRow]:
        """Every row decided at or after `since` and not expired at `now`, oldest first,
        read `PAGE` rows at a time (keyset: no offset, no cursor held between pages)."""
        after: tuple[float, str, str] = (since, "", "")
        first = True
        while True:
            where = "decided_at >= ?" if first else "(decided_at, tenant, call_id) > (?, ?, ?)"
            params: tuple[Any, ...] = (after[0],) if first else after
            if tenant is not None:
                where += " AND tenant = ?"
                params += (tenant,)
            rows = self._run(f"SELECT {_COLUMNS} FROM retained_inputs WHERE {where} AND expires_at > ? "
                             "ORDER BY decided_at, tenant, call_id LIMIT ?", (*params, now, PAGE))
            for values in rows:
                yield RetainedRow(values[0], values[1], values[2], values[3], values[4], values[5],
                                  bytes(values[6]))
            if len(rows) < PAGE:
                return
            last = rows[-1]
            after, first = (last[3], last[0], last[1]), False

    def count(self) -> int:
        return int(self._run("SELECT count(*) FROM retained_inputs")[0][0])

    def close(self) -> None:
        with self._lock:
            self._conn.close()
