"""A waiting call decided afresh under the policies loaded now: whether its approval still
makes it runnable. Pure functions of the engine and the approval record."""

from __future__ import annotations

from toolauthz.bundle import Bundle
from toolauthz.engine import RunCounts, evaluate, prepare, request_entities, supplied_entities
from toolauthz.errors import InputError, RequestError
from toolauthz.model import Decision, ErrorDetail, Principal, ProposedCall, TrustedContext, Verdict
from toolauthz.store.approvals import ApprovalRecord

POLICY_CHANGED = "policy_changed"


def still_allowed(bundle: Bundle, record: ApprovalRecord) -> ErrorDetail | None:
    """None when the policies in `bundle` still let this approval stand for the call (the
    ones that opened it trivially do), else why not."""
    if bundle.version == record.policy_version:
        return None
    requester = TrustedContext(record.tenant, Principal(record.requester_type, record.requester_id),
                               record.request_id, record.call_entities)
    call = ProposedCall(record.call_id, record.tool, record.call_input)
    return refusal_of(redecide(bundle, requester, call, record), record.group)


def redecide(bundle: Bundle, requester: TrustedContext, call: ProposedCall, record: ApprovalRecord) -> Verdict:
    """The call decided afresh by the engine under `bundle`, on the run counts and meter
    values it was first decided on (its share of both is held while it waits): a DENY
    for anything that no longer prepares (a tool gone, a schema narrowed, entities now
    refused) or no longer has the digest the approval is bound to."""
    run = RunCounts(record.run_calls, record.run_tool_calls)
    try:
        prepared = prepare(bundle, requester, call)
        if prepared.digest != record.digest:
            return Verdict(Decision.DENY, errors=(ErrorDetail("digest_mismatch", "the call is not the one approved"),))
        supplied = supplied_entities(requester.entities_json)
        return evaluate(bundle, requester, prepared, run, request_entities(bundle, requester, prepared, supplied),
                        record.usage)
    except (InputError, RequestError) as exc:
        code = exc.code if isinstance(exc, InputError) else "invalid_request"
        return Verdict(Decision.DENY, errors=(ErrorDetail(code, "the call can no longer be prepared"),))


def refusal_of(fresh: Verdict, group: str) -> ErrorDetail | None:
    """Why an approval by `group` no longer makes the call `fresh` runnable, or None:
    it stands when the call is now allowed outright or still needs that same group."""
    if fresh.decision is Decision.ALLOW:
        return None
    if fresh.decision is Decision.APPROVAL_REQUIRED:
        if fresh.approval_group == group:
            return None
        return ErrorDetail(POLICY_CHANGED, f"the policies loaded now ask approval by `{fresh.approval_group}`, "
                                           "not this approval's group; propose the call again")
    return ErrorDetail(POLICY_CHANGED, "the policies loaded now deny this call")
