"""The Guard: runs a model's proposed tool calls only as the sidecar allows.

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
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import grpc

from sidecar.client import results as r
from sidecar.client.context import ProposedCall, TrustedContext, check_call_id
from sidecar.client.results import CallResult
from sidecar.client.sync import AuthzClient
from sidecar.client.tools import OutputProblem, Tool, ToolError, ToolInvocation, ToolSet
from sidecar.proto.toolauthz.v1 import approvals_pb2 as apb
from sidecar.proto.toolauthz.v1 import authorizer_pb2 as pb

__all__ = ["Guard", "GuardEvent", "GuardStateError", "UnknownCallError"]

log = logging.getLogger("toolauthz.client")
_DECISIONS = {pb.ALLOW: "ALLOW", pb.DENY: "DENY", pb.APPROVAL_REQUIRED: "APPROVAL_REQUIRED"}
_NOT_OURS = ("call_id_reused", "call_in_progress")  # DENY codes whose ledger row is another call's
DEFAULT_EXECUTION_TIMEOUT = 30.0
_POLL = 0.01  # how often a threading.Event the caller owns is looked at


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
    data: dict = field(default_factory=dict)


@dataclass
class _CallState:
    name: str
    signature: Any
    running: bool = True
    result: CallResult | None = None


@dataclass
class _Attempt:
    """What one run of a call has got to (read when it is cut short)."""

    authorize_sent: bool = False
    decision: str = ""
    decision_id: str = ""
    approval_id: str = ""
    started: bool = False  # the implementation was entered


@dataclass(frozen=True)
class _End:
    """A result plus what to report for it (None: do not report)."""

    result: CallResult
    report: tuple[str, str, str] | None = None  # (status, error_code, output_digest)


def _signature(call: ProposedCall) -> Any:
    # The same call is the same tool with the same arguments (as parsed, so that a
    # re-serialization with other whitespace is still the same call).
    return (call.name, json.dumps(call.arguments, sort_keys=True) if call.arguments is not None else call.input_json)


class _GuardCore:
    """State and result-building shared by Guard and AsyncGuard."""

    def __init__(self, context: TrustedContext, tools: ToolSet, *, approval_wait: float = 0.0,
                 execution_timeout: float = DEFAULT_EXECUTION_TIMEOUT, rpc_timeout: float | None = None,
                 observer: Callable[[GuardEvent], None] | None = None):
        if not isinstance(context, TrustedContext):
            raise TypeError("context must be a sidecar.client.TrustedContext built from the runtime's session")
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

    def _open(self, call_id: str, name: str, input_json: bytes | str) -> tuple[ProposedCall | None, CallResult | None]:
        """Admission, shared by the sync and async guards: the call, or the result that
        ends it before any RPC (an invalid call id, a replay, a call already running)."""
        try:
            check_call_id(call_id)
        except ValueError:
            return None, CallResult(call_id, name, r.REJECTED, "invalid_call_id", r.MESSAGES["invalid_call_id"])
        call = ProposedCall.of(call_id, name, input_json)
        early = self._admit(call)
        if early is not None:
            self._emit("outcome", early, status=early.status, code=early.code, replayed=True, executed=False,
                       reported=early.reported)
        return call, early

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

    def _take_pending_approval(self, call_id: str) -> CallResult:
        """For cancel(): claims a call that waits for approval, or raises."""
        with self._lock:
            state = self._calls.get(call_id)
            if state is None:
                raise UnknownCallError(f"no call `{call_id}`")
            if state.running:
                raise GuardStateError(f"call `{call_id}` is running; cancel it with its cancellation signal")
            if state.result is None or state.result.terminal:
                raise UnknownCallError(f"call `{call_id}` is finished")
            state.running = True
            return state.result

    # -- events ------------------------------------------------------------------------

    def _emit(self, kind: str, call: ProposedCall | CallResult, **data) -> None:
        if self._observer is None:
            return
        try:
            self._observer(GuardEvent(kind, call.call_id, call.name, data))
        except Exception:  # an observer never changes a call's course
            log.exception("guard observer failed on %s", kind)

    # -- results -----------------------------------------------------------------------

    @staticmethod
    def _rejected(call: ProposedCall, code: str) -> CallResult:
        return CallResult(call.call_id, call.name, r.REJECTED, code, r.MESSAGES[code], replayed=True)

    @staticmethod
    def _result(call: ProposedCall, att: _Attempt, status: str, code: str = "", content: str = "",
                **kw) -> CallResult:
        return CallResult(call.call_id, call.name, status, code, content or r.MESSAGES.get(code, ""),
                          decision=att.decision, decision_id=att.decision_id, approval_id=att.approval_id, **kw)

    def _fail(self, call, att, code, *, report=True, content="", **kw) -> _End:
        result = self._result(call, att, r.FAILED, code, content, executed=att.started, **kw)
        return _End(result, (r.FAILED, code, "") if report else None)

    def _cancelled(self, call, att, *, report: bool) -> _End:
        report_as = (r.CANCELLED, "cancelled", "") if report else None
        return _End(self._result(call, att, r.CANCELLED, "cancelled"), report_as)

    def _unknown(self, call, att, code: str) -> _End:
        return _End(self._result(call, att, r.OUTCOME_UNKNOWN, code, executed=True), (r.OUTCOME_UNKNOWN, code, ""))

    def _pending_approval(self, call, att) -> _End:
        return _End(self._result(call, att, r.APPROVAL_PENDING, "approval_pending",
                                 r.approval_pending(att.approval_id)))

    def _on_authorized(self, call: ProposedCall, att: _Attempt, response: pb.AuthorizeResponse, *,
                       sync: bool) -> _End | Tool:
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
        tool = self._tool_for(call, sync=sync)
        if tool is None:
            return self._fail(call, att, "unknown_tool", content=r.tool_unavailable(call.name))
        if call.arguments is None:  # cannot happen after the sidecar accepted it; fail closed anyway
            return self._fail(call, att, "invalid_input")
        return tool

    def _tool_for(self, call: ProposedCall, *, sync: bool) -> Tool | None:
        tool = self.tools.get(call.name)
        if tool is not None and sync and tool.is_async:
            log.warning("tool %s is a coroutine function: use AsyncGuard to run it", call.name)
            return None
        return tool

    def _invocation(self, call: ProposedCall, att: _Attempt, tool: Tool, timeout: float | None) -> ToolInvocation:
        seconds = (timeout if timeout is not None
                   else tool.timeout if tool.timeout is not None else self.execution_timeout)
        return ToolInvocation(call.call_id, call.name, self.context, threading.Event(), time.monotonic() + seconds,
                              att.decision_id, att.approval_id)

    def _on_output(self, call, att, tool: Tool, output: Any) -> _End:
        try:
            content, digest = tool.check_output(output)
        except OutputProblem as problem:
            log.warning("tool %s returned invalid output for call %s: %s", call.name, call.call_id, problem.why)
            return self._fail(call, att, "invalid_output", detail={"why": problem.why})
        return _End(self._result(call, att, r.COMPLETED, "", content, output=output, executed=True),
                    (r.COMPLETED, "", digest))

    def _on_error(self, call, att, exc: BaseException) -> _End:
        if isinstance(exc, ToolError):
            return self._fail(call, att, exc.code, content=exc.message)
        log.error("tool %s failed in call %s", call.name, call.call_id, exc_info=exc)
        return self._fail(call, att, "execution_error", detail={"exception": type(exc).__name__})

    def _on_verified(self, call, att, response: pb.VerifyResponse) -> _End | None:
        self._emit("verify", call, valid=response.valid, code=response.code)
        if response.valid:
            return None
        if response.code == "already_used":  # another runtime executed it and owns the outcome
            return self._fail(call, att, "already_executed", report=False, detail={"verify": response.code})
        return self._fail(call, att, "verification_failed", detail={"verify": response.code})

    def _on_approval(self, call, att, approval: apb.Approval) -> _End | str | None:
        """A token (str) to run with, an end, or None to keep waiting."""
        status = apb.ApprovalStatus.Name(approval.status)
        approver = f'{approval.approver.type}::"{approval.approver.id}"' if approval.approver.id else ""
        self._emit("approval", call, status=status, approver=approver, approval_id=approval.approval_id)
        if approval.status == apb.APPROVED:
            return approval.token or ""
        if approval.status == apb.REJECTED:
            return self._fail(call, att, "approval_rejected")
        if approval.status == apb.EXPIRED:
            return self._fail(call, att, "approval_expired")
        return None

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
    def _authorize_failed(call, exc: grpc.RpcError) -> str:
        code = exc.code()
        log.warning("Authorize of call %s failed: %s %s", call.call_id, code, exc.details())
        transient = code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                             grpc.StatusCode.RESOURCE_EXHAUSTED)
        return "authorization_unavailable" if transient else "authorization_error"


class Guard(_GuardCore):
    """Runs proposed calls through the sidecar (blocking; thread-safe).

    One Guard per model run: `context` is that run's trusted context, and call ids are
    tracked per Guard. `approval_wait` is how long to wait for a person when a policy asks
    for approval (0: answer "approval pending" at once), `execution_timeout` the default
    deadline of a tool (a Tool's own `timeout` or `run(timeout=)` override it), and
    `rpc_timeout` the deadline of each sidecar RPC (default: the client's)."""

    def __init__(self, client: AuthzClient, context: TrustedContext, tools: ToolSet, **options):
        super().__init__(context, tools, **options)
        self.client = client

    def run(self, call_id: str, name: str, input_json: bytes | str, *, cancel: threading.Event | None = None,
            timeout: float | None = None, approval_wait: float | None = None) -> CallResult:
        """Authorize → (approval) → Verify → execute → ReportOutcome, for one call.

        `input_json` is the model's argument text exactly as produced. `cancel`, when
        set, cancels the call: before the tool started the outcome is `cancelled`, after
        it `outcome_unknown` (the tool's `call.cancelled` event is set; a thread cannot
        be killed, so a tool should watch it). Never raises for anything the model or
        the sidecar did; returns the result."""
        call, early = self._open(call_id, name, input_json)
        if early is not None:
            return early
        att = _Attempt()
        try:
            end = self._drive(call, att, cancel, timeout, approval_wait)
        except Exception as exc:  # a bug here must still end the call
            log.exception("guard failed in call %s", call_id)
            end = self._unknown(call, att, "internal_error") if att.started else \
                self._fail(call, att, "internal_error", report=att.authorize_sent,
                           detail={"exception": type(exc).__name__})
        except BaseException:
            end = (self._unknown(call, att, "interrupted") if att.started
                   else self._cancelled(call, att, report=att.authorize_sent))
            self._finish(call_id, self._report(end))
            raise
        return self._finish(call_id, self._report(end))

    def cancel(self, call_id: str) -> CallResult:
        """Ends a call that waits for approval: `cancelled`, reported to the sidecar.
        Raises UnknownCallError for an id that is not waiting (unknown or finished)."""
        pending = self._take_pending_approval(call_id)
        call = ProposedCall(call_id, pending.name, b"")
        att = _Attempt(True, pending.decision, pending.decision_id, pending.approval_id)
        return self._finish(call_id, self._report(self._cancelled(call, att, report=True)))

    # -- the steps ---------------------------------------------------------------------

    def _drive(self, call: ProposedCall, att: _Attempt, cancel: threading.Event | None, timeout: float | None,
               approval_wait: float | None) -> _End:
        if cancel is not None and cancel.is_set():
            return self._cancelled(call, att, report=False)
        try:
            entities = self.context.entities(call) if self.context.entities else None
            ctx = self.context.to_proto(entities)
        except Exception:  # the runtime's provider; never the model's business
            log.exception("entities provider failed for call %s", call.call_id)
            return self._fail(call, att, "context_error", report=False)
        att.authorize_sent = True
        try:
            response = self.client.authorize(ctx, call.to_proto(), timeout=self.rpc_timeout)
        except grpc.RpcError as exc:
            return self._fail(call, att, self._authorize_failed(call, exc))
        tool = self._on_authorized(call, att, response, sync=True)
        if isinstance(tool, _End):
            return tool
        token = response.token
        if response.decision == pb.APPROVAL_REQUIRED:
            if cancel is not None and cancel.is_set():
                return self._cancelled(call, att, report=True)
            waited = self._await_approval(call, att, ctx, cancel, approval_wait)
            if isinstance(waited, _End):
                return waited
            token = waited
        if cancel is not None and cancel.is_set():
            return self._cancelled(call, att, report=True)
        try:
            verified = self.client.verify(token, ctx, call.to_proto(), timeout=self.rpc_timeout)
        except grpc.RpcError as exc:
            log.warning("Verify of call %s failed: %s", call.call_id, exc.code())
            return self._fail(call, att, "verification_unavailable")
        end = self._on_verified(call, att, verified)
        if end is not None:
            return end
        if cancel is not None and cancel.is_set():
            return self._cancelled(call, att, report=True)
        return self._execute(call, att, tool, cancel, timeout)

    def _await_approval(self, call, att, ctx, cancel, approval_wait) -> _End | str:
        wait = self.approval_wait if approval_wait is None else approval_wait
        self._emit("approval_wait", call, approval_id=att.approval_id, seconds=wait)
        if wait <= 0:
            return self._pending_approval(call, att)
        viewer = self.context.to_proto()
        stream = self.client.watch_approval(att.approval_id, viewer, timeout=wait)
        stop = threading.Event()
        if cancel is not None:
            threading.Thread(target=_cancel_when, args=(cancel, stop, stream), daemon=True).start()
        try:
            for approval in stream:
                got = self._on_approval(call, att, approval)
                if isinstance(got, _End):
                    return got
                if isinstance(got, str):
                    return got or self._token_after_approval(call, att, ctx)
        except grpc.RpcError as exc:
            if cancel is not None and cancel.is_set():
                return self._cancelled(call, att, report=True)
            if exc.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                log.warning("watching approval %s failed: %s", att.approval_id, exc.code())
        finally:
            stop.set()
            stream.cancel()  # a no-op once the stream ended; frees it when we returned early
        if cancel is not None and cancel.is_set():
            return self._cancelled(call, att, report=True)
        return self._pending_approval(call, att)

    def _token_after_approval(self, call, att, ctx) -> _End | str:
        """Approved, but the watch carried no token: the replayed Authorize issues one."""
        try:
            again = self.client.authorize(ctx, call.to_proto(), timeout=self.rpc_timeout)
        except grpc.RpcError as exc:
            return self._fail(call, att, self._authorize_failed(call, exc))
        if again.decision == pb.ALLOW and again.token:
            return again.token
        return self._fail(call, att, "approval_unavailable")

    def _execute(self, call, att, tool: Tool, cancel: threading.Event | None, timeout: float | None) -> _End:
        invocation = self._invocation(call, att, tool, timeout)
        gate = threading.Lock()
        done = threading.Event()
        box: dict[str, Any] = {}
        aborted = False

        def worker() -> None:
            with gate:
                if aborted:
                    return
                att.started = True
            try:
                box["output"] = tool.fn(call.arguments, invocation)
            except BaseException as exc:  # noqa: BLE001 - reported as the call's failure
                box["error"] = exc
            finally:
                done.set()

        self._emit("execute", call, deadline_seconds=round(invocation.remaining(), 3))
        threading.Thread(target=worker, daemon=True, name=f"toolauthz-{call.call_id}").start()
        while True:
            left = invocation.deadline - time.monotonic()
            if done.wait(max(0.0, min(left, _POLL) if cancel is not None else left)):
                break
            cancelled = cancel is not None and cancel.is_set()
            if cancelled or time.monotonic() >= invocation.deadline:
                with gate:
                    if not att.started:
                        aborted = True
                if aborted:
                    return self._cancelled(call, att, report=True)
                invocation.cancelled.set()  # ask the tool to stop; its late result is discarded
                return self._unknown(call, att, "cancelled_after_start" if cancelled else "timeout")
        if "error" in box:
            return self._on_error(call, att, box["error"])
        return self._on_output(call, att, tool, box.get("output"))

    def _report(self, end: _End) -> CallResult:
        result = end.result
        if end.report is None:
            return result
        status, code, digest = end.report
        try:
            report = self.client.report_outcome(self.context.to_proto(), result.call_id, status, error_code=code,
                                                output_digest=digest, timeout=self.rpc_timeout)
        except grpc.RpcError as exc:
            return replace(result, reported=self._reported(exc))
        return replace(result, reported=r.ALREADY_RECORDED if report.already_recorded else r.RECORDED,
                       detail={**result.detail, **({"unverified": True} if report.unverified else {})})


def _cancel_when(cancel: threading.Event, stop: threading.Event, stream) -> None:
    """Cancels a watch stream when the caller's event is set (until `stop`)."""
    while not stop.is_set():
        if cancel.wait(_POLL):
            stream.cancel()
            return
