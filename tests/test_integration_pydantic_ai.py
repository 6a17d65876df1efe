"""Pydantic AI driven by its own FunctionModel against a live sidecar (port 0, FrozenClock):
the real agent loop, the real deferred-tool flow, the adapter in between. No hosted model.

Every scenario counts the wrapped tool's executions and reads the sidecar's audit trail.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from dataclasses import dataclass

import pytest
from conftest import order_entity
from pydantic_ai import Agent, DeferredToolRequests, DeferredToolResults
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.toolsets import FunctionToolset

from toolauthz.audit.store import AuditQuery
from toolauthz.client import AsyncAuthzClient, Principal, ProposedCall, TrustedContext, load_output_schemas
from toolauthz.integrations.pydantic_ai import APPROVAL_METADATA_KEY, SidecarToolset

BOB = TrustedContext("acme", Principal("User", "bob"), "approval-ui")


@dataclass
class Session:
    """The runtime's authenticated session: where identity comes from."""

    user: str
    run_id: str


def trusted(ctx) -> TrustedContext:
    session: Session = ctx.deps

    def entities(call: ProposedCall):
        if isinstance(call.arguments, dict) and call.arguments.get("order_id") == "ord_1":
            return [order_entity("ord_1", "alice")]
        return []

    return TrustedContext("acme", Principal("User", session.user), session.run_id, entities=entities)


def scripted(*calls: tuple[str, str, str]) -> FunctionModel:
    """A model that proposes `calls` (tool, raw JSON arguments, tool-call id) in one turn,
    then repeats what the tools answered as its final text."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        answered = [p for p in messages[-1].parts if hasattr(p, "tool_call_id")] \
            if isinstance(messages[-1], ModelRequest) else []
        if answered:
            return ModelResponse(parts=[TextPart(" | ".join(f"{p.tool_call_id}: {p.content}" for p in answered))])
        return ModelResponse(parts=[ToolCallPart(name, args, tool_call_id=call_id) for name, args, call_id in calls])

    return FunctionModel(respond)


class Shop:
    """The wrapped tools, counting executions."""

    def __init__(self):
        self.runs: Counter[str] = Counter()
        self.entered = asyncio.Event()
        self.release: asyncio.Event | None = None
        self.toolset = FunctionToolset([self.issue_refund, self.lookup_order])

    async def issue_refund(self, order_id: str, amount_cents: int, reason: str | None = None) -> dict:
        """Refund an order."""
        self.runs["issue_refund"] += 1
        self.entered.set()
        if self.release is not None:
            await self.release.wait()
        return {"refund_id": f"rf_{order_id}_{amount_cents}"}

    async def lookup_order(self, order_id: str) -> dict:
        """Look an order up."""
        self.runs["lookup_order"] += 1
        return {"order_id": order_id, "status": "shipped"}


def agent_for(shop: Shop, client: AsyncAuthzClient, bundle_dir, model: FunctionModel, **options) -> Agent:
    guarded = SidecarToolset(shop.toolset, client=client, context_of=trusted,
                             output_schemas=load_output_schemas(bundle_dir), **options)
    return Agent(model, toolsets=[guarded], deps_type=Session, output_type=[str, DeferredToolRequests])


def events(sidecar, call_id: str) -> list[tuple[str, str]]:
    return [(r.event.kind, r.event.result) for r in sidecar.audit_log.query(AuditQuery(call_id=call_id), limit=50)]


def run(scenario):
    return asyncio.run(asyncio.wait_for(scenario(), 30))


SMALL = '{"order_id": "ord_1", "amount_cents": 1500}'
LARGE = '{"order_id": "ord_1", "amount_cents": 6000}'
ALICE = Session("alice", "run-1")


def test_allowed_call_runs_once_verified_and_reported(server, bundle_dir, sidecar):
    shop = Shop()

    async def scenario():
        async with AsyncAuthzClient(f"127.0.0.1:{server[1]}") as client:
            agent = agent_for(shop, client, bundle_dir, scripted(("issue_refund", SMALL, "toolu_pa_1")))
            return await agent.run("refund ord_1", deps=ALICE)

    result = run(scenario)
    assert result.output == "toolu_pa_1: {'refund_id': 'rf_ord_1_1500'}"
    assert shop.runs == Counter({"issue_refund": 1})
    kinds = [kind for kind, _ in events(sidecar, "toolu_pa_1")]
    assert kinds == ["authorize", "verify", "outcome"]
    entry = sidecar.ledger.get("acme", "toolu_pa_1")
    assert entry.outcome == "completed" and entry.principal == 'User::"alice"'


def test_authorized_bytes_are_the_model_s_not_the_validated_defaults(server, bundle_dir, sidecar):
    """Pydantic AI fills `reason: None` in; the bundle's schema refuses a null reason. The
    sidecar sees what the model sent, and the tool still gets its default."""
    shop = Shop()

    async def scenario():
        async with AsyncAuthzClient(f"127.0.0.1:{server[1]}") as client:
            agent = agent_for(shop, client, bundle_dir, scripted(("issue_refund", SMALL, "toolu_pa_raw")))
            return await agent.run("refund", deps=ALICE)

    run(scenario)
    assert shop.runs["issue_refund"] == 1 and sidecar.ledger.get("acme", "toolu_pa_raw").outcome == "completed"


def test_denied_call_is_a_failed_tool_result_the_model_sees(server, bundle_dir, sidecar):
    shop = Shop()
    mallory = Session("carol", "run-2")  # not the order's owner

    async def scenario():
        async with AsyncAuthzClient(f"127.0.0.1:{server[1]}") as client:
            agent = agent_for(shop, client, bundle_dir, scripted(("issue_refund", SMALL, "toolu_pa_2")))
            return await agent.run("refund someone else's order", deps=mallory)

    result = run(scenario)
    assert result.output.startswith("toolu_pa_2: Not allowed, the call was not executed")
    assert shop.runs == Counter()
    assert events(sidecar, "toolu_pa_2") == [("authorize", "DENY"), ("outcome", "failed")]


def test_duplicate_keys_are_refused_by_the_sidecar_not_resolved_by_the_framework(server, bundle_dir, sidecar):
    """Pydantic AI would keep the last `amount_cents` (1,000,000); the sidecar parses the
    model's own bytes strictly and refuses them: nothing runs."""
    shop = Shop()
    doubled = '{"order_id": "ord_1", "amount_cents": 1500, "amount_cents": 1000000}'

    async def scenario():
        async with AsyncAuthzClient(f"127.0.0.1:{server[1]}") as client:
            agent = agent_for(shop, client, bundle_dir, scripted(("issue_refund", doubled, "toolu_pa_dup")))
            return await agent.run("refund", deps=ALICE)

    result = run(scenario)
    assert "not executed" in result.output and shop.runs == Counter()
    assert events(sidecar, "toolu_pa_dup") == [("authorize", "DENY")]  # refused before the ledger


