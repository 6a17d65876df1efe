"""The agent (see __init__): prints one line per step; exit status 0 when every tool ran
exactly as the sidecar allowed."""

from __future__ import annotations

from collections import Counter
from typing import Any

from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, StateGraph
from langgraph.prebuilt import tools_condition
from langgraph.types import Command

from examples.local_sidecar import ORDER, local_sidecar
from toolauthz.client import AuthzClient, Guard, Principal, ToolSet, TrustedContext
from toolauthz.integrations.langgraph import ApprovalNode, GuardedState, GuardedToolNode, after_tools

RUNS: Counter[str] = Counter()


@tool
def lookup_order(order_id: str) -> dict:
    """Look an order up."""
    RUNS["lookup_order"] += 1
    return {"order_id": order_id, "status": "shipped"}


@tool
def issue_refund(order_id: str, amount_cents: int) -> dict:
    """Refund part of an order (your ledger, keyed by the call id)."""
    RUNS["issue_refund"] += 1
    return {"refund_id": f"rf_{order_id}", "amount_cents": amount_cents}


class ScriptedChat(FakeMessagesListChatModel):
    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:  # the scripted answers already name the tools
        return self


def build(client: AuthzClient) -> Any:
    model = ScriptedChat(responses=[
        AIMessage(content="", tool_calls=[
            {"name": "lookup_order", "args": {"order_id": "ord_1"}, "id": "call_1", "type": "tool_call"},
            {"name": "issue_refund", "args": {"order_id": "ord_1", "amount_cents": 6000}, "id": "call_2",
             "type": "tool_call"}]),
        AIMessage(content="Refunded 60.00 after approval.")])
    guards: dict[str, Guard] = {}

    def guard_of(config: Any) -> Guard:
        # One Guard per thread, its identity from YOUR session (here: alice), never the model.
        thread = config["configurable"]["thread_id"]
        if thread not in guards:
            context = TrustedContext("acme", Principal("User", "alice"), f"run-{thread}", entities=lambda c: [ORDER])
            guards[thread] = Guard(client, context, ToolSet())
        return guards[thread]

    tools = GuardedToolNode([lookup_order, issue_refund], guard_of)
    graph = StateGraph(GuardedState)
    graph.add_node("agent", lambda state: {"messages": [model.invoke(state["messages"])]})
    graph.add_node("tools", tools)
    graph.add_node("approvals", ApprovalNode(tools))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_conditional_edges("tools", after_tools, ["agent", "approvals"])
    graph.add_conditional_edges("approvals", after_tools, ["agent", "approvals"])
    return graph.compile(checkpointer=InMemorySaver())


def main() -> int:
    with local_sidecar() as address, AuthzClient(address, timeout=5.0) as client:
        app = build(client)
        config = {"configurable": {"thread_id": "1"}}
        state = app.invoke({"messages": [HumanMessage("Where is order 1, and refund 60.00 of it.")]}, config)
        [asked] = state["__interrupt__"][0].value["toolauthz_approvals"]
        print(f"interrupted for {asked['call_id']} ({asked['tool']}), runs {dict(RUNS)}")
        bob = TrustedContext("acme", Principal("User", "bob"), "console")
        client.decide_approval(asked["approval_id"], bob, "approve", reason="checked the order")
        print(f"bob approved {asked['approval_id']}")
        state = app.invoke(Command(resume="approved"), config)
        results = {m.tool_call_id: m.status for m in state["messages"] if isinstance(m, ToolMessage)}
        print(f"resumed: {state['messages'][-1].content!r}, tool results {results}, runs {dict(RUNS)}")
    return 0 if RUNS == Counter({"lookup_order": 1, "issue_refund": 1}) else 1
