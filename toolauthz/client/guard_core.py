"""The Guard's algorithm, written once for the blocking Guard and the AsyncGuard.

For each proposed call (call id, tool name, raw argument JSON), in this order:

1. Authorize, with the trusted context of the run (plus the entities the runtime vouches
   for). DENY ends the call (failed); APPROVAL_REQUIRED waits for a person up to
   `approval_wait` seconds (default 0: answer "approval pending" at once).
2. Verify the token immediately before executing: this consumes it, so a call runs at
   most once across every runtime that shares the sidecar.
3. Execute the implementation with the arguments parsed from the exact bytes that were
   authorized, under a deadline and a cancellation signal.
4. Validate the output (JSON, size, output schema), then ReportOutcome.

Every call id gets exactly one terminal outcome, kept in the Guard: running the same id
again returns the recorded result (`replayed=True`) and executes nothing; the same id
with different arguments is `rejected/call_id_reused`.

Which outcomes are reported to the sidecar (ReportOutcome works only for calls in its
ledger, and the ledger keeps one outcome per call id):

* every call the sidecar decided (ALLOW, DENY, APPROVAL_REQUIRED) and this Guard ended:
  completed, failed (denied, invalid_output, ...), cancelled, outcome_unknown;
* a DENY for input the sidecar refused before its ledger (invalid_input, unknown_tool)
  is reported too and answered NOT_FOUND, recorded as `reported="not_in_ledger"`: the
  Guard does not guess which denials reach the ledger (that is the sidecar's business);
* NOT reported: a DENY for `call_id_reused` or `call_in_progress` (the ledger row
  belongs to another call, whose outcome is not ours to write), a Verify answered
  `already_used` or an ALLOW without a token on replay (another runtime executed the
  call and owns its outcome), and calls the sidecar never saw (cancelled before
  Authorize, an entities provider that failed, an unusable call id).

How the two Guards share it: `GuardCore.decide` and `GuardCore.reporting` are generators
that make every decision and yield each piece of I/O they need as a step (`Await`,
`Rpc`, `WatchApproval`, `Execute`). A driver (Guard: threads and blocking calls;
AsyncGuard: asyncio) performs each step and sends its reply back, or throws the step's
exception in. The drivers decide nothing.

The parts: the steps and their replies (guard_steps.py), the call table (call_table.py),
what each answer means and which End it gives (guard_outcomes.py), and here the order of
the steps.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable, Generator
from dataclasses import replace
from typing import Any

import grpc

from toolauthz.client import results as r
from toolauthz.client.call_table import GuardEvent, GuardStateError, UnknownCallError
from toolauthz.client.context import ProposedCall, TrustedContext
from toolauthz.client.guard_outcomes import Outcomes
from toolauthz.client.guard_steps import (
    Attempt,
    Authorized,
    Await,
    End,
    Execute,
    Ran,
    Rpc,
    Step,
    Stepper,
    WatchApproval,
)
from toolauthz.client.results import CallResult
from toolauthz.client.sync import OutcomeReport
from toolauthz.client.tools import ToolSet
from toolauthz.proto.toolauthz.v1 import approvals_pb2 as apb
from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb

__all__ = ["GuardCore", "GuardEvent", "GuardStateError", "UnknownCallError", "Attempt", "Authorized", "End", "Ran",
           "Step",
           "Await", "Rpc", "WatchApproval", "Execute", "Stepper", "DEFAULT_EXECUTION_TIMEOUT"]

log = logging.getLogger("toolauthz.client")
DEFAULT_EXECUTION_TIMEOUT = 30.0


class GuardCore(Outcomes):
    """The algorithm shared by Guard and AsyncGuard, over the call table (call_table.py)
    and the meaning of each answer (guard_outcomes.py)."""

    def __init__(self, context: TrustedContext, tools: ToolSet, *, approval_wait: float = 0.0,
                 execution_timeout: float = DEFAULT_EXECUTION_TIMEOUT, rpc_timeout: float | None = None,
                 observer: Callable[[GuardEvent], None] | None = None):
        if not isinstance(context, TrustedContext):
            raise TypeError("context must be a toolauthz.client.TrustedContext built from the runtime's session")
        if approval_wait < 0 or execution_timeout <= 0:
            raise ValueError("approval_wait must be >= 0 and execution_timeout > 0")
        super().__init__(observer)
        self.context = context
        self.tools = tools
        self.approval_wait = float(approval_wait)
        self.execution_timeout = float(execution_timeout)
        self.rpc_timeout = rpc_timeout

    def _cancel_pending_approval(self, call_id: str) -> End:
        """For cancel(): claims a call that waits for approval and ends it `cancelled`
        (reported), or raises UnknownCallError / GuardStateError."""
        with self._lock:
            state = self._calls.get(call_id)
            if state is None:
                raise UnknownCallError(f"no call `{call_id}`")
            if state.running:
                raise GuardStateError(f"call `{call_id}` is running; cancel it with its cancellation signal")
            if state.result is None or state.result.terminal:
                raise UnknownCallError(f"call `{call_id}` is finished")
            state.running = True
            pending = state.result
        call = ProposedCall(call_id, pending.name, b"")
        att = Attempt(True, pending.decision, pending.decision_id, pending.approval_id)
        return self._cancelled(call, att, report=True)

    # -- the algorithm -----------------------------------------------------------------

    def call_context(self, call: ProposedCall) -> Generator[Step, Any, pb.TrustedContext | None]:
        """The run's context with the entities the runtime vouches for this call, or None
        when the entities provider failed (logged)."""
        try:
            entities = self.context.entities(call) if self.context.entities else None
            if inspect.isawaitable(entities):
                entities = yield Await(entities)
            return self.context.to_proto(entities)
        except Exception:
            log.exception("entities provider failed for call %s", call.call_id)
            return None

    def decide(self, call: ProposedCall, att: Attempt, timeout: float | None, approval_wait: float | None,
               cancelled: Callable[[], bool], authorized: Authorized | None = None) -> Generator[Step, Any, End]:
        """Authorize → (approval) → Verify → execute, for one admitted call: its End.
        `cancelled()` says whether the caller cancelled the call (a driver whose
        cancellation arrives as an exception answers False). `authorized`: the call's
        context and Authorize answer when a turn's batch already asked (client/turn.py)."""
        if cancelled():
            return self._cancelled(call, att, report=authorized is not None)
        if authorized is None:
            ctx = yield from self.call_context(call)
            if ctx is None:
                return self._fail(call, att, "context_error", report=False)
            att.authorize_sent = True
            try:
                response: pb.AuthorizeResponse = yield self._authorize(ctx, call)
            except grpc.RpcError as exc:
                return self._fail(call, att, self._authorize_failed(call, exc))
        else:
            att.authorize_sent = True
            ctx, answer = authorized
            if isinstance(answer, grpc.RpcError):
                return self._fail(call, att, self._authorize_failed(call, answer))
            response = answer
        tool = self._on_authorized(call, att, response)
        if isinstance(tool, End):
            return tool
        token = response.token
        if response.decision == pb.APPROVAL_REQUIRED:
            if cancelled():
                return self._cancelled(call, att, report=True)
            waited = yield from self._await_approval(call, att, ctx, approval_wait, cancelled)
            if isinstance(waited, End):
                return waited
            token = waited
        if cancelled():
            return self._cancelled(call, att, report=True)
        try:
            verified: pb.VerifyResponse = yield self._verify(token, ctx, call)
        except grpc.RpcError as exc:
            log.warning("Verify of call %s failed: %s", call.call_id, exc.code())
            return self._fail(call, att, "verification_unavailable")
        end = self._on_verified(call, att, verified)
        if end is not None:
            return end
        if cancelled():
            return self._cancelled(call, att, report=True)
        invocation = self._invocation(call, att, tool, timeout)
        self._emit("execute", call, deadline_seconds=round(invocation.remaining(), 3))
        ran: Ran = yield Execute(tool, call.arguments, invocation, att)
        return self._on_ran(call, att, tool, ran)

    def _await_approval(self, call: ProposedCall, att: Attempt, ctx: pb.TrustedContext, approval_wait: float | None,
                        cancelled: Callable[[], bool]) -> Generator[Step, Any, End | str]:
        """The token to run with once a person approved, or the call's End."""
        wait = self.approval_wait if approval_wait is None else approval_wait
        self._emit("approval_wait", call, approval_id=att.approval_id, seconds=wait)
        if wait <= 0:
            return self._pending_approval(call, att)
        settles = functools.partial(self._on_approval, call)
        try:
            approval: apb.Approval | None = yield WatchApproval(att.approval_id, self.context.to_proto(), wait, settles)
        except grpc.RpcError as exc:
            if not cancelled() and exc.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                log.warning("watching approval %s failed: %s", att.approval_id, exc.code())
            approval = None
        if approval is None:
            return self._cancelled(call, att, report=True) if cancelled() else self._pending_approval(call, att)
        if approval.status == apb.REJECTED:
            return self._fail(call, att, "approval_rejected")
        if approval.status == apb.EXPIRED:
            return self._fail(call, att, "approval_expired")
        if approval.token:
            return approval.token
        # Approved, but the watch carried no token: the replayed Authorize issues one.
        try:
            again: pb.AuthorizeResponse = yield self._authorize(ctx, call)
        except grpc.RpcError as exc:
            return self._fail(call, att, self._authorize_failed(call, exc))
        if again.decision == pb.ALLOW and again.token:
            return again.token
        return self._fail(call, att, "approval_unavailable")

    def reporting(self, end: End) -> Generator[Step, Any, CallResult]:
        """ReportOutcome for an End that has something to report: the result as reported."""
        result = end.result
        if end.report is None:
            return result
        status, code, digest = end.report
        context = self.context.to_proto()
        rpc_timeout = self.rpc_timeout
        try:
            report: OutcomeReport = yield Rpc("ReportOutcome", lambda client: client.report_outcome(
                context, result.call_id, status, error_code=code, output_digest=digest, timeout=rpc_timeout))
        except grpc.RpcError as exc:
            return replace(result, reported=self._reported(exc))
        return replace(result, reported=r.ALREADY_RECORDED if report.already_recorded else r.RECORDED,
                       detail={**result.detail, **({"unverified": True} if report.unverified else {})})

    def _authorize(self, ctx: pb.TrustedContext, call: ProposedCall) -> Rpc:
        msg, rpc_timeout = call.to_proto(), self.rpc_timeout
        return Rpc("Authorize", lambda client: client.authorize(ctx, msg, timeout=rpc_timeout))

    def _verify(self, token: str, ctx: pb.TrustedContext, call: ProposedCall) -> Rpc:
        msg, rpc_timeout = call.to_proto(), self.rpc_timeout
        return Rpc("Verify", lambda client: client.verify(token, ctx, msg, timeout=rpc_timeout))
