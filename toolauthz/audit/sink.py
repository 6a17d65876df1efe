"""What the decision path needs of the audit trail, and nothing more."""

from __future__ import annotations

from typing import Protocol

from toolauthz.audit.records import AuditEvent


class AuditSink(Protocol):
    """Write one event; return once it is committed (raise StoreUnavailable otherwise)."""

    def write(self, event: AuditEvent) -> object: ...  # what a sink returns (its record) is its own business
