"""A Pydantic AI agent whose tools run only as the sidecar allows, offline:
`.venv/bin/python -m examples.pydantic_ai_agent` (from the repository root).

The model is Pydantic AI's own FunctionModel, scripted; the sidecar runs in this process
on a free port with the example bundle (policies/). Alice's run:

    turn 1  lookup_order ord_1 and a 15.00 refund         allowed, each executed once
    turn 2  a 60.00 refund                                 approval required: the run ends with
                                                           DeferredToolRequests
            bob (finance) approves through the Approvals API; the run is resumed and the refund
            runs, once
    turn 3  a refund of carol's order                      denied: the model sees the reason
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import pathlib
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator

from pydantic_ai import Agent, DeferredToolRequests, DeferredToolResults
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.toolsets import FunctionToolset

from toolauthz.client import AsyncAuthzClient, Principal, ProposedCall, TrustedContext, load_output_schemas
from toolauthz.integrations.pydantic_ai import APPROVAL_METADATA_KEY, SidecarToolset
from toolauthz.server.build import build_sidecar, create_server
from toolauthz.server.config import Settings

ROOT = pathlib.Path(__file__).resolve().parents[2]
BUNDLE = ROOT / "policies"
ORDERS = {"ord_1": ("alice", 10_000), "ord_2": ("carol", 10_000)}  # the shop's own records
BOB = TrustedContext("acme", Principal("User", "bob"), "finance-desk")
executed: Counter[str] = Counter()


async def lookup_order(order_id: str) -> dict:
    """Look up one of the customer's orders."""
    executed["lookup_order"] += 1
    return {"order_id": order_id, "status": "shipped"}


async def issue_refund(order_id: str, amount_cents: int, reason: str | None = None) -> dict:
    """Refund part of an order."""
    executed["issue_refund"] += 1
    return {"refund_id": f"rf_{order_id}_{amount_cents}"}


def session_context(ctx) -> TrustedContext:
    """The run's identity from the runtime's session (`deps`), and the orders it vouches for."""
    user: str = ctx.deps

    def entities(call: ProposedCall) -> list:
        order = call.arguments.get("order_id") if isinstance(call.arguments, dict) else None
        if order not in ORDERS:
            return []
        owner, refundable = ORDERS[order]
        return [{"uid": {"type": "Order", "id": order}, "parents": [],
                 "attrs": {"owner": {"__entity": {"type": "User", "id": owner}}, "refundable_cents": refundable}}]

    return TrustedContext("acme", Principal("User", user), f"pydantic-run-{user}", entities=entities)


TURNS = {
    "check and refund": [("lookup_order", '{"order_id": "ord_1"}', "toolu_pa_01"),
                         ("issue_refund", '{"order_id": "ord_1", "amount_cents": 1500}', "toolu_pa_02")],
    "refund the rest": [("issue_refund", '{"order_id": "ord_1", "amount_cents": 6000}', "toolu_pa_03")],
    "refund my friend": [("issue_refund", '{"order_id": "ord_2", "amount_cents": 100}', "toolu_pa_04")],
}


def scripted_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    last = messages[-1]
    answered = [p for p in last.parts if hasattr(p, "tool_call_id")] if isinstance(last, ModelRequest) else []
    if answered:
        return ModelResponse(parts=[TextPart("; ".join(f"{p.tool_call_id} -> {p.content}" for p in answered))])
    prompt = next(p.content for p in last.parts if getattr(p, "part_kind", "") == "user-prompt")
    return ModelResponse(parts=[ToolCallPart(name, args, tool_call_id=cid) for name, args, cid in TURNS[prompt]])


@contextlib.contextmanager
def local_sidecar() -> Iterator[str]:
    logging.getLogger("toolauthz").setLevel(logging.ERROR)  # "generated a development key" is expected
    with tempfile.TemporaryDirectory(prefix="toolauthz-example-") as tmp:
        sidecar = build_sidecar(Settings(bundle=BUNDLE, data_dir=pathlib.Path(tmp) / "data", listen="127.0.0.1:0"))
        server, port = create_server(sidecar, "127.0.0.1:0")
        try:
            yield f"127.0.0.1:{port}"
        finally:
            server.stop(grace=2).wait()
            sidecar.close()


async def main(address: str) -> int:
    async with AsyncAuthzClient(address) as client:
        guarded = SidecarToolset(FunctionToolset([lookup_order, issue_refund]), client=client,
                                 context_of=session_context, output_schemas=load_output_schemas(BUNDLE))
        agent = Agent(FunctionModel(scripted_model), toolsets=[guarded], deps_type=str,
                      output_type=[str, DeferredToolRequests])

        first = await agent.run("check and refund", deps="alice")
        print(f"turn 1: {first.output}")

        second = await agent.run("refund the rest", deps="alice")
        assert isinstance(second.output, DeferredToolRequests)
        [asked] = second.output.approvals
        approval_id = second.output.metadata[asked.tool_call_id][APPROVAL_METADATA_KEY]
        print(f"turn 2: {asked.tool_call_id} waits for approval {approval_id}; refunds so far: "
              f"{executed['issue_refund']}")
        await client.decide_approval(approval_id, BOB, "approve", "parcel lost")
        print("        bob (finance) approved it through the Approvals API")
        resumed = await agent.run(message_history=second.all_messages(), deps="alice",
                                  deferred_tool_results=DeferredToolResults(approvals={asked.tool_call_id: True}))
        print(f"        resumed: {resumed.output}")

        third = await agent.run("refund my friend", deps="alice")
        print(f"turn 3: {third.output}")
    print(f"executed: {dict(sorted(executed.items()))}")
    return 0 if executed == Counter({"lookup_order": 1, "issue_refund": 2}) else 1


if __name__ == "__main__":
    with local_sidecar() as sidecar_address:
        sys.exit(asyncio.run(main(sidecar_address)))
