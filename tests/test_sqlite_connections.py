"""The SQLite store's connections: one per thread, and none left open by a thread that
has ended (the health checks read the store from a new thread every second)."""

from __future__ import annotations

import sqlite3
import threading

import pytest

from toolauthz.store.sqlite import SqliteStore, SqliteUnit


def unit_of(store: SqliteStore) -> SqliteUnit:
    assert isinstance(store.unit, SqliteUnit)
    return store.unit


def read_on_a_thread_of_its_own(store: SqliteStore) -> sqlite3.Connection:
    """The store read on a new thread, as probes.BoundedRead does; the connection it used."""
    used: list[sqlite3.Connection] = []

    def read() -> None:
        assert store.available()
        used.append(unit_of(store)._local.conn)

    thread = threading.Thread(target=read)
    thread.start()
    thread.join()
    return used[0]


def test_a_connection_of_an_ended_thread_is_closed_when_the_next_is_opened(tmp_path):
    store = SqliteStore(str(tmp_path / "toolauthz.db"))
    try:
        first = read_on_a_thread_of_its_own(store)
        first.execute("SELECT 1")  # its thread has ended, but no connection was opened since
        later = [read_on_a_thread_of_its_own(store) for _ in range(20)]
        with pytest.raises(sqlite3.ProgrammingError):
            first.execute("SELECT 1")  # closed
        assert all(conn is not first for conn in later)
        # This thread's (the schema's) and the last reader's; not one per reader.
        assert len(unit_of(store)._connections) == 2
        assert store.available()  # this thread's connection is still open
    finally:
        store.close()


def test_close_closes_every_connection(tmp_path):
    store = SqliteStore(str(tmp_path / "toolauthz.db"))
    last = read_on_a_thread_of_its_own(store)
    mine = unit_of(store)._local.conn
    store.close()
    for conn in (last, mine):
        with pytest.raises(sqlite3.ProgrammingError):
            conn.execute("SELECT 1")
