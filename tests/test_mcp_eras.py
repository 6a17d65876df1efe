"""The gateway serves both MCP protocol eras on one Streamable HTTP endpoint (2025-11-25
sessions and 2026-07-28 stateless requests) and over stdio: runs, call ids, replays and
approval resumption in each, driven by the official client in its default mode (auto)
and in legacy mode, and by raw 2026-07-28 requests where a replay has to be sent as is."""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp_support import MODERN, RUN_META, Upstream, approve, example_bundle, gateway_over_http, modern_post, text

from toolauthz.client import GuardEvent, Principal
from toolauthz.mcp_proxy.proxy import McpProxy, ProxySettings

ROOT = pathlib.Path(__file__).resolve().parent.parent


bundle_dir = example_bundle  # the sidecar (conftest) and the proxy load a copy of the example bundle


class Gateway:
    """The proxy over Streamable HTTP on a loopback port, in front of an in-process upstream."""

    def __init__(self, port: int, bundle: pathlib.Path):
        self.sidecar_port = port
        self.bundle = bundle
        self.upstream = Upstream()
        self.events: list[GuardEvent] = []
        self.url = ""

    @asynccontextmanager
    async def serving(self) -> AsyncIterator[McpProxy]:
        settings = ProxySettings(bundle=self.bundle, tenant="acme", principal=Principal("User", "alice"),
                                 downstream="http")
        async with gateway_over_http(settings, self.sidecar_port, self.events, self.upstream.server) as (proxy, url):
            self.url = url
            yield proxy

    def approval_ids(self) -> list[str]:
        return [e.data["approval_id"] for e in self.events if e.kind == "authorize" and e.data.get("approval_id")]


@pytest.fixture
def gateway(server, bundle_dir) -> Gateway:
    return Gateway(server[1], bundle_dir)


def result_of(response: Any) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    body = response.text
    if response.headers["content-type"].startswith("text/event-stream"):
        body = [line[6:] for line in body.splitlines() if line.startswith("data: ")][-1]
    return dict(json.loads(body))


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_the_official_client_in_both_modes_lists_and_calls(gateway, mode):
    async def main() -> None:
        async with gateway.serving(), Client(gateway.url, mode=mode, cache=None) as client:
            modern = client.session.discover_result is not None
            assert modern == (mode == "auto")  # auto negotiated the stateless revision
            assert sorted(t.name for t in (await client.list_tools()).tools) == ["delete_note", "read_note"]
            first = await client.call_tool("read_note", {"note_id": "n1"})
            second = await client.call_tool("read_note", {"note_id": "n2"})
            assert first.structured_content == {"note_id": "n1", "text": "buy milk"} and not second.is_error
            runs = {first.meta[RUN_META], second.meta[RUN_META]}  # type: ignore[index]
            # 2025-11-25: both calls are in the session's run; 2026-07-28 without a run: one run each.
            assert len(runs) == (2 if modern else 1)

    anyio.run(main)
    assert [name for name, _ in gateway.upstream.calls] == ["read_note", "read_note"]


def test_a_client_run_groups_stateless_calls_into_one_sidecar_run(gateway):
    async def main() -> None:
        async with gateway.serving(), Client(gateway.url, cache=None) as client:
            for note in ("n1", "n2"):
                result = await client.call_tool("read_note", {"note_id": note}, meta={RUN_META: "triage-42"})
                assert not result.is_error and result.meta[RUN_META] == "triage-42"  # type: ignore[index]

    anyio.run(main)
    outcomes = [e for e in gateway.events if e.kind == "outcome"]
    assert len(outcomes) == 2 and all("-triage-42-" in e.call_id for e in outcomes)
    assert len({e.call_id.rsplit("-", 1)[0] for e in outcomes}) == 1


@pytest.mark.parametrize("run", ["", "a" * 65, "-lead", "a/b", "ü", 7, None])
def test_a_malformed_run_is_refused_as_invalid_params(gateway, run):
    async def main() -> dict[str, Any]:
        async with gateway.serving():
            params = {"name": "read_note", "arguments": {"note_id": "n1"}}
            meta_run: Any = run if run is not None else {"nested": True}
            response = await modern_post(gateway.url, 1, "tools/call", params, run=meta_run)
            return dict(response.json())

    answer = anyio.run(main)
    assert answer["error"]["code"] == -32602, answer
    assert RUN_META in answer["error"]["message"]
    assert gateway.upstream.calls == []


def test_a_replayed_stateless_request_runs_nothing_and_7_is_not_the_string_7(gateway):
    async def main() -> list[dict[str, Any]]:
        async with gateway.serving():
            call = {"name": "read_note", "arguments": {"note_id": "n1"}}
            answers = [result_of(await modern_post(gateway.url, 7, "tools/call", call, run="r1")),
                       result_of(await modern_post(gateway.url, 7, "tools/call", call, run="r1")),  # the replay
                       result_of(await modern_post(gateway.url, "7", "tools/call", call, run="r1")),
                       result_of(await modern_post(gateway.url, 7, "tools/call", call, run="r2"))]
            return answers

    first, replay, string_seven, other_run = anyio.run(main)
    assert first["result"]["structuredContent"] == {"note_id": "n1", "text": "buy milk"}
    assert first["result"]["resultType"] == "complete"
    assert replay["result"]["structuredContent"] == first["result"]["structuredContent"]
    assert not string_seven["result"].get("isError") and not other_run["result"].get("isError")
    # The replay ran nothing: three distinct calls reached the upstream, not four.
    assert len(gateway.upstream.calls) == 3
    call_ids = {e.call_id for e in gateway.events if e.kind == "outcome"}
    assert len(call_ids) == 3 and any(c.endswith("-n7") for c in call_ids) and any(c.endswith("-s7") for c in call_ids)


