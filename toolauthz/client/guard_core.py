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
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass, field, replace
from typing import Any, Generic, TypeVar

import grpc

from toolauthz.client import results as r
from toolauthz.client.context import ProposedCall, TrustedContext, check_call_id
from toolauthz.client.results import CallResult
from toolauthz.client.sync import OutcomeReport
from toolauthz.client.tools import OutputProblem, Tool, ToolError, ToolInvocation, ToolOutcomeUnknown, ToolSet
from toolauthz.proto.toolauthz.v1 import approvals_pb2 as apb
from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb

__all__ = ["GuardCore", "GuardEvent", "GuardStateError", "UnknownCallError", "Attempt", "Authorized", "End", "Ran",
           "Step",
           "Await", "Rpc", "WatchApproval", "Execute", "Stepper", "DEFAULT_EXECUTION_TIMEOUT"]

log = logging.getLogger("toolauthz.client")
_DECISIONS = {pb.ALLOW: "ALLOW", pb.DENY: "DENY", pb.APPROVAL_REQUIRED: "APPROVAL_REQUIRED"}
_NOT_OURS = ("call_id_reused", "call_in_progress")  # DENY codes whose ledger row is another call's
_SETTLED = (apb.APPROVED, apb.REJECTED, apb.EXPIRED)  # approval states that end a wait
DEFAULT_EXECUTION_TIMEOUT = 30.0
T = TypeVar("T")


class GuardStateError(RuntimeError):
    """A result for a call that is not pending, or a second terminal result."""


class UnknownCallError(GuardStateError, KeyError):
    """The Guard has no pending call with this id."""


@dataclass(frozen=True)
class GuardEvent:
    """One step of a guarded call, for traces and metrics (never shown to the model)."""

    kind: str  # authorize, approval_wait, approval, verify, execute, outcome
    call_id: str
    name: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class _CallState:
    name: str
    signature: Any
    running: bool = True
    result: CallResult | None = None


@dataclass
class Attempt:
    """What one run of a call has got to (read when it is cut short)."""

    authorize_sent: bool = False
    decision: str = ""
    decision_id: str = ""
    approval_id: str = ""
    started: bool = False  # the implementation was entered (set by the driver that enters it)


@dataclass(frozen=True)
class End:
    """A result plus what to report for it (None: do not report)."""

    result: CallResult
    report: tuple[str, str, str] | None = None  # (status, error_code, output_digest)


# -- the steps a driver performs ----------------------------------------------------------


@dataclass(frozen=True)
class Await:
    """Reply: the value of an awaitable the runtime's entities provider returned."""

    awaitable: Awaitable[Any]


@dataclass(frozen=True)
class Rpc:
    """Reply: the response of one sidecar RPC. `send(client)` makes it; the sync and
    async clients have the same methods, the async ones return awaitables."""

    name: str
    send: Callable[[Any], Any]


@dataclass(frozen=True)
class WatchApproval:
    """Reply: the first approval on the watch stream for which `settles` is true, or
    None when the stream ended without one (its deadline, `seconds`, passed)."""

    approval_id: str
    viewer: pb.TrustedContext
    seconds: float
    settles: Callable[[apb.Approval], bool]


@dataclass(frozen=True)
class Execute:
    """Reply: a Ran. The driver runs `tool.fn(arguments, invocation)` until the
    invocation's deadline and sets `attempt.started` as it enters the implementation."""

    tool: Tool
    arguments: Any
    invocation: ToolInvocation
    attempt: Attempt


Step = Await | Rpc | WatchApproval | Execute
# A call's context and its Authorize answer (or the status it failed with), when a turn's
# AuthorizeBatch asked for it (client/turn.py).
Authorized = tuple[pb.TrustedContext, "pb.AuthorizeResponse | grpc.RpcError"]


@dataclass(frozen=True)
class Ran:
    """How an execution ended: an output, an exception, or cut short."""

    output: Any = None
    error: BaseException | None = None
    cut: str = ""  # the tool had started: "timeout" or "cancelled_after_start"
    started: bool = True  # False: cancelled before the implementation was entered

    @classmethod
    def never_started(cls) -> Ran:
        return cls(started=False)


class Stepper(Generic[T]):
    """Runs a step generator for a driver: `step` is the I/O to perform next, None once
    the generator has returned `result`. Answer each step with `reply` or `fail`."""

    def __init__(self, steps: Generator[Step, Any, T]):
        self._steps = steps
        self.step: Step | None = None
        self.result: T | None = None
        self._resume(lambda: next(steps))

    def reply(self, value: Any) -> None:
        self._resume(lambda: self._steps.send(value))

    def fail(self, error: Exception) -> None:
        self._resume(lambda: self._steps.throw(error))

    def _resume(self, advance: Callable[[], Step]) -> None:
        try:
            self.step = advance()
        except StopIteration as done:
            self.step = None
            self.result = done.value


def _signature(call: ProposedCall) -> Any:
    # The same call is the same tool with the same arguments (as parsed, so that a
    # re-serialization with other whitespace is still the same call).
    return (call.name, json.dumps(call.arguments, sort_keys=True) if call.arguments is not None else call.input_json)


