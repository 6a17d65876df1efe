"""Shared SQLite plumbing: WAL, one connection per thread, BEGIN IMMEDIATE transactions
so that several processes sharing one file stay consistent. Every sqlite3 error leaves as
StoreUnavailable, which callers turn into a deny."""

from __future__ import annotations

import fcntl
import os
import sqlite3
import threading
import time
from contextlib import contextmanager
from typing import Iterator

from sidecar.errors import StoreUnavailable


class WriteLock:
    """One writer at a time on one SQLite file. Threads of this process queue on a
    threading.Lock; processes on an flock() of a side file, tried without blocking and
    retried after 50 us, doubling to 1 ms, until `timeout`. SQLite's own busy handler
    sleeps 1, 2, 5, 10 ... 100 ms between tries, far longer than a write transaction
    here (~0.1 ms), so contending writers would mostly sleep while the lock is free."""

    def __init__(self, db_path: str, timeout: float, cross_process: bool = True):
        self._threads = threading.Lock()
        self._timeout = timeout
        self._path = db_path + "-writer.lock" if cross_process else None
        self._fd = None

    def __enter__(self):
        if not self._threads.acquire(timeout=self._timeout):
            raise sqlite3.OperationalError("database is locked (write lock)")
        if self._path is None:
            return self
        if self._fd is None:
            try:
                self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
            except OSError as exc:
                self._threads.release()
                raise sqlite3.OperationalError(f"cannot open the write lock: {exc.strerror}") from None
        deadline, pause = time.monotonic() + self._timeout, 50e-6
        while True:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except BlockingIOError:
                if time.monotonic() > deadline:
                    self._threads.release()
                    raise sqlite3.OperationalError("database is locked (write lock)") from None
                time.sleep(pause)
                pause = min(pause * 2, 1e-3)
            except BaseException:
                self._threads.release()
                raise

    def __exit__(self, *exc):
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        self._threads.release()

    def close(self):
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class SqliteDatabase:
    def __init__(self, path: str, schema: str, *, label: str):
        self._path, self._label = path, label
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._all_lock = threading.Lock()
        self._write_lock = WriteLock(path, 10.0, cross_process=True)
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
        if immediate:
            try:
                lock = self._write_lock.__enter__()
            except sqlite3.Error as exc:
                raise StoreUnavailable(f"{self._label} `{self._path}`: {exc}") from exc
            try:
                with self._transaction(True) as conn:
                    yield conn
            finally:
                lock.__exit__()
        else:
            with self._transaction(False) as conn:
                yield conn

    @contextmanager
    def _transaction(self, immediate: bool) -> Iterator[sqlite3.Connection]:
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
        self._write_lock.close()
