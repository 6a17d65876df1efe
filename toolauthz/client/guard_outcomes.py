"""What each answer of the sidecar, and each end of a tool, means for a guarded call:
the Ends the algorithm (`toolauthz.client.guard_core`) returns, and what they report.

Which outcomes are reported to the sidecar is decided here (see guard_core's docstring):
a DENY whose ledger row is another call's (`call_id_reused`, `call_in_progress`) is not,
nor a Verify answered `already_used` (another runtime executed the call and owns its
outcome), nor a call the sidecar never saw.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import grpc

from toolauthz.client import results as r
from toolauthz.client.call_table import CallTable
from toolauthz.client.context import ProposedCall, TrustedContext
from toolauthz.client.guard_steps import Attempt, End, Ran
from toolauthz.client.results import CallResult
from toolauthz.client.tools import OutputProblem, Tool, ToolError, ToolInvocation, ToolOutcomeUnknown, ToolSet
from toolauthz.proto.toolauthz.v1 import approvals_pb2 as apb
from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb

__all__ = ["Outcomes"]

log = logging.getLogger("toolauthz.client")
_DECISIONS = {pb.ALLOW: "ALLOW", pb.DENY: "DENY", pb.APPROVAL_REQUIRED: "APPROVAL_REQUIRED"}
_NOT_OURS = ("call_id_reused", "call_in_progress")  # DENY codes whose ledger row is another call's
_SETTLED = (apb.APPROVED, apb.REJECTED, apb.EXPIRED)  # approval states that end a wait
# An Authorize failed with these is transient (`authorization_unavailable`): the call was
# not decided, or its answer was lost, and asking again with the same call id is safe.
# CANCELLED is gRPC's core refusing a call its full backlog cannot hold (or a channel
# closed under the call); a user's own cancellation never arrives as an RpcError
# (asyncio: the task's CancelledError; the blocking Guard checks its `cancel` event
# between steps).
_UNDECIDED = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                        grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.CANCELLED})


class Outcomes(CallTable):
    """The result-building half of the GuardCore: reads answers, builds Ends."""

    runs_coroutines = False  # whether the driver can run a coroutine-function tool
    context: TrustedContext
    tools: ToolSet
    execution_timeout: float

    # -- ending a call that was cut short ----------------------------------------------

    def _broken(self, call: ProposedCall, att: Attempt, exc: Exception) -> End:
        """The End of a call whose driver failed: a bug here must still end the call."""
        if att.started:
            return self._unknown(call, att, "internal_error")
        return self._fail(call, att, "internal_error", report=att.authorize_sent,
                          detail={"exception": type(exc).__name__})

    def _interrupted(self, call: ProposedCall, att: Attempt, code: str) -> End:
        """The End of a call interrupted from outside (KeyboardInterrupt, task cancel)."""
        if att.started:
            return self._unknown(call, att, code)
        return self._cancelled(call, att, report=att.authorize_sent)

    # -- results -----------------------------------------------------------------------

    @staticmethod
    def _result(call: ProposedCall, att: Attempt, status: str, code: str = "", content: str = "",
                **kw: Any) -> CallResult:
        return CallResult(call.call_id, call.name, status, code, content or r.MESSAGES.get(code, ""),
                          decision=att.decision, decision_id=att.decision_id, approval_id=att.approval_id, **kw)

    def _fail(self, call: ProposedCall, att: Attempt, code: str, *, report: bool = True, content: str = "",
              **kw: Any) -> End:
        result = self._result(call, att, r.FAILED, code, content, executed=att.started, **kw)
        return End(result, (r.FAILED, code, "") if report else None)

    def _cancelled(self, call: ProposedCall, att: Attempt, *, report: bool) -> End:
        return End(self._result(call, att, r.CANCELLED, "cancelled"),
                   (r.CANCELLED, "cancelled", "") if report else None)

    def _unknown(self, call: ProposedCall, att: Attempt, code: str) -> End:
        return End(self._result(call, att, r.OUTCOME_UNKNOWN, code, executed=True), (r.OUTCOME_UNKNOWN, code, ""))

    def _pending_approval(self, call: ProposedCall, att: Attempt) -> End:
        return End(self._result(call, att, r.APPROVAL_PENDING, "approval_pending",
                                r.approval_pending(att.approval_id)))

    def _on_authorized(self, call: ProposedCall, att: Attempt, response: pb.AuthorizeResponse) -> End | Tool:
        """The end of the call, or the tool that may now run (after Verify)."""
        att.decision = _DECISIONS.get(response.decision, "")
        att.decision_id = response.decision_id
        att.approval_id = response.approval_id
        codes = [e.code for e in response.errors]
        self._emit("authorize", call, decision=att.decision, replayed=response.replayed, codes=codes,
                   reasons=list(response.reasons), approval_id=response.approval_id, token=bool(response.token))
        if response.decision == pb.DENY:
            code = codes[0] if codes and codes[0] in ("invalid_input", "unknown_tool", *_NOT_OURS) else "denied"
            content = (r.MESSAGES[code] if code in _NOT_OURS else
                       r.refused([e.message for e in response.errors], list(response.reasons)))
            return self._fail(call, att, code, report=code not in _NOT_OURS, content=content,
                              detail={"errors": codes, "reasons": list(response.reasons)})
        if response.decision == pb.ALLOW and not response.token:
            # A replay of a call that was already executed (by this or another runtime).
            return self._fail(call, att, "already_executed", report=False)
        if response.decision not in _DECISIONS:
            return self._fail(call, att, "authorization_error")
        tool = self._tool_for(call)
        if tool is None:
            return self._fail(call, att, "unknown_tool", content=r.tool_unavailable(call.name))
        if call.arguments is None:  # cannot happen after the sidecar accepted it; fail closed anyway
            return self._fail(call, att, "invalid_input")
        return tool

    def _tool_for(self, call: ProposedCall) -> Tool | None:
        tool = self.tools.get(call.name)
        if tool is not None and tool.is_async and not self.runs_coroutines:
            log.warning("tool %s is a coroutine function: use AsyncGuard to run it", call.name)
            return None
        return tool

    def _invocation(self, call: ProposedCall, att: Attempt, tool: Tool, timeout: float | None) -> ToolInvocation:
        seconds = (timeout if timeout is not None else tool.timeout if tool.timeout is not None
                   else self.execution_timeout)
        return ToolInvocation(call.call_id, call.name, self.context, threading.Event(), time.monotonic() + seconds,
                              att.decision_id, att.approval_id)

    def _on_ran(self, call: ProposedCall, att: Attempt, tool: Tool, ran: Ran) -> End:
        if not ran.started:
            return self._cancelled(call, att, report=True)
        if ran.cut:
            return self._unknown(call, att, ran.cut)
        if ran.error is not None:
            return self._on_error(call, att, ran.error)
        return self._on_output(call, att, tool, ran.output)

    def _on_output(self, call: ProposedCall, att: Attempt, tool: Tool, output: Any) -> End:
        try:
            content, digest = tool.check_output(output)
        except OutputProblem as problem:
            log.warning("tool %s returned invalid output for call %s: %s", call.name, call.call_id, problem.why)
            return self._fail(call, att, "invalid_output", detail={"why": problem.why})
        return End(self._result(call, att, r.COMPLETED, "", content, output=output, executed=True),
                   (r.COMPLETED, "", digest))

    def _on_error(self, call: ProposedCall, att: Attempt, exc: BaseException) -> End:
        if isinstance(exc, ToolOutcomeUnknown):  # the tool says it cannot tell whether it took effect
            return End(self._result(call, att, r.OUTCOME_UNKNOWN, exc.code, exc.message, executed=True),
                       (r.OUTCOME_UNKNOWN, exc.code, ""))
        if isinstance(exc, ToolError):
            return self._fail(call, att, exc.code, content=exc.message)
        log.error("tool %s failed in call %s", call.name, call.call_id, exc_info=exc)
        return self._fail(call, att, "execution_error", detail={"exception": type(exc).__name__})

    def _on_verified(self, call: ProposedCall, att: Attempt, response: pb.VerifyResponse) -> End | None:
        self._emit("verify", call, valid=response.valid, code=response.code)
        if response.valid:
            return None
        if response.code == "already_used":  # another runtime executed it and owns the outcome
            return self._fail(call, att, "already_executed", report=False, detail={"verify": response.code})
        return self._fail(call, att, "verification_failed", detail={"verify": response.code})

    def _on_approval(self, call: ProposedCall, approval: apb.Approval) -> bool:
        """Whether this state of the approval ends the wait (approved, rejected, expired)."""
        status = apb.ApprovalStatus.Name(approval.status)
        approver = f'{approval.approver.type}::"{approval.approver.id}"' if approval.approver.id else ""
        self._emit("approval", call, status=status, approver=approver, approval_id=approval.approval_id)
        return approval.status in _SETTLED

    @staticmethod
    def _reported(exc: grpc.RpcError) -> str:
        code = exc.code()
        if code == grpc.StatusCode.NOT_FOUND:
            return r.NOT_IN_LEDGER
        if code == grpc.StatusCode.ALREADY_EXISTS:
            log.warning("outcome already recorded by someone else: %s", exc.details())
            return r.CONFLICT
        log.warning("could not report an outcome: %s", code)
        return r.REPORT_FAILED

    @staticmethod
    def _authorize_failed(call: ProposedCall, exc: grpc.RpcError) -> str:
        code = exc.code()
        log.warning("Authorize of call %s failed: %s %s", call.call_id, code, exc.details())
        return "authorization_unavailable" if code in _UNDECIDED else "authorization_error"
