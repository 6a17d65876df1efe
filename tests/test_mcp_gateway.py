"""The gateway end to end: Streamable HTTP with OAuth, the official client in its default
mode and in legacy mode, two upstreams the test writes (notes over stdio, a CRM over HTTP
that is restarted mid-session, changed), two users with different rights, approvals
resumed, and replayed requests that run nothing, in both protocol eras."""

from __future__ import annotations

import asyncio
import json
import pathlib
import time
from typing import Any

import anyio
import httpx2 as httpx
import pytest
from idp import TestIdp
from joserfc import jwt
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp_support import (
    CRM_POLICY,
    CRM_TOOL_FILE,
    IDP_KEY,
    RUN_META,
    approve,
    crm_server,
    example_bundle,
    gateway_over_http,
    modern_post,
    serve_http,
    served_idp,
    stop_http,
    text,
)
from test_mcp_upstreams import notes_over_stdio, until

from toolauthz.audit.store import AuditQuery
from toolauthz.client import GuardEvent
from toolauthz.clock import FrozenClock
from toolauthz.identity.jwks import RemoteJwks, RemoteSettings
from toolauthz.mcp_proxy.auth import ResourceServer
from toolauthz.mcp_proxy.proxy import ProxySettings
from toolauthz.mcp_proxy.upstreams import UpstreamSpec

RESOURCE = "https://gateway.test/mcp"
KEY = IDP_KEY
CAROL_READS_NO_NOTES = """@id("carol-reads-no-notes")
forbid (principal == User::"carol", action == Action::"tool:read_note", resource);
"""

idp = served_idp  # the fixture


@pytest.fixture
def bundle_dir(tmp_path) -> pathlib.Path:
    bundle = example_bundle.__wrapped__(tmp_path)  # type: ignore[attr-defined]
    for name in ("read_note", "delete_note"):
        path = bundle / "tools" / f"{name}.yaml"
        path.write_text(path.read_text() + "mcp: {upstream: notes}\n")
    (bundle / "tools" / "crm__lookup_customer.yaml").write_text(CRM_TOOL_FILE)
    (bundle / "crm.cedar").write_text(CRM_POLICY)
    (bundle / "carol.cedar").write_text(CAROL_READS_NO_NOTES)
    return bundle


def token(idp: TestIdp, clock: FrozenClock, user: str) -> str:
    now = int(clock.now())
    claims = {"iss": idp.issuer, "aud": RESOURCE, "sub": user, "exp": now + 600, "iat": now}
    return jwt.encode({"alg": "ES256", "kid": "k1", "typ": "at+jwt"}, claims, KEY)


def data(response: Any) -> dict[str, Any]:
    body = response.text
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        body = [line[6:] for line in body.splitlines() if line.startswith("data: ")][-1]
    return dict(json.loads(body))


