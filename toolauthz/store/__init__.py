"""Storage: the call ledger, the approvals and the audit trail of one database, written
in shared transactions (`unit.py` is what a backend implements, `rules.py` what the
stores mean). Backends: SQLite (`sqlite/`, embedded, the default) and PostgreSQL
(`postgres/`, shared by a fleet of sidecars).
"""

from toolauthz.store.ledger import CallEntry, CallLedger, Reservation
from toolauthz.store.rules import Store
from toolauthz.store.sqlite import SqliteAuditLog, SqliteStore

__all__ = ["CallEntry", "CallLedger", "Reservation", "SqliteAuditLog", "SqliteStore", "Store"]
