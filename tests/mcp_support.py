"""What the MCP gateway tests share: an upstream MCP server the test controls, an HTTP
server on a loopback port 0, raw 2026-07-28 requests, and small result helpers."""

from __future__ import annotations

import asyncio
import json
import pathlib
import shutil
import subprocess
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx2 as httpx
import mcp_types as types
import pytest
from joserfc.jwk import ECKey
from mcp import Client
from mcp.server import Server

from examples.mcp_gateway.upstream import TOOLS
from toolauthz.client import AsyncAuthzClient, AuthzClient, GuardEvent, Principal, TrustedContext
from toolauthz.mcp_proxy.proxy import McpProxy, ProxySettings
from toolauthz.mcp_proxy.upstreams import UpstreamSpec

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "mcp_gateway" / "bundle"
MODERN = "2026-07-28"
RUN_META = "io.toolauthz/run"


@pytest.fixture
def example_bundle(tmp_path) -> pathlib.Path:
    """A copy of the example's bundle (tests change its tool files)."""
    target = tmp_path / "bundle"
    shutil.copytree(EXAMPLE, target)
    return target


IDP_KEY = ECKey.generate_key("P-256", parameters={"kid": "k1"})


@pytest.fixture
def served_idp(tmp_path):
    """An identity provider over HTTPS (tests/idp.py) whose JWKS holds IDP_KEY."""
    from idp import TestIdp

    served = TestIdp(tmp_path)
    served.publish(IDP_KEY)
    yield served
    served.close()


class Upstream:
    """An upstream MCP server whose tools the test controls: `handlers[name]` answers a
    call, `calls` counts them, `tools` is what it advertises."""

    def __init__(self) -> None:
        self.tools = [t.model_copy(deep=True) for t in TOOLS]
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.handlers: dict[str, Callable[[dict[str, Any]], Awaitable[types.CallToolResult]]] = {}
        self.server: Server[Any] = Server("upstream", on_list_tools=self._list, on_call_tool=self._call)

    async def _list(self, ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=self.tools)

    async def _call(self, ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        args = params.arguments or {}
        self.calls.append((params.name, args))
        handler = self.handlers.get(params.name)
        if handler is not None:
            return await handler(args)
        if params.name == "read_note":
            value = {"note_id": args["note_id"], "text": "buy milk"}
        else:
            value = {"deleted": args["note_id"]}
        return types.CallToolResult(content=[types.TextContent(text=json.dumps(value))], structured_content=value)


async def serve_http(app: Any, tg: Any, port: int = 0) -> tuple[Any, int]:
    """Serves an ASGI app with uvicorn on 127.0.0.1 (port 0 unless given): (server, port)."""
    import uvicorn

    http = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    stopped = anyio.Event()

    async def serve() -> None:
        try:
            await http.serve()
        finally:
            stopped.set()

    http.stopped = stopped  # type: ignore[attr-defined]
    tg.start_soon(serve)
    with anyio.fail_after(20):
        while not http.started:
            await asyncio.sleep(0.01)
    return http, http.servers[0].sockets[0].getsockname()[1]


async def stop_http(http: Any) -> None:
    """Stops a uvicorn server at once (open streams included) and waits until it is down."""
    http.should_exit = http.force_exit = True
    with anyio.fail_after(20):
        await http.stopped.wait()


def crm_server(description: str = "Look a customer up by id.", calls: list[str] | None = None) -> Server[Any]:
    """A second upstream, for the gateway's tests: one read-only tool (`calls` records them)."""
    schema = {"type": "object", "properties": {"customer_id": {"type": "string", "pattern": "^c[0-9]{1,6}$"}},
              "required": ["customer_id"], "additionalProperties": False}
    tool = types.Tool(name="lookup_customer", description=description, input_schema=schema,
                      annotations=types.ToolAnnotations(read_only_hint=True))

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[tool])

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        customer = (params.arguments or {}).get("customer_id")
        if calls is not None:
            calls.append(str(customer))
        return types.CallToolResult(content=[types.TextContent(text=f"customer {customer}: Ada")])

    return Server("crm", on_list_tools=list_tools, on_call_tool=call_tool)


CRM_TOOL_FILE = """name: crm__lookup_customer
description: Look a customer up by id.
side_effect: read
input_schema:
  $schema: https://json-schema.org/draft/2020-12/schema
  type: object
  properties:
    customer_id: {type: string, pattern: '^c[0-9]{1,6}$'}
  required: [customer_id]
  additionalProperties: false
mcp: {upstream: crm, name: lookup_customer}
"""

CRM_POLICY = """@id("read-customers")
permit (principal, action == Action::"tool:crm__lookup_customer", resource);
"""


