"""The official MCP conformance suite (`@modelcontextprotocol/conformance`, server
scenarios) against the reference server `@modelcontextprotocol/server-everything`,
directly and through the gateway with an allow-all bundle: the gateway passes every
scenario the server passes alone, except those refused by design (REFUSED_BY_DESIGN,
which the README's MCP section lists with the reason)."""

from __future__ import annotations

import os
import pathlib
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp_conformance_support import (
    EVERYTHING,
    NODE,
    SUITE,
    allow_all_bundle,
    listening_port,
    scenario_results,
)
from mcp_support import gateway_over_http

from toolauthz.client import GuardEvent, Principal
from toolauthz.mcp_proxy.proxy import ProxySettings
from toolauthz.mcp_proxy.upstreams import UpstreamSpec

# Scenario -> why the gateway fails it on purpose, where the server alone passes.
_SUBSCRIBE = ("the suite subscribes to `test://watched-resource`, which the reference server does not offer "
              "(it accepts any URI); the gateway subscribes only to catalogued resources")
REFUSED_BY_DESIGN: dict[str, str] = {"resources-subscribe": _SUBSCRIBE, "resources-unsubscribe": _SUBSCRIBE}


def _installed() -> None:
    if not (NODE.exists() and SUITE.exists() and EVERYTHING.exists()):
        pytest.fail("tests/conformance/node_modules is missing: scripts/setup.sh --dev installs it (npm ci)")


def _stdio_everything() -> StdioServerParameters:
    return StdioServerParameters(command=str(NODE), args=[str(EVERYTHING), "stdio"], env=dict(os.environ))


async def _everything_offers() -> tuple[list[Any], ...]:
    async with Client(_stdio_everything(), mode="legacy", cache=None) as client:
        found: list[list[Any]] = []
        for method, field in (("list_tools", "tools"), ("list_resources", "resources"),
                              ("list_resource_templates", "resource_templates"), ("list_prompts", "prompts")):
            items: list[Any] = []
            cursor = None
            for _ in range(100):
                page = await getattr(client, method)(cursor=cursor)
                items += getattr(page, field)
                cursor = page.next_cursor
                if cursor is None:
                    break
            found.append(items)
        return tuple(found)


@pytest.fixture
def bundle_dir(tmp_path) -> pathlib.Path:
    _installed()
    tools, resources, templates, prompts = anyio.run(_everything_offers)
    return allow_all_bundle(tmp_path / "bundle", tools, resources, templates, prompts)


async def _suite(url: str, output: pathlib.Path) -> dict[str, bool]:
    with anyio.fail_after(300):
        await anyio.run_process([str(NODE), str(SUITE), "server", "--url", url, "-o", str(output)], check=False)
    return scenario_results(output)


async def _direct(output: pathlib.Path) -> dict[str, bool]:
    """The suite against the server over Streamable HTTP, on a port it picked (PORT=0)."""
    async with await anyio.open_process([str(NODE), str(EVERYTHING), "streamableHttp"],
                                        env={**os.environ, "PORT": "0"}) as process:
        try:
            assert process.stderr is not None
            with anyio.fail_after(60):
                async for chunk in process.stderr:  # "... listening on port 0": it is listening
                    if b"listening" in chunk:
                        break
            port = listening_port(process.pid)
            assert port is not None, "the reference server did not listen"
            return await _suite(f"http://127.0.0.1:{port}/mcp", output)
        finally:
            process.terminate()


def test_the_gateway_passes_what_the_reference_server_passes(server, bundle_dir, tmp_path):
    _srv, sidecar_port = server
    events: list[GuardEvent] = []
    settings = ProxySettings(bundle=bundle_dir, tenant="acme", principal=Principal("User", "tester"),
                             downstream="http")

    async def main() -> tuple[dict[str, bool], dict[str, bool]]:
        direct = await _direct(tmp_path / "direct")
        upstream = UpstreamSpec("everything", _stdio_everything(), mode="legacy")
        async with gateway_over_http(settings, sidecar_port, events, upstream) as (_proxy, url):
            through = await _suite(url, tmp_path / "gateway")
        return direct, through

    direct, through = anyio.run(main)
    assert direct, "the suite reported no scenario"
    lost = sorted(s for s, ok in direct.items() if ok and not through.get(s) and s not in REFUSED_BY_DESIGN)
    assert lost == [], f"the gateway fails what the server passes alone: {lost}"
    stale = sorted(s for s in REFUSED_BY_DESIGN if not direct.get(s) or through.get(s))
    assert stale == [], f"no longer refused (or never passed directly): {stale}"
