"""Pending approvals: bound to one call's digest, decided once by a second principal."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from toolauthz.audit.records import AuditEvent

PENDING, APPROVED, REJECTED, EXPIRED = "pending", "approved", "rejected", "expired"


@dataclass(frozen=True)
class ApprovalRecord:
    approval_id: str
    tenant: str
    call_id: str
    request_id: str
    requester_type: str
    requester_id: str
    tool: str
    resource: str
    group: str
    policy_id: str
    digest: str
    short_code: str
    decision_id: str
    policy_version: str
    created_at: float
    expires_at: float
    fields: dict[str, Any] = field(default_factory=dict)  # allow-listed arguments only
    status: str = PENDING
    decided_at: float | None = None
    approver: str = ""  # Cedar uid of the approver
    reason: str = ""
    token: str = ""
    token_jti: str = ""
    token_expires_at: float | None = None
    # What re-deciding the call needs while the approval is pending (approvals.py): the
    # call's arguments as canonical JSON and the entities its runtime vouched for. Kept
    # nowhere else, never audited, erased when the approval is decided or has expired.
    call_input: bytes = b""
    call_entities: bytes = b""
    # The run's counts the call was decided on, and the policy version that approved it
    # (its token's `policy_version`).
    run_calls: int = 0
    run_tool_calls: int = 0
    approved_version: str = ""
    # The usage meters' values the call was decided on, by name: shown to approvers, and
    # what re-deciding it reads in `context.usage` (its share is held meanwhile).
    usage: dict[str, int] = field(default_factory=dict)

    @property
    def requester(self) -> str:
        return f'{self.requester_type}::"{self.requester_id}"'

    def as_of(self, now: float) -> ApprovalRecord:
        """Expiry is a function of time: a pending approval past its expiry reads as expired."""
        if self.status == PENDING and now > self.expires_at:
            return replace(self, status=EXPIRED)
        return self


class ApprovalStore(Protocol):
    def create(self, record: ApprovalRecord) -> None: ...

    def get(self, approval_id: str) -> ApprovalRecord | None: ...

    def list(self, *, tenant: str = "", status: str = "", group: str = "", now: float,
             limit: int = 100) -> list[ApprovalRecord]: ...

    def decide(self, approval_id: str, *, status: str, approver: str, reason: str, now: float,
               token: str = "", token_jti: str = "", token_expires_at: float | None = None,
               approved_version: str = "", audit: Callable[[bool], AuditEvent] | None = None) -> bool:
        """Atomically moves a pending, unexpired approval to `status`, erasing its
        `call_input` and `call_entities` (and those of every expired approval); False when
        it was no longer pending (someone else decided first, or it expired). `audit(won)`
        builds the record of this attempt, committed in the same transaction: an approval
        never changes without its record, nor is one recorded that did not happen."""


def approvals_filter(*, tenant: str, status: str, group: str, now: float,
                     mark: str) -> tuple[str, list[object]]:
    """The WHERE clause (empty, or starting with `WHERE`) and its values that select
    the approvals a listing asks for; `mark` is the backend's placeholder (`?`, `%s`).
    `pending` and `expired` are read against `now`: the stored status stays `pending`
    until an approval is decided."""
    where: list[str] = []
    args: list[object] = []
    if tenant:
        where.append(f"tenant = {mark}")
        args.append(tenant)
    if group:
        where.append(f"group_name = {mark}")
        args.append(group)
    if status == EXPIRED:
        where.append(f"status = 'pending' AND expires_at < {mark}")
        args.append(now)
    elif status == PENDING:
        where.append(f"status = 'pending' AND expires_at >= {mark}")
        args.append(now)
    elif status:
        where.append(f"status = {mark}")
        args.append(status)
    return ("WHERE " + " AND ".join(where)) if where else "", args
