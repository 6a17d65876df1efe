"""The agent (see __init__): prints one line per step; exit status 0 when every tool ran
exactly as the sidecar allowed."""

from __future__ import annotations

import asyncio
from collections import Counter

from agents import Agent, Runner, RunState, function_tool, set_tracing_disabled
from agents.testing import ScriptedModel, assistant_message, function_call

from examples.local_sidecar import ORDER, local_sidecar
from toolauthz.client import AsyncAuthzClient, AsyncGuard, AuthzClient, Principal, ToolSet, TrustedContext
from toolauthz.integrations.openai_agents import AgentsGuard

RUNS: Counter[str] = Counter()


@function_tool
def lookup_order(order_id: str) -> dict:
    """Look an order up."""
    RUNS["lookup_order"] += 1
    return {"order_id": order_id, "status": "shipped"}


@function_tool
def issue_refund(order_id: str, amount_cents: int) -> dict:
    """Refund part of an order (your ledger, keyed by the call id)."""
    RUNS["issue_refund"] += 1
    return {"refund_id": f"rf_{order_id}", "amount_cents": amount_cents}


def session() -> TrustedContext:
    # Who the user is comes from YOUR session, never from the model.
    return TrustedContext("acme", Principal("User", "alice"), "run-1", entities=lambda call: [ORDER])


def script() -> ScriptedModel:
    return ScriptedModel([
        [function_call("lookup_order", {"order_id": "ord_1"}, call_id="call_1")],
        [function_call("issue_refund", {"order_id": "ord_1", "amount_cents": 6000}, call_id="call_2")],
        [assistant_message("Refunded 60.00 after approval.")]])


async def run(address: str) -> bool:
    async with AsyncAuthzClient(address) as client:
        guarded = AgentsGuard(AsyncGuard(client, session(), ToolSet()))
        model = script()
        agent = Agent(name="support", instructions="Help alice.", tools=guarded.tools([lookup_order, issue_refund]),
                      model=guarded.model(model))
        result = await Runner.run(agent, "Where is order 1, and refund 60.00 of it.")
        print(f"run 1: interrupted for {[i.call_id for i in result.interruptions]}, runs {dict(RUNS)}")
        saved = result.to_state().to_string()
        approval_id = guarded.approval_ids["call_2"]

    # bob, of finance, decides in the sidecar (the console or the Approvals API), not in the SDK
    with AuthzClient(address, timeout=5.0) as approvals:
        approvals.decide_approval(approval_id, TrustedContext("acme", Principal("User", "bob"), "console"),
                                  "approve", reason="checked the order")
    print(f"bob approved {approval_id}")

    async with AsyncAuthzClient(address) as client:  # a new process: a new Guard from the same session
        guarded = AgentsGuard(AsyncGuard(client, session(), ToolSet()))
        agent = Agent(name="support", instructions="Help alice.", tools=guarded.tools([lookup_order, issue_refund]),
                      model=guarded.model(model))
        state = await RunState.from_string(agent, saved)
        for item in state.get_interruptions():
            state.approve(item)  # lets the SDK invoke the tool; the Guard asks the sidecar again
        result = await Runner.run(agent, state)
    print(f"run 2: {result.final_output!r}, runs {dict(RUNS)}")
    return RUNS == Counter({"lookup_order": 1, "issue_refund": 1})


def main() -> int:
    set_tracing_disabled(True)  # offline: the SDK's traces go nowhere
    with local_sidecar() as address:
        return 0 if asyncio.run(run(address)) else 1
