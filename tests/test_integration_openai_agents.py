"""The OpenAI Agents SDK adapter (toolauthz/integrations/openai_agents.py), driven by the
real SDK with its own scripted model (`agents.testing.ScriptedModel`) against a live
sidecar with the example bundle: allow, deny, an approval granted by bob and resumed
from a serialized RunState, the SDK's own approve() without a grant, a rejection, a
replayed run, a cancelled run. Every tool runs at most once and every outcome is audited."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import pytest
from agents import Agent, RunConfig, Runner, RunState, function_tool, set_tracing_disabled
from agents.testing import ScriptedModel, assistant_message, function_call
from conftest import order_entity

from toolauthz.audit.store import AuditQuery
from toolauthz.client import AsyncAuthzClient, AsyncGuard, AuthzClient, Principal, ProposedCall, ToolSet, TrustedContext
from toolauthz.integrations.openai_agents import AgentsGuard

BOB = TrustedContext("acme", Principal("User", "bob"), "approval-ui")
set_tracing_disabled(True)  # offline: the SDK's traces go nowhere


def alice_session() -> TrustedContext:
    """The runtime's session: alice, whose order ord_1 the runtime looks up itself."""

    def entities(call: ProposedCall):
        if isinstance(call.arguments, dict) and call.arguments.get("order_id") == "ord_1":
            return [order_entity("ord_1", "alice", 10_000)]
        return []

    return TrustedContext("acme", Principal("User", "alice"), "run-1", entities=entities)


class Shop:
    """The tools, as the SDK's `function_tool`s, counting their executions."""

    def __init__(self):
        self.runs = Counter()
        self.entered = asyncio.Event()
        self.hold: asyncio.Event | None = None

        @function_tool
        async def issue_refund(order_id: str, amount_cents: int) -> dict:
            """Refund part of an order."""
            self.runs["issue_refund"] += 1
            self.entered.set()
            if self.hold is not None:
                await self.hold.wait()
            return {"refund_id": f"rf_{order_id}_{amount_cents}"}

        @function_tool
        def lookup_order(order_id: str) -> dict:
            """Look an order up."""
            self.runs["lookup_order"] += 1
            return {"order_id": order_id, "status": "shipped"}

        self.tools = [issue_refund, lookup_order]


def agent_for(shop: Shop, guarded: AgentsGuard, model: ScriptedModel) -> Agent:
    return Agent(name="support", instructions="help", tools=guarded.tools(shop.tools), model=guarded.model(model))


