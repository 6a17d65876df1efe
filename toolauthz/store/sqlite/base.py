"""SQLite plumbing: one writer at a time across processes, and durability after the
write lock is released."""

from __future__ import annotations

import fcntl
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from toolauthz.errors import StoreUnavailable


class WriteLock:
    """One writer at a time on one SQLite file. Threads of this process queue on a
    threading.Lock; processes on an flock() of a side file, tried without blocking and
    retried after 50 us, doubling to 1 ms, until the timeout. SQLite's own busy handler
    sleeps 1, 2, 5, 10 ... 100 ms between tries, far longer than a write transaction
    here (~0.1 ms), so contending writers would mostly sleep while the lock is free.

    `for_database` gives every store of this process that writes one file the same lock:
    flock() is held per open file, so two locks on one file in one process would make
    its own writers wait for each other through the retry loop above."""

    _shared: dict[str, WriteLock] = {}
    _shared_guard = threading.Lock()

    def __init__(self, db_path: str, timeout: float, cross_process: bool = True):
        self._threads = threading.Lock()
        self._timeout = timeout
        self._path = db_path + "-writer.lock" if cross_process else None
        self._fd: int | None = None
        self._key: str | None = None
        self._users = 0

    @classmethod
    def for_database(cls, db_path: str) -> WriteLock:
        """The process's lock of `db_path`; give it back with `release_user`."""
        key = os.path.realpath(db_path)
        with cls._shared_guard:
            lock = cls._shared.get(key)
            if lock is None:
                lock = cls._shared[key] = cls(db_path, 10.0)
                lock._key = key
            lock._users += 1
            return lock

    def release_user(self) -> None:
        """One store is done with a shared lock; the last one closes it."""
        with self._shared_guard:
            self._users -= 1
            if self._users > 0:
                return
            if self._key is not None and self._shared.get(self._key) is self:
                del self._shared[self._key]
        self.close()

    @contextmanager
    def held(self, timeout: float) -> Iterator[WriteLock]:
        self._acquire(timeout)
        try:
            yield self
        finally:
            self._release()

    def __enter__(self) -> WriteLock:
        self._acquire(self._timeout)
        return self

    def __exit__(self, *exc: object) -> None:
        self._release()

    def _acquire(self, timeout: float) -> None:
        if not self._threads.acquire(timeout=timeout):
            raise sqlite3.OperationalError("database is locked (write lock)")
        if self._path is None:
            return
        if self._fd is None:
            try:
                self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
            except OSError as exc:
                self._threads.release()
                raise sqlite3.OperationalError(f"cannot open the write lock: {exc.strerror}") from None
        deadline, pause = time.monotonic() + timeout, 50e-6
        while True:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() > deadline:
                    self._threads.release()
                    raise sqlite3.OperationalError("database is locked (write lock)") from None
                time.sleep(pause)
                pause = min(pause * 2, 1e-3)
            except BaseException:
                self._threads.release()
                raise

    def _release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        self._threads.release()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def sync_log(db_path: str, label: str) -> None:
    """Makes every transaction committed so far on `db_path` durable by syncing its
    write-ahead log. Connections commit with synchronous=NORMAL (no fsync while the write
    lock is held) and a committer calls this after releasing the lock, so processes
    sharing the file do not queue behind each other's fsync, and one fsync may cover
    several commits. Sound because, in WAL mode with NORMAL, SQLite syncs the log before
    a checkpoint copies frames out of it and the database after: a committed frame is
    either still in the log, made durable here, or already synced into the database.
    Raises StoreUnavailable (`label` names the store) when the disk refuses."""
    for path in (db_path + "-wal", db_path):
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            try:
                os.fdatasync(fd)  # as SQLite itself syncs: the data and the size, not the times
            finally:
                os.close(fd)
        except FileNotFoundError:
            continue  # no log: everything was checkpointed into the database
        except OSError as exc:
            raise StoreUnavailable(f"{label} `{db_path}`: cannot sync: {exc.strerror}") from exc
        return