def test_a_replayed_legacy_request_runs_nothing_and_7_is_not_the_string_7(gateway):
    async def main() -> list[dict[str, Any]]:
        import httpx2 as httpx

        async with gateway.serving(), httpx.AsyncClient(timeout=30) as http:
            accept = {"accept": "application/json, text/event-stream"}
            opened = await http.post(gateway.url, headers=accept, json={
                "jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                    "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}})
            session = {**accept, "mcp-session-id": opened.headers["mcp-session-id"],
                       "mcp-protocol-version": "2025-11-25"}
            await http.post(gateway.url, headers=session, json={"jsonrpc": "2.0",
                                                                "method": "notifications/initialized"})
            call = {"name": "read_note", "arguments": {"note_id": "n1"}}
            answers = []
            for request_id in (7, 7, "7"):
                answers.append(result_of(await http.post(gateway.url, headers=session, json={
                    "jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": call})))
            return answers

    first, replay, string_seven = anyio.run(main)
    assert first["result"]["structuredContent"] == {"note_id": "n1", "text": "buy milk"}
    assert replay["result"] == first["result"]
    assert not string_seven["result"].get("isError")
    assert len(gateway.upstream.calls) == 2


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_an_approval_resumes_in_both_eras(gateway, mode):
    async def main() -> None:
        async with gateway.serving(), Client(gateway.url, mode=mode, cache=None) as client:
            pending = await client.call_tool("delete_note", {"note_id": "n2"})
            [approval_id] = gateway.approval_ids()
            assert pending.is_error and approval_id in text(pending)
            run = pending.meta[RUN_META]  # type: ignore[index]
            await asyncio.to_thread(approve, gateway.sidecar_port, approval_id)
            # The same call in the same run resumes it: the run is the session (legacy) or
            # the handle the pending result named (stateless), passed back in `_meta`.
            done = await client.call_tool("delete_note", {"note_id": "n2"}, meta={RUN_META: run})
            assert not done.is_error and done.structured_content == {"deleted": "n2"}
            again = await client.call_tool("delete_note", {"note_id": "n2"}, meta={RUN_META: run})
            assert again.is_error and approval_id not in text(again)  # a new call needs a new approval

    anyio.run(main)
    assert gateway.upstream.calls == [("delete_note", {"note_id": "n2"})]
    decisions = [e.data["decision"] for e in gateway.events if e.kind == "authorize"]
    assert decisions == ["APPROVAL_REQUIRED", "ALLOW", "APPROVAL_REQUIRED"]


def test_an_approval_of_one_run_is_not_resumed_by_another(gateway):
    async def main() -> None:
        async with gateway.serving(), Client(gateway.url, cache=None) as client:
            pending = await client.call_tool("delete_note", {"note_id": "n2"}, meta={RUN_META: "one"})
            await asyncio.to_thread(approve, gateway.sidecar_port, gateway.approval_ids()[0])
            other = await client.call_tool("delete_note", {"note_id": "n2"}, meta={RUN_META: "two"})
            assert pending.is_error and other.is_error  # run two has its own approval to wait for

    anyio.run(main)
    assert gateway.upstream.calls == []
    assert len(set(gateway.approval_ids())) == 2


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_the_official_client_over_stdio_in_both_modes(server, bundle_dir, mode):
    """`toolauthz mcp-proxy` as a stdio subprocess (the example upstream as its own)."""
    port = server[1]
    args = ["-m", "toolauthz.cli", "mcp-proxy", "--bundle", str(bundle_dir), "--sidecar", f"127.0.0.1:{port}",
            "--tenant", "acme", "--principal", "User::alice",
            "--", sys.executable, "-m", "examples.mcp_gateway.upstream"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    params = StdioServerParameters(command=sys.executable, args=args, env=env, cwd=str(ROOT))

    async def main() -> None:
        with anyio.fail_after(120):
            async with Client(params, mode=mode, cache=None) as client:
                assert (client.session.discover_result is not None) == (mode == "auto")
                read = await client.call_tool("read_note", {"note_id": "n1"})
                assert not read.is_error and "buy milk" in text(read)
                pending = await client.call_tool("delete_note", {"note_id": "n2"})
                assert pending.is_error and "approval" in text(pending)
                # Over stdio the run is the connection, in both eras.
                assert read.meta[RUN_META] == pending.meta[RUN_META]  # type: ignore[index]

    anyio.run(main)
    assert MODERN  # the revision the auto mode negotiates
