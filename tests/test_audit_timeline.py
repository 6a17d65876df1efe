"""toolauthz/audit/timeline.py: one call's records become its story, in seq order."""

from __future__ import annotations

from toolauthz.audit.records import AuditEvent, AuditRecord
from toolauthz.audit.timeline import build_timeline

CALL = {"call_id": "c1", "tenant": "acme", "principal": 'User::"alice"', "tool": "issue_refund",
        "resource": 'Order::"ord_777"', "digest": "ab" * 32, "decision_id": "d1", "approval_id": "a1"}


def _record(seq: int, kind: str, result: str, time: float, **extra: object) -> AuditRecord:
    values = {**CALL, **extra}
    return AuditRecord(seq, AuditEvent(kind=kind, time=time, result=result, **values), "0" * 64, "1" * 64)


def test_steps_follow_seq_and_the_summary_answers_who_approved_and_whether_it_ran() -> None:
    records = [
        _record(5, "outcome", "completed", 50.0, detail={"error_code": ""}),
        _record(2, "approval", "refused", 20.0, approver='User::"mallory"', error_codes=("approver_not_permitted",)),
        _record(1, "authorize", "APPROVAL_REQUIRED", 10.0, reasons=("refund-needs-approval",),
                policy_version="v1"),
        _record(3, "approval", "APPROVE", 30.0, approver='User::"bob"', detail={"reason": "checked the order"}),
        _record(4, "verify", "ok", 40.0),
        _record(6, "authorize", "ALLOW", 44.0, detail={"replayed": True}),
    ]
    timeline = build_timeline(records)
    assert [s.seq for s in timeline.steps] == [1, 2, 3, 4, 5, 6]
    assert [s.stage for s in timeline.steps] == ["decision", "approval", "approval", "verification", "outcome",
                                                 "decision"]
    assert timeline.steps[2].actor == 'User::"bob"' and timeline.steps[2].reason == "checked the order"
    assert timeline.steps[5].replayed and not timeline.steps[0].replayed
    assert timeline.steps[0].codes == ("refund-needs-approval",)
    s = timeline.summary
    assert (s.decision, s.final_decision, s.policy_version) == ("APPROVAL_REQUIRED", "ALLOW", "v1")
    assert s.approval is not None
    assert (s.approval.verdict, s.approval.approver, s.approval.reason) == ("APPROVE", 'User::"bob"',
                                                                            "checked the order")
    assert s.refused_approvals == 1
    assert s.verified and s.outcome == "completed" and s.ran is True
    assert s.resource == 'Order::"ord_777"' and s.approval_id == "a1"


def test_a_rejected_call_never_verified_nor_run() -> None:
    timeline = build_timeline([
        _record(1, "authorize", "APPROVAL_REQUIRED", 1.0),
        _record(2, "approval", "REJECT", 2.0, approver='User::"bob"', detail={"reason": "wrong order"}),
    ])
    s = timeline.summary
    assert s.approval is not None and (s.approval.verdict, s.approval.reason) == ("REJECT", "wrong order")
    assert not s.verified and s.outcome == "" and s.ran is None


def test_an_approval_ended_by_changed_policies_is_its_verdict() -> None:
    timeline = build_timeline([
        _record(1, "authorize", "APPROVAL_REQUIRED", 1.0),
        _record(2, "approval", "refused", 2.0, approver='User::"bob"', error_codes=("policy_changed",),
                detail={"reason": "policy_changed: the policies loaded now deny this call"}),
    ])
    s = timeline.summary
    assert s.approval is not None and s.approval.verdict == "refused" and s.refused_approvals == 0
    assert s.approval.reason.startswith("policy_changed")


def test_no_records_is_an_empty_story() -> None:
    timeline = build_timeline([])
    assert timeline.steps == () and timeline.summary.call_id == "" and timeline.summary.approval is None
