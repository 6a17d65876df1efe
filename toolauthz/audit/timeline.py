"""One call's story from its audit records: the steps in the order they happened, and
the answers an auditor asks first (who approved or rejected it and why, was its token
verified, did it run and how did it end).

Pure: it takes the records of one call (any order; `audit query --call-id`, the Audit
service or the console fetch them) and reads nothing else. Values are returned as the
records hold them, unescaped: every string here may come from a model or a runtime, so
whoever shows them escapes them (toolauthz/display/escape.py for a terminal, Jinja2 autoescape
and `display` for a page).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from toolauthz.audit.records import AuditRecord

# The stage of each record kind, as a person reads a call's story.
STAGES = {"authorize": "decision", "approval": "approval", "verify": "verification", "outcome": "outcome"}
VERDICTS = ("APPROVE", "REJECT")
# What an outcome record's result says about the tool having been run.
ENDED_BY_POLICY = "policy_changed"  # toolauthz.approvals.POLICY_CHANGED (audit/ sits below it)
RAN = {"completed": True, "failed": True, "cancelled": False, "outcome_unknown": None}


@dataclass(frozen=True)
class Step:
    """One record of the call, as a step of its story."""

    seq: int
    time: float
    stage: str  # decision, approval, verification or outcome (STAGES)
    result: str  # the record's result: ALLOW, APPROVE, ok, completed, refused...
    actor: str  # who acted: the approver for an approval, else the call's principal
    codes: tuple[str, ...]  # the policies that decided it (reasons), else its error codes
    reason: str = ""  # an approver's reason, or why an approval was ended
    replayed: bool = False  # a decision replayed after its approval
    error_code: str = ""  # an outcome's error code, as the runtime reported it
    record: AuditRecord | None = None  # the record itself, for a reader who wants every field


@dataclass(frozen=True)
class ApprovalVerdict:
    """How the call's approval was settled: APPROVE or REJECT by a person, or `refused`
    when the policies loaded at approval time no longer allowed it (`reason` says why)."""

    verdict: str
    approver: str
    reason: str
    seq: int
    time: float


@dataclass(frozen=True)
class Summary:
    call_id: str = ""
    tenant: str = ""
    tool: str = ""
    resource: str = ""
    principal: str = ""
    digest: str = ""
    decision: str = ""  # the first decision (ALLOW, DENY, APPROVAL_REQUIRED, refused)
    final_decision: str = ""  # the last decision, e.g. ALLOW when the call was replayed after approval
    policy_version: str = ""  # of the first decision
    approval_id: str = ""
    approval: ApprovalVerdict | None = None
    refused_approvals: int = 0  # attempts to decide refused (not an approver, expired...)
    verified: bool = False  # a token for the call was verified (`ok`) at least once
    outcome: str = ""  # completed, failed, cancelled, outcome_unknown; "" when none was reported
    ran: bool | None = None  # True: it ran (completed or failed), False: it did not, None: unknown


@dataclass(frozen=True)
class Timeline:
    steps: tuple[Step, ...]
    summary: Summary


def build_timeline(records: Iterable[AuditRecord]) -> Timeline:
    """The story of one call from its records, ordered by seq (the order they were
    committed in: a replayed decision after an approval comes after it)."""
    ordered = sorted(records, key=lambda r: r.seq)
    steps = tuple(_step(r) for r in ordered)
    return Timeline(steps, _summary(ordered))


def _step(record: AuditRecord) -> Step:
    e = record.event
    reason = e.detail.get("reason")
    error_code = e.detail.get("error_code") if e.kind == "outcome" else ""
    return Step(seq=record.seq, time=e.time, stage=STAGES.get(e.kind, e.kind), result=e.result,
                actor=e.approver if e.kind == "approval" else e.principal,
                codes=tuple(e.reasons or e.error_codes),
                reason=reason if isinstance(reason, str) else "",
                replayed=bool(e.detail.get("replayed")),
                error_code=error_code if isinstance(error_code, str) else "", record=record)


def _summary(ordered: list[AuditRecord]) -> Summary:
    if not ordered:
        return Summary()
    decisions = [r for r in ordered if r.event.kind == "authorize"]
    first = (decisions or ordered)[0].event
    approval: ApprovalVerdict | None = None
    refused = 0
    for r in ordered:
        e = r.event
        if e.kind != "approval":
            continue
        reason = e.detail.get("reason")
        text = reason if isinstance(reason, str) else ""
        if e.result in VERDICTS:
            approval = ApprovalVerdict(e.result, e.approver, text, r.seq, e.time)
        elif e.result == "refused" and ENDED_BY_POLICY in e.error_codes:
            # The desk ended the approval: the policies loaded now refuse the call.
            approval = ApprovalVerdict("refused", e.approver, text, r.seq, e.time)
        elif e.result == "refused":
            refused += 1
    outcomes = [r.event.result for r in ordered if r.event.kind == "outcome" and r.event.result in RAN]
    outcome = outcomes[0] if outcomes else ""
    return Summary(
        call_id=first.call_id, tenant=first.tenant, tool=first.tool,
        resource=next((r.event.resource for r in ordered if r.event.resource), ""),
        principal=first.principal, digest=next((r.event.digest for r in ordered if r.event.digest), ""),
        decision=decisions[0].event.result if decisions else "",
        final_decision=decisions[-1].event.result if decisions else "",
        policy_version=first.policy_version,
        approval_id=next((r.event.approval_id for r in ordered if r.event.approval_id), ""),
        approval=approval, refused_approvals=refused,
        verified=any(r.event.kind == "verify" and r.event.result == "ok" for r in ordered),
        outcome=outcome, ran=RAN.get(outcome) if outcome else None)
