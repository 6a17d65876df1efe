"""The LangGraph adapter (toolauthz/integrations/langgraph.py), driven by the real
LangGraph with langchain-core's scripted chat model (`FakeMessagesListChatModel`, its
`bind_tools` a no-op) against a live sidecar with the example bundle: allow and deny in
one AuthorizeBatch, an approval granted by bob and resumed from the checkpoint by another
Guard, a resume without a grant, a rejection, a replayed run, a cancelled turn before and
after its tool started. Every tool runs at most once and every outcome is audited."""

from __future__ import annotations

import threading
from collections import Counter

import pytest
from conftest import order_entity
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, StateGraph
from langgraph.prebuilt import tools_condition
from langgraph.types import Command

from toolauthz.audit.store import AuditQuery
from toolauthz.client import AuthzClient, Guard, Principal, ProposedCall, ToolSet, TrustedContext
from toolauthz.integrations.langgraph import CANCEL_KEY, ApprovalNode, GuardedState, GuardedToolNode, after_tools

BOB = TrustedContext("acme", Principal("User", "bob"), "approval-ui")


class ScriptedChat(FakeMessagesListChatModel):
    def bind_tools(self, tools, **kwargs):  # the scripted answers already name the tools
        return self


class CountingClient(AuthzClient):
    """The sync client, counting the authorization RPCs it sends."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.rpcs = Counter()

    def authorize(self, *args, **kwargs):
        self.rpcs["Authorize"] += 1
        return super().authorize(*args, **kwargs)

    def authorize_batch(self, *args, **kwargs):
        self.rpcs["AuthorizeBatch"] += 1
        return super().authorize_batch(*args, **kwargs)


def alice_session(request_id: str) -> TrustedContext:
    def entities(call: ProposedCall):
        if isinstance(call.arguments, dict) and call.arguments.get("order_id") == "ord_1":
            return [order_entity("ord_1", "alice", 10_000)]
        return []

    return TrustedContext("acme", Principal("User", "alice"), request_id, entities=entities)


class Shop:
    def __init__(self):
        self.runs = Counter()
        self.entered = threading.Event()
        self.hold: threading.Event | None = None

        @tool
        def issue_refund(order_id: str, amount_cents: int) -> dict:
            """Refund part of an order."""
            self.runs["issue_refund"] += 1
            self.entered.set()
            if self.hold is not None:
                self.hold.wait(30)
            return {"refund_id": f"rf_{order_id}_{amount_cents}"}

        @tool
        def lookup_order(order_id: str) -> dict:
            """Look an order up."""
            self.runs["lookup_order"] += 1
            return {"order_id": order_id, "status": "shipped"}

        self.tools = [issue_refund, lookup_order]


class Runtime:
    """The runtime around the graph: one Guard per thread, built from its session."""

    def __init__(self, channel, shop: Shop, turns: list[AIMessage], checkpointer=None):
        self.client = CountingClient(channel, timeout=5.0)
        self.guards: dict[str, Guard] = {}
        self.model = ScriptedChat(responses=[*turns, AIMessage(content="done")])
        self.checkpointer = checkpointer or InMemorySaver()
        tools = GuardedToolNode(shop.tools, self.guard_of)
        graph = StateGraph(GuardedState)
        model = self.model.bind_tools(shop.tools)
        graph.add_node("agent", lambda state: {"messages": [model.invoke(state["messages"])]})
        graph.add_node("tools", tools)
        graph.add_node("approvals", ApprovalNode(tools, approval_check_seconds=0.5))
        graph.add_edge(START, "agent")
        graph.add_conditional_edges("agent", tools_condition)
        graph.add_conditional_edges("tools", after_tools, ["agent", "approvals"])
        graph.add_conditional_edges("approvals", after_tools, ["agent", "approvals"])
        self.app = graph.compile(checkpointer=self.checkpointer)

    def guard_of(self, config) -> Guard:
        thread = config["configurable"]["thread_id"]
        if thread not in self.guards:
            self.guards[thread] = Guard(self.client, alice_session(f"run-{thread}"), ToolSet())
        return self.guards[thread]


def turn(*calls) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": n, "args": a, "id": i, "type": "tool_call"} for n, a, i in calls])


def config(thread: str, **configurable) -> dict:
    return {"configurable": {"thread_id": thread, **configurable}}


def tool_messages(state) -> dict[str, ToolMessage]:
    return {m.tool_call_id: m for m in state["messages"] if isinstance(m, ToolMessage)}


def outcome_of(sidecar, call_id) -> str:
    return sidecar.ledger.get("acme", call_id).outcome


def audited_outcomes(sidecar, call_id) -> list:
    records = sidecar.audit_log.query(AuditQuery(call_id=call_id), limit=100)
    return [r.event for r in records if r.event.kind == "outcome"]


LOOK = ("lookup_order", {"order_id": "ord_1"}, "call_look")
DENY = ("issue_refund", {"order_id": "ord_1", "amount_cents": 20_000}, "call_deny")
BIG = ("issue_refund", {"order_id": "ord_1", "amount_cents": 6000}, "call_big")


def test_allow_and_deny_of_one_turn_in_one_batch(channel, sidecar):
    shop = Shop()
    runtime = Runtime(channel, shop, [turn(LOOK, DENY)])
    state = runtime.app.invoke({"messages": [HumanMessage("refund it all")]}, config("t1"))
    messages = tool_messages(state)
    assert state["messages"][-1].content == "done" and shop.runs == Counter({"lookup_order": 1})
    assert messages["call_look"].status == "success" and "shipped" in messages["call_look"].content
    assert messages["call_deny"].status == "error" and "refund_id" not in messages["call_deny"].content
    assert runtime.client.rpcs == Counter({"AuthorizeBatch": 1})
    assert outcome_of(sidecar, "call_look") == "completed" and outcome_of(sidecar, "call_deny") == "failed"
    assert len(audited_outcomes(sidecar, "call_look")) == len(audited_outcomes(sidecar, "call_deny")) == 1


def test_approval_interrupts_and_a_resume_runs_the_tool_once_bob_approved(channel, sidecar):
    shop = Shop()
    checkpointer = InMemorySaver()
    first = Runtime(channel, shop, [turn(BIG)], checkpointer)
    state = first.app.invoke({"messages": [HumanMessage("refund 60")]}, config("t2"))
    [interrupted] = state["__interrupt__"]
    [asked] = interrupted.value["toolauthz_approvals"]
    assert asked["call_id"] == "call_big" and asked["approval_id"] and shop.runs == Counter()

    again = first.app.invoke(Command(resume="approved"), config("t2"))  # the UI says yes; no approver did
    assert "__interrupt__" in again and shop.runs == Counter()

    AuthzClient(channel, timeout=5.0).decide_approval(asked["approval_id"], BOB, "approve", reason="checked")
    later = Runtime(channel, shop, [turn(BIG)], checkpointer)  # another process: a new Guard, the same checkpoint
    later.model.i = 1  # the model's first answer was given before
    state = later.app.invoke(Command(resume="approved"), config("t2"))
    assert "__interrupt__" not in state and state["messages"][-1].content == "done"
    assert shop.runs == Counter({"issue_refund": 1})
    assert tool_messages(state)["call_big"].status == "success" and state["toolauthz_pending"] == []
    assert outcome_of(sidecar, "call_big") == "completed"
    state = later.app.invoke(None, config("t2"))  # nothing left to run on this thread
    assert shop.runs == Counter({"issue_refund": 1})


def test_a_rejected_approval_ends_the_call_with_an_error_and_runs_nothing(channel, sidecar):
    shop = Shop()
    runtime = Runtime(channel, shop, [turn(BIG)])
    state = runtime.app.invoke({"messages": [HumanMessage("refund 60")]}, config("t3"))
    approval_id = state["__interrupt__"][0].value["toolauthz_approvals"][0]["approval_id"]
    AuthzClient(channel, timeout=5.0).decide_approval(approval_id, BOB, "reject", reason="no")
    state = runtime.app.invoke(Command(resume="approved"), config("t3"))
    message = tool_messages(state)["call_big"]
    assert message.status == "error" and "reject" in message.content.lower() and shop.runs == Counter()
    assert outcome_of(sidecar, "call_big") == "failed"


def test_a_replayed_run_executes_nothing(channel, sidecar):
    shop = Shop()
    Runtime(channel, shop, [turn(LOOK)]).app.invoke({"messages": [HumanMessage("look")]}, config("t4"))
    # The same run replayed by another runtime without the checkpoint (the same session and
    # model turn): the sidecar's ledger knows the call ran.
    replay = Runtime(channel, shop, [turn(LOOK)])
    state = replay.app.invoke({"messages": [HumanMessage("look")]}, config("t4"))
    assert shop.runs == Counter({"lookup_order": 1})
    assert tool_messages(state)["call_look"].status == "error"
    assert outcome_of(sidecar, "call_look") == "completed" and len(audited_outcomes(sidecar, "call_look")) == 1


def test_a_turn_cancelled_before_it_starts_runs_nothing_and_reports_cancelled(channel, sidecar):
    shop = Shop()
    cancel = threading.Event()
    cancel.set()
    runtime = Runtime(channel, shop, [turn(LOOK)])
    state = runtime.app.invoke({"messages": [HumanMessage("look")]}, config("t6", **{CANCEL_KEY: cancel}))
    assert shop.runs == Counter() and tool_messages(state)["call_look"].status == "error"
    assert outcome_of(sidecar, "call_look") == "cancelled"


def test_a_turn_cancelled_after_its_tool_started_reports_outcome_unknown(channel, sidecar):
    shop = Shop()
    shop.hold = threading.Event()
    cancel = threading.Event()
    runtime = Runtime(channel, shop, [turn(("issue_refund", {"order_id": "ord_1", "amount_cents": 1500}, "call_cut"))])
    states = []
    worker = threading.Thread(target=lambda: states.append(runtime.app.invoke(
        {"messages": [HumanMessage("refund 15")]}, config("t7", **{CANCEL_KEY: cancel}))))
    worker.start()
    try:
        assert shop.entered.wait(20)
        cancel.set()
        worker.join(20)
    finally:
        shop.hold.set()
    assert not worker.is_alive() and shop.runs == Counter({"issue_refund": 1})
    assert tool_messages(states[0])["call_cut"].status == "error"
    assert outcome_of(sidecar, "call_cut") == "outcome_unknown"


@pytest.mark.parametrize("seconds", [-1.0])
def test_a_negative_approval_check_is_refused(seconds):
    with pytest.raises(ValueError, match="approval_check_seconds"):
        ApprovalNode(GuardedToolNode([], lambda config: None), approval_check_seconds=seconds)  # type: ignore[arg-type, return-value]


def test_identity_in_the_arguments_and_a_repeated_call_id_run_nothing(channel, sidecar):
    """The model cannot name whose order it is (the tool's schema has no such field, and
    the Guard's identity is the session's); a call id given twice in a turn is refused."""
    shop = Shop()
    spoof = ("issue_refund", {"order_id": "ord_1", "amount_cents": 100, "customer_id": "bob"}, "call_spoof")
    twice = [("lookup_order", {"order_id": "ord_1"}, "call_twice"),
             ("lookup_order", {"order_id": "ord_2"}, "call_twice")]
    runtime = Runtime(channel, shop, [turn(spoof, *twice)])
    state = runtime.app.invoke({"messages": [HumanMessage("refund bob's order")]}, config("t8"))
    answers = [m for m in state["messages"] if isinstance(m, ToolMessage)]
    spoofed = [m for m in answers if m.tool_call_id == "call_spoof"]
    assert [m.status for m in spoofed] == ["error"] and "additionalProperties" in spoofed[0].content
    assert shop.runs["issue_refund"] == 0
    assert shop.runs["lookup_order"] <= 1  # at most the first of the two calls named call_twice
    assert "error" in [m.status for m in answers if m.tool_call_id == "call_twice"]
