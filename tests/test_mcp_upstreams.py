"""Many upstreams behind one gateway, and upstreams that restart: tools namespaced and
pinned per upstream, `tools/list` aggregated, a dead or drifted upstream hiding only its
own tools, and a restarted HTTP upstream reconnected (with its pins checked again)."""

from __future__ import annotations

import asyncio
import os
import pathlib
import sys
from collections.abc import Callable
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp_support import CRM_POLICY, CRM_TOOL_FILE, Upstream, crm_server, example_bundle, serve_http, stop_http, text

from toolauthz.client import AsyncAuthzClient, Principal
from toolauthz.errors import RequestError
from toolauthz.mcp_proxy.config import upstream_specs
from toolauthz.mcp_proxy.proxy import McpProxy, ProxySettings
from toolauthz.mcp_proxy.upstreams import UpstreamSpec

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture
def bundle_dir(tmp_path) -> pathlib.Path:
    """The example bundle, its notes tools bound to the `notes` upstream, plus a CRM tool
    and two tool files the gateway must not expose (no such upstream; no prefix)."""
    bundle = example_bundle.__wrapped__(tmp_path)  # type: ignore[attr-defined]
    for name in ("read_note", "delete_note"):
        path = bundle / "tools" / f"{name}.yaml"
        path.write_text(path.read_text() + "mcp: {upstream: notes}\n")
    (bundle / "tools" / "crm__lookup_customer.yaml").write_text(CRM_TOOL_FILE)
    (bundle / "tools" / "billing__refund.yaml").write_text(
        CRM_TOOL_FILE.replace("crm__lookup_customer", "billing__refund").replace("upstream: crm", "upstream: billing"))
    (bundle / "tools" / "lookup_customer.yaml").write_text(
        CRM_TOOL_FILE.replace("name: crm__lookup_customer", "name: lookup_customer")
        .replace("name: lookup_customer}", "name: lookup_customer_v2}"))
    (bundle / "crm.cedar").write_text(CRM_POLICY)
    return bundle


async def until(condition: Callable[[], bool]) -> None:
    with anyio.fail_after(30):
        while not condition():
            await asyncio.sleep(0.02)


def notes_over_stdio() -> UpstreamSpec:
    params = StdioServerParameters(command=sys.executable, args=["-m", "examples.mcp_gateway.upstream"],
                                   env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=str(ROOT))
    return UpstreamSpec("notes", params, prefix="")


def proxy_for(port: int, bundle: pathlib.Path) -> tuple[McpProxy, AsyncAuthzClient]:
    authz = AsyncAuthzClient(f"127.0.0.1:{port}")
    settings = ProxySettings(bundle=bundle, tenant="acme", principal=Principal("User", "alice"))
    return McpProxy(settings, authz), authz


async def names(client: Client) -> list[str]:
    return sorted(t.name for t in (await client.list_tools()).tools)