async def modern_post(url: str, request_id: Any, method: str, params: dict[str, Any], *,
                      run: str | None = None, headers: dict[str, str] | None = None) -> httpx.Response:
    """One raw 2026-07-28 request (no session, `_meta` on the request), as a replay would send it."""
    meta: dict[str, Any] = {"io.modelcontextprotocol/protocolVersion": MODERN,
                            "io.modelcontextprotocol/clientCapabilities": {}}
    if run is not None:
        meta[RUN_META] = run
    body = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": {**params, "_meta": meta}}
    routing = {"mcp-protocol-version": MODERN, "mcp-method": method}
    if isinstance(params.get("name"), str):
        routing["mcp-name"] = params["name"]
    async with httpx.AsyncClient(timeout=30) as http:
        return await http.post(url, json=body, headers={**routing,
                                                        "accept": "application/json, text/event-stream",
                                                        **(headers or {})})


@asynccontextmanager
async def gateway_over_http(settings: Any, sidecar_port: int, events: list[GuardEvent],
                            *upstreams: Any) -> AsyncIterator[tuple[Any, str]]:
    """The proxy serving Streamable HTTP on a loopback port: (proxy, its URL)."""
    from toolauthz.client import AsyncAuthzClient
    from toolauthz.mcp_proxy.proxy import McpProxy

    authz = AsyncAuthzClient(f"127.0.0.1:{sidecar_port}")
    proxy = McpProxy(settings, authz)
    proxy.observers.append(events.append)
    try:
        async with proxy.connected(*upstreams), anyio.create_task_group() as tg:
            http, port = await serve_http(proxy.http_app("127.0.0.1"), tg)
            try:
                yield proxy, f"http://127.0.0.1:{port}/mcp"
            finally:
                http.should_exit = True
    finally:
        await authz.close()


def text(result: types.CallToolResult) -> str:
    return " ".join(b.text for b in result.content if isinstance(b, types.TextContent))


def approve(port: int, approval_id: str, verdict: str = "approve") -> None:
    with AuthzClient(f"127.0.0.1:{port}") as client:
        bob = TrustedContext("acme", Principal("User", "bob"), "approver-run")
        client.decide_approval(approval_id, bob, verdict, reason="checked")


async def wait_for(events: list[GuardEvent], kind: str, **data: Any) -> GuardEvent:
    """The first event of `kind` whose data has these values (polls the event list the
    Guard appends to on the loop; no timing assertion)."""
    with anyio.fail_after(20):
        while True:
            for event in events:
                if event.kind == kind and all(event.data.get(k) == v for k, v in data.items()):
                    return event
            await asyncio.sleep(0.01)


# -- subprocesses the tests run as a user would ----------------------------------------


@dataclass
class Running:
    """A subprocess whose output a thread drains: `lines` so far, `seen` set once a line
    contains `wanted`."""

    proc: subprocess.Popen[str]
    wanted: str
    lines: list[str] = field(default_factory=list)
    seen: threading.Event = field(default_factory=threading.Event)
    ended: threading.Event = field(default_factory=threading.Event)

    def drain(self, stream) -> None:
        for line in stream:
            self.lines.append(line)
            if self.wanted in line:
                self.seen.set()
        self.ended.set()

    def wait_for_line(self) -> str:
        """The first line with `wanted`; fails if the process ends first."""
        while not self.seen.wait(0.1):  # wakes to notice a process that ended without it
            assert not self.ended.is_set(), "".join(self.lines)[-3000:]
        return next(line for line in self.lines if self.wanted in line)


def start(argv: list[str], wanted: str, *, output: str = "stderr") -> Running:
    proc = subprocess.Popen(argv, cwd=ROOT, text=True, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE if output == "stdout" else subprocess.DEVNULL,
                            stderr=subprocess.PIPE if output == "stderr" else subprocess.DEVNULL)
    running = Running(proc, wanted)
    threading.Thread(target=running.drain, args=(getattr(proc, output),), daemon=True).start()
    return running


def stop(running: Running) -> None:
    running.proc.terminate()
    running.proc.wait(60)
    running.ended.wait(60)  # the drain reached the end of the output
    for stream in (running.proc.stdout, running.proc.stderr):
        if stream is not None:
            stream.close()


LONG = 600.0  # an execution timeout no test reaches: a call that ends did so for another reason


def run_gateway(port: int, bundle: pathlib.Path, spec: UpstreamSpec, events: list[GuardEvent],
                body: Callable[[Client], Awaitable[None]], *, execution_timeout: float = LONG) -> None:
    async def main() -> None:
        authz = AsyncAuthzClient(f"127.0.0.1:{port}")
        settings = ProxySettings(bundle=bundle, tenant="acme", principal=Principal("User", "alice"),
                                 execution_timeout=execution_timeout)
        proxy = McpProxy(settings, authz)
        proxy.observers.append(events.append)
        try:
            async with proxy.connected(spec), Client(proxy.server, cache=None) as client:
                await body(client)
        finally:
            await authz.close()

    anyio.run(main)
