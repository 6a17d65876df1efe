"""The Guard: runs a model's proposed tool calls only as the sidecar allows (blocking).

The rules, and the algorithm that applies them, are in `toolauthz.client.guard_core`,
shared with the AsyncGuard. This module performs the algorithm's steps with blocking
RPCs and a worker thread per tool execution, and takes cancellation as a
`threading.Event`.
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
from collections.abc import Generator, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import grpc

from toolauthz.client import turn
from toolauthz.client.assembly import REFUSALS, AssembledCall, RefusedCall
from toolauthz.client.context import ProposedCall, TrustedContext
from toolauthz.client.guard_core import (
    DEFAULT_EXECUTION_TIMEOUT,
    Attempt,
    Authorized,
    End,
    Execute,
    GuardCore,
    GuardEvent,
    GuardStateError,
    Ran,
    Rpc,
    Step,
    Stepper,
    UnknownCallError,
    WatchApproval,
)
from toolauthz.client.results import CallResult
from toolauthz.client.sync import ApprovalStream, AuthzClient
from toolauthz.client.tools import ToolSet
from toolauthz.client.turn import TurnCall
from toolauthz.proto.toolauthz.v1 import approvals_pb2 as apb

__all__ = ["Guard", "GuardEvent", "GuardStateError", "UnknownCallError", "DEFAULT_EXECUTION_TIMEOUT"]

log = logging.getLogger("toolauthz.client")
_POLL = 0.01  # how often a threading.Event the caller owns is looked at
T = TypeVar("T")


class Guard(GuardCore):
    """Runs proposed calls through the sidecar (blocking; thread-safe).

    One Guard per model run: `context` is that run's trusted context, and call ids are
    tracked per Guard. `approval_wait` is how long to wait for a person when a policy asks
    for approval (0: answer "approval pending" at once), `execution_timeout` the default
    deadline of a tool (a Tool's own `timeout` or `run(timeout=)` override it), and
    `rpc_timeout` the deadline of each sidecar RPC (default: the client's)."""

    def __init__(self, client: AuthzClient, context: TrustedContext, tools: ToolSet, **options: Any):
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
        call = self._open(call_id, name, input_json)
        if isinstance(call, CallResult):
            return call
        return self._run_admitted(call, cancel, timeout, approval_wait)

    def run_turn(self, calls: Iterable[TurnCall], *, cancel: threading.Event | None = None,
                 timeout: float | None = None, approval_wait: float | None = None) -> list[CallResult]:
        """The calls of one model turn: authorized in one AuthorizeBatch, run by the rules
        of `toolauthz.client.turn` (consecutive concurrent tools together, the others in the
        model's order), one result per call in the model's order. `calls`: (call id, tool
        name, argument text) tuples, or what a stream assembled. `cancel` ends the turn:
        calls not started end `cancelled`, started ones `outcome_unknown`."""
        slots = turn.admit(self, calls)
        for slot in slots:
            if slot.call is not None:
                slot.context = self._perform(self.call_context(slot.call))
                if slot.context is None:
                    slot.result = self._finish(slot.call.call_id, self._report(
                        self._fail(slot.call, Attempt(), "context_error", report=False)))
        for chunk in turn.batches(slots):
            try:
                answers: Any = self.client.authorize_batch(self.context.to_proto(), turn.batch_calls(chunk),
                                                           timeout=self.rpc_timeout)
            except grpc.RpcError as exc:
                answers = exc
            turn.authorized_of(chunk, answers)
        for group in turn.groups(slots):
            if len(group) == 1:
                self._run_slot(group[0], cancel, timeout, approval_wait)
                continue
            with ThreadPoolExecutor(len(group), thread_name_prefix="toolauthz-turn") as pool:
                list(pool.map(lambda s: self._run_slot(s, cancel, timeout, approval_wait), group))
        return [slot.result for slot in slots if slot.result is not None]

    def _run_slot(self, slot: turn.Slot, cancel: threading.Event | None, timeout: float | None,
                  approval_wait: float | None) -> None:
        assert slot.call is not None
        slot.result = self._run_admitted(slot.call, cancel, timeout, approval_wait, slot.authorized)

    def _run_admitted(self, call: ProposedCall, cancel: threading.Event | None, timeout: float | None,
                      approval_wait: float | None, authorized: Authorized | None = None) -> CallResult:
        att = Attempt()

        def cancelled() -> bool:
            return cancel is not None and cancel.is_set()

        try:
            end = self._perform(self.decide(call, att, timeout, approval_wait, cancelled, authorized), cancel)
        except Exception as exc:
            log.exception("guard failed in call %s", call.call_id)
            end = self._broken(call, att, exc)
        except BaseException:
            self._finish(call.call_id, self._report(self._interrupted(call, att, "interrupted")))
            raise
        return self._finish(call.call_id, self._report(end))

    def run_assembled(self, answer: AssembledCall | RefusedCall, **options: Any) -> CallResult:
        """A call from a streamed response (client/streaming.py): an assembled call runs as
        `run` would run it (`options` are run's); a refused one ends `failed` with its
        code, authorizing nothing."""
        if isinstance(answer, RefusedCall):
            return self.refuse(answer.call_id, answer.name, answer.code, REFUSALS[answer.code])
        return self.run(answer.call_id, answer.name, answer.input_json, **options)

    def cancel(self, call_id: str) -> CallResult:
        """Ends a call that waits for approval: `cancelled`, reported to the sidecar.
        Raises UnknownCallError for an id that is not waiting (unknown or finished)."""
        return self._finish(call_id, self._report(self._cancel_pending_approval(call_id)))

    def _report(self, end: End) -> CallResult:
        return self._perform(self.reporting(end))

    # -- performing the algorithm's steps ----------------------------------------------

    def _perform(self, steps: Generator[Step, Any, T], cancel: threading.Event | None = None) -> T:
        stepper = Stepper(steps)
        while (step := stepper.step) is not None:
            try:
                reply = self._do(step, cancel)
            except Exception as exc:  # noqa: BLE001 - the algorithm decides what a failed step means
                stepper.fail(exc)
            else:
                stepper.reply(reply)
        return stepper.result  # type: ignore[return-value]  # set once the generator returned

    def _do(self, step: Step, cancel: threading.Event | None) -> Any:
        if isinstance(step, Rpc):
            return step.send(self.client)
        if isinstance(step, WatchApproval):
            return self._watch(step, cancel)
        if isinstance(step, Execute):
            return self._execute(step, cancel)
        if inspect.iscoroutine(step.awaitable):
            step.awaitable.close()  # it will never be awaited: closed, Python does not warn about it
        raise TypeError("the entities provider returned an awaitable: use AsyncGuard for a coroutine provider")

    def _watch(self, step: WatchApproval, cancel: threading.Event | None) -> apb.Approval | None:
        stream = self.client.watch_approval(step.approval_id, step.viewer, timeout=step.seconds)
        stop = threading.Event()
        if cancel is not None:
            threading.Thread(target=_cancel_when, args=(cancel, stop, stream), daemon=True).start()
        try:
            for approval in stream:
                if step.settles(approval):
                    return approval
            return None
        finally:
            stop.set()
            stream.cancel()  # a no-op once the stream ended; frees it when we returned early

    def _execute(self, step: Execute, cancel: threading.Event | None) -> Ran:
        """Runs the tool in a worker thread, waiting for it until the deadline or `cancel`."""
        invocation, att = step.invocation, step.attempt
        gate = threading.Lock()
        done = threading.Event()
        outcome: list[Ran] = []  # the worker's one result, read after `done`
        aborted = False

        def worker() -> None:
            with gate:
                if aborted:
                    return
                att.started = True
            try:
                outcome.append(Ran(output=step.tool.fn(step.arguments, invocation)))
            except BaseException as exc:  # noqa: BLE001 - reported as the call's failure
                outcome.append(Ran(error=exc))
            finally:
                done.set()

        threading.Thread(target=worker, daemon=True, name=f"toolauthz-{invocation.call_id}").start()
        while True:
            left = invocation.deadline - time.monotonic()
            if done.wait(max(0.0, min(left, _POLL) if cancel is not None else left)):
                return outcome[0]
            cancelled = cancel is not None and cancel.is_set()
            if cancelled or time.monotonic() >= invocation.deadline:
                with gate:
                    if not att.started:
                        aborted = True
                if aborted:
                    return Ran.never_started()
                invocation.cancelled.set()  # ask the tool to stop; its late result is discarded
                return Ran(cut="cancelled_after_start" if cancelled else "timeout")


def _cancel_when(cancel: threading.Event, stop: threading.Event, stream: ApprovalStream) -> None:
    """Cancels a watch stream when the caller's event is set (until `stop`)."""
    while not stop.is_set():
        if cancel.wait(_POLL):
            stream.cancel()
            return
