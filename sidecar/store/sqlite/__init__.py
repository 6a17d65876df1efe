"""The embedded backend: one SQLite file."""

from sidecar.store.sqlite.unit import SqliteAuditLog, SqliteStore, SqliteUnit

__all__ = ["SqliteAuditLog", "SqliteStore", "SqliteUnit"]
