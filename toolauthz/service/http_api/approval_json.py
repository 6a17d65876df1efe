"""The JSON of an approval and of one call's audit story, as the HTTP API answers them.

An approval carries the fields gRPC's `Approval` message carries (service/approvals.py
`approval_message`), spelled as JSON: absent values are null, times RFC 3339, the
status in lowercase as the store keeps it. A story is audit/timeline.py's `Timeline`.
Values are the records' own, unescaped: JSON is not a display, and whoever shows them to
a person escapes them (the console, `audit query`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from toolauthz.audit.timeline import Step, Timeline
from toolauthz.display.hints import DisplayHint, labelled, shown_usage
from toolauthz.service.http_api.answers import rfc3339
from toolauthz.store.approvals import ApprovalRecord

__all__ = ["approval_json", "story_json"]


def _principal(uid: str) -> dict[str, str] | None:
    """`Type::"id"` as {type, id}; None for an empty uid."""
    if not uid:
        return None
    kind, _, rest = uid.partition("::")
    return {"type": kind, "id": rest[1:-1]}


def approval_json(r: ApprovalRecord, hints: Mapping[str, DisplayHint],
                  usage_hints: Mapping[str, DisplayHint | None]) -> dict[str, Any]:
    """The approval; its token is there only when the desk left it in `r` (the owner's
    read, service/ownership.py)."""
    return {
        "approval_id": r.approval_id, "status": r.status, "tenant": r.tenant,
        "requester": {"type": r.requester_type, "id": r.requester_id},
        "tool": r.tool, "resource": r.resource, "group": r.group, "policy_id": r.policy_id,
        "call_id": r.call_id, "request_id": r.request_id, "digest": r.digest, "short_code": r.short_code,
        "arguments": r.fields,
        "shown_fields": [{"label": label, "value": value} for label, value in labelled(r.fields, hints).items()],
        "usage": [{"label": name, "value": value} for name, value in shown_usage(r.usage, usage_hints).items()],
        "created_at": rfc3339(r.created_at), "expires_at": rfc3339(r.expires_at),
        "decided_at": rfc3339(r.decided_at) if r.decided_at is not None else None,
        "approver": _principal(r.approver), "reason": r.reason,
        "token": r.token or None,
        "token_expires_at": rfc3339(r.token_expires_at) if r.token and r.token_expires_at is not None else None,
    }


def _step_json(step: Step) -> dict[str, Any]:
    return {"seq": step.seq, "time": rfc3339(step.time), "stage": step.stage, "result": step.result,
            "actor": step.actor, "codes": list(step.codes), "reason": step.reason, "replayed": step.replayed,
            "error_code": step.error_code}


def story_json(timeline: Timeline, *, complete: bool) -> dict[str, Any]:
    """`complete`: False when the call has more records than one answer holds (the
    first ones are given)."""
    s = timeline.summary
    verdict = s.approval
    return {
        "summary": {
            "call_id": s.call_id, "tenant": s.tenant, "tool": s.tool, "resource": s.resource,
            "principal": s.principal, "digest": s.digest, "decision": s.decision,
            "final_decision": s.final_decision, "policy_version": s.policy_version,
            "approval_id": s.approval_id or None,
            "approval": None if verdict is None else {
                "verdict": verdict.verdict, "approver": verdict.approver, "reason": verdict.reason,
                "seq": verdict.seq, "time": rfc3339(verdict.time)},
            "refused_approvals": s.refused_approvals, "verified": s.verified,
            "outcome": s.outcome or None, "ran": s.ran,
        },
        "steps": [_step_json(step) for step in timeline.steps],
        "complete": complete,
    }
