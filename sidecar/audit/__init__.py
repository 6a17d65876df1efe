"""The tamper-evident audit trail: records chained by hash, signed checkpoints, the
interface of a log and its verification. Pure: storage (sidecar/store/) implements the
log and imports this package, never the reverse."""

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
from sidecar.audit.store import AuditLog, AuditQuery
from sidecar.audit.verify import Finding, verify_chain

__all__ = [
    "GENESIS_HASH", "KINDS", "AuditEvent", "AuditLog", "AuditQuery", "AuditRecord",
    "Checkpoint", "CheckpointError", "Finding", "canonical_body", "record_hash",
    "sign_checkpoint", "verify_chain", "verify_checkpoint",
]
