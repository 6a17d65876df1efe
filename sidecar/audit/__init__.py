"""The tamper-evident audit trail: records chained by hash, signed checkpoints, and a
group-commit writer in front of a storage backend (SQLite; PostgreSQL can follow)."""

from sidecar.audit.checkpoint import (
    Checkpoint,
    CheckpointError,
    sign_checkpoint,
    verify_checkpoint,
)
from sidecar.audit.records import (
    GENESIS_HASH,
    KINDS,
    AuditEvent,
    AuditRecord,
    canonical_body,
    record_hash,
)
from sidecar.audit.sqlite import SqliteAuditLog
from sidecar.audit.store import AuditLog, AuditQuery
from sidecar.audit.verify import Finding, verify_chain
from sidecar.audit.writer import AuditWriter, Checkpointer

__all__ = [
    "GENESIS_HASH", "KINDS", "AuditEvent", "AuditLog", "AuditQuery", "AuditRecord",
    "AuditWriter", "Checkpoint", "CheckpointError", "Checkpointer", "Finding",
    "SqliteAuditLog", "canonical_body", "record_hash", "sign_checkpoint", "verify_chain",
    "verify_checkpoint",
]