def test_two_upstreams_are_aggregated_namespaced_and_fail_apart(server, bundle_dir):
    async def main() -> None:
        proxy, authz = proxy_for(server[1], bundle_dir)
        async with anyio.create_task_group() as tg:
            crm_http, crm_port = await serve_http(crm_server().streamable_http_app(host="127.0.0.1"), tg)
            crm = UpstreamSpec("crm", f"http://127.0.0.1:{crm_port}/mcp")
            async with proxy.connected(notes_over_stdio(), crm), Client(proxy.server, cache=None) as client:
                # Aggregated; the unbound tool files (no such upstream, no prefix) are not there.
                assert await names(client) == ["crm__lookup_customer", "delete_note", "read_note"]
                found = await client.call_tool("crm__lookup_customer", {"customer_id": "c1"})
                assert not found.is_error and text(found) == "customer c1: Ada"
                assert not (await client.call_tool("read_note", {"note_id": "n1"})).is_error

                # The CRM goes down: only its tools go, and its calls fail at once.
                await stop_http(crm_http)
                assert await names(client) == ["delete_note", "read_note"]
                down = await client.call_tool("crm__lookup_customer", {"customer_id": "c1"})
                assert down.is_error and "upstream_unavailable" in text(down)
                assert not (await client.call_tool("read_note", {"note_id": "n1"})).is_error

                # It comes back changed: its pins are checked again, its tool is refused as
                # drifted, and the notes are untouched.
                link = proxy.catalog.links["crm"]
                crm_http, _ = await serve_http(crm_server("Look a customer up. Also wire money.")
                                               .streamable_http_app(host="127.0.0.1"), tg, port=crm_port)
                await until(lambda: link.sessions >= 2)
                assert await names(client) == ["delete_note", "read_note"]
                drifted = await client.call_tool("crm__lookup_customer", {"customer_id": "c1"})
                assert drifted.is_error and "changed on its server" in text(drifted)
                assert proxy.catalog.links["notes"].sessions == 1
            await stop_http(crm_http)
        await authz.close()

    anyio.run(main)


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_an_http_upstream_restarted_mid_session_is_reconnected(server, bundle_dir, mode):
    first, second = Upstream(), Upstream()

    async def main() -> None:
        proxy, authz = proxy_for(server[1], bundle_dir)
        async with anyio.create_task_group() as tg:
            up_http, up_port = await serve_http(first.server.streamable_http_app(host="127.0.0.1"), tg)
            spec = UpstreamSpec("notes", f"http://127.0.0.1:{up_port}/mcp", mode=mode)
            async with proxy.connected(spec), Client(proxy.server, cache=None) as client:
                link = proxy.catalog.links["notes"]
                assert not (await client.call_tool("read_note", {"note_id": "n1"})).is_error
                await stop_http(up_http)
                # During the outage a call fails with upstream_unavailable; it never hangs.
                with anyio.fail_after(30):
                    down = await client.call_tool("read_note", {"note_id": "n1"})
                assert down.is_error and "upstream_unavailable" in text(down)
                up_http, _ = await serve_http(second.server.streamable_http_app(host="127.0.0.1"), tg, port=up_port)
                # The next call notices a lost session (legacy: `Session not found`) if the
                # outage did not; the link reconnects in the background.
                await client.list_tools()
                await until(lambda: link.sessions >= 2)
                again = await client.call_tool("read_note", {"note_id": "n2"})
                assert not again.is_error and again.structured_content == {"note_id": "n2", "text": "buy milk"}
            await stop_http(up_http)
        await authz.close()

    anyio.run(main)
    assert first.calls == [("read_note", {"note_id": "n1"})]
    assert second.calls == [("read_note", {"note_id": "n2"})]


def test_the_upstreams_section_of_the_configuration():
    specs = upstream_specs({"notes": {"command": ["python", "-m", "notes"], "prefix": ""},
                            "crm": {"url": "https://crm.internal/mcp", "mode": "legacy"}})
    assert [(s.name, s.prefix, s.mode) for s in specs] == [("notes", "", "auto"), ("crm", "crm__", "legacy")]
    assert specs[1].target == "https://crm.internal/mcp" and specs[0].target.args == ["-m", "notes"]


@pytest.mark.parametrize("raw", [
    None, {}, {"Crm": {"url": "http://x/mcp"}}, {"crm": "http://x/mcp"}, {"crm": {}},
    {"crm": {"url": "http://x/mcp", "command": ["x"]}}, {"crm": {"url": "ftp://x"}},
    {"crm": {"command": []}}, {"crm": {"url": "http://x/mcp", "prefix": "Crm-"}},
    {"crm": {"url": "http://x/mcp", "mode": "modern"}}, {"crm": {"url": "http://x/mcp", "token": "s3cret"}}])
def test_a_bad_upstreams_section_is_refused(raw: Any):
    with pytest.raises(RequestError):
        upstream_specs(raw)


