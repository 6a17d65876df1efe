"""Honest outcomes at the gateway's edge: an upstream lost after a call was sent ends the
call `outcome_unknown` (it may have run), at once rather than at its deadline, over stdio
and over HTTP; a call that never reached the upstream ends `failed`; the execution
timeout is the gateway's, the upstream's or the tool's."""

from __future__ import annotations

import os
import pathlib
import sys
from typing import Any

import anyio
import httpx2 as httpx
import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters
from mcp.shared.exceptions import MCPError
from mcp_support import LONG, Upstream, example_bundle, run_gateway, serve_http, start, stop, stop_http, text

from toolauthz.client import AsyncAuthzClient, GuardEvent, Principal
from toolauthz.mcp_proxy.proxy import McpProxy, ProxySettings
from toolauthz.mcp_proxy.upstreams import UpstreamLink, UpstreamLost, UpstreamSpec, UpstreamUnavailable

bundle_dir = example_bundle
DYING = str(pathlib.Path(__file__).resolve().parent / "mcp_dying_upstream.py")


def outcomes(events: list[GuardEvent]) -> list[tuple[str, str]]:
    return [(e.data["status"], e.data.get("code", "")) for e in events if e.kind == "outcome"]


def meta_of(result: types.CallToolResult) -> tuple[str, str]:
    meta = result.meta or {}
    return meta.get("io.toolauthz/status", "completed"), meta.get("io.toolauthz/code", "")


def test_a_stdio_upstream_that_dies_mid_call_gives_outcome_unknown(server, bundle_dir):
    _srv, port = server
    events: list[GuardEvent] = []
    spec = UpstreamSpec("default", StdioServerParameters(command=sys.executable, args=[DYING], env=dict(os.environ)))

    async def body(client: Client) -> None:
        assert not (await client.call_tool("read_note", {"note_id": "n1"})).is_error
        lost = await client.call_tool("read_note", {"note_id": "n9"})  # the upstream exits while running it
        assert lost.is_error and meta_of(lost) == ("outcome_unknown", "upstream_lost")
        assert "whether it took effect is unknown" in text(lost)

    run_gateway(port, bundle_dir, spec, events, body)
    # `upstream_lost`, not `timeout`: the call ended when the connection did, not at its deadline
    assert outcomes(events)[-1][0] == "outcome_unknown"


def test_an_http_upstream_that_dies_mid_call_gives_outcome_unknown(server, bundle_dir):
    _srv, port = server
    events: list[GuardEvent] = []
    running = start([sys.executable, DYING, "--http", "127.0.0.1:0"], "listening on", output="stdout")
    try:
        url = running.wait_for_line().split()[-1]

        async def body(client: Client) -> None:
            assert not (await client.call_tool("read_note", {"note_id": "n1"})).is_error
            lost = await client.call_tool("read_note", {"note_id": "n9"})  # the upstream exits while running it
            assert lost.is_error and meta_of(lost) == ("outcome_unknown", "upstream_lost"), text(lost)

        run_gateway(port, bundle_dir, UpstreamSpec("default", url), events, body)
    finally:
        stop(running)
    assert running.proc.returncode == 3  # it died of the call, not of the test's stop


def test_an_http_upstream_that_hangs_mid_call_ends_at_the_deadline(server, bundle_dir):
    """An upstream that stops answering but keeps its connection open (a hung process, a
    partition): nothing tells the gateway, and the call ends at its deadline, never later."""
    _srv, port = server
    events: list[GuardEvent] = []
    upstream = Upstream()
    started = anyio.Event()

    async def hangs(args: dict[str, Any]) -> types.CallToolResult:
        started.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    upstream.handlers["read_note"] = hangs

    async def main() -> None:
        authz = AsyncAuthzClient(f"127.0.0.1:{port}")
        settings = ProxySettings(bundle=bundle_dir, tenant="acme", principal=Principal("User", "alice"),
                                 execution_timeout=1.0)
        proxy = McpProxy(settings, authz)
        proxy.observers.append(events.append)
        try:
            async with anyio.create_task_group() as tg:
                up_http, up_port = await serve_http(upstream.server.streamable_http_app(host="127.0.0.1"), tg)
                async with proxy.connected(f"http://127.0.0.1:{up_port}/mcp"), \
                        Client(proxy.server, cache=None) as client:
                    cut = await client.call_tool("read_note", {"note_id": "n1"})
                    assert started.is_set() and meta_of(cut) == ("outcome_unknown", "timeout"), text(cut)
                await stop_http(up_http)
        finally:
            await authz.close()

    anyio.run(main)
    assert outcomes(events) == [("outcome_unknown", "timeout")]


