"""The asyncio Guard: the same rules and algorithm as `toolauthz.client.guard.Guard` (both
in `toolauthz.client.guard_core`), with its steps performed over grpc.aio.

Cancellation is asyncio's own: cancel the task that awaits `run()`. The Guard records
the terminal outcome first (`cancelled` if the tool had not started, `outcome_unknown`
if it had), reports it to the sidecar (shielded from the cancellation), then lets the
CancelledError propagate. `guard.result(call_id)` gives the recorded result.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Generator, Iterable
from typing import Any, TypeVar

import grpc

from toolauthz.client import turn
from toolauthz.client.aio import AsyncAuthzClient
from toolauthz.client.assembly import REFUSALS, AssembledCall, RefusedCall
from toolauthz.client.context import ProposedCall, TrustedContext
from toolauthz.client.guard_core import (
    Attempt,
    Authorized,
    End,
    Execute,
    GuardCore,
    Ran,
    Rpc,
    Step,
    Stepper,
    WatchApproval,
)
from toolauthz.client.results import CallResult
from toolauthz.client.tools import ToolSet
from toolauthz.client.turn import TurnCall
from toolauthz.proto.toolauthz.v1 import approvals_pb2 as apb

__all__ = ["AsyncGuard"]

log = logging.getLogger("toolauthz.client")
T = TypeVar("T")


def _never() -> bool:
    """asyncio cancels a call by raising CancelledError into it, never by a flag."""
    return False


class AsyncGuard(GuardCore):
    """`AsyncGuard(client, context, tools, approval_wait=0, execution_timeout=30,
    rpc_timeout=None, observer=None)`; coroutine tools run on the loop, plain functions
    in a worker thread."""

    runs_coroutines = True

    def __init__(self, client: AsyncAuthzClient, context: TrustedContext, tools: ToolSet, **options: Any):
        super().__init__(context, tools, **options)
        self.client = client

    async def run(self, call_id: str, name: str, input_json: bytes | str, *, timeout: float | None = None,
                  approval_wait: float | None = None) -> CallResult:
        call = self._open(call_id, name, input_json)
        if isinstance(call, CallResult):
            return call
        return await self._run_admitted(call, timeout, approval_wait)

    async def run_turn(self, calls: Iterable[TurnCall], *, timeout: float | None = None,
                       approval_wait: float | None = None) -> list[CallResult]:
        """The calls of one model turn (see Guard.run_turn and `toolauthz.client.turn`).
        Cancelling the task ends the turn: calls not started end `cancelled`, started
        ones `outcome_unknown`, each recorded and reported; then CancelledError is raised."""
        slots = turn.admit(self, calls)
        try:
            for slot in slots:
                if slot.call is not None:
                    slot.context = await self._perform(self.call_context(slot.call))
                    if slot.context is None:
                        slot.result = self._finish(slot.call.call_id, await self._report(
                            self._fail(slot.call, Attempt(), "context_error", report=False)))
            for chunk in turn.batches(slots):
                try:
                    answers: Any = await self.client.authorize_batch(
                        self.context.to_proto(), turn.batch_calls(chunk), timeout=self.rpc_timeout)
                except grpc.RpcError as exc:
                    answers = exc
                turn.authorized_of(chunk, answers)
            for group in turn.groups(slots):
                await asyncio.gather(*(self._run_slot(slot, timeout, approval_wait) for slot in group))
        except asyncio.CancelledError:
            await self._end_unstarted(slots)
            raise
        return [slot.result for slot in slots if slot.result is not None]

    async def _run_slot(self, slot: turn.Slot, timeout: float | None, approval_wait: float | None) -> None:
        assert slot.call is not None
        slot.result = await self._run_admitted(slot.call, timeout, approval_wait, slot.authorized)

    async def _end_unstarted(self, slots: list[turn.Slot]) -> None:
        """After the turn was cancelled: every admitted call that never ran ends `cancelled`
        (reported when the batch decided it), so each call id has its one outcome."""
        for slot in slots:
            if slot.call is None or slot.result is not None or self.result(slot.call.call_id) is not None:
                continue
            att = Attempt(authorize_sent=slot.authorized is not None)
            end = self._cancelled(slot.call, att, report=att.authorize_sent)
            report = asyncio.ensure_future(self._report(end))
            try:
                result = await asyncio.shield(report)
            except asyncio.CancelledError:
                result = end.result
            slot.result = self._finish(slot.call.call_id, result)

    async def _run_admitted(self, call: ProposedCall, timeout: float | None, approval_wait: float | None,
                            authorized: Authorized | None = None) -> CallResult:
        att = Attempt()
        try:
            end = await self._perform(self.decide(call, att, timeout, approval_wait, _never, authorized))
        except asyncio.CancelledError:
            interrupted = self._interrupted(call, att, "cancelled_after_start")
            report = asyncio.ensure_future(self._report(interrupted))
            try:
                result = await asyncio.shield(report)
            except asyncio.CancelledError:  # cancelled again: the report finishes on its own
                result = interrupted.result
            self._finish(call.call_id, result)
            raise
        except Exception as exc:
            log.exception("guard failed in call %s", call.call_id)
            end = self._broken(call, att, exc)
        return self._finish(call.call_id, await self._report(end))

    async def run_assembled(self, answer: AssembledCall | RefusedCall, **options: Any) -> CallResult:
        """A call from a streamed response (client/streaming.py): an assembled call runs as
        `run` would run it (`options` are run's); a refused one ends `failed` with its
        code, authorizing nothing."""
        if isinstance(answer, RefusedCall):
            return self.refuse(answer.call_id, answer.name, answer.code, REFUSALS[answer.code])
        return await self.run(answer.call_id, answer.name, answer.input_json, **options)

    async def cancel(self, call_id: str) -> CallResult:
        """Ends a call that waits for approval (see Guard.cancel)."""
        return self._finish(call_id, await self._report(self._cancel_pending_approval(call_id)))

    async def _report(self, end: End) -> CallResult:
        return await self._perform(self.reporting(end))

    # -- performing the algorithm's steps ----------------------------------------------

    async def _perform(self, steps: Generator[Step, Any, T]) -> T:
        stepper = Stepper(steps)
        while (step := stepper.step) is not None:
            try:
                reply = await self._do(step)
            except Exception as exc:  # noqa: BLE001 - the algorithm decides what a failed step means
                stepper.fail(exc)
            else:
                stepper.reply(reply)
        return stepper.result  # type: ignore[return-value]  # set once the generator returned

    async def _do(self, step: Step) -> Any:
        if isinstance(step, Rpc):
            return await step.send(self.client)
        if isinstance(step, WatchApproval):
            return await self._watch(step)
        if isinstance(step, Execute):
            return await self._execute(step)
        return await step.awaitable

    async def _watch(self, step: WatchApproval) -> apb.Approval | None:
        stream = self.client.watch_approval(step.approval_id, step.viewer, timeout=step.seconds)
        try:
            async for approval in stream:
                if step.settles(approval):
                    return approval
            return None
        finally:
            stream.cancel()

    async def _execute(self, step: Execute) -> Ran:
        invocation = step.invocation
        step.attempt.started = True
        if step.tool.is_async:
            pending = step.tool.fn(step.arguments, invocation)
        else:
            pending = asyncio.to_thread(step.tool.fn, step.arguments, invocation)
        deadline = asyncio.timeout(invocation.remaining())
        try:
            async with deadline:
                return Ran(output=await pending)
        except TimeoutError as exc:
            if deadline.expired():
                invocation.cancelled.set()
                return Ran(cut="timeout")
            return Ran(error=exc)
        except asyncio.CancelledError:
            invocation.cancelled.set()
            raise
        except Exception as exc:  # noqa: BLE001 - reported as the call's failure
            return Ran(error=exc)
