"""Authorize, planned: checks, validation and the decision's inputs, up to the ledger's
write; the decision itself is made on the run's counts and the call's meters when the
plan runs (`writes.py`)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from toolauthz.authorizer.parts import Parts
from toolauthz.authorizer.plans import AuthorizeResult, Deciding, Plan, refuse
from toolauthz.authorizer.replay import replay
from toolauthz.bundle.catalog import resolve_pointer
from toolauthz.call_record import CallRecord
from toolauthz.decided_by import decided_by
from toolauthz.engine import PreparedCall, RunCounts, evaluate, prepare, request_entities, supplied_entities
from toolauthz.errors import InputError, RequestError
from toolauthz.model import Decision, ProposedCall, TrustedContext, Verdict, deny
from toolauthz.store.approvals import ApprovalRecord
from toolauthz.store.ledger import AppendAudit, CallEntry, RecordedDecision, Reservation, Standing
from toolauthz.telemetry import tracing
from toolauthz.tokens import IssuedToken


def plan_authorize(parts: Parts, ctx: TrustedContext, call: ProposedCall, still_wanted: Callable[[], bool],
                   caller: str, deadline: float | None = None) -> Plan[AuthorizeResult]:
    """Everything of Authorize up to its ledger write. `caller`: who asked, as the
    transport proved it; a new call is recorded as theirs (`CallEntry.caller`)."""
    ctx.check()
    call.check()
    trace = tracing.current()
    bundle = parts.bundles.deciding  # refused while the bundle is below the fleet's floor
    record = replace(CallRecord.of("authorize", ctx, call.call_id, call.name, caller),
                     decision_id=parts.new_id(), policy_version=bundle.version)
    try:
        with tracing.step("validate", trace):
            prepared = prepare(bundle, ctx, call)
    except InputError as exc:
        verdict = deny(exc.code, exc.message)
        return Plan(AppendAudit(parts.event(record, verdict)),
                    lambda _: AuthorizeResult(Decision.DENY, record.decision_id, bundle.version,
                                              errors=verdict.errors), trace=trace)

    record = replace(record, resource=prepared.resource, digest=prepared.digest, fields=_fields(prepared))
    try:
        supplied = supplied_entities(ctx.entities_json)
        entities = request_entities(bundle, ctx, prepared, supplied)
    except RequestError as exc:  # refused before anything but its audit record is stored
        refusal = record.event(parts.clock.now(), "refused", error_codes=("invalid_entities",),
                               detail={"error": str(exc)[:500]})
        return Plan(AppendAudit(refusal), functools.partial(refuse, exc), trace=trace)
    tool = prepared.slice.tool.name
    decided = {"decided_by": decided_by(bundle, ctx, prepared, supplied)}

    def draft(counts: Standing) -> _Draft:
        with tracing.step("evaluate", trace, {"toolauthz.tool": tool}):
            verdict = evaluate(bundle, ctx, prepared, _run_of(counts), entities, _usage_of(prepared, counts))
        wanted = verdict.decision is not Decision.ALLOW or still_wanted()
        token = None
        if verdict.decision is Decision.ALLOW and wanted:
            with tracing.step("sign", trace):
                token = parts.issue(ctx, call.call_id, prepared, record.decision_id, bundle.version)
        return _Draft(counts, verdict, token, gone=not wanted)

    state = _DecisionState()

    def decide(counts: Standing) -> RecordedDecision:
        # Called before each try at the ledger's transaction: Cedar, the signature and
        # the audit event are made again only if the counts or the meters differ from
        # the last try.
        # The row, the token's jti, the approval a policy asks for and the audit
        # record commit together.
        previous = state.draft
        current = previous
        if current is None or current.counts != counts:
            current = draft(counts)
        elif current.token is not None and not still_wanted():
            current = _Draft(current.counts, current.verdict, None, gone=True)
        if current is not previous or state.recorded is None:
            state.draft = current
            state.recorded = _recorded(parts, ctx, prepared, current, record, state, decided)
        return state.recorded

    def finish(reservation: Reservation) -> AuthorizeResult:
        if reservation.existing is not None:
            return replay(parts, record, ctx, prepared, reservation.existing, still_wanted)
        latest = state.latest()
        verdict, token = latest.verdict, latest.token
        if token is not None and not still_wanted():
            # Gone while the decision was being stored: the token minted for it (its
            # jti is in the record) is handed to no one; a retry replays the decision.
            token = None
        parts.count_shadow(bundle, verdict)
        if parts.retainer is not None:
            parts.retainer.retain(ctx, call.call_id, prepared, _run_of(latest.counts), bundle.version,
                                  _usage_of(prepared, latest.counts))
        approval = state.approval if verdict.decision is Decision.APPROVAL_REQUIRED else None
        return AuthorizeResult(verdict.decision, record.decision_id, bundle.version, verdict.reasons,
                               verdict.errors, prepared.digest, token, approval.approval_id if approval else "",
                               approval_expires_at=approval.expires_at if approval else None)

    entry = CallEntry(ctx.tenant, call.call_id, ctx.request_id, tool, prepared.digest, record.principal,
                      parts.clock.now(), caller=caller, charges=prepared.charges)
    return Plan(None, finish, Deciding(entry, decide), trace=trace, deadline=deadline)


@dataclass(frozen=True)
class _Draft:
    """A decision made on `counts` (the run's counts and the call's meters), with its
    token if one is due; `gone`: an ALLOW whose client no longer wants it (no token)."""

    counts: Standing
    verdict: Verdict
    token: IssuedToken | None
    gone: bool = False


@dataclass
class _DecisionState:
    """What one Authorize's `decide` made so far: it is called once per try at the
    ledger's transaction, and the call opens at most one approval."""

    draft: _Draft | None = None
    recorded: RecordedDecision | None = None  # what the ledger stores of `draft`
    approval: ApprovalRecord | None = None

    def latest(self) -> _Draft:
        if self.draft is None:
            raise RuntimeError("the ledger recorded a new call without asking for its decision")
        return self.draft