class GuardCore:
    """The call table, the algorithm and result-building shared by Guard and AsyncGuard."""

    runs_coroutines = False  # whether the driver can run a coroutine-function tool

    def __init__(self, context: TrustedContext, tools: ToolSet, *, approval_wait: float = 0.0,
                 execution_timeout: float = DEFAULT_EXECUTION_TIMEOUT, rpc_timeout: float | None = None,
                 observer: Callable[[GuardEvent], None] | None = None):
        if not isinstance(context, TrustedContext):
            raise TypeError("context must be a toolauthz.client.TrustedContext built from the runtime's session")
        if approval_wait < 0 or execution_timeout <= 0:
            raise ValueError("approval_wait must be >= 0 and execution_timeout > 0")
        self.context = context
        self.tools = tools
        self.approval_wait = float(approval_wait)
        self.execution_timeout = float(execution_timeout)
        self.rpc_timeout = rpc_timeout
        self._observer = observer
        self._calls: dict[str, _CallState] = {}
        self._lock = threading.Lock()

    # -- the call table ----------------------------------------------------------------

    def result(self, call_id: str) -> CallResult | None:
        """The last result of a call id (terminal, or approval pending), or None."""
        with self._lock:
            state = self._calls.get(call_id)
            return state.result if state else None

    def pending(self) -> list[str]:
        """Call ids without a terminal outcome: running now or waiting for approval."""
        with self._lock:
            return [cid for cid, s in self._calls.items() if s.running or not (s.result and s.result.terminal)]

    def finished(self) -> dict[str, CallResult]:
        with self._lock:
            return {cid: s.result for cid, s in self._calls.items() if s.result and s.result.terminal}

    def _admit(self, call: ProposedCall) -> CallResult | None:
        """Registers the call as running, or answers at once without running anything."""
        signature = _signature(call)
        with self._lock:
            state = self._calls.get(call.call_id)
            if state is None:
                self._calls[call.call_id] = _CallState(call.name, signature)
                return None
            if state.signature != signature:
                return self._rejected(call, "call_id_reused")
            if state.running:
                return self._rejected(call, "call_in_progress")
            if state.result is not None and state.result.terminal:
                return replace(state.result, replayed=True)
            state.running = True  # waiting for approval: run it again (resume)
            return None

    def _open(self, call_id: str, name: str, input_json: bytes | str) -> ProposedCall | CallResult:
        """Admission: the call to run, or the result that ends it before any RPC (an
        invalid call id, a replay, a call already running)."""
        try:
            check_call_id(call_id)
        except ValueError:
            return CallResult(call_id, name, r.REJECTED, "invalid_call_id", r.MESSAGES["invalid_call_id"])
        call = ProposedCall.of(call_id, name, input_json)
        early = self._admit(call)
        if early is None:
            return call
        self._emit("outcome", early, status=early.status, code=early.code, replayed=True, executed=False,
                   reported=early.reported)
        return early

    def refuse(self, call_id: str, name: str, code: str, content: str) -> CallResult:
        """Ends, with no RPC, a call the runtime refused before authorization (a malformed
        stream, see client/streaming.py): `failed` with `code`, never reported (the sidecar
        never saw it), and kept like any outcome, so the same call id never runs later."""
        opened = self._open(call_id, name, b"")
        if isinstance(opened, CallResult):
            return opened
        return self._finish(call_id, CallResult(call_id, name, r.FAILED, code, content))

    def _finish(self, call_id: str, result: CallResult) -> CallResult:
        """Records the result of a pending call: the one place a call's state changes."""
        with self._lock:
            state = self._calls.get(call_id)
            if state is None or not state.running:
                raise UnknownCallError(f"no pending call `{call_id}`")
            if state.result is not None and state.result.terminal:
                raise GuardStateError(f"call `{call_id}` already has the outcome `{state.result.status}`")
            if state.name != result.name:
                raise GuardStateError(f"a result for `{result.name}` does not belong to call `{call_id}`")
            state.result = result
            state.running = False
        self._emit("outcome", result, status=result.status, code=result.code, reported=result.reported,
                   executed=result.executed, replayed=result.replayed)
        return result

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

    # -- events ------------------------------------------------------------------------

    def _emit(self, kind: str, call: ProposedCall | CallResult, **data: Any) -> None:
        if self._observer is None:
            return
        try:
            self._observer(GuardEvent(kind, call.call_id, call.name, data))
        except Exception:
            log.exception("guard observer failed on %s", kind)

    # -- results -----------------------------------------------------------------------

    @staticmethod
    def _rejected(call: ProposedCall, code: str) -> CallResult:
        return CallResult(call.call_id, call.name, r.REJECTED, code, r.MESSAGES[code], replayed=True)

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
        if isinstance(exc, ToolOutcomeUnknown):
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
        transient = code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                             grpc.StatusCode.RESOURCE_EXHAUSTED)
        return "authorization_unavailable" if transient else "authorization_error"