def test_a_tool_timeout_from_the_configuration_cuts_the_call(server, bundle_dir):
    """`tool_timeouts` of the upstream wins over the gateway's: the hanging call ends
    `outcome_unknown` / `timeout` at its own deadline."""
    _srv, port = server
    events: list[GuardEvent] = []
    upstream = Upstream()

    async def hangs(args: dict[str, Any]) -> types.CallToolResult:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    upstream.handlers["read_note"] = hangs
    spec = UpstreamSpec("default", upstream.server, execution_timeout=LONG, tool_timeouts={"read_note": 0.5})

    async def body(client: Client) -> None:
        cut = await client.call_tool("read_note", {"note_id": "n1"})
        assert meta_of(cut) == ("outcome_unknown", "timeout")

    run_gateway(port, bundle_dir, spec, events, body)
    assert outcomes(events) == [("outcome_unknown", "timeout")]


class StubClient:
    """What UpstreamLink.call_tool sees of an MCP client: its call raises `error`."""

    def __init__(self, error: BaseException):
        self.error = error

    async def call_tool(self, *args: Any, **kwargs: Any) -> types.CallToolResult:
        raise self.error


@pytest.mark.parametrize("error, expected, dropped", [
    (httpx.ConnectError("refused"), UpstreamUnavailable, True),  # never connected: nothing was sent
    (MCPError(types.INVALID_REQUEST, "Session not found"), UpstreamUnavailable, True),  # refused it unseen
    (MCPError(types.CONNECTION_CLOSED, "Connection closed"), UpstreamLost, True),  # after it was handed over
    (httpx.ReadError("reset"), UpstreamLost, True),
    (MCPError(types.REQUEST_TIMEOUT, "Timed out"), UpstreamLost, False),  # slow, not gone
])
def test_sent_or_not_decides_failed_or_outcome_unknown(error, expected, dropped):
    link = UpstreamLink(UpstreamSpec("crm", "http://127.0.0.1:9/mcp"))

    async def main() -> None:
        link._client = StubClient(error)  # type: ignore[assignment]
        with pytest.raises(expected):
            await link.call_tool("lookup", {})
        assert link.connected is not dropped  # a dropped link is reconnected in the background

    anyio.run(main)


def test_a_call_on_a_link_that_is_down_is_never_sent():
    link = UpstreamLink(UpstreamSpec("crm", "http://127.0.0.1:9/mcp"))

    async def main() -> None:
        with pytest.raises(UpstreamUnavailable):
            await link.call_tool("lookup", {})

    anyio.run(main)


def test_a_protocol_error_of_the_call_is_the_upstreams_answer():
    link = UpstreamLink(UpstreamSpec("crm", "http://127.0.0.1:9/mcp"))

    async def main() -> None:
        link._client = StubClient(MCPError(types.INVALID_PARAMS, "bad"))  # type: ignore[assignment]
        with pytest.raises(MCPError):
            await link.call_tool("lookup", {})

    anyio.run(main)


def test_losing_the_link_ends_every_call_in_flight_at_once():
    link = UpstreamLink(UpstreamSpec("crm", "http://127.0.0.1:9/mcp"))

    class Hanging:
        async def call_tool(self, *args: Any, **kwargs: Any) -> types.CallToolResult:
            await anyio.sleep_forever()
            raise AssertionError("unreachable")

    ended: list[str] = []

    async def call() -> None:
        try:
            await link.call_tool("lookup", {})
        except UpstreamLost as lost:
            ended.append(lost.why)

    async def main() -> None:
        link._client = Hanging()  # type: ignore[assignment]
        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            tg.start_soon(call)
            await anyio.wait_all_tasks_blocked()  # both calls wait for an answer
            link.lose("another request saw the connection reset")

    anyio.run(main)
    assert ended == ["lost", "lost"]


