"""LangGraph / LangChain: a tool node that runs a model turn's tool calls only as the
sidecar allows, and an approval node whose `interrupt` resumes by asking the sidecar.

    graph = StateGraph(GuardedState)
    graph.add_node("agent", call_model)
    tools = GuardedToolNode([issue_refund, lookup_order], guard_of)
    graph.add_node("tools", tools)
    graph.add_node("approvals", ApprovalNode(tools))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)           # langgraph.prebuilt
    graph.add_conditional_edges("tools", after_tools, ["agent", "approvals"])
    graph.add_conditional_edges("approvals", after_tools, ["agent", "approvals"])
    app = graph.compile(checkpointer=checkpointer)

`guard_of(config)` returns the blocking `Guard` of this run, built from the runtime's
session (the caller of `app.invoke` vouches for who the user is, in its config), never
from the model's arguments.

* The tool node runs the calls of the last AI message with `Guard.run_turn`: one
  AuthorizeBatch for the turn, each call verified immediately before its LangChain tool
  runs (with the arguments decoded from the authorized bytes), every outcome reported.
  Each call ends as a `ToolMessage` whose `tool_call_id` is the model's call id (the
  call id and idempotency key); a DENY or any other refusal is an error `ToolMessage`
  (`status="error"`) the model reads.
* A call the sidecar holds for approval gets no ToolMessage yet: it is kept in the state
  (`toolauthz_pending`) and `after_tools` routes to the approval node, which
  `interrupt`s the graph with the approval ids. Whatever the resume value says, the
  resumed node asks the sidecar again (`Guard.run`, watching the approval up to
  `approval_check_seconds`): an approval granted by an approver runs the tool, a
  rejected or expired one ends the call with an error ToolMessage, one still pending
  interrupts again.
* The checkpointer keeps every ToolMessage with its call id, so a resumed or replayed
  graph never re-executes: a call that already has a ToolMessage is not run again, and a
  call executed by any runtime is refused by the sidecar (single-use tokens).
* `cancel` (a `threading.Event` the runtime may put in the config's `configurable` as
  `toolauthz_cancel`) ends the turn: calls not started are `cancelled`, started ones
  `outcome_unknown`.

Why not `ToolNode(wrap_tool_call=...)`: it runs each call on its own (no batch for the
turn), and an interrupt raised inside it re-runs the whole turn when the graph resumes.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from typing import Annotated, Any, Literal, TypedDict

from toolauthz.client import Guard
from toolauthz.client.results import APPROVAL_PENDING, CallResult
from toolauthz.client.tools import ToolInvocation

try:
    from langchain_core.messages import AIMessage, AnyMessage, ToolMessage
    from langchain_core.runnables import RunnableConfig
    from langchain_core.tools import BaseTool
    from langgraph.graph.message import add_messages
    from langgraph.types import interrupt
except ImportError as exc:  # pragma: no cover - the extra is not installed
    raise ImportError("toolauthz.integrations.langgraph needs LangGraph: pip install 'toolauthz[langgraph]'") from exc

__all__ = ["GuardedState", "GuardedToolNode", "ApprovalNode", "after_tools", "PendingCall", "CANCEL_KEY"]

CANCEL_KEY = "toolauthz_cancel"
GuardOf = Callable[[RunnableConfig], Guard]


class PendingCall(TypedDict):
    """A call the sidecar holds for a person: kept in the checkpoint until it ends."""
    call_id: str
    name: str
    input_json: str
    approval_id: str


class GuardedState(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    toolauthz_pending: list[PendingCall]


def after_tools(state: Any) -> Literal["agent", "approvals"]:
    """Route after the tool or approval node: to the approval node while calls wait."""
    return "approvals" if _pending(state) else "agent"


class GuardedToolNode:
    """Runs the last AI message's tool calls through the run's Guard (see module doc)."""

    def __init__(self, tools: Sequence[BaseTool], guard_of: GuardOf):
        self._tools = {tool.name: tool for tool in tools}
        self._guard_of = guard_of

    def __call__(self, state: Any, config: RunnableConfig) -> dict[str, Any]:
        guard = self.guard_for(config)
        messages = _messages(state)
        answered = {m.tool_call_id for m in messages if isinstance(m, ToolMessage)}
        waiting = {p["call_id"] for p in _pending(state)}
        ai = next((m for m in reversed(messages) if isinstance(m, AIMessage)), None)
        calls = [(c["id"] or "", c["name"], json.dumps(c["args"], ensure_ascii=False))
                 for c in (ai.tool_calls if ai is not None else [])
                 if c["id"] not in answered and c["id"] not in waiting]
        results = guard.run_turn(calls, cancel=_cancel_of(config)) if calls else []
        inputs = {call_id: input_json for call_id, _name, input_json in calls}
        pending = [*_pending(state), *(_pending_call(r, inputs[r.call_id]) for r in results
                                       if r.status == APPROVAL_PENDING)]
        return {"messages": [tool_message(r) for r in results if r.status != APPROVAL_PENDING],
                "toolauthz_pending": pending}

    def guard_for(self, config: RunnableConfig) -> Guard:
        """The run's Guard, its ToolSet holding these tools."""
        guard = self._guard_of(config)
        for name, tool in self._tools.items():
            if name not in guard.tools:
                guard.tools.register(name, _implementation(tool))
        return guard


class ApprovalNode:
    """Interrupts the graph while calls wait for approval; on resume asks the sidecar."""

    def __init__(self, tool_node: GuardedToolNode, *, approval_check_seconds: float = 1.0):
        if approval_check_seconds < 0:
            raise ValueError("approval_check_seconds must be >= 0")
        self._tool_node = tool_node
        self.approval_check_seconds = approval_check_seconds

    def __call__(self, state: Any, config: RunnableConfig) -> dict[str, Any]:
        pending = _pending(state)
        # The value a person's UI resumes with is not an approval: the sidecar's is.
        interrupt({"toolauthz_approvals": [{"call_id": p["call_id"], "tool": p["name"],
                                            "approval_id": p["approval_id"]} for p in pending]})
        guard = self._tool_node.guard_for(config)
        ended, still = [], []
        for call in pending:
            result = guard.run(call["call_id"], call["name"], call["input_json"], cancel=_cancel_of(config),
                               approval_wait=self.approval_check_seconds)
            if result.status == APPROVAL_PENDING:
                still.append(call)
            else:
                ended.append(tool_message(result))
        return {"messages": ended, "toolauthz_pending": still}


def tool_message(result: CallResult) -> ToolMessage:
    """The call's result as the model reads it, under the model's own call id."""
    return ToolMessage(content=result.content, tool_call_id=result.call_id, name=result.name,
                       status="error" if result.is_error else "success")


def _implementation(tool: BaseTool) -> Callable[[Any, ToolInvocation], Any]:
    def run(args: Any, call: ToolInvocation) -> Any:
        return tool.invoke(args)

    return run


def _pending_call(result: CallResult, input_json: str) -> PendingCall:
    return PendingCall(call_id=result.call_id, name=result.name, input_json=input_json,
                       approval_id=result.approval_id)


def _messages(state: Any) -> list[Any]:
    return list(state.get("messages", []) if isinstance(state, dict) else getattr(state, "messages", []))


def _pending(state: Any) -> list[PendingCall]:
    value = state.get("toolauthz_pending") if isinstance(state, dict) else getattr(state, "toolauthz_pending", None)
    return list(value or [])


def _cancel_of(config: RunnableConfig) -> threading.Event | None:
    cancel = (config.get("configurable") or {}).get(CANCEL_KEY)
    return cancel if isinstance(cancel, threading.Event) else None