def _recorded(parts: Parts, ctx: TrustedContext, prepared: PreparedCall, draft: _Draft, record: CallRecord,
              state: _DecisionState, decided: Mapping[str, Any]) -> RecordedDecision:
    """What the ledger stores of a draft: the row's decision, the approval it opens
    (made once per call, kept in `state`) and its audit event."""
    verdict = draft.verdict
    approval = None
    if verdict.decision is Decision.APPROVAL_REQUIRED:
        if state.approval is None:
            state.approval = _new_approval(parts, ctx, prepared, verdict, record, draft.counts)
        else:  # decided again on counts or meters that moved: the same approval, on them
            state.approval = replace(state.approval, run_calls=draft.counts.calls,
                                     run_tool_calls=draft.counts.tool_calls, usage=_usage_of(prepared, draft.counts))
        approval = state.approval
    detail = dict(decided)
    if prepared.charges:  # what the meters stood at when this was decided
        detail["usage"] = _usage_of(prepared, draft.counts)
    if draft.gone:
        detail["client_gone"] = True
    event = parts.event(replace(record, approval_id=approval.approval_id if approval else ""), verdict,
                        jti=draft.token.jti if draft.token else "", detail=detail)
    return RecordedDecision(verdict.decision.value, record.decision_id, record.policy_version,
                            verdict.reasons, _error_pairs(verdict), approval=approval, audit=event)


def _new_approval(parts: Parts, ctx: TrustedContext, prepared: PreparedCall, verdict: Verdict,
                  record: CallRecord, standing: Standing) -> ApprovalRecord:
    if parts.approvals is None:
        raise RuntimeError("a policy asks for approval but no approval desk is configured")
    return parts.approvals.new_record(ctx, record.call_id, prepared, verdict, decision_id=record.decision_id,
                                      policy_version=record.policy_version, fields=dict(record.fields),
                                      run=_run_of(standing), usage=_usage_of(prepared, standing))


def _run_of(standing: Standing) -> RunCounts:
    return RunCounts(standing.calls, standing.tool_calls)


def _usage_of(prepared: PreparedCall, standing: Standing) -> dict[str, int]:
    """Each meter's value before the call, by name (what `context.usage` shows)."""
    return {charge.meter: value for charge, value in zip(prepared.charges, standing.usage, strict=True)}


def _fields(prepared: PreparedCall) -> dict[str, Any]:
    """The tool's allow-listed arguments (`audit_fields`), for the audit record."""
    out: dict[str, Any] = {}
    for pointer in prepared.slice.tool.audit_fields:
        found, value = resolve_pointer(prepared.input, pointer)
        if found:
            out[pointer] = value
    return out


def _error_pairs(verdict: Verdict) -> tuple[tuple[str, str], ...]:
    """A verdict's errors as the ledger stores them."""
    return tuple((e.code, e.message) for e in verdict.errors)
