"""The asyncio Guard: the same rules as `sidecar.client.guard.Guard`, over grpc.aio.

Cancellation is asyncio's own: cancel the task that awaits `run()`. The Guard records
the terminal outcome first (`cancelled` if the tool had not started, `outcome_unknown`
if it had), reports it to the sidecar (shielded from the cancellation), then lets the
CancelledError propagate. `guard.result(call_id)` gives the recorded result.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from dataclasses import replace

import grpc

from sidecar.client import results as r
from sidecar.client.aio import AsyncAuthzClient
from sidecar.client.context import ProposedCall, TrustedContext
from sidecar.client.guard import _Attempt, _End, _GuardCore
from sidecar.client.results import CallResult
from sidecar.client.tools import Tool, ToolSet
from sidecar.proto.toolauthz.v1 import authorizer_pb2 as pb

__all__ = ["AsyncGuard"]

log = logging.getLogger("toolauthz.client")


class AsyncGuard(_GuardCore):
    """`AsyncGuard(client, context, tools, approval_wait=0, execution_timeout=30,
    rpc_timeout=None, observer=None)`; coroutine tools run on the loop, plain functions
    in a worker thread."""

    def __init__(self, client: AsyncAuthzClient, context: TrustedContext, tools: ToolSet, **options):
        super().__init__(context, tools, **options)
        self.client = client

    async def run(self, call_id: str, name: str, input_json: bytes | str, *, timeout: float | None = None,
                  approval_wait: float | None = None) -> CallResult:
        call, early = self._open(call_id, name, input_json)
        if early is not None:
            return early
        att = _Attempt()
        try:
            end = await self._drive(call, att, timeout, approval_wait)
        except asyncio.CancelledError:
            end = self._unknown(call, att, "cancelled_after_start") if att.started else \
                self._cancelled(call, att, report=att.authorize_sent)
            report = asyncio.ensure_future(self._report(end))
            try:
                result = await asyncio.shield(report)
            except asyncio.CancelledError:  # cancelled again: the report finishes on its own
                result = end.result
            self._finish(call_id, result)
            raise
        except Exception as exc:  # a bug here must still end the call
            log.exception("guard failed in call %s", call_id)
            end = self._unknown(call, att, "internal_error") if att.started else \
                self._fail(call, att, "internal_error", report=att.authorize_sent,
                           detail={"exception": type(exc).__name__})
        return self._finish(call_id, await self._report(end))

    async def cancel(self, call_id: str) -> CallResult:
        """Ends a call that waits for approval (see Guard.cancel)."""
        pending = self._take_pending_approval(call_id)
        call = ProposedCall(call_id, pending.name, b"")
        att = _Attempt(True, pending.decision, pending.decision_id, pending.approval_id)
        return self._finish(call_id, await self._report(self._cancelled(call, att, report=True)))

    async def _drive(self, call: ProposedCall, att: _Attempt, timeout: float | None,
                     approval_wait: float | None) -> _End:
        try:
            entities = self.context.entities(call) if self.context.entities else None
            if inspect.isawaitable(entities):
                entities = await entities
            ctx = self.context.to_proto(entities)
        except Exception:  # the runtime's provider
            log.exception("entities provider failed for call %s", call.call_id)
            return self._fail(call, att, "context_error", report=False)
        att.authorize_sent = True
        try:
            response = await self.client.authorize(ctx, call.to_proto(), timeout=self.rpc_timeout)
        except grpc.RpcError as exc:
            return self._fail(call, att, self._authorize_failed(call, exc))
        tool = self._on_authorized(call, att, response, sync=False)
        if isinstance(tool, _End):
            return tool
        token = response.token
        if response.decision == pb.APPROVAL_REQUIRED:
            waited = await self._await_approval(call, att, ctx, approval_wait)
            if isinstance(waited, _End):
                return waited
            token = waited
        try:
            verified = await self.client.verify(token, ctx, call.to_proto(), timeout=self.rpc_timeout)
        except grpc.RpcError as exc:
            log.warning("Verify of call %s failed: %s", call.call_id, exc.code())
            return self._fail(call, att, "verification_unavailable")
        end = self._on_verified(call, att, verified)
        if end is not None:
            return end
        return await self._execute(call, att, tool, timeout)

    async def _await_approval(self, call, att, ctx, approval_wait) -> _End | str:
        wait = self.approval_wait if approval_wait is None else approval_wait
        self._emit("approval_wait", call, approval_id=att.approval_id, seconds=wait)
        if wait <= 0:
            return self._pending_approval(call, att)
        stream = self.client.watch_approval(att.approval_id, self.context.to_proto(), timeout=wait)
        try:
            async for approval in stream:
                got = self._on_approval(call, att, approval)
                if isinstance(got, _End):
                    return got
                if isinstance(got, str):
                    return got or await self._token_after_approval(call, att, ctx)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                log.warning("watching approval %s failed: %s", att.approval_id, exc.code())
        finally:
            stream.cancel()
        return self._pending_approval(call, att)

    async def _token_after_approval(self, call, att, ctx) -> _End | str:
        try:
            again = await self.client.authorize(ctx, call.to_proto(), timeout=self.rpc_timeout)
        except grpc.RpcError as exc:
            return self._fail(call, att, self._authorize_failed(call, exc))
        if again.decision == pb.ALLOW and again.token:
            return again.token
        return self._fail(call, att, "approval_unavailable")

    async def _execute(self, call, att, tool: Tool, timeout: float | None) -> _End:
        invocation = self._invocation(call, att, tool, timeout)
        self._emit("execute", call, deadline_seconds=round(invocation.remaining(), 3))
        att.started = True
        if tool.is_async:
            pending = tool.fn(call.arguments, invocation)
        else:
            pending = asyncio.to_thread(tool.fn, call.arguments, invocation)
        deadline = asyncio.timeout(invocation.remaining())
        try:
            async with deadline:
                output = await pending
        except TimeoutError as exc:
            if deadline.expired():
                invocation.cancelled.set()
                return self._unknown(call, att, "timeout")
            return self._on_error(call, att, exc)
        except asyncio.CancelledError:
            invocation.cancelled.set()
            raise
        except Exception as exc:  # noqa: BLE001 - reported as the call's failure
            return self._on_error(call, att, exc)
        return self._on_output(call, att, tool, output)

    async def _report(self, end: _End) -> CallResult:
        result = end.result
        if end.report is None:
            return result
        status, code, digest = end.report
        try:
            report = await self.client.report_outcome(self.context.to_proto(), result.call_id, status,
                                                      error_code=code, output_digest=digest,
                                                      timeout=self.rpc_timeout)
        except grpc.RpcError as exc:
            return replace(result, reported=self._reported(exc))
        return replace(result, reported=r.ALREADY_RECORDED if report.already_recorded else r.RECORDED,
                       detail={**result.detail, **({"unverified": True} if report.unverified else {})})
