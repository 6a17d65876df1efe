"""Durable state behind interfaces: the call ledger (decisions, single use, outcomes).

The embedded backend is SQLite; the interfaces are written so that a PostgreSQL backend
shared by several sidecar replicas can implement them unchanged.
"""

from sidecar.store.ledger import CallEntry, CallLedger, Reservation
from sidecar.store.sqlite_ledger import SqliteLedger

__all__ = ["CallEntry", "CallLedger", "Reservation", "SqliteLedger"]
