"""The embedded backend: one SQLite file."""

from toolauthz.store.sqlite.unit import SqliteAuditLog, SqliteStore, SqliteUnit

__all__ = ["SqliteAuditLog", "SqliteStore", "SqliteUnit"]
