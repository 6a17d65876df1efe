"""The tamper-evident audit trail: records in hash chains, signed checkpoints over every
chain's head, the interface of a log and its verification. Pure: storage (toolauthz/store/) implements the
log and imports this package, never the reverse."""

from toolauthz.audit.checkpoint import (
    Checkpoint,
    CheckpointError,
    sign_checkpoint,
    sign_heads,
    verify_checkpoint,
)
from toolauthz.audit.merkle import ChainHead, heads_root
from toolauthz.audit.records import (
    GENESIS_HASH,
    KINDS,
    LEGACY_CHAIN,
    AuditEvent,
    AuditRecord,
    canonical_body,
    chain_of,
    record_hash,
)
from toolauthz.audit.store import AuditLog, AuditQuery
from toolauthz.audit.verify import Finding, verify_chain

__all__ = [
    "GENESIS_HASH", "KINDS", "LEGACY_CHAIN", "AuditEvent", "AuditLog", "AuditQuery", "AuditRecord",
    "ChainHead", "Checkpoint", "CheckpointError", "Finding", "canonical_body", "chain_of", "heads_root",
    "record_hash", "sign_checkpoint", "sign_heads", "verify_chain", "verify_checkpoint",
]