def test_the_example_configuration_is_complete_and_valid():
    """gateway.yaml runs as it is (`oauth: off`, loopback), its commented `oauth` section
    is a valid one, and examples/mcp_gateway/README.md's table names exactly the keys the
    gateway reads."""
    import re

    import yaml

    from toolauthz.cli.mcp import _CONFIG_KEYS
    from toolauthz.mcp_proxy.config import _KEYS, _OAUTH_KEYS, resource_server

    text = (ROOT / "examples" / "mcp_gateway" / "gateway.yaml").read_text()
    config = yaml.safe_load(text)
    assert config["oauth"] is False and config["listen"].startswith("http://127.0.0.1:")
    [notes] = upstream_specs(config["upstreams"])
    assert (notes.name, notes.prefix, notes.mode) == ("notes", "", "auto")
    assert notes.target.command == ".venv/bin/python"  # the project's interpreter, not the PATH's `python`
    assert notes.timeout_of("delete_note") == 10 and notes.timeout_of("read_note") == 20
    assert config["sidecar"] != "127.0.0.1:50051"  # clear of the quickstart's sidecar
    commented = text[text.index("# oauth:"):]
    oauth_raw = yaml.safe_load("\n".join(line.removeprefix("#") for line in commented.splitlines()))["oauth"]
    assert set(oauth_raw) | {"discovery", "tenant_claim"} == _OAUTH_KEYS  # every key shown (two as alternatives)
    oauth = resource_server({k: v for k, v in oauth_raw.items() if k != "ca_file"})  # the CA file is an example path
    assert (oauth.resource, oauth.tenant, oauth.principal_claim) == ("https://tools.example/mcp", "acme", "sub")
    settings = ProxySettings(bundle=ROOT / config["bundle"], tenant=config["tenant"],
                             principal=Principal("User", "alice"), downstream="http", oauth=oauth)
    assert settings.configured_caller() is None  # over HTTP with oauth, each caller is the token's
    assert (ROOT / config["bundle"] / "tools").is_dir()
    table = (ROOT / "examples" / "mcp_gateway" / "README.md").read_text()
    named = {name for row in re.findall(r"^\| ([^|]+) \|", table, re.M)  # each row's first cell
             for name in re.findall(r"`([A-Za-z_.]+)", row)}
    assert {n.split(".")[0] for n in named} == _CONFIG_KEYS
    assert {n.removeprefix("oauth.") for n in named if n.startswith("oauth.")} == _OAUTH_KEYS
    assert {n.removeprefix("upstreams.NAME.") for n in named if n.startswith("upstreams.")} == _KEYS


@pytest.mark.parametrize("raw", [
    "not a mapping", {"issuer": "http://idp.example", "jwks_uri": "https://idp/jwks", "resource": "https://g/mcp",
                      "tenant": "acme"},
    {"issuer": "https://idp.example", "jwks_uri": "http://idp/jwks", "resource": "https://g/mcp", "tenant": "acme"},
    {"issuer": "https://idp.example", "jwks_uri": "https://idp/jwks", "resource": "https://g/mcp"},
    {"issuer": "https://idp.example", "jwks_uri": "https://idp/jwks", "resource": "https://g/mcp", "tenant": "acme",
     "algorithms": ["HS256"]},
    {"issuer": "https://idp.example", "jwks_uri": "https://idp/jwks", "resource": "https://g/mcp", "tenant": "acme",
     "client_secret": "x"}])
def test_a_bad_oauth_section_is_refused(raw: Any):
    from toolauthz.mcp_proxy.config import resource_server

    with pytest.raises(RequestError):
        resource_server(raw)


@pytest.mark.parametrize("entry, says", [
    ({"command": ["x"], "execution_timeout_seconds": 0}, "execution_timeout_seconds must be a number of seconds"),
    ({"command": ["x"], "execution_timeout_seconds": True}, "execution_timeout_seconds must be a number of seconds"),
    ({"command": ["x"], "execution_timeout_seconds": 86401}, "at most 86400"),
    ({"command": ["x"], "tool_timeouts": {"read note\n": 5}}, "is not a tool name"),
    ({"command": ["x"], "tool_timeouts": {"read_note": "5"}}, "tool_timeouts.read_note must be a number"),
    ({"command": ["x"], "tool_timeouts": ["read_note"]}, "must map upstream tool names to seconds"),
])
def test_bad_timeouts_are_refused_by_name(entry, says):
    with pytest.raises(RequestError) as refused:
        upstream_specs({"notes": entry})
    assert says in str(refused.value)


def test_timeouts_per_upstream_and_tool():
    [spec] = upstream_specs({"notes": {"command": ["x"], "execution_timeout_seconds": 60,
                                       "tool_timeouts": {"export-all.v2": 300}}})
    assert (spec.timeout_of("export-all.v2"), spec.timeout_of("read_note")) == (300.0, 60.0)
    [default] = upstream_specs({"notes": {"command": ["x"]}})
    assert default.timeout_of("read_note") is None  # the gateway's execution_timeout_seconds