class CountingClient(AsyncAuthzClient):
    """The async client, counting the authorization RPCs it sends."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.rpcs = Counter()

    async def authorize(self, *args, **kwargs):
        self.rpcs["Authorize"] += 1
        return await super().authorize(*args, **kwargs)

    async def authorize_batch(self, *args, **kwargs):
        self.rpcs["AuthorizeBatch"] += 1
        return await super().authorize_batch(*args, **kwargs)


def audit(sidecar, call_id):
    return [r.event for r in sidecar.audit_log.query(AuditQuery(call_id=call_id), limit=100)]


def outcome_of(sidecar, call_id) -> str:
    return sidecar.ledger.get("acme", call_id).outcome


def tool_outputs(model: ScriptedModel) -> dict[str, str]:
    """The function_call_output items the model was sent on its last call, by call id."""
    items = model.last_call.input if model.last_call else []
    return {i["call_id"]: i["output"] for i in items if isinstance(i, dict) and i.get("type") == "function_call_output"}


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_allowed_and_denied_calls_of_one_turn_decided_in_one_batch(server, sidecar):
    shop = Shop()

    async def scenario():
        async with CountingClient(f"127.0.0.1:{server[1]}") as client:
            guarded = AgentsGuard(AsyncGuard(client, alice_session(), ToolSet()))
            model = ScriptedModel([
                [function_call("lookup_order", {"order_id": "ord_1"}, call_id="call_look"),
                 function_call("issue_refund", {"order_id": "ord_1", "amount_cents": 20_000}, call_id="call_deny")],
                [assistant_message("done")]])
            result = await Runner.run(agent_for(shop, guarded, model), "refund it all")
            return result, model, client.rpcs

    result, model, rpcs = run(scenario())
    # the turn decided in one batch; the allowed call's invocation replays its decision for
    # a token (the denied one is refused at its replay too: it never runs)
    assert rpcs == Counter({"AuthorizeBatch": 1, "Authorize": 2})
    assert result.final_output == "done" and result.interruptions == []
    assert shop.runs == Counter({"lookup_order": 1})
    outputs = tool_outputs(model)
    assert json.loads(outputs["call_look"].replace("'", '"')) == {"order_id": "ord_1", "status": "shipped"}
    assert "not allowed" in outputs["call_deny"].lower() or "refused" in outputs["call_deny"].lower()
    assert "refund_id" not in outputs["call_deny"]
    assert outcome_of(sidecar, "call_look") == "completed" and outcome_of(sidecar, "call_deny") == "failed"
    assert [e.kind for e in audit(sidecar, "call_look")][-2:] == ["verify", "outcome"]
    assert sidecar.ledger.get("acme", "call_deny").decision == "DENY"


def _approval_script() -> ScriptedModel:
    return ScriptedModel([
        [function_call("issue_refund", {"order_id": "ord_1", "amount_cents": 6000}, call_id="call_big")],
        [assistant_message("refunded")]])


def test_approval_required_interrupts_and_resumes_once_bob_approved(server, sidecar, channel):
    shop = Shop()

    async def first():
        async with AsyncAuthzClient(f"127.0.0.1:{server[1]}") as client:
            guarded = AgentsGuard(AsyncGuard(client, alice_session(), ToolSet()))
            agent = agent_for(shop, guarded, _approval_script())
            result = await Runner.run(agent, "refund 60")
            return result.to_state().to_string(), [i.call_id for i in result.interruptions], guarded.approval_ids

    saved, interrupted, approval_ids = run(first())
    assert interrupted == ["call_big"] and shop.runs == Counter()
    AuthzClient(channel, timeout=5.0).decide_approval(approval_ids["call_big"], BOB, "approve", reason="checked")

    async def resumed():  # another process: a new Guard from the same session, the state from its string
        async with AsyncAuthzClient(f"127.0.0.1:{server[1]}") as client:
            guarded = AgentsGuard(AsyncGuard(client, alice_session(), ToolSet()))
            model = _approval_script()
            agent = agent_for(shop, guarded, model)
            model._steps.pop(0)  # the first step was consumed by the first process
            state = await RunState.from_string(agent, saved)
            for item in state.get_interruptions():
                state.approve(item)
            result = await Runner.run(agent, state)
            return result, model

    result, model = run(resumed())
    assert result.final_output == "refunded" and shop.runs == Counter({"issue_refund": 1})
    assert "rf_ord_1_6000" in tool_outputs(model)["call_big"]
    assert outcome_of(sidecar, "call_big") == "completed"
    assert "approval" in [e.kind for e in audit(sidecar, "call_big")]


def test_the_sdks_own_approve_without_a_grant_runs_nothing(server, sidecar):
    shop = Shop()

    async def scenario():
        async with AsyncAuthzClient(f"127.0.0.1:{server[1]}") as client:
            guarded = AgentsGuard(AsyncGuard(client, alice_session(), ToolSet()))
            model = _approval_script()
            agent = agent_for(shop, guarded, model)
            result = await Runner.run(agent, "refund 60")
            state = result.to_state()
            for item in result.interruptions:
                state.approve(item)  # the framework says yes; no approver did
            resumed = await Runner.run(agent, state)
            return resumed, model

    result, model = run(scenario())
    assert shop.runs == Counter()
    assert "approval" in tool_outputs(model)["call_big"].lower()
    assert sidecar.ledger.get("acme", "call_big").outcome == ""  # still waiting for a person


def test_a_rejected_approval_never_runs_even_if_the_sdk_approves(server, sidecar, channel):
    shop = Shop()

    async def scenario():
        async with AsyncAuthzClient(f"127.0.0.1:{server[1]}") as client:
            guarded = AgentsGuard(AsyncGuard(client, alice_session(), ToolSet()))
            model = _approval_script()
            agent = agent_for(shop, guarded, model)
            result = await Runner.run(agent, "refund 60")
            await asyncio.to_thread(AuthzClient(channel, timeout=5.0).decide_approval,
                                    guarded.approval_ids["call_big"], BOB, "reject", "not this one")
            state = result.to_state()
            for item in result.interruptions:
                state.approve(item)
            return await Runner.run(agent, state), model

    result, model = run(scenario())
    assert shop.runs == Counter() and result.final_output == "refunded"
    assert "rejected" in tool_outputs(model)["call_big"].lower()
    assert outcome_of(sidecar, "call_big") == "failed"


def test_a_replayed_run_executes_nothing(server, sidecar):
    shop = Shop()

    def script():
        return ScriptedModel([[function_call("lookup_order", {"order_id": "ord_1"}, call_id="call_look")],
                              [assistant_message("done")]])

    async def once():
        async with AsyncAuthzClient(f"127.0.0.1:{server[1]}") as client:
            guarded = AgentsGuard(AsyncGuard(client, alice_session(), ToolSet()))
            model = script()
            await Runner.run(agent_for(shop, guarded, model), "look", run_config=RunConfig(tracing_disabled=True))
            return tool_outputs(model)

    run(once())
    again = run(once())  # the same model turn replayed by another runtime: the sidecar's ledger refuses it
    assert shop.runs == Counter({"lookup_order": 1})
    assert "shipped" not in again["call_look"]
    assert outcome_of(sidecar, "call_look") == "completed"


def test_a_cancelled_run_reports_outcome_unknown_for_the_started_tool(server, sidecar):
    shop = Shop()

    async def scenario():
        shop.hold = asyncio.Event()
        ended = asyncio.Event()

        def observe(event):
            if event.kind == "outcome" and event.call_id == "call_cut":
                ended.set()

        async with AsyncAuthzClient(f"127.0.0.1:{server[1]}") as client:
            guarded = AgentsGuard(AsyncGuard(client, alice_session(), ToolSet(), observer=observe))
            model = ScriptedModel([
                [function_call("issue_refund", {"order_id": "ord_1", "amount_cents": 1500}, call_id="call_cut")],
                [assistant_message("done")]])
            task = asyncio.ensure_future(Runner.run(agent_for(shop, guarded, model), "refund 15"))
            await shop.entered.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            # The SDK's run ends before its tool tasks do; the Guard's task reports on its own.
            await ended.wait()
            return guarded.guard.result("call_cut")

    result = run(scenario())
    assert shop.runs == Counter({"issue_refund": 1})
    assert (result.status, result.reported) == ("outcome_unknown", "recorded")
    assert outcome_of(sidecar, "call_cut") == "outcome_unknown"


def test_a_run_cancelled_before_the_tool_started_reports_cancelled(server, sidecar):
    shop = Shop()

    class HeldVerify(AsyncAuthzClient):
        """Holds Verify until cancelled: the call is authorized, its tool not started."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.verifying = asyncio.Event()

        async def verify(self, *args, **kwargs):
            self.verifying.set()
            await asyncio.Event().wait()

    async def scenario():
        ended = asyncio.Event()

        def observe(event):
            if event.kind == "outcome" and event.call_id == "call_early":
                ended.set()

        async with HeldVerify(f"127.0.0.1:{server[1]}") as client:
            guarded = AgentsGuard(AsyncGuard(client, alice_session(), ToolSet(), observer=observe))
            model = ScriptedModel([
                [function_call("issue_refund", {"order_id": "ord_1", "amount_cents": 1500}, call_id="call_early")],
                [assistant_message("done")]])
            task = asyncio.ensure_future(Runner.run(agent_for(shop, guarded, model), "refund 15"))
            await client.verifying.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await ended.wait()
            return guarded.guard.result("call_early")

    result = run(scenario())
    assert shop.runs == Counter()
    assert (result.status, result.executed, result.reported) == ("cancelled", False, "recorded")
    assert outcome_of(sidecar, "call_early") == "cancelled"

