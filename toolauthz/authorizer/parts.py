"""What every plan of the authorizer uses: its collaborators, and the glue between them
(ids, tokens, audit events, the count of `@shadow` effects)."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ulid import ULID

from toolauthz.approvals import ApprovalDesk
from toolauthz.audit.records import AuditEvent
from toolauthz.audit.sink import AuditSink
from toolauthz.authorizer.retainer import Retainer
from toolauthz.bundle import Bundle, BundleHolder
from toolauthz.call_record import CallRecord
from toolauthz.clock import Clock
from toolauthz.engine import PreparedCall
from toolauthz.model import TrustedContext, Verdict
from toolauthz.store.ledger import CallLedger
from toolauthz.telemetry import metrics
from toolauthz.tokens import CallClaims, IssuedToken, TokenIssuer, TokenVerifier


@dataclass
class Parts:
    bundles: BundleHolder
    ledger: CallLedger
    issuer: TokenIssuer
    verifier: TokenVerifier
    audit: AuditSink
    clock: Clock
    approvals: ApprovalDesk | None = None
    # A replayed call gets a fresh token only this long after its decision (or approval),
    # and for a plain ALLOW only under the same policy version: an old decision must not
    # become executable again days later, under policies that may have changed since.
    reissue_window: float = 300.0
    retainer: Retainer | None = None  # keeps the inputs of tools with `audit.retain_input`
    _shadow_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _shadow: Counter = field(default_factory=Counter, repr=False)

    def shadow_effects(self) -> dict[str, int]:
        with self._shadow_lock:
            return dict(self._shadow)

    def count_shadow(self, bundle: Bundle, verdict: Verdict) -> None:
        shadow = verdict.detail.get("shadow")
        if shadow:
            ids = [pid for pid in shadow["reasons"] if pid in bundle.policies and bundle.policies[pid].shadow]
            with self._shadow_lock:
                self._shadow.update(ids or ["(unattributed)"])
            for pid in ids or ["(unattributed)"]:
                metrics.SHADOW_DISAGREEMENTS.labels(policy=pid).inc()

    def new_id(self) -> str:
        return str(ULID.from_timestamp(self.clock.now()))

    def issue(self, ctx: TrustedContext, call_id: str, prepared: PreparedCall, decision_id: str,
              version: str) -> IssuedToken:
        claims = CallClaims(ctx.tenant, ctx.principal.type, ctx.principal.id, prepared.slice.tool.name, call_id)
        return self.issuer.issue(claims, prepared.digest, decision_id=decision_id, policy_version=version)

    def record(self, record: CallRecord, verdict: Verdict, *, jti: str = "",
               detail: Mapping[str, Any] | None = None) -> None:
        """The audit record of an answer that has no ledger write of its own (a replay)."""
        self.write(self.event(record, verdict, jti=jti, detail=detail))

    def event(self, record: CallRecord, verdict: Verdict, *, jti: str = "",
              detail: Mapping[str, Any] | None = None) -> AuditEvent:
        return record.event(self.clock.now(), verdict.decision.value, reasons=verdict.reasons,
                            error_codes=tuple(e.code for e in verdict.errors), jti=jti,
                            detail={**verdict.detail, **(detail or {})})

    def write(self, event: AuditEvent) -> None:
        self.audit.write(event)  # raises StoreUnavailable: the caller sends no token
