"""One call's story as `toolauthz audit show` prints it: every step in the order it
happened and a summary line, each recorded string escaped (toolauthz/display/escape.py);
or, with `--output json`, one JSON object per call."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from toolauthz.audit import AuditRecord
from toolauthz.audit.shadow import shadow_line
from toolauthz.audit.timeline import Summary, build_timeline
from toolauthz.display.escape import display, display_uid


def iso_time(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def story_json(records: list[AuditRecord], record_json: Callable[[AuditRecord], dict]) -> dict[str, Any]:
    """`{call_id, tenant, summary, records}`: the summary's fields as the timeline holds
    them, and every record as `audit export` writes it (JSON escapes what a model wrote)."""
    first = records[0].event
    return {"call_id": first.call_id, "tenant": first.tenant,
            "summary": dataclasses.asdict(build_timeline(records).summary),
            "records": [record_json(record) for record in records]}


def print_story(records: list[AuditRecord]) -> None:
    story = build_timeline(records)
    first = records[0].event
    print(f"call {display(first.call_id)} in tenant {display(first.tenant)}: {display(first.tool)}"
          f" by {display_uid(first.principal)} on {display_uid(first.resource) if first.resource else '-'}")
    print(f"digest {display(first.digest) or '-'}  policy version {display(first.policy_version)}")
    # In the order it happened (seq): a replayed decision after an approval shows after it.
    for record in (step.record for step in story.steps if step.record is not None):
        print("  " + _story_line(record))
        decided = record.event.detail.get("decided_by") if record.event.kind == "authorize" else None
        if isinstance(decided, dict):
            print("  " + " " * 26 + _decided_by_line(decided))
        shadow = shadow_line(record.event.detail) if record.event.kind == "authorize" else None
        if shadow is not None:
            print("  " + " " * 26 + shadow)
    print("  " + _summary_line(story.summary))


def _summary_line(s: Summary) -> str:
    """The answers first: decided how, approved by whom and why, verified, did it run."""
    parts = [f"decision {display(s.decision or '-')}"]
    if s.final_decision and s.final_decision != s.decision:
        parts[0] += f" then {display(s.final_decision)}"
    if s.approval is not None:
        said = f": {display(s.approval.reason)}" if s.approval.reason else ""
        who = f" by {display_uid(s.approval.approver)}" if s.approval.approver else ""
        parts.append(f"{_VERDICT_WORDS.get(s.approval.verdict, display(s.approval.verdict))}{who}{said}")
    elif s.approval_id:
        parts.append("approval not decided")
    parts.append("token verified" if s.verified else "never verified")
    ran = {True: "it ran", False: "it did not run", None: "whether it ran is unknown"}[s.ran]
    parts.append(f"outcome {display(s.outcome)} ({ran})" if s.outcome else "no outcome reported")
    return "summary: " + "; ".join(parts)


_VERDICT_WORDS = {"APPROVE": "approved", "REJECT": "rejected", "refused": "approval ended by policy change"}


def _decided_by_line(decided: dict) -> str:
    """The entities a decision was made on (toolauthz/decided_by.py), escaped."""
    def uids(name: str) -> str:
        return ", ".join(display_uid(str(uid)) for uid in decided.get(name, [])) or "-"

    # JSON text is a literal of its own: its quotes are already escaped (display's quotes=False)
    supplied = "; ".join(
        display_uid(str(entity.get("uid"))) + (" " + display(json.dumps(entity.get("attrs"), sort_keys=True,
                                                                         ensure_ascii=False), quotes=False)
                                               if entity.get("attrs") else "")
        for entity in decided.get("supplied", []) if isinstance(entity, dict)) or "-"
    omitted = decided.get("omitted") or {}
    left_out = ", ".join(f"{display(str(n))} {display(str(what))}" for what, n in sorted(omitted.items()) if n)
    return (f"on principal {uids('principal')} | resource {uids('resource')} | supplied {supplied}"
            + (f" | left out: {left_out}" if left_out else ""))


def _story_line(record: AuditRecord) -> str:
    """One step of a call's story; every recorded string is escaped (toolauthz/display/escape.py)."""
    e = record.event
    at = iso_time(e.time)
    if e.kind == "authorize":
        why = display(", ".join(e.reasons) or ", ".join(e.error_codes) or "-")
        extra = f" approval {display(e.approval_id)}" if e.approval_id else ""
        replay = " (replayed)" if e.detail.get("replayed") else ""
        decision = f"[decision {display(e.decision_id)}]"
        return f"{at}  decision     {display(e.result)}{replay} because {why}{extra}  {decision}"
    if e.kind == "approval":
        why = f" ({display(', '.join(e.error_codes))})" if e.error_codes else ""
        reason = e.detail.get("reason")
        said = f": {display(reason)}" if isinstance(reason, str) and reason else ""
        return f"{at}  approval     {display(e.result)}{why} by {display_uid(e.approver)}{said}"
    if e.kind == "verify":
        return f"{at}  verification {display(e.result)}" + (f" token {display(e.jti[:8])}…" if e.jti else "")
    flags = display(" ".join(str(flag) for flag in e.detail.get("flags", [])))
    code = display(str(e.detail.get("error_code") or ""))
    return f"{at}  outcome      {display(e.result)}{' ' + code if code else ''}{' [' + flags + ']' if flags else ''}"