# -- upstream_unavailable, audited in aggregate ---------------------------------------


def closed_port() -> tuple[Any, int]:
    """A loopback port bound but not listening: connecting to it is refused."""
    import socket

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return sock, sock.getsockname()[1]


def test_upstream_unavailable_refusals_are_audited_per_caller_tool_and_minute(server, sidecar, bundle_dir):
    from toolauthz.audit.store import AuditQuery
    from toolauthz.clock import FrozenClock

    _srv, port = server
    sock, closed = closed_port()
    clock = FrozenClock(1_800_000_000.0)  # the start of a minute

    async def main() -> None:
        authz = AsyncAuthzClient(f"127.0.0.1:{port}")
        settings = ProxySettings(bundle=bundle_dir, tenant="acme", principal=Principal("User", "alice"))
        proxy = McpProxy(settings, authz, clock=clock)
        try:
            async with proxy.connected(f"http://127.0.0.1:{closed}/mcp"), Client(proxy.server, cache=None) as client:
                for note in ("n1", "n2", "n3"):
                    refused = await client.call_tool("read_note", {"note_id": note})
                    assert refused.is_error and "upstream_unavailable" in text(refused)
                assert len(records()) == 1  # the first of the minute, at once; two more counted
                clock.advance(60)
                await client.call_tool("read_note", {"note_id": "n4"})  # the next minute: the count is written
                await client.call_tool("delete_note", {"note_id": "n2"})  # another tool: its own record
                await client.call_tool("delete_note", {"note_id": "n2"})
        finally:
            await authz.close()

    def records() -> list[Any]:
        return [r.event for r in sidecar.audit_log.query(AuditQuery(result="refused"), limit=50)]

    try:
        anyio.run(main)
    finally:
        sock.close()
    seen = [(e.tool, e.error_codes, e.detail["detail"]) for e in records()]
    minute = 1_800_000_000
    assert sorted(seen) == sorted([
        ("read_note", ("upstream_unavailable",), f"count=1 minute={minute}"),
        ("read_note", ("upstream_unavailable",), f"count=2 minute={minute}"),
        ("read_note", ("upstream_unavailable",), f"count=1 minute={minute + 60}"),
        ("delete_note", ("upstream_unavailable",), f"count=1 minute={minute + 60}"),
        ("delete_note", ("upstream_unavailable",), f"count=1 minute={minute + 60}"),  # written when it stopped
    ])
    assert {(e.tenant, e.principal) for e in records()} == {("acme", 'User::"alice"')}


def test_a_tool_that_raises_outcome_unknown_is_never_failed(server, sidecar):
    """The SDK side of upstream_lost: any tool may say its effect is unknown."""
    from toolauthz.client import AsyncGuard, ToolOutcomeUnknown, ToolSet, TrustedContext

    _srv, port = server
    tools = ToolSet()

    async def read_note(args: Any, call: Any) -> Any:
        raise ToolOutcomeUnknown("upstream_lost", "The connection was lost; whether it took effect is unknown.")

    tools.register("read_note", read_note)

    async def main() -> None:
        authz = AsyncAuthzClient(f"127.0.0.1:{port}")
        try:
            guard = AsyncGuard(authz, TrustedContext("acme", Principal("User", "alice"), "run-1"), tools)
            result = await guard.run("toolu_1", "read_note", '{"note_id":"n1"}')
        finally:
            await authz.close()
        assert (result.status, result.code, result.executed) == ("outcome_unknown", "upstream_lost", True)
        assert result.content == "The connection was lost; whether it took effect is unknown."

    anyio.run(main)
    from toolauthz.audit.store import AuditQuery

    [outcome] = [r.event for r in sidecar.audit_log.query(AuditQuery(kind="outcome"), limit=5)]
    assert (outcome.result, outcome.detail["error_code"]) == ("outcome_unknown", "upstream_lost")
