"""The decision path's own settings: tokens, audit checkpoints, approvals, batches and
the keys that signed bundles must verify with."""

from __future__ import annotations

import pathlib
from typing import Any

from pydantic import Field, model_validator

from toolauthz.batch import DEFAULT_MAX_BYTES, DEFAULT_MAX_CALLS, BatchLimits
from toolauthz.server.config.base import StrictModel


class TokenSettings(StrictModel):
    """The tokens the sidecar signs for allowed calls (PASETO v4.public)."""

    issuer: str = "toolauthz"
    """The `iss` of the tokens the sidecar signs; runtimes check it."""
    audience: str = "toolauthz-runtime"
    """The `aud` of the tokens the sidecar signs; runtimes check it."""
    lifetime_seconds: int = Field(60, ge=1, le=600)
    """How long a token is valid after it is issued."""
    leeway_seconds: int = Field(5, ge=0, le=5)
    """Clock skew allowed when a token's times are checked."""
    reissue_window_seconds: float = Field(300.0, ge=0, le=3600)
    """How long after a decision (or an approval) a replayed call may get a fresh token."""


class AuditSettings(StrictModel):
    """The audit trail's signed checkpoints."""

    checkpoint_interval_seconds: float = Field(60.0, gt=0)
    """Seconds between signed checkpoints of the audit chains."""


class ApprovalSettings(StrictModel):
    """Approvals: how long they wait, and how many may be watched."""

    ttl_seconds: float = Field(900.0, gt=0, le=7 * 24 * 3600)
    """How long an approval waits for a decision before it expires."""
    max_watches_per_caller: int = Field(64, ge=1)
    """Open WatchApproval streams, per caller identity and in the whole process; one over either limit is
    RESOURCE_EXHAUSTED. Every unauthenticated caller counts as one. A gRPC watch takes one of the
    `max_streaming_rpcs` places while open, an HTTP wait one of the HTTP API's `max_concurrent_rpcs`, so
    `max_watches` must stay below both."""
    max_watches: int = Field(128, ge=1)
    """Open WatchApproval streams in the whole process."""


class BatchSettings(StrictModel):
    """AuthorizeBatch's limits."""

    max_calls: int = Field(DEFAULT_MAX_CALLS, ge=1, le=256)
    """AuthorizeBatch: the most calls in one batch, and the most bytes their arguments and entities may hold
    together; beyond either, the batch is INVALID_ARGUMENT. At most 256, the most plans the decision pump
    runs together: a batch always commits in one transaction."""
    max_bytes: int = Field(DEFAULT_MAX_BYTES, ge=1024)
    """The most bytes the arguments and entities of one AuthorizeBatch may hold together."""

    def limits(self) -> BatchLimits:
        return BatchLimits(self.max_calls, self.max_bytes)




class BundleKeySettings(StrictModel):
    """One public key a bundle's signature may name: its key id and an Ed25519 PEM file."""

    kid: str = Field(pattern=r"^[A-Za-z0-9._:-]{1,128}$")
    """The key id a bundle's signature names."""
    file: pathlib.Path
    """The Ed25519 public key, a PEM file."""


class BundleVerificationSettings(StrictModel):
    """Bundles load only when signed (`toolauthz bundle sign`) with one of these keys;
    several for a rotation."""

    keys: tuple[BundleKeySettings, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _one_entry_per_kid(self) -> BundleVerificationSettings:
        if len({key.kid for key in self.keys}) != len(self.keys):
            raise ValueError("each key id may be listed once in `bundle_verification.keys`")
        return self

    def public_keys(self) -> dict[str, Any]:
        """kid -> Ed25519 public key, read now (SignatureError when a file is unusable)."""
        from toolauthz.bundle.signature import load_public_key_file

        return {key.kid: load_public_key_file(key.file) for key in self.keys}