def test_approval_granted_by_another_principal_then_resumed_runs_once(server, bundle_dir, sidecar):
    shop = Shop()

    async def scenario():
        async with AsyncAuthzClient(f"127.0.0.1:{server[1]}") as client:
            agent = agent_for(shop, client, bundle_dir, scripted(("issue_refund", LARGE, "toolu_pa_4")))
            first = await agent.run("refund 60", deps=ALICE)
            requests = first.output
            assert isinstance(requests, DeferredToolRequests)
            [asked] = requests.approvals
            approval_id = requests.metadata[asked.tool_call_id][APPROVAL_METADATA_KEY]
            history = first.all_messages()

            # The framework's own approval alone: the sidecar still says pending, so nothing runs.
            framework_only = await agent.run(message_history=history, deps=ALICE,
                                             deferred_tool_results=DeferredToolResults(
                                                 approvals={asked.tool_call_id: True}))
            assert isinstance(framework_only.output, DeferredToolRequests) and shop.runs == Counter()

            await client.decide_approval(approval_id, BOB, "approve", "checked")
            resumed = await agent.run(message_history=history, deps=ALICE,
                                      deferred_tool_results=DeferredToolResults(approvals={asked.tool_call_id: True}))
            return asked.tool_call_id, resumed

    call_id, resumed = run(scenario)
    assert call_id == "toolu_pa_4"
    assert resumed.output == "toolu_pa_4: {'refund_id': 'rf_ord_1_6000'}"
    assert shop.runs == Counter({"issue_refund": 1})
    assert sidecar.ledger.get("acme", "toolu_pa_4").outcome == "completed"
    trail = events(sidecar, "toolu_pa_4")
    assert ("approval", "APPROVE") in trail and trail[-2:] == [("verify", "ok"), ("outcome", "completed")]