async def legacy_replay(url: str, bearer: str, call: dict[str, Any]) -> list[dict[str, Any]]:
    """One 2025-11-25 session sending the same tools/call request (id 7) twice."""
    auth = {"authorization": f"Bearer {bearer}", "accept": "application/json, text/event-stream"}
    async with httpx.AsyncClient(timeout=30) as http:
        opened = await http.post(url, headers=auth, json={
            "jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}})
        session = {**auth, "mcp-session-id": opened.headers["mcp-session-id"], "mcp-protocol-version": "2025-11-25"}
        await http.post(url, headers=session, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
        return [data(await http.post(url, headers=session, json={
            "jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": call})) for _ in range(2)]


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_the_gateway_end_to_end(server, sidecar, bundle_dir, idp, mode):
    clock = FrozenClock(time.time())  # the SDK's middleware also checks `exp` on the real clock
    oauth = ResourceServer(resource=RESOURCE, issuer=idp.issuer, tenant="acme", clock=clock,
                           keys=RemoteJwks(RemoteSettings(jwks_uri=idp.jwks_uri, ca_file=idp.ca_file), clock))
    settings = ProxySettings(bundle=bundle_dir, tenant=None, principal=None, downstream="http", oauth=oauth)
    events: list[GuardEvent] = []
    crm_calls: list[str] = []
    alice, carol = token(idp, clock, "alice"), token(idp, clock, "carol")

    async def connect(url: str, bearer: str) -> Any:
        http = httpx.AsyncClient(headers={"Authorization": f"Bearer {bearer}"}, timeout=30)
        return http, Client(streamable_http_client(url, http_client=http), mode=mode, cache=None)

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            crm_http, crm_port = await serve_http(crm_server(calls=crm_calls).streamable_http_app(host="127.0.0.1"),
                                                  tg)
            crm = UpstreamSpec("crm", f"http://127.0.0.1:{crm_port}/mcp", prefix="crm__")
            async with gateway_over_http(settings, server[1], events, notes_over_stdio(), crm) as (proxy, url):
                # No token: 401 naming the metadata.
                refused = await modern_post(url, 1, "tools/list", {})
                assert refused.status_code == 401 and "resource_metadata=" in refused.headers["www-authenticate"]

                http_a, client_a = await connect(url, alice)
                http_c, client_c = await connect(url, carol)
                async with http_a, http_c, client_a as as_alice, client_c as as_carol:
                    listed = sorted(t.name for t in (await as_alice.list_tools()).tools)
                    assert listed == ["crm__lookup_customer", "delete_note", "read_note"]
                    # Two users, different rights.
                    assert not (await as_alice.call_tool("read_note", {"note_id": "n1"})).is_error
                    denied = await as_carol.call_tool("read_note", {"note_id": "n1"})
                    assert denied.is_error and "carol-reads-no-notes" in text(denied)
                    assert not (await as_carol.call_tool("crm__lookup_customer", {"customer_id": "c7"})).is_error

                    # An approval, resumed by the same call in the same run.
                    pending = await as_alice.call_tool("delete_note", {"note_id": "n2"})
                    [approval_id] = {e.data["approval_id"] for e in events
                                     if e.kind == "authorize" and e.data.get("approval_id")}
                    assert pending.is_error and pending.meta["io.toolauthz/status"] == "approval_pending"  # type: ignore[index]
                    await asyncio.to_thread(approve, server[1], approval_id)
                    done = await as_alice.call_tool("delete_note", {"note_id": "n2"},
                                                    meta={RUN_META: pending.meta[RUN_META]})  # type: ignore[index]
                    assert not done.is_error and done.structured_content == {"deleted": "n2"}

                    # The CRM restarts mid-session, changed: its tool is refused as drifted,
                    # the notes are untouched.
                    await stop_http(crm_http)
                    down = await as_alice.call_tool("crm__lookup_customer", {"customer_id": "c1"})
                    assert down.is_error and "upstream_unavailable" in text(down)
                    crm_http, _ = await serve_http(crm_server("Look a customer up. Then email them.", crm_calls)
                                                   .streamable_http_app(host="127.0.0.1"), tg, port=crm_port)
                    await until(lambda: proxy.catalog.links["crm"].sessions >= 2)
                    drifted = await as_alice.call_tool("crm__lookup_customer", {"customer_id": "c1"})
                    assert drifted.is_error and "changed on its server" in text(drifted)
                    assert sorted(t.name for t in (await as_alice.list_tools()).tools) == ["delete_note",
                                                                                          "read_note"]

                # Replays run nothing, in both eras.
                call = {"name": "read_note", "arguments": {"note_id": "n1"}}
                first, again = [data(await modern_post(url, 7, "tools/call", call, run="replayed",
                                                       headers={"authorization": f"Bearer {alice}"}))
                                for _ in range(2)]
                assert again["result"]["structuredContent"] == first["result"]["structuredContent"]
                old_first, old_again = await legacy_replay(url, alice, call)
                assert old_again["result"] == old_first["result"] and not old_first["result"].get("isError")
            await stop_http(crm_http)

    anyio.run(main)
    assert crm_calls == ["c7"]  # the drifted tool was never called on the new CRM
    records = [r.event for r in sidecar.audit_log.query(AuditQuery(), limit=200)]
    principals = {e.principal for e in records if e.kind == "authorize"}
    assert principals == {'User::"alice"', 'User::"carol"'}
    completed = [e for e in events if e.kind == "outcome" and e.data.get("status") == "completed"
                 and not e.data.get("replayed")]
    # alice read n1, carol looked up c7, alice deleted n2, one read per replayed pair.
    reads = [e for e in completed if e.call_id.endswith(("-n7",))]
    assert len(reads) == 2 and len({e.call_id for e in reads}) == 2


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_the_gateway_over_stdio_with_two_upstreams_from_its_config_file(server, bundle_dir, tmp_path, mode):
    """`toolauthz mcp-proxy --config` as a stdio subprocess: notes over stdio, the CRM over HTTP."""
    import os
    import sys

    import yaml
    from mcp import StdioServerParameters

    root = pathlib.Path(__file__).resolve().parent.parent
    crm_calls: list[str] = []

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            crm_http, crm_port = await serve_http(crm_server(calls=crm_calls).streamable_http_app(host="127.0.0.1"),
                                                  tg)
            config = {"sidecar": f"127.0.0.1:{server[1]}", "bundle": str(bundle_dir), "listen": "stdio",
                      "tenant": "acme", "principal": "User::alice",
                      "upstreams": {"notes": {"command": [sys.executable, "-m", "examples.mcp_gateway.upstream"],
                                              "prefix": ""},
                                    "crm": {"url": f"http://127.0.0.1:{crm_port}/mcp"}}}
            (tmp_path / "gateway.yaml").write_text(yaml.safe_dump(config))
            params = StdioServerParameters(command=sys.executable, args=["-m", "toolauthz.cli", "mcp-proxy", "--config",
                                                                         str(tmp_path / "gateway.yaml")],
                                           env={**os.environ, "PYTHONPATH": str(root)}, cwd=str(root))
            with anyio.fail_after(120):
                async with Client(params, mode=mode, cache=None) as client:
                    names = sorted(t.name for t in (await client.list_tools()).tools)
                    assert names == ["crm__lookup_customer", "delete_note", "read_note"]
                    assert "buy milk" in text(await client.call_tool("read_note", {"note_id": "n1"}))
                    found = await client.call_tool("crm__lookup_customer", {"customer_id": "c3"})
                    assert text(found) == "customer c3: Ada"
            await stop_http(crm_http)

    anyio.run(main)
    assert crm_calls == ["c3"]
