"""One SQLite file for the ledger, the approvals and the audit trail, and one write lock
per file in a process."""

from __future__ import annotations

import pytest

from toolauthz.server.config import DATABASE_FILE
from toolauthz.store import SqliteStore
from toolauthz.store.sqlite.base import WriteLock


def test_stores_of_one_file_share_one_write_lock_until_the_last_closes(tmp_path):
    path = str(tmp_path / DATABASE_FILE)
    first, second = SqliteStore(path), SqliteStore(path)
    other = SqliteStore(str(tmp_path / "other.db"))
    lock = first.unit._write_lock
    assert second.unit._write_lock is lock and other.unit._write_lock is not lock
    with lock.held(1.0):
        assert lock._fd is not None  # the flock side file is open while the stores are
    first.close()
    first.close()  # a second close gives nothing back twice
    assert WriteLock.for_database(path) is lock  # the second store still holds it
    lock.release_user()
    second.close()
    assert lock._fd is None  # the last user closed it
    fresh = WriteLock.for_database(path)
    assert fresh is not lock
    fresh.release_user()
    other.close()


def test_the_sidecar_keeps_all_its_state_in_one_file(sidecar, settings):
    assert sidecar.ledger.get("acme", "nothing") is None
    names = {p.name for p in settings.data_dir.iterdir() if p.suffix == ".db"}
    assert names == {DATABASE_FILE}


def _recorded_fsyncs(monkeypatch) -> list[str]:
    import os

    names, real = [], os.fdatasync

    def fsync(fd):
        names.append(os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))
        return real(fd)

    monkeypatch.setattr(os, "fdatasync", fsync)
    return names


def test_sync_log_syncs_the_write_ahead_log_or_else_the_database(tmp_path, monkeypatch):
    import sqlite3

    from toolauthz.store.sqlite.base import sync_log

    wal = tmp_path / "wal.db"
    conn = sqlite3.connect(wal)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE t (x)")
    plain = tmp_path / "plain.db"
    sqlite3.connect(plain).execute("CREATE TABLE t (x)")
    names = _recorded_fsyncs(monkeypatch)
    sync_log(str(wal), "test")
    sync_log(str(plain), "test")  # no log next to it: the database file itself
    assert names == ["wal.db-wal", "plain.db"]
    conn.close()


def test_an_audit_record_written_alone_is_synced_after_the_lock_is_released(sidecar, monkeypatch):
    """The audit writer's own commits (outcomes, approvals, replays), like the ledger's."""
    from toolauthz.audit.records import AuditEvent

    lock = sidecar.store.unit._write_lock
    states = []
    names = _recorded_fsyncs(monkeypatch)
    import toolauthz.store.sqlite.unit as sqlite_unit

    real_sync = sqlite_unit.sync_log

    def sync(path, label):
        states.append(lock._threads.locked())
        return real_sync(path, label)

    monkeypatch.setattr(sqlite_unit, "sync_log", sync)
    record = sidecar.audit_writer.write(AuditEvent(kind="outcome", time=1.0, call_id="c1", result="completed"))
    assert record.seq >= 1 and names == [f"{DATABASE_FILE}-wal"] and states == [False]


def test_a_data_directory_of_the_two_file_layout_is_refused(settings, clock):
    """Starting on a fresh database beside an old ledger would forget which tokens were
    spent, and start a second audit chain."""
    from toolauthz.errors import StoreUnavailable
    from toolauthz.server.build import build_sidecar

    settings.data_dir.mkdir(parents=True, exist_ok=True)
    (settings.data_dir / "ledger.db").write_bytes(b"")
    with pytest.raises(StoreUnavailable, match="ledger.db from an earlier version"):
        build_sidecar(settings, clock=clock)
    assert not settings.database_path.exists()


def test_a_disk_that_refuses_the_sync_means_no_token(sidecar, stub, monkeypatch):
    """The commit is durable only once synced: an answer that cannot wait for that is
    UNAVAILABLE, with no token, and the message names the store."""
    import errno
    import os

    import grpc
    from conftest import make_request

    from toolauthz.errors import StoreUnavailable
    from toolauthz.store.sqlite.base import sync_log

    def eio(fd):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "fdatasync", eio)
    with pytest.raises(StoreUnavailable, match="ledger `.*`: cannot sync: Input/output error"):
        sync_log(str(sidecar.settings.database_path), "ledger")
    with pytest.raises(grpc.RpcError) as info:
        stub.Authorize(make_request())
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
