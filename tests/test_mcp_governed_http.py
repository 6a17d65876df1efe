"""Two users on one gateway over Streamable HTTP, each proving who they are with a bearer
token (the gateway as an OAuth resource server), with the official client in both modes:
each one's lists hold exactly what their policies allow, and each read is decided and
audited as its user."""

from __future__ import annotations

import pathlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import httpx2 as httpx
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_governed_support import RichUpstream, govern
from mcp_support import example_bundle, gateway_over_http
from test_mcp_oauth import OAuthGateway, idp  # noqa: F401 (idp: the fixture)

from toolauthz.audit.store import AuditQuery
from toolauthz.mcp_proxy.proxy import McpProxy, ProxySettings
from toolauthz.mcp_proxy.upstreams import UpstreamSpec


@pytest.fixture
def bundle_dir(tmp_path) -> pathlib.Path:
    return govern(example_bundle.__wrapped__(tmp_path))  # type: ignore[attr-defined]


class RichGateway(OAuthGateway):
    """The OAuth test gateway in front of the upstream with resources and prompts."""

    def __init__(self, sidecar_port: int, bundle: pathlib.Path, identity_provider) -> None:
        super().__init__(sidecar_port, bundle, identity_provider)
        self.upstream = RichUpstream()

    @asynccontextmanager
    async def serving(self) -> AsyncIterator[McpProxy]:
        settings = ProxySettings(bundle=self.bundle, tenant=None, principal=None, downstream="http",
                                 oauth=self.oauth, list_watch_seconds=0.05)
        target = UpstreamSpec("default", self.upstream.server, mode="legacy")
        async with gateway_over_http(settings, self.sidecar_port, self.events, target) as (proxy, url):
            self.url = url
            yield proxy

    @asynccontextmanager
    async def listening_client(self, token: str, on_message) -> AsyncIterator[Client]:
        """A 2025-11-25 client over HTTP whose notifications go to `on_message`."""
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30) as http, \
                Client(streamable_http_client(self.url, http_client=http), mode="legacy", cache=None,
                       message_handler=on_message) as client:
            yield client


async def lists(client) -> tuple[list[str], ...]:
    return ([t.name for t in (await client.list_tools()).tools],
            [r.uri for r in (await client.list_resources()).resources],
            [t.uri_template for t in (await client.list_resource_templates()).resource_templates],
            [p.name for p in (await client.list_prompts()).prompts])


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_each_user_lists_and_reads_what_their_policies_allow(server, sidecar, bundle_dir, idp, mode):  # noqa: F811
    gateway = RichGateway(server[1], bundle_dir, idp)

    async def main() -> None:
        async with gateway.serving():
            async with gateway.client(gateway.token("alice"), mode) as alice:
                assert await lists(alice) == (["delete_note", "read_note"], ["note://readme"],
                                              ["note://notes/{id}"], ["summarize"])
                assert (await alice.read_resource("note://notes/n1")).contents[0].text == "text of note://notes/n1"
            async with gateway.client(gateway.token("bob"), mode) as bob:
                assert await lists(bob) == (["read_note"], ["note://readme"], [], [])
                with pytest.raises(MCPError) as caught:
                    await bob.read_resource("note://notes/n1")
                assert "no policy permits" in caught.value.error.message

    anyio.run(main)
    assert gateway.upstream.reads == ["note://notes/n1"]
    decided = [(r.event.principal, r.event.result, r.event.resource)
               for r in sidecar.audit_log.query(AuditQuery(kind="authorize", tool="note_file"), limit=10)]
    assert decided == [('User::"alice"', "ALLOW", 'Doc::"note://notes/n1"'),
                       ('User::"bob"', "DENY", 'Doc::"note://notes/n1"')]


def test_a_changed_bundle_is_announced_to_each_http_session(server, sidecar, bundle_dir, idp):  # noqa: F811
    gateway = RichGateway(server[1], bundle_dir, idp)
    changed = anyio.Event()

    async def on_message(message) -> None:
        if getattr(getattr(message, "root", message), "method", None) == "notifications/tools/list_changed":
            changed.set()

    async def main() -> None:
        async with gateway.serving() as proxy, gateway.listening_client(gateway.token("bob"), on_message) as bob:
            assert [t.name for t in (await bob.list_tools()).tools] == ["read_note"]
            with anyio.fail_after(20):
                await proxy.list_watch.first_checked.wait()
            policies = bundle_dir / "governed.cedar"
            policies.write_text(policies.read_text().split('@id("bob-deletes-nothing")')[0])
            assert await anyio.to_thread.run_sync(sidecar.reloader.reload)
            with anyio.fail_after(20):
                await changed.wait()
            assert [t.name for t in (await bob.list_tools()).tools] == ["delete_note", "read_note"]

    anyio.run(main)
