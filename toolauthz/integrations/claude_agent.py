"""The Claude Agent SDK: `PreToolUse` hooks and a `can_use_tool` callback that ask the
sidecar about every tool use of an agent (built-in tools and MCP tools alike).

    from toolauthz.integrations.claude_agent import ClaudeAgentAuthz

    authz = ClaudeAgentAuthz(AuthzClient(addr), TrustedContext("acme", Principal("User", user), run_id))
    options = ClaudeAgentOptions(hooks=authz.hooks(), ...)

`hooks()` answers PreToolUse from the sidecar (allow; deny with the reason, which the model
sees; and while an approver has not decided, `defer` by default: the run ends with the
deferred call, and resuming the session (`resume=`) replays the same `tool_use_id` through
the hook, which allows it only once the sidecar says an approver granted it). It reports
the outcome on PostToolUse and PostToolUseFailure. A failing callback blocks the call
(`on_failure="block"`).

`can_use_tool` is the SDK's permission prompt: it is asked only for calls no permission rule
already allowed, so it is not a gate on every call; use the hooks for that. It cannot
defer: a pending approval is a deny there.

The identity is the trusted context given here, from the runtime's session; the hook's
input (written by the agent) never supplies it. What a hook guarantees and what it cannot
(it decides; Claude Code executes) is in docs/frameworks.md.
"""

from __future__ import annotations

import asyncio
from typing import Any

from claude_agent_sdk import HookMatcher, PermissionResultAllow, PermissionResultDeny
from claude_agent_sdk.types import HookContext, HookEvent, PermissionResult, ToolPermissionContext

from toolauthz.client import AuthzClient, TrustedContext
from toolauthz.integrations.claude_hooks import ALLOW, DEFER, DENY, HookAnswer, ToolUseDecider, post_tool_outcome

__all__ = ["ClaudeAgentAuthz"]


class ClaudeAgentAuthz:
    """`ClaudeAgentAuthz(client, context, on_pending="defer", approval_wait=0)`; both as
    `ToolUseDecider` takes them (`approval_wait`: seconds the hook waits for the approver
    before answering `on_pending`; keep it below the hook matcher's timeout)."""

    def __init__(self, client: AuthzClient, context: TrustedContext, *, on_pending: str = DEFER,
                 approval_wait: float = 0.0, rpc_timeout: float | None = None):
        self.decider = ToolUseDecider(client, context, on_pending=on_pending, approval_wait=approval_wait,
                                      rpc_timeout=rpc_timeout)

    def hooks(self, matcher: str | None = None, *, timeout: float | None = None) -> dict[HookEvent, list[HookMatcher]]:
        """`ClaudeAgentOptions(hooks=...)`: every tool (or those `matcher` names)."""
        def matching(callback: Any) -> list[HookMatcher]:
            return [HookMatcher(matcher=matcher, hooks=[callback], timeout=timeout, on_failure="block")]

        return {"PreToolUse": matching(self.pre_tool_use), "PostToolUse": matching(self.post_tool_use),
                "PostToolUseFailure": matching(self.post_tool_use)}

    async def pre_tool_use(self, input_data: Any, tool_use_id: str | None, context: HookContext) -> Any:
        answer = await asyncio.to_thread(self._decide, input_data, tool_use_id)
        return answer.pre_tool_use_output()

    async def post_tool_use(self, input_data: Any, tool_use_id: str | None, context: HookContext) -> Any:
        call_id = input_data.get("tool_use_id") if isinstance(input_data, dict) else None
        if isinstance(call_id, str) and call_id:
            await asyncio.to_thread(self.decider.report, call_id, post_tool_outcome(input_data))
        return {}

    async def interrupted(self) -> list[str]:
        """Call after interrupting a turn (`ClaudeSDKClient.interrupt()`, a cancelled task):
        every call the hooks allowed whose outcome never came ends `outcome_unknown`
        (Claude Code sends no post-tool event for an interrupted tool). Returns their ids."""
        return await asyncio.to_thread(self.decider.interrupted)

    async def can_use_tool(self, tool_name: str, tool_input: dict[str, Any],
                           context: ToolPermissionContext) -> PermissionResult:
        """`ClaudeAgentOptions(can_use_tool=authz.can_use_tool)`."""
        answer = await asyncio.to_thread(self.decider.decide, context.tool_use_id or "", tool_name, tool_input)
        if answer.decision == ALLOW:
            return PermissionResultAllow()
        return PermissionResultDeny(message=answer.reason)

    def _decide(self, input_data: Any, tool_use_id: str | None) -> HookAnswer:
        if not isinstance(input_data, dict) or input_data.get("hook_event_name") != "PreToolUse":
            return HookAnswer(DENY, "the hook input is not a PreToolUse event; the tool call was not run")
        call_id = input_data.get("tool_use_id") or tool_use_id or ""
        return self.decider.decide(call_id, input_data.get("tool_name"), input_data.get("tool_input"))
