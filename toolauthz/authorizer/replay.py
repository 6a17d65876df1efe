"""Authorize of a call already recorded (the same call id again): its decision replayed,
to its owner alone, with a fresh token only while the call may still run."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from toolauthz.authorizer.parts import Parts
from toolauthz.authorizer.plans import AuthorizeResult
from toolauthz.call_record import CallRecord
from toolauthz.display.escape import display
from toolauthz.engine import PreparedCall
from toolauthz.errors import ForbiddenError
from toolauthz.model import Decision, ErrorDetail, TrustedContext, Verdict, deny
from toolauthz.store.ledger import CallEntry


def replay(parts: Parts, record: CallRecord, ctx: TrustedContext, prepared: PreparedCall, entry: CallEntry,
           still_wanted: Callable[[], bool]) -> AuthorizeResult:
    """`record`: this request, as its audit records name it; `entry`: the call recorded
    under its call id. Another caller, principal or run than the call's gets
    ForbiddenError (audited): its decision, token and approval stay its owner's."""
    if entry.owner != record.owner:
        parts.write(record.not_owner(entry, parts.clock.now(), {"replayed": True}))
        raise ForbiddenError(f"call `{display(entry.call_id)}` belongs to another caller, principal or run")
    version = record.policy_version
    if entry.digest != prepared.digest:
        verdict = deny("call_id_reused", "this call id was already used for a different call")
        parts.record(record, verdict, detail={"original_decision_id": entry.decision_id})
        return AuthorizeResult(Decision.DENY, record.decision_id, version, errors=verdict.errors,
                               digest=prepared.digest)
    if not entry.decided:
        verdict = deny("call_in_progress", "this call is still being decided; retry shortly")
        parts.record(record, verdict)
        return AuthorizeResult(Decision.DENY, record.decision_id, version, errors=verdict.errors,
                               digest=prepared.digest)
    decision = Decision(entry.decision)
    errors = tuple(ErrorDetail(c, m) for c, m in entry.errors)
    # A token only while the call has not been executed: Verify consumes per call.
    token = None
    fresh = parts.clock.now() - entry.created_at <= parts.reissue_window
    approvals = parts.approvals
    if not still_wanted() or entry.verified_jti or entry.outcome:
        pass  # nobody to hand a token to, or the call was executed or has ended
    elif decision is Decision.ALLOW:
        if fresh and entry.policy_version == version:
            token = parts.issue(ctx, entry.call_id, prepared, entry.decision_id, entry.policy_version)
        else:
            errors += (ErrorDetail("reissue_refused", "this call was decided too long ago or under other "
                                   "policies; propose it again with a new call id"),)
    elif decision is Decision.APPROVAL_REQUIRED and approvals:
        # Re-decided under the policies loaded now if they are not those that approved it.
        approval = approvals.on_replay(entry.approval_id, parts.reissue_window, ctx, prepared)
        token = approval.token if approval else None
        if token is not None:
            decision = Decision.ALLOW  # approved by a second principal: now it may run
        elif approval is not None and approval.refusal is not None:
            decision, errors = Decision.DENY, errors + (approval.refusal,)
    approval_expires_at = approvals.expiry(entry.approval_id) \
        if decision is Decision.APPROVAL_REQUIRED and approvals else None
    verdict = Verdict(decision, entry.reasons, errors)
    original = replace(record, decision_id=entry.decision_id, policy_version=entry.policy_version,
                       approval_id=entry.approval_id)
    parts.record(original, verdict, jti=token.jti if token else "", detail={"replayed": True})
    return AuthorizeResult(decision, entry.decision_id, entry.policy_version, entry.reasons, errors,
                           prepared.digest, token, entry.approval_id, replayed=True,
                           approval_expires_at=approval_expires_at)
