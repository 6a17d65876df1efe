"""Approval events, derived from the approvals themselves, and what each one says.

Three events per approval, each with a stable id `<approval id>.<suffix>` that is the
webhook id of every attempt to deliver it (a receiver drops a repeat by it):

    approval.created    the approval opened (not sent once it is decided: nothing to do)
    approval.expiring   it is still pending `warning_seconds` before it expires
    approval.decided    approved, rejected, or expired without a decision

An event says only what an approver needs and may see: the tool, the resource, the
requester, the group, the short code of the call's digest, the times, and the
arguments the tool allow-lists for approvers, as its display hints show them. Never the
rest of the arguments, the digest, a token or the kept call input.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from toolauthz.store.approvals import APPROVED, EXPIRED, PENDING, REJECTED, ApprovalRecord

CREATED, EXPIRING, DECIDED = "approval.created", "approval.expiring", "approval.decided"
_SUFFIX = {CREATED: "created", EXPIRING: "expiring", DECIDED: "decided"}
_TYPE = {suffix: kind for kind, suffix in _SUFFIX.items()}

# (record) -> the allow-listed arguments as an approver reads them, by label.
FieldsOf = Callable[[ApprovalRecord], Mapping[str, str]]


@dataclass(frozen=True)
class ApprovalEvent:
    event_id: str
    type: str
    approval_id: str


def event(approval_id: str, kind: str) -> ApprovalEvent:
    return ApprovalEvent(f"{approval_id}.{_SUFFIX[kind]}", kind, approval_id)


def parse_event_id(event_id: str) -> ApprovalEvent | None:
    approval_id, _, suffix = event_id.rpartition(".")
    kind = _TYPE.get(suffix)
    return ApprovalEvent(event_id, kind, approval_id) if kind and approval_id else None


def events_of(record: ApprovalRecord, now: float, warning_seconds: float) -> list[ApprovalEvent]:
    """The events of an approval that are due at `now`."""
    seen = record.as_of(now)
    due = [event(record.approval_id, CREATED)]
    if seen.status == PENDING and now >= record.expires_at - warning_seconds:
        due.append(event(record.approval_id, EXPIRING))
    if seen.status in (APPROVED, REJECTED, EXPIRED):
        due.append(event(record.approval_id, DECIDED))
    return due


def still_news(kind: str, record: ApprovalRecord, now: float) -> bool:
    """Whether the event is worth sending now: a request to act only while it is pending."""
    return kind == DECIDED or record.as_of(now).status == PENDING


def iso(epoch: float | None) -> str:
    if epoch is None:
        return ""
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def approval_url(console_url: str, approval_id: str) -> str:
    return f"{console_url.rstrip('/')}/approvals/{approval_id}" if console_url else ""


def payload(ev: ApprovalEvent, record: ApprovalRecord, *, now: float, console_url: str,
            fields_of: FieldsOf) -> dict[str, Any]:
    """The event as JSON data (the webhook body; the chat message is made from it)."""
    seen = record.as_of(now)
    return {
        "type": ev.type,
        "id": ev.event_id,
        "timestamp": iso(now),
        "data": {
            "approval_id": record.approval_id,
            "tenant": record.tenant,
            "tool": record.tool,
            "resource": record.resource,
            "requester": record.requester,
            "group": record.group,
            "policy": record.policy_id,
            "short_code": record.short_code,
            "status": seen.status,
            "created_at": iso(record.created_at),
            "expires_at": iso(record.expires_at),
            "decided_at": iso(seen.decided_at),
            "approver": seen.approver,
            "reason": seen.reason,
            "fields": dict(fields_of(record)),
            "url": approval_url(console_url, record.approval_id),
        },
    }