def test_approval_rejected_in_the_sidecar_is_a_failed_result(server, bundle_dir, sidecar):
    shop = Shop()

    async def scenario():
        async with AsyncAuthzClient(f"127.0.0.1:{server[1]}") as client:
            agent = agent_for(shop, client, bundle_dir, scripted(("issue_refund", LARGE, "toolu_pa_5")))
            first = await agent.run("refund 60", deps=ALICE)
            [asked] = first.output.approvals
            await client.decide_approval(first.output.metadata[asked.tool_call_id][APPROVAL_METADATA_KEY], BOB,
                                         "reject", "not refundable")
            return await agent.run(message_history=first.all_messages(), deps=ALICE,
                                   deferred_tool_results=DeferredToolResults(approvals={asked.tool_call_id: True}))

    resumed = run(scenario)
    assert "rejected it; it was not executed" in resumed.output and shop.runs == Counter()
    assert sidecar.ledger.get("acme", "toolu_pa_5").outcome == "failed"


def test_a_replayed_run_executes_nothing(server, bundle_dir, sidecar):
    shop = Shop()

    async def scenario():
        async with AsyncAuthzClient(f"127.0.0.1:{server[1]}") as client:
            agent = agent_for(shop, client, bundle_dir, scripted(("issue_refund", SMALL, "toolu_pa_6"),
                                                                 ("lookup_order", '{"order_id": "ord_1"}',
                                                                  "toolu_pa_7")))
            first = await agent.run("refund", deps=ALICE)
            again = await agent.run("refund", deps=ALICE)  # the same script: the same call ids
            return first, again

    first, again = run(scenario)
    assert "rf_ord_1_1500" in first.output and "shipped" in first.output
    assert again.output.count("already executed; it was not run again") == 2
    assert shop.runs == Counter({"issue_refund": 1, "lookup_order": 1})
    assert [k for k, _ in events(sidecar, "toolu_pa_6")].count("verify") == 1


def test_cancelled_turn_before_and_after_the_tool_started(server, bundle_dir, sidecar):
    shop = Shop()
    shop.release = asyncio.Event()  # the refund blocks until the turn is cancelled

    async def scenario():
        async with AsyncAuthzClient(f"127.0.0.1:{server[1]}") as client:
            agent = agent_for(shop, client, bundle_dir, scripted(("issue_refund", SMALL, "toolu_pa_8")))
            task = asyncio.create_task(agent.run("refund", deps=ALICE))
            await shop.entered.wait()  # the refund has started
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    run(scenario)
    assert shop.runs == Counter({"issue_refund": 1})
    assert sidecar.ledger.get("acme", "toolu_pa_8").outcome == "outcome_unknown"
    assert events(sidecar, "toolu_pa_8")[-1] == ("outcome", "outcome_unknown")


def test_cancelled_before_start_is_cancelled_and_nothing_runs(server, bundle_dir, sidecar):
    shop = Shop()
    asked = asyncio.Event()
    hold = asyncio.Event()

    async def slow_entities(call):  # the runtime's own store is slow: the turn is cancelled meanwhile
        asked.set()
        await hold.wait()
        return [order_entity("ord_1", "alice")]

    def context_of(ctx):
        return TrustedContext("acme", Principal("User", "alice"), "run-9", entities=slow_entities)

    outcomes = []

    async def scenario():
        async with AsyncAuthzClient(f"127.0.0.1:{server[1]}") as client:
            guarded = SidecarToolset(shop.toolset, client=client, context_of=context_of,
                                     guard_options={"observer": lambda e: e.kind == "outcome" and outcomes.append(e)})
            agent = Agent(scripted(("issue_refund", SMALL, "toolu_pa_9")), toolsets=[guarded], deps_type=Session)
            task = asyncio.create_task(agent.run("refund", deps=ALICE))
            await asked.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    run(scenario)
    assert shop.runs == Counter()
    assert [(e.call_id, e.data["status"], e.data["executed"]) for e in outcomes] == [("toolu_pa_9", "cancelled", False)]
    assert sidecar.ledger.get("acme", "toolu_pa_9") is None  # the sidecar never saw it: nothing to record


def test_a_toolset_without_identity_is_refused():
    with pytest.raises(TypeError):
        SidecarToolset(FunctionToolset([]))
    assert json.loads(SMALL)["amount_cents"] == 1500
