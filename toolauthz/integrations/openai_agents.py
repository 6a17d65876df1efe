"""The OpenAI Agents SDK (`openai-agents`): its `function_tool`s and the tools of its MCP
servers run only as the sidecar allows.

    guarded = AgentsGuard(AsyncGuard(client, context_from_session, ToolSet()))
    agent = Agent(name="support", tools=guarded.tools([issue_refund, lookup_order]),
                  mcp_servers=[notes],              # their tools governed by guarded.agent
                  model=guarded.model(model))     # optional: one AuthorizeBatch per turn
    agent = guarded.agent(agent)
    result = await Runner.run(agent, "refund order 4471")
    # result.interruptions: the calls an approver must decide in the sidecar (approval ids
    # in `guarded.approval_ids`); later, from the RunState (serialized or not):
    result = await Runner.run(agent, state)

Where each rule of the Guard lands in the SDK's tool loop:

* `needs_approval` asks the sidecar (recorded and audited like any call): APPROVAL_REQUIRED
  becomes the SDK's interruption (`result.interruptions`, a resumable `RunState`); any
  other decision lets the SDK invoke the tool. With the agent's model wrapped
  (`guarded.model(model)`), the first `needs_approval` of a turn decides all the turn's
  calls in one AuthorizeBatch, on the exact argument text the model sent; otherwise (or
  for a RunState resumed without the model's answer) each call is one Authorize.
* `on_invoke_tool` is `AsyncGuard.run`: Authorize again (a replay of the same call id and
  digest: the recorded decision, a fresh token), Verify immediately before the tool's own
  invoker runs (with the arguments decoded from the authorized bytes), then
  ReportOutcome. A DENY, a rejected or expired approval, an approval still pending, a
  failed verification come back as the string the SDK shows the model as the tool's
  result, and the tool does not run.
* Resuming a RunState runs the tool only when the sidecar says an approver granted the
  approval: the SDK's own `state.approve()` only lets the SDK call `on_invoke_tool`,
  where the Guard asks the sidecar again; without a grant the model reads that the call
  waits for approval. `state.reject()` ends the call in the SDK without running it.
* The call id and idempotency key is the SDK's `tool_call_id` (the provider's call id);
  identity is the Guard's TrustedContext, built from the runtime's session, never from
  the arguments or the SDK's run context.
* A call already executed (this Guard, or any runtime: the sidecar's single-use token)
  never runs again: a replayed run executes nothing.
* An MCP server's tools: the SDK lists them each turn and makes each a FunctionTool (its
  name: the MCP tool's name, or with `include_server_in_tool_names` the SDK's prefixed
  one); the governed agent (`guarded.agent(agent)`) wraps each like a function tool, so
  the sidecar decides on that name and the SDK's call to the server is the tool's
  invoker, run only after Verify. A server's tool whose name another tool of the agent
  has is refused (the run fails; nothing runs); the server's own `require_approval`
  is replaced by the sidecar's decision.
* Cancelling the run's task: a call that had not started ends `cancelled`, one that had
  `outcome_unknown` (the AsyncGuard's rules).

The SDK offers no hook that holds a turn's calls before the first `needs_approval`; the
model wrapper is that hook: it only reads the model's answer (docs/integrations.md).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import weakref
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any

from toolauthz.client import AsyncGuard, ProposedCall
from toolauthz.client.results import APPROVAL_PENDING, COMPLETED, CallResult
from toolauthz.client.tools import ToolInvocation
from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb

try:
    from agents import Agent, FunctionTool, Tool, UserError
    from agents.models.interface import Model
    from agents.run_context import RunContextWrapper
    from agents.tool import ToolOriginType, get_function_tool_origin
    from agents.tool_context import ToolContext
except ImportError as exc:  # pragma: no cover - the extra is not installed
    raise ImportError("toolauthz.integrations.openai_agents needs the SDK: "
                      "pip install 'toolauthz[openai-agents]'") from exc

__all__ = ["AgentsGuard"]

log = logging.getLogger("toolauthz.integrations")

Invoker = Callable[[ToolContext[Any], str], Awaitable[Any]]
_FUNCTION = "function"  # where a tool wrapped by `tools()` comes from


class AgentsGuard:
    """Wraps an SDK run's function tools (`tools`) and its agent's MCP servers' tools
    (`agent`) around one AsyncGuard (one per model run: its TrustedContext is that run's
    session). The Guard's ToolSet receives each wrapped tool's implementation; give it an
    empty ToolSet (with output schemas if any).

    `approval_check_seconds`: when an invocation finds its call held for approval (a
    resumed RunState), how long the Guard watches the approval for a person's decision
    before answering that it still waits: an approval already decided answers at once."""

    def __init__(self, guard: AsyncGuard, *, approval_check_seconds: float = 1.0):
        if approval_check_seconds < 0:
            raise ValueError("approval_check_seconds must be >= 0")
        self.guard = guard
        self.approval_check_seconds = approval_check_seconds
        self.approval_ids: dict[str, str] = {}  # call id -> the sidecar's approval id, while pending
        # call id -> the SDK's context and the invoker of the tool it called, while the call runs
        self._running: dict[str, tuple[ToolContext[Any], Invoker]] = {}
        self._origins: dict[str, object] = {}  # the wrapped tools' names -> where each comes from
        self._invokers: weakref.WeakSet[Any] = weakref.WeakSet()  # the wrapped tools' on_invoke_tool
        self._turn: dict[str, tuple[str, str]] = {}  # the last model turn's calls: id -> (tool, argument text)
        self._decided: dict[str, asyncio.Future[pb.AuthorizeResponse | None]] = {}  # the turn's batch answers

    def model(self, model: Model) -> Model:
        """The agent's model, read by the adapter: each answer's function calls (of the
        wrapped tools) are the turn whose decisions one AuthorizeBatch makes."""
        return _TurnReader(model, self._on_turn)

    def tools(self, tools: Iterable[FunctionTool]) -> list[FunctionTool]:
        return [self.tool(tool) for tool in tools]

    def tool(self, tool: FunctionTool) -> FunctionTool:
        """The same tool, authorized, verified and reported through the sidecar."""
        if not isinstance(tool, FunctionTool):
            raise TypeError("AgentsGuard wraps FunctionTools (the SDK's `function_tool`)")
        if tool.name in self._origins:
            raise ValueError(f"tool `{tool.name}` is already wrapped")
        return self._governed(tool, _FUNCTION)

    def agent(self, agent: Agent[Any]) -> Agent[Any]:
        """The same agent, whose MCP servers' tools (`agent.mcp_servers`) are governed like
        its function tools: each time the SDK lists them (every turn, and when a RunState
        resumes), each becomes the wrapped FunctionTool under its SDK name, which is the
        bundle's tool name. Its function tools are wrapped with `tools()`; one that is not
        (added to `agent.tools` unwrapped) fails the run before the model is asked."""
        if not isinstance(agent, Agent):
            raise TypeError("AgentsGuard.agent takes the SDK's `Agent`")
        fields = {f.name: getattr(agent, f.name) for f in dataclasses.fields(agent) if f.init}
        return _GovernedAgent(**{**fields, "toolauthz": self})

    def mcp_tool(self, tool: Tool) -> FunctionTool:
        """An MCP server's tool as the SDK converted it, governed. A name already taken by
        another tool (a function tool, another server's) is refused: an MCP server could
        otherwise stand in for a tool the bundle allows under that name."""
        origin = get_function_tool_origin(tool) if isinstance(tool, FunctionTool) else None
        if not isinstance(tool, FunctionTool) or origin is None or origin.type != ToolOriginType.MCP:
            raise UserError(f"toolauthz: `{getattr(tool, 'name', tool)}` is not an MCP server's tool")
        source = ("mcp", origin.mcp_server_name)
        known = self._origins.get(tool.name)
        if known is not None and known != source:
            raise UserError(f"toolauthz: MCP server `{origin.mcp_server_name}` offers `{tool.name}`, "
                            "a name another tool of this agent has")
        return self._governed(tool, source)

    def _governed(self, tool: FunctionTool, source: object) -> FunctionTool:
        if tool.name not in self._origins:
            self.guard.tools.register(tool.name, self._run_invoker)
            self._origins[tool.name] = source
        invoke = tool.on_invoke_tool
        name = tool.name

        async def needs_approval(run_context: Any, params: dict[str, Any], call_id: str) -> bool:
            return await self._needs_approval(name, params, call_id)

        async def on_invoke_tool(context: ToolContext[Any], arguments: str) -> Any:
            return await self._invoke(name, invoke, context, arguments)

        self._invokers.add(on_invoke_tool)
        return dataclasses.replace(tool, on_invoke_tool=on_invoke_tool, needs_approval=needs_approval)

    def governs(self, tool: Tool) -> bool:
        """Whether the SDK's tool runs through this Guard (hosted tools are not FunctionTools:
        the provider runs them, and no adapter sees their calls)."""
        return not isinstance(tool, FunctionTool) or tool.on_invoke_tool in self._invokers

    async def _run_invoker(self, args: Any, call: ToolInvocation) -> Any:
        """The tool's implementation in the Guard: the SDK's own invoker of the tool the SDK
        called (argument model, failure handling; for an MCP tool, the call to the server)
        on the authorized bytes' value."""
        context, invoke = self._running[call.call_id]
        return await invoke(context, json.dumps(args, ensure_ascii=False))

    async def _needs_approval(self, name: str, params: dict[str, Any], call_id: str) -> bool:
        """Whether the sidecar holds this call for a person (then the SDK interrupts)."""
        known = self.guard.result(call_id)
        if known is not None and known.terminal:
            return False  # ended already: the invocation replays the result and runs nothing
        answer = None
        if call_id in self._turn:
            answer = await self._batch_answer(call_id, name)
            self._turn.pop(call_id, None)  # read once: a later question (a resumed run) asks the sidecar again
        if answer is None:
            try:
                call = ProposedCall.of(call_id, name, json.dumps(params, ensure_ascii=False))
                answer = await self.guard.client.authorize(self.guard.context, call, timeout=self.guard.rpc_timeout)
            except Exception:  # fails closed later: the invocation's own Authorize decides
                log.warning("asking the sidecar whether call %s needs approval failed", call_id, exc_info=True)
                return False
        if answer.decision == pb.APPROVAL_REQUIRED and not answer.token:
            self.approval_ids[call_id] = answer.approval_id
            return True
        self.approval_ids.pop(call_id, None)
        return False

    def _on_turn(self, output: Iterable[Any]) -> None:
        calls = [(item.call_id, item.name, item.arguments) for item in output
                 if getattr(item, "type", None) == "function_call" and getattr(item, "name", None) in self._origins
                 and isinstance(getattr(item, "call_id", None), str)
                 and isinstance(getattr(item, "arguments", None), str)]
        ids = Counter(call_id for call_id, _, _ in calls)
        # A call id the model gave twice is left out: each of those asks on its own, and the
        # Guard refuses the second (the same id is never two calls).
        self._turn = {call_id: (name, text) for call_id, name, text in calls if ids[call_id] == 1}

    async def _batch_answer(self, call_id: str, name: str) -> pb.AuthorizeResponse | None:
        """The turn's AuthorizeBatch answer for the call (the first caller of a turn sends
        the batch); None when the batch failed or did not answer this call as proposed
        (then the call asks on its own)."""
        if self._turn.get(call_id, ("", ""))[0] != name:
            return None
        if call_id not in self._decided:
            undecided = [cid for cid in self._turn if cid not in self._decided]
            loop = asyncio.get_running_loop()
            futures = {cid: loop.create_future() for cid in undecided}
            self._decided.update(futures)
            calls = [ProposedCall.of(cid, *self._turn[cid]) for cid in undecided]
            try:
                answers = await self.guard.client.authorize_batch(self.guard.context, calls,
                                                                  timeout=self.guard.rpc_timeout)
            except Exception:  # each call then asks on its own, and its invocation decides anyway
                log.warning("the turn's AuthorizeBatch failed", exc_info=True)
                answers = []
            for i, cid in enumerate(undecided):
                ok = i < len(answers) and answers[i].WhichOneof("answer") == "response"
                futures[cid].set_result(answers[i].response if ok else None)
        return await self._decided[call_id]

    async def _invoke(self, name: str, invoke: Invoker, context: ToolContext[Any], arguments: str) -> Any:
        call_id = context.tool_call_id
        self._running[call_id] = (context, invoke)
        try:
            result = await self.guard.run(call_id, name, arguments, approval_wait=self.approval_check_seconds)
        finally:
            self._running.pop(call_id, None)
        if result.status == APPROVAL_PENDING:
            self.approval_ids[call_id] = result.approval_id
        else:
            self.approval_ids.pop(call_id, None)
        return model_visible(result)


