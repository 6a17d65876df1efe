"""The OpenAI Agents SDK adapter governing an agent's MCP tools (`AgentsGuard.agent`):
the real SDK with its scripted model, a live sidecar with the example bundle, and a real
MCP server over Streamable HTTP on a loopback port whose tools are the bundle's
`lookup_order` and `issue_refund`. Allow, deny (the server never called), an approval
granted by bob and resumed from a serialized RunState, the SDK's own approve() without a
grant, a replayed run, a tool the bundle does not know, a server shadowing a function tool."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import mcp_types as types
import pytest
from agents import Agent, Runner, RunState, UserError, function_tool, set_tracing_disabled
from agents.mcp import MCPServerStreamableHttp
from agents.testing import ScriptedModel, assistant_message, function_call
from mcp.server import Server
from mcp_support import serve_http, stop_http
from test_integration_openai_agents import BOB, CountingClient, alice_session, audit, outcome_of, tool_outputs

from toolauthz.client import AsyncAuthzClient, AsyncGuard, AuthzClient, ToolSet
from toolauthz.integrations.openai_agents import AgentsGuard

set_tracing_disabled(True)  # offline: the SDK's traces go nowhere

ORDER_ID = {"type": "string", "pattern": "^ord_[A-Za-z0-9]{1,32}$"}


def _object(properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": sorted(properties), "additionalProperties": False}


class ShopServer:
    """An MCP server offering the bundle's tools (and `export_orders`, which the bundle does
    not know), recording every call it receives."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.tools = [
            types.Tool(name="lookup_order", description="Look an order up.",
                       input_schema=_object({"order_id": ORDER_ID})),
            types.Tool(name="issue_refund", description="Refund part of an order.",
                       input_schema=_object({"order_id": ORDER_ID, "amount_cents": {"type": "integer"}})),
            types.Tool(name="export_orders", description="Dump every order.", input_schema=_object({})),
        ]
        self.server: Server[Any] = Server("shop", on_list_tools=self._list, on_call_tool=self._call)

    @property
    def runs(self) -> Counter[str]:
        return Counter(name for name, _ in self.calls)

    async def _list(self, ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=self.tools)

    async def _call(self, ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        args = params.arguments or {}
        self.calls.append((params.name, args))
        if params.name == "issue_refund":
            value = {"refund_id": f"rf_{args['order_id']}_{args['amount_cents']}"}
        else:
            value = {"order_id": args.get("order_id"), "status": "shipped"}
        return types.CallToolResult(content=[types.TextContent(text=json.dumps(value))])


@asynccontextmanager
async def connected(shop: ShopServer) -> AsyncIterator[MCPServerStreamableHttp]:
    """The shop served on a loopback port 0, and the SDK's client of it, connected."""
    async with anyio.create_task_group() as tg:
        http, port = await serve_http(shop.server.streamable_http_app(host="127.0.0.1"), tg)
        try:
            async with MCPServerStreamableHttp({"url": f"http://127.0.0.1:{port}/mcp"}, name="shop") as mcp:
                yield mcp
        finally:
            await stop_http(http)


def governed_agent(guarded: AgentsGuard, mcp: MCPServerStreamableHttp, model: ScriptedModel, tools=()) -> Agent:
    agent = Agent(name="support", instructions="help", tools=guarded.tools(tools), mcp_servers=[mcp],
                  model=guarded.model(model))
    return guarded.agent(agent)


def outputs_of(model: ScriptedModel) -> dict[str, str]:
    """The tool outputs the model was sent last, as text (an MCP tool's result is a list of
    content items; the Guard's refusals are strings)."""
    return {call_id: output if isinstance(output, str) else " ".join(part.get("text", "") for part in output)
            for call_id, output in tool_outputs(model).items()}


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_allowed_mcp_call_runs_and_denied_one_never_reaches_the_server(server, sidecar):
    shop = ShopServer()

    async def scenario():
        async with CountingClient(f"127.0.0.1:{server[1]}") as client, connected(shop) as mcp:
            guarded = AgentsGuard(AsyncGuard(client, alice_session(), ToolSet()))
            model = ScriptedModel([
                [function_call("lookup_order", {"order_id": "ord_1"}, call_id="call_look"),
                 function_call("issue_refund", {"order_id": "ord_1", "amount_cents": 20_000}, call_id="call_deny")],
                [assistant_message("done")]])
            result = await Runner.run(governed_agent(guarded, mcp, model), "refund it all")
            return result, model, client.rpcs

    result, model, rpcs = run(scenario())
    assert rpcs == Counter({"AuthorizeBatch": 1, "Authorize": 2})  # the turn in one batch, then each replayed
    assert result.final_output == "done"
    assert shop.calls == [("lookup_order", {"order_id": "ord_1"})]
    outputs = outputs_of(model)
    assert "shipped" in outputs["call_look"]
    assert "refund_id" not in outputs["call_deny"]
    assert outcome_of(sidecar, "call_look") == "completed" and outcome_of(sidecar, "call_deny") == "failed"
    assert sidecar.ledger.get("acme", "call_deny").decision == "DENY"
    assert [e.kind for e in audit(sidecar, "call_look")][-2:] == ["verify", "outcome"]


def _approval_script() -> ScriptedModel:
    return ScriptedModel([
        [function_call("issue_refund", {"order_id": "ord_1", "amount_cents": 6000}, call_id="call_big")],
        [assistant_message("refunded")]])


def test_approval_required_interrupts_and_resumes_once_bob_approved(server, sidecar, channel):
    shop = ShopServer()

    async def first():
        async with AsyncAuthzClient(f"127.0.0.1:{server[1]}") as client, connected(shop) as mcp:
            guarded = AgentsGuard(AsyncGuard(client, alice_session(), ToolSet()))
            result = await Runner.run(governed_agent(guarded, mcp, _approval_script()), "refund 60")
            return result.to_state().to_string(), [i.call_id for i in result.interruptions], guarded.approval_ids

    saved, interrupted, approval_ids = run(first())
    assert interrupted == ["call_big"] and shop.calls == []
    AuthzClient(channel, timeout=5.0).decide_approval(approval_ids["call_big"], BOB, "approve", reason="checked")

    async def resumed():  # another process: a new Guard, a new connection, the state from its string
        async with AsyncAuthzClient(f"127.0.0.1:{server[1]}") as client, connected(shop) as mcp:
            guarded = AgentsGuard(AsyncGuard(client, alice_session(), ToolSet()))
            model = _approval_script()
            model._steps.pop(0)  # the first step was consumed by the first process
            agent = governed_agent(guarded, mcp, model)
            state = await RunState.from_string(agent, saved)
            for item in state.get_interruptions():
                state.approve(item)
            return await Runner.run(agent, state), model

    result, model = run(resumed())
    assert result.final_output == "refunded"
    assert shop.calls == [("issue_refund", {"order_id": "ord_1", "amount_cents": 6000})]
    assert "rf_ord_1_6000" in outputs_of(model)["call_big"]
    assert outcome_of(sidecar, "call_big") == "completed"
    assert "approval" in [e.kind for e in audit(sidecar, "call_big")]


def test_the_sdks_own_approve_without_a_grant_calls_no_server(server, sidecar):
    shop = ShopServer()

    async def scenario():
        async with AsyncAuthzClient(f"127.0.0.1:{server[1]}") as client, connected(shop) as mcp:
            guarded = AgentsGuard(AsyncGuard(client, alice_session(), ToolSet()))
            model = _approval_script()
            agent = governed_agent(guarded, mcp, model)
            result = await Runner.run(agent, "refund 60")
            state = result.to_state()
            for item in result.interruptions:
                state.approve(item)  # the framework says yes; no approver did
            await Runner.run(agent, state)
            return model

    model = run(scenario())
    assert shop.calls == []
    assert "approval" in outputs_of(model)["call_big"].lower()
    assert outcome_of(sidecar, "call_big") == ""  # still waiting for a person


def test_a_replayed_run_calls_the_server_once(server, sidecar):
    shop = ShopServer()

    async def once():
        async with AsyncAuthzClient(f"127.0.0.1:{server[1]}") as client, connected(shop) as mcp:
            guarded = AgentsGuard(AsyncGuard(client, alice_session(), ToolSet()))
            model = ScriptedModel([[function_call("lookup_order", {"order_id": "ord_1"}, call_id="call_look")],
                                   [assistant_message("done")]])
            await Runner.run(governed_agent(guarded, mcp, model), "look")
            return outputs_of(model)

    first = run(once())
    again = run(once())  # the same model turn replayed by another runtime: the sidecar's ledger refuses it
    assert shop.runs == Counter({"lookup_order": 1})
    assert "shipped" in first["call_look"] and "shipped" not in again["call_look"]
    assert outcome_of(sidecar, "call_look") == "completed"


def test_an_mcp_tool_the_bundle_does_not_know_never_runs(server, sidecar):
    shop = ShopServer()

    async def scenario():
        async with AsyncAuthzClient(f"127.0.0.1:{server[1]}") as client, connected(shop) as mcp:
            guarded = AgentsGuard(AsyncGuard(client, alice_session(), ToolSet()))
            model = ScriptedModel([[function_call("export_orders", {}, call_id="call_export")],
                                   [assistant_message("done")]])
            await Runner.run(governed_agent(guarded, mcp, model), "dump")
            return outputs_of(model)

    outputs = run(scenario())
    assert shop.calls == []
    assert "shipped" not in outputs["call_export"]
    assert outputs["call_export"] == ("Not allowed, the call was not executed: "
                                      "no tool named `export_orders` is available.")
    assert [e.kind for e in audit(sidecar, "call_export")] == ["authorize", "authorize"]  # refused, recorded


def test_an_mcp_server_cannot_stand_in_for_a_function_tool(server, sidecar):
    shop = ShopServer()
    local: Counter[str] = Counter()
    lookup_order = _lookup_tool(local)

    async def scenario():
        async with AsyncAuthzClient(f"127.0.0.1:{server[1]}") as client, connected(shop) as mcp:
            guarded = AgentsGuard(AsyncGuard(client, alice_session(), ToolSet()))
            model = ScriptedModel([[function_call("lookup_order", {"order_id": "ord_1"}, call_id="call_look")],
                                   [assistant_message("done")]])
            with pytest.raises(UserError, match="`lookup_order`, a name another tool of this agent has"):
                await Runner.run(governed_agent(guarded, mcp, model, tools=[lookup_order]), "look")

    run(scenario())
    assert shop.calls == [] and local == Counter()
    assert sidecar.ledger.get("acme", "call_look") is None


def test_an_agent_only_governs_through_its_guard():
    with pytest.raises(TypeError, match="takes the SDK's `Agent`"):
        AgentsGuard(AsyncGuard.__new__(AsyncGuard)).agent(object())  # type: ignore[arg-type]


def test_a_rejected_approval_never_reaches_the_server_even_if_the_sdk_approves(server, sidecar, channel):
    shop = ShopServer()

    async def scenario():
        async with AsyncAuthzClient(f"127.0.0.1:{server[1]}") as client, connected(shop) as mcp:
            guarded = AgentsGuard(AsyncGuard(client, alice_session(), ToolSet()))
            model = _approval_script()
            agent = governed_agent(guarded, mcp, model)
            result = await Runner.run(agent, "refund 60")
            await asyncio.to_thread(AuthzClient(channel, timeout=5.0).decide_approval,
                                    guarded.approval_ids["call_big"], BOB, "reject", "not this one")
            state = result.to_state()
            for item in result.interruptions:
                state.approve(item)
            return await Runner.run(agent, state), model

    result, model = run(scenario())
    assert shop.calls == [] and result.final_output == "refunded"
    assert "rejected" in outputs_of(model)["call_big"].lower()
    assert outcome_of(sidecar, "call_big") == "failed"


def test_a_failing_mcp_tool_is_reported_once_with_the_sdks_failure_text(server, sidecar):
    shop = ShopServer()

    async def broken(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        shop.calls.append((params.name, params.arguments or {}))
        raise RuntimeError("the order service is down")

    shop.server = Server("shop", on_list_tools=shop._list, on_call_tool=broken)

    async def scenario():
        async with AsyncAuthzClient(f"127.0.0.1:{server[1]}") as client, connected(shop) as mcp:
            guarded = AgentsGuard(AsyncGuard(client, alice_session(), ToolSet()))
            model = ScriptedModel([[function_call("lookup_order", {"order_id": "ord_1"}, call_id="call_down")],
                                   [assistant_message("sorry")]])
            result = await Runner.run(governed_agent(guarded, mcp, model), "look")
            return result, outputs_of(model)

    result, outputs = run(scenario())
    assert result.final_output == "sorry"
    assert shop.runs == Counter({"lookup_order": 1})
    assert "shipped" not in outputs["call_down"]
    assert outcome_of(sidecar, "call_down") == "completed"  # the SDK's invoker answered with its failure text
    assert [e.kind for e in audit(sidecar, "call_down")][-2:] == ["verify", "outcome"]


@pytest.fixture
def prefixed_bundle(bundle_dir):
    """The example bundle, with the shop server's lookup under the SDK's prefixed name."""
    tool = (bundle_dir / "tools" / "lookup_order.yaml").read_text()
    (bundle_dir / "tools" / "mcp_shop__lookup_order.yaml").write_text(
        tool.replace("name: lookup_order", "name: mcp_shop__lookup_order", 1))
    (bundle_dir / "mcp_shop.cedar").write_text(
        'permit (principal, action == Action::"tool:mcp_shop__lookup_order", resource)\n'
        "when { resource.owner == principal };\n")
    return bundle_dir


def test_with_server_prefixed_names_the_bundle_names_the_prefixed_tool(prefixed_bundle, server, sidecar):
    shop = ShopServer()

    async def scenario():
        async with AsyncAuthzClient(f"127.0.0.1:{server[1]}") as client, connected(shop) as mcp:
            guarded = AgentsGuard(AsyncGuard(client, alice_session(), ToolSet()))
            model = ScriptedModel([
                [function_call("mcp_shop__lookup_order", {"order_id": "ord_1"}, call_id="call_look"),
                 function_call("mcp_shop__issue_refund", {"order_id": "ord_1", "amount_cents": 100},
                               call_id="call_refund")],
                [assistant_message("done")]])
            agent = Agent(name="support", instructions="help", mcp_servers=[mcp], model=guarded.model(model),
                          mcp_config={"include_server_in_tool_names": True})
            await Runner.run(guarded.agent(agent), "look")
            return outputs_of(model)

    outputs = run(scenario())
    # the server's own tool name reaches the server; the bundle decided on the prefixed one
    assert shop.calls == [("lookup_order", {"order_id": "ord_1"})]
    assert "shipped" in outputs["call_look"]
    assert sidecar.ledger.get("acme", "call_look").tool == "mcp_shop__lookup_order"
    assert outputs["call_refund"].endswith("no tool named `mcp_shop__issue_refund` is available.")


def _lookup_tool(runs: Counter) -> Any:
    @function_tool
    def lookup_order(order_id: str) -> dict:
        """Look an order up."""
        runs["lookup_order"] += 1
        return {"order_id": order_id, "status": "local"}

    return lookup_order


def test_function_and_mcp_tools_of_one_turn_are_governed_together(server, sidecar):
    shop = ShopServer()
    shop.tools = [t for t in shop.tools if t.name == "issue_refund"]
    local: Counter[str] = Counter()

    async def scenario():
        async with CountingClient(f"127.0.0.1:{server[1]}") as client, connected(shop) as mcp:
            guarded = AgentsGuard(AsyncGuard(client, alice_session(), ToolSet()))
            model = ScriptedModel([
                [function_call("lookup_order", {"order_id": "ord_1"}, call_id="call_look"),
                 function_call("issue_refund", {"order_id": "ord_1", "amount_cents": 1500}, call_id="call_small")],
                [assistant_message("done")]])
            await Runner.run(governed_agent(guarded, mcp, model, tools=[_lookup_tool(local)]), "refund 15")
            return client.rpcs, outputs_of(model)

    rpcs, outputs = run(scenario())
    assert rpcs["AuthorizeBatch"] == 1  # both calls of the turn in one batch
    assert local == Counter({"lookup_order": 1})
    assert shop.calls == [("issue_refund", {"order_id": "ord_1", "amount_cents": 1500})]
    assert "local" in outputs["call_look"] and "rf_ord_1_1500" in outputs["call_small"]
    assert outcome_of(sidecar, "call_look") == outcome_of(sidecar, "call_small") == "completed"


def test_an_unwrapped_function_tool_fails_the_run_before_anything_runs(server, sidecar):
    shop = ShopServer()
    shop.tools = [t for t in shop.tools if t.name == "issue_refund"]
    local: Counter[str] = Counter()

    async def scenario():
        async with AsyncAuthzClient(f"127.0.0.1:{server[1]}") as client, connected(shop) as mcp:
            guarded = AgentsGuard(AsyncGuard(client, alice_session(), ToolSet()))
            model = ScriptedModel([[function_call("lookup_order", {"order_id": "ord_1"}, call_id="call_look")],
                                   [assistant_message("done")]])
            agent = governed_agent(guarded, mcp, model)
            agent.tools.append(_lookup_tool(local))  # added after, never wrapped
            with pytest.raises(UserError, match="tool `lookup_order` is not governed"):
                await Runner.run(agent, "look")
            return model

    model = run(scenario())
    assert local == Counter() and shop.calls == [] and model.last_call is None
    assert sidecar.ledger.get("acme", "call_look") is None


def test_a_run_cancelled_while_the_server_works_reports_outcome_unknown(server, sidecar):
    shop = ShopServer()
    entered, hold = asyncio.Event(), asyncio.Event()

    async def slow(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        shop.calls.append((params.name, params.arguments or {}))
        entered.set()
        await hold.wait()
        return types.CallToolResult(content=[types.TextContent(text="late")])

    shop.server = Server("shop", on_list_tools=shop._list, on_call_tool=slow)

    async def scenario():
        ended = asyncio.Event()

        def observe(event):
            if event.kind == "outcome" and event.call_id == "call_cut":
                ended.set()

        async with AsyncAuthzClient(f"127.0.0.1:{server[1]}") as client, connected(shop) as mcp:
            guarded = AgentsGuard(AsyncGuard(client, alice_session(), ToolSet(), observer=observe))
            model = ScriptedModel([
                [function_call("issue_refund", {"order_id": "ord_1", "amount_cents": 1500}, call_id="call_cut")],
                [assistant_message("done")]])
            task = asyncio.ensure_future(Runner.run(governed_agent(guarded, mcp, model), "refund 15"))
            try:
                await entered.wait()
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                await ended.wait()  # the SDK's run ends before its tool tasks do
            finally:
                hold.set()
            return guarded.guard.result("call_cut")

    result = run(scenario())
    assert shop.runs == Counter({"issue_refund": 1})
    assert (result.status, result.reported) == ("outcome_unknown", "recorded")
    assert outcome_of(sidecar, "call_cut") == "outcome_unknown"
