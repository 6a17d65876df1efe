"""The result of one guarded call, and the model-safe texts it carries.

A call ends in exactly one terminal outcome, the same four the sidecar records:

    completed        the tool ran and returned valid output
    failed           it did not run (refused, invalid input, not verified, ...) or it
                     ran and failed (execution_error, invalid_output, a ToolError code)
    cancelled        cancelled before the tool started: nothing ran
    outcome_unknown  cancelled or timed out after the tool started: it may have acted

Two more statuses are answers that are not outcomes:

    approval_pending the call waits for a person's approval; it has not run, and running
                     the same call id again resumes it
    rejected         this proposal was refused without touching the call it names (the
                     call id is running right now, or was used for a different call)

`content` is always safe to show to the model: fixed texts, the sidecar's model-safe
messages, or the tool's own output. Never a stack trace, a token, a digest or a server
detail; those go to `detail` and the log, for operators.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from toolauthz.model import TOOL_NAME

COMPLETED = "completed"
FAILED = "failed"
CANCELLED = "cancelled"
OUTCOME_UNKNOWN = "outcome_unknown"
APPROVAL_PENDING = "approval_pending"
REJECTED = "rejected"
TERMINAL = frozenset({COMPLETED, FAILED, CANCELLED, OUTCOME_UNKNOWN})

# How the outcome reached the sidecar's ledger (CallResult.reported).
RECORDED = "recorded"  # ReportOutcome succeeded
ALREADY_RECORDED = "already_recorded"  # a retried ReportOutcome found our first attempt recorded
NOT_IN_LEDGER = "not_in_ledger"  # NOT_FOUND: the sidecar denied before its ledger (invalid input, unknown tool)
NOT_REPORTED = "not_reported"  # deliberately not reported (see Guard docs), or not terminal
CONFLICT = "conflict"  # ALREADY_EXISTS at once: someone else reported this call id
REPORT_FAILED = "report_failed"  # the sidecar could not be reached; the local outcome stands


MESSAGES = {
    "cancelled": "The call was cancelled before it started; it was not executed.",
    "cancelled_after_start": "The call was interrupted after it started; whether it took effect is unknown. "
                             "Do not retry it; it will be reconciled.",
    "timeout": "The tool did not finish in time; whether it took effect is unknown. "
               "Do not retry it; it will be reconciled.",
    "execution_error": "The tool failed while running.",
    "invalid_output": "The tool returned output that does not match its declared shape; the output was withheld.",
    "authorization_unavailable": "The call could not be authorized right now and was not executed; "
                                 "try again later.",
    "authorization_error": "The call could not be authorized and was not executed.",
    "verification_unavailable": "The call's authorization could not be verified right now; it was not executed.",
    "verification_failed": "The call's authorization could not be verified; it was not executed.",
    "already_executed": "This call was already executed; it was not run again.",
    "call_in_progress": "This call is already running; it was not started again.",
    "call_id_reused": "This call id was already used for a different call; it was not executed.",
    "approval_rejected": "A person reviewed this call and rejected it; it was not executed.",
    "approval_expired": "The approval request for this call expired; it was not executed.",
    "approval_unavailable": "The call was approved but could not be authorized to run; it was not executed.",
    "context_error": "The call could not be prepared and was not executed.",
    "invalid_call_id": "The call has an unusable id and was not executed.",
    "internal_error": "The call could not be completed because of an internal error.",
}


def tool_unavailable(name: str) -> str:
    shown = f"`{name}` " if TOOL_NAME.fullmatch(name or "") else ""
    return f"The tool {shown}is not available here; the call was not executed."


def approval_pending(approval_id: str) -> str:
    return ("This call needs approval by a person before it can run; an approval request is open "
            f"(reference {approval_id}). It has not been executed. Tell the user it is waiting for approval.")


def refused(messages: list[str], reasons: list[str]) -> str:
    """A DENY: the sidecar's model-safe messages, and the ids of forbid policies."""
    parts = [m.rstrip(".") for m in messages if m]
    if reasons:
        parts.append("refused by policy " + ", ".join(f"`{r}`" for r in reasons))
    return "Not allowed, the call was not executed: " + ("; ".join(parts) or "refused by policy") + "."


@dataclass(frozen=True)
class CallResult:
    call_id: str
    name: str
    status: str
    code: str = ""  # "" when completed; else why (denied, invalid_input, invalid_output, timeout, ...)
    content: str = ""  # model-safe text
    output: Any = None  # the tool's validated output (completed only)
    executed: bool = False  # the implementation was started (so it may have had effects)
    decision: str = ""  # ALLOW, DENY or APPROVAL_REQUIRED, when the sidecar answered
    decision_id: str = ""
    approval_id: str = ""
    reported: str = NOT_REPORTED
    replayed: bool = False  # answered from the Guard's record of this call id: nothing ran now
    detail: Mapping[str, Any] = field(default_factory=dict, compare=False)  # operators only

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    @property
    def is_error(self) -> bool:
        """Everything but `completed`: a pending approval too, because its content is not
        the tool's output (and MCP must mark it so for a tool with an output schema). The
        same shape through the Guard and the MCP gateway; `status` and `approval_id` tell
        a pending call from a failed one."""
        return self.status != COMPLETED

    def to_tool_result(self) -> dict:
        """The provider tool result (Messages API shape) for this call."""
        return {"type": "tool_result", "tool_use_id": self.call_id, "content": self.content,
                "is_error": self.is_error}
