"""Shared SQLite plumbing: WAL, one connection per thread, BEGIN IMMEDIATE transactions
so that several processes sharing one file stay consistent. Every sqlite3 error leaves as
StoreUnavailable, which callers turn into a deny."""

from __future__ import annotations

import sqlite3
import threading
from contextlib import contextmanager
from typing import Iterator

from sidecar.errors import StoreUnavailable


class SqliteDatabase:
    def __init__(self, path: str, schema: str, *, label: str):
        self._path, self._label = path, label
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._all_lock = threading.Lock()
        try:
            self._conn().executescript(schema)
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"{label} `{path}`: {exc}") from exc

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
    def transaction(self, immediate: bool = True) -> Iterator[sqlite3.Connection]:
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
            raise StoreUnavailable(f"{self._label} `{self._path}`: {exc}") from exc

    def close(self) -> None:
        with self._all_lock:
            for conn in self._all:
                conn.close()
            self._all.clear()
        self._local = threading.local()
