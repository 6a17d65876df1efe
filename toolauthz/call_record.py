"""How every audit record names the call it is about."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from toolauthz.audit.records import AuditEvent
from toolauthz.model import TrustedContext
from toolauthz.store.ledger import CallEntry, CallOwner

# The error code of every refusal of a request about a call its caller does not own.
NOT_CALL_OWNER = "not_call_owner"


@dataclass(frozen=True)
class CallRecord:
    """The call as every audit record about it names it. Made once from the trusted
    context and the call envelope (`of`) or from the ledger's row (`of_entry`), then
    completed with `replace` as the decision path learns more: the resource, digest and
    allow-listed fields once the call is prepared, the approval a decision opens."""

    kind: str
    tenant: str
    principal: str
    request_id: str
    call_id: str
    tool: str
    decision_id: str = ""
    policy_version: str = ""
    resource: str = ""
    digest: str = ""
    approval_id: str = ""
    approver: str = ""
    fields: Mapping[str, Any] = field(default_factory=dict)
    caller: str = ""  # who asked, as the transport proved it (AuditEvent.caller)

    @classmethod
    def of(cls, kind: str, ctx: TrustedContext, call_id: str, tool: str, caller: str = "") -> CallRecord:
        # The tool as the caller named it, cut short: it may be no tool at all.
        return cls(kind, ctx.tenant, str(ctx.principal), ctx.request_id, call_id, tool[:64], caller=caller)

    @classmethod
    def of_entry(cls, kind: str, entry: CallEntry, caller: str = "") -> CallRecord:
        return cls(kind, entry.tenant, entry.principal, entry.request_id, entry.call_id, entry.tool,
                   decision_id=entry.decision_id, policy_version=entry.policy_version, digest=entry.digest,
                   approval_id=entry.approval_id, caller=caller)

    @property
    def owner(self) -> CallOwner:
        """Who asks, as the owner of the call they name would be."""
        return CallOwner(self.tenant, self.caller, self.principal, self.request_id)

    def not_owner(self, entry: CallEntry, time: float, detail: Mapping[str, Any] | None = None, *,
                  jti: str = "") -> AuditEvent:
        """The record of a refusal: this request named the call of `entry`, which it does
        not own. Named as the caller claimed to be, with the call it tried to act on and
        in which of the owner's fields it differs (never their values)."""
        shown = replace(self, tool=entry.tool, decision_id=entry.decision_id)
        return shown.event(time, "refused", error_codes=(NOT_CALL_OWNER,), jti=jti,
                           detail={**(detail or {}), "mismatch": entry.owner.differences(self.owner)})

    def event(self, time: float, result: str, *, reasons: tuple[str, ...] = (), error_codes: tuple[str, ...] = (),
              jti: str = "", detail: Mapping[str, Any] | None = None) -> AuditEvent:
        return AuditEvent(kind=self.kind, time=time, decision_id=self.decision_id, request_id=self.request_id,
                          call_id=self.call_id, tenant=self.tenant, principal=self.principal, tool=self.tool,
                          resource=self.resource, result=result, reasons=reasons, error_codes=error_codes,
                          digest=self.digest, policy_version=self.policy_version, jti=jti,
                          approval_id=self.approval_id, approver=self.approver,
                          fields=dict(self.fields), detail=dict(detail or {}), caller=self.caller)
