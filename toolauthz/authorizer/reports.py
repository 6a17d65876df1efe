"""What a runtime reports after a decision: a call's outcome (ReportOutcome), or a call
it refused itself before asking (ReportRefusal)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from toolauthz.audit.records import AuditEvent
from toolauthz.authorizer.parts import Parts
from toolauthz.authorizer.plans import OutcomeResult, Plan
from toolauthz.call_record import CallRecord
from toolauthz.display.escape import display
from toolauthz.errors import InputError, RequestError
from toolauthz.model import ProposedCall, TrustedContext
from toolauthz.store.ledger import OUTCOMES, AppendAudit, CallEntry, RecordOutcome
from toolauthz.telemetry import tracing

# The refusals a runtime may report (`plan_report_refusal`): each one a check the runtime
# makes before Authorize, which the sidecar cannot make itself.
# `upstream_unavailable`: the MCP gateway's upstream was down, counted per caller, tool and
# minute by the gateway (toolauthz/mcp_proxy/refusal_tally.py): detail `count=N minute=T`.
REPORTABLE_REFUSALS = frozenset({"tool_changed", "upstream_unavailable"})
MAX_REFUSAL_DETAIL_CHARS = 512


def plan_report_outcome(parts: Parts, ctx: TrustedContext, call_id: str, status: str, error_code: str,
                        output_digest: str, caller: str) -> Plan[OutcomeResult]:
    """The outcome and its audit record commit together: a call never shows an outcome
    the audit trail lacks. Only the call's owner (its caller, principal and run) may
    report it: anyone else gets ForbiddenError, recorded in the audit trail, and changes
    nothing. The identical report again is answered as the first was and recorded once;
    another outcome after the first is a ConflictError."""
    ctx.check()
    ProposedCall(call_id, "-", b"").check()
    if status not in OUTCOMES:
        raise InputError("invalid_outcome", f"outcome must be one of {', '.join(OUTCOMES)}")
    claimant = CallRecord.of("outcome", ctx, call_id, "", caller)
    now = parts.clock.now()

    def accepted(entry: CallEntry) -> AuditEvent:
        detail: dict[str, Any] = {"error_code": error_code, "output_digest": output_digest}
        if not entry.verified_jti:
            detail["flags"] = ["unverified_outcome"]
        return CallRecord.of_entry("outcome", entry, caller).event(now, status, jti=entry.verified_jti,
                                                                  detail=detail)

    def refused(entry: CallEntry) -> AuditEvent:
        return claimant.not_owner(entry, now, {"outcome": status})

    op = RecordOutcome(ctx.tenant, call_id, status, error_code, output_digest, now, owner=claimant.owner,
                       audit=accepted, refused=refused)
    return Plan(op, lambda entry: OutcomeResult(entry.decision_id, unverified=not entry.verified_jti),
                trace=tracing.current())


def plan_report_refusal(parts: Parts, ctx: TrustedContext, call_id: str, tool: str, code: str, detail: str,
                        caller: str) -> Plan[str]:
    """A call the runtime refused before asking Authorize, as one audit record of kind
    `authorize`, result `refused`; the answer is the record's id. The call gets no ledger
    row: the same call id proposed later is decided as any new call. The runtime controls
    every value here, so the code is allow-listed, the tool is named as given only when
    the catalog has it, and the detail is bounded and escaped."""
    ctx.check()
    ProposedCall(call_id, tool, b"").check()
    if code not in REPORTABLE_REFUSALS:
        raise RequestError(f"code must be one of {', '.join(sorted(REPORTABLE_REFUSALS))}")
    if len(detail) > MAX_REFUSAL_DETAIL_CHARS:
        raise RequestError(f"detail must be at most {MAX_REFUSAL_DETAIL_CHARS} characters")
    bundle = parts.bundles.current
    catalogued = tool in bundle.tools
    # A name the catalog lacks is any string the runtime chose: cut short, then escaped.
    shown_tool = tool if catalogued else display(tool[:64])
    record = replace(CallRecord.of("authorize", ctx, call_id, tool, caller), tool=shown_tool,
                     decision_id=parts.new_id(), policy_version=bundle.version)
    event = record.event(parts.clock.now(), "refused", error_codes=(code,),
                         detail={"reported_by": "runtime", "detail": display(detail), "catalogued_tool": catalogued})
    return Plan(AppendAudit(event), lambda _: record.decision_id, trace=tracing.current())