def model_visible(result: CallResult) -> Any:
    """What the model reads as the tool's result: the tool's own output when it ran, else
    the Guard's model-safe text (why it did not run)."""
    if result.status == COMPLETED:
        return result.output
    return result.content


@dataclasses.dataclass
class _GovernedAgent(Agent[Any]):
    """An Agent whose MCP tools, each time the SDK lists them, come back governed. A
    dataclass field, so the SDK's own copies of the agent (`clone`) keep it."""

    toolauthz: AgentsGuard | None = dataclasses.field(default=None, kw_only=True, repr=False)

    async def get_mcp_tools(self, run_context: RunContextWrapper[Any]) -> list[Tool]:
        tools = await super().get_mcp_tools(run_context)
        if self.toolauthz is None:  # built without a Guard: no MCP tool runs ungoverned
            raise UserError("toolauthz: build a governed agent with `AgentsGuard.agent`")
        return [self.toolauthz.mcp_tool(tool) for tool in tools]

    async def get_all_tools(self, run_context: RunContextWrapper[Any]) -> list[Tool]:
        tools = await super().get_all_tools(run_context)
        for tool in tools:
            if self.toolauthz is None or not self.toolauthz.governs(tool):
                raise UserError(f"toolauthz: tool `{getattr(tool, 'name', '?')}` is not governed: "
                                "wrap the agent's function tools with `AgentsGuard.tools`")
        return tools


class _TurnReader(Model):
    """The agent's model, unchanged, telling the adapter each answer's output items."""

    def __init__(self, inner: Model, on_turn: Any):
        self._inner = inner
        self._on_turn = on_turn

    async def get_response(self, *args: Any, **kwargs: Any) -> Any:
        response = await self._inner.get_response(*args, **kwargs)
        self._on_turn(response.output)
        return response

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        return self._events(self._inner.stream_response(*args, **kwargs))

    async def _events(self, events: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for event in events:
            if getattr(event, "type", None) == "response.completed":
                self._on_turn(event.response.output)
            yield event

    async def close(self) -> None:
        await self._inner.close()

    async def _cleanup_on_run_end(self, owner: object) -> None:
        await self._inner._cleanup_on_run_end(owner)

    def get_retry_advice(self, request: Any) -> Any:
        return self._inner.get_retry_advice(request)

    def __getattr__(self, name: str) -> Any:  # anything else the SDK asks of the model
        return getattr(self._inner, name)
