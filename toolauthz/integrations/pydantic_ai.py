"""Pydantic AI: a toolset wrapper that runs every tool call the way the sidecar allows it.

    from toolauthz.integrations.pydantic_ai import SidecarToolset

    guarded = SidecarToolset(FunctionToolset([issue_refund]), client=AsyncAuthzClient(addr),
                             context_of=lambda ctx: ctx.deps.trusted_context)
    agent = Agent(model, toolsets=[guarded], output_type=[str, DeferredToolRequests])

Each call goes through an `AsyncGuard` (one per agent run): authorized with the trusted
context of the run's own session (`context_of(ctx)`, typically from `ctx.deps`; never from
the arguments), the provider's tool-call id (`ctx.tool_call_id`) as the call id, verified
immediately before the wrapped tool runs, and its outcome reported.

How the answers map onto Pydantic AI:

    ALLOW, ran                   the tool's return value
    DENY, or any failure         `ToolFailed(reason)`: a failed tool result the model sees
    APPROVAL_REQUIRED            `ApprovalRequired`: the run ends with `DeferredToolRequests`
                                 (metadata `toolauthz_approval_id`)

A run resumed with `DeferredToolResults` asks the sidecar again with the same call id. The
tool runs only once the sidecar answers ALLOW, that is once an approver (another
principal) granted it; `approvals={id: True}` alone re-defers the call, and a rejection
in the sidecar is a failed tool result. A call the framework itself denies is never
passed to the toolset, so it stays pending in the sidecar until it expires.

The wrapped tool receives arguments decoded from the exact bytes that were authorized and
verified (re-validated by the tool's own argument validator); its return value must be
JSON-serialisable (pydantic's `to_jsonable_python`) and is checked against the bundle's
output schema when one is given.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import grpc
from pydantic_ai.exceptions import ApprovalRequired, ToolFailed
from pydantic_ai.messages import ModelResponse, ToolCallPart
from pydantic_ai.tools import AgentDepsT, RunContext
from pydantic_ai.toolsets import AbstractToolset, ToolsetTool, WrapperToolset
from pydantic_core import to_json, to_jsonable_python

from toolauthz.client import (
    APPROVAL_PENDING,
    COMPLETED,
    AsyncAuthzClient,
    AsyncGuard,
    CallResult,
    ToolInvocation,
    ToolSet,
    TrustedContext,
)
from toolauthz.proto.toolauthz.v1 import approvals_pb2 as apb

__all__ = ["APPROVAL_METADATA_KEY", "SidecarToolset"]

APPROVAL_METADATA_KEY = "toolauthz_approval_id"


@dataclass
class _Pending:
    ctx: RunContext[Any]
    tool: ToolsetTool[Any]


@dataclass
class SidecarToolset(WrapperToolset[AgentDepsT]):
    """`SidecarToolset(wrapped, client=..., context_of=...)`. `output_schemas`: the bundle's
    (`load_output_schemas("policies")`); `guard_options`: passed to each run's
    `AsyncGuard` (`execution_timeout`, `approval_wait`, ...)."""

    client: AsyncAuthzClient | None = None
    context_of: Callable[[RunContext[AgentDepsT]], TrustedContext] | None = None
    output_schemas: Mapping[str, Mapping[str, Any]] | None = None
    guard_options: Mapping[str, Any] = field(default_factory=dict)
    # Per run (set by for_run): the run's Guard, and the calls it is running by call id.
    guard: AsyncGuard | None = None
    _tools: ToolSet | None = field(default=None, repr=False)
    _running: dict[str, _Pending] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.client is None or self.context_of is None:
            raise TypeError("SidecarToolset needs client= and context_of= (the run's trusted context)")

    async def for_run(self, ctx: RunContext[AgentDepsT]) -> AbstractToolset[AgentDepsT]:
        """A fresh Guard per run, with the run's own identity: a Guard belongs to one run."""
        wrapped = await self.wrapped.for_run(ctx)
        assert self.client is not None and self.context_of is not None
        context = self.context_of(ctx)
        if not isinstance(context, TrustedContext):
            raise TypeError("context_of must return a toolauthz.client.TrustedContext")
        tools = ToolSet(output_schemas=self.output_schemas)
        guard = AsyncGuard(self.client, context, tools, **dict(self.guard_options))
        return replace(self, wrapped=wrapped, guard=guard, _tools=tools, _running={})

    def result(self, call_id: str) -> CallResult | None:
        """The recorded result of a call of this run (e.g. after the run was cancelled)."""
        return self.guard.result(call_id) if self.guard is not None else None

    async def call_tool(self, name: str, tool_args: dict[str, Any], ctx: RunContext[AgentDepsT],
                        tool: ToolsetTool[AgentDepsT]) -> Any:
        if self.guard is None or self._tools is None:
            raise ToolFailed("The tool call could not be authorized (no run is open); it was not executed.")
        call_id = ctx.tool_call_id
        if not call_id:
            raise ToolFailed("The tool call has no id and was not executed.")
        raw = _raw_arguments(ctx, call_id, name)
        if raw is None:
            raise ToolFailed("The tool call could not be found in the conversation; it was not executed.")
        if name not in self._tools:
            self._tools.register(name, self._execute)
        if call_id in self._running:  # the same id twice in one step: the Guard answers call_in_progress
            return self._answer(await self.guard.run(call_id, name, raw))
        self._running[call_id] = _Pending(ctx, tool)
        try:
            result = await self.guard.run(call_id, name, raw)
            if result.status == APPROVAL_PENDING and await self._decided(result.approval_id):
                # Rejected or expired: the Guard reads that state off the watch at once and
                # ends the call `failed` (reported). A replayed Authorize cannot tell it.
                result = await self.guard.run(call_id, name, raw, approval_wait=self._watch_seconds())
        finally:
            self._running.pop(call_id, None)
        return self._answer(result)

    def _watch_seconds(self) -> float:
        return self.guard.rpc_timeout if self.guard is not None and self.guard.rpc_timeout else 5.0

    async def _decided(self, approval_id: str) -> bool:
        """Whether a person already rejected the approval, or it expired: the watch's first
        message is the approval's current state. Unknown (an error) counts as not decided,
        and the call stays deferred."""
        assert self.client is not None and self.guard is not None
        stream = self.client.watch_approval(approval_id, self.guard.context, timeout=self._watch_seconds())
        try:
            async for approval in stream:
                return approval.status in (apb.REJECTED, apb.EXPIRED)
        except grpc.RpcError:
            return False
        finally:
            stream.cancel()
        return False

    @staticmethod
    def _answer(result: CallResult) -> Any:
        if result.status == COMPLETED:
            return result.output
        if result.status == APPROVAL_PENDING:
            raise ApprovalRequired(metadata={APPROVAL_METADATA_KEY: result.approval_id})
        raise ToolFailed(result.content)

    async def _execute(self, args: Any, invocation: ToolInvocation) -> Any:
        """The Guard's implementation of every tool: the wrapped toolset's, with arguments
        decoded from the verified bytes and validated as Pydantic AI would."""
        pending = self._running[invocation.call_id]
        validated = pending.tool.args_validator.validate_python(args, context=pending.ctx.validation_context)
        output = await self.wrapped.call_tool(invocation.name, validated, pending.ctx, pending.tool)
        return to_jsonable_python(output)


def _raw_arguments(ctx: RunContext[Any], call_id: str, name: str) -> bytes | None:
    """The arguments exactly as the model sent them, from the call's part in the
    conversation. The toolset itself is handed the *validated* arguments, with defaults
    filled in and values coerced: not what the model proposed, and not what the bundle's
    schema describes. A model that gave a parsed object (some providers, FunctionModel)
    is serialised; an empty string is `{}`, as Pydantic AI reads it."""
    for message in reversed(ctx.messages):
        if not isinstance(message, ModelResponse):
            continue
        for part in message.parts:
            if isinstance(part, ToolCallPart) and part.tool_call_id == call_id and part.tool_name == name:
                if isinstance(part.args, str):
                    return part.args.encode("utf-8", "surrogatepass") if part.args else b"{}"
                return to_json(part.args or {})
    return None
