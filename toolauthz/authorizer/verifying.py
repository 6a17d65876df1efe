"""Verify, planned: the token checked against the exact call, then consumed, once, by the
call's owner, in the transaction that records it."""

from __future__ import annotations

from dataclasses import replace

from toolauthz.audit.records import AuditEvent
from toolauthz.authorizer.parts import Parts
from toolauthz.authorizer.plans import Plan, VerifyResult
from toolauthz.bundle.catalog import MAX_INPUT_BYTES_CEILING
from toolauthz.call_record import CallRecord
from toolauthz.digest import InputLimits, digest_call
from toolauthz.errors import InputError
from toolauthz.model import ProposedCall, TrustedContext
from toolauthz.store.ledger import AppendAudit, CallEntry, ConsumeToken
from toolauthz.telemetry import tracing
from toolauthz.tokens import CallClaims


def plan_verify(parts: Parts, token: str, ctx: TrustedContext, call: ProposedCall, caller: str) -> Plan[VerifyResult]:
    """A token that checks out is consumed only by the call's owner (the caller, principal
    and run it was decided for): anyone else gets ForbiddenError, audited, and the token
    stays unused."""
    ctx.check()
    call.check()
    trace = tracing.current()
    try:
        with tracing.step("validate", trace):
            digest = digest_call(ctx, call, verify_limits(parts, call.name)).digest
    except InputError:
        digest = ""  # Authorize refuses such input: no token was ever issued for it
    expected = CallClaims(ctx.tenant, ctx.principal.type, ctx.principal.id, call.name, call.call_id)
    if digest:
        with tracing.step("check_token", trace):
            checked = parts.verifier.verify(token, digest, expected)
        code, jti, decision_id = checked.code, checked.jti or "", checked.decision_id or ""
    else:
        code, jti, decision_id = "bad_signature", "", ""
    record = replace(CallRecord.of("verify", ctx, call.call_id, call.name, caller), decision_id=decision_id,
                     digest=digest)
    now = parts.clock.now()

    def event(result: str) -> AuditEvent:
        return record.event(now, result, jti=jti)

    def refused(entry: CallEntry) -> AuditEvent:
        return record.not_owner(entry, now, jti=jti)

    if code == "ok":  # single use and its record: one transaction
        return Plan(ConsumeToken(ctx.tenant, call.call_id, jti, now, audit=event, owner=record.owner,
                                 refused=refused),
                    lambda consumed: VerifyResult(consumed == "ok", consumed, decision_id), trace=trace)
    return Plan(AppendAudit(event(code)), lambda _: VerifyResult(False, code, decision_id), trace=trace)


def verify_limits(parts: Parts, tool_name: str) -> InputLimits:
    """The limits Authorize parses a call of `tool_name` with. A tool the loaded bundle
    no longer has may still hold a token issued under an older one, so its input is read
    up to the largest `max_input_bytes` any bundle may set: input beyond that was never
    authorized under any bundle."""
    tool_slice = parts.bundles.current.tools.get(tool_name)
    return InputLimits(tool_slice.tool.max_input_bytes if tool_slice is not None else MAX_INPUT_BYTES_CEILING)
