"""The gateway as an OAuth 2.1 resource server: Protected Resource Metadata, 401 naming
it, bearer access tokens (RFC 9068) checked against the identity provider's JWKS (an IdP
the test serves over HTTPS), the audience bound to the gateway, and each user's calls
decided and audited as that user, with the official client in default and legacy mode."""

from __future__ import annotations

import pathlib
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx2 as httpx
import pytest
from idp import TestIdp
from joserfc import jwt
from joserfc.jwk import ECKey
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp_support import (
    IDP_KEY,
    Upstream,
    example_bundle,
    gateway_over_http,
    modern_post,
    served_idp,
    text,
)

from toolauthz.audit.store import AuditQuery
from toolauthz.client import GuardEvent, Principal
from toolauthz.clock import FrozenClock
from toolauthz.identity.jwks import RemoteJwks, RemoteSettings
from toolauthz.mcp_proxy.auth import ResourceServer
from toolauthz.mcp_proxy.proxy import McpProxy, ProxySettings

RESOURCE = "https://gateway.test/mcp"
METADATA = "https://gateway.test/.well-known/oauth-protected-resource/mcp"
KEY_1 = IDP_KEY
KEY_2 = ECKey.generate_key("P-256", parameters={"kid": "k2"})
CAROL_READS_NOTHING = """@id("carol-reads-nothing")
forbid (principal == User::"carol", action == Action::"tool:read_note", resource);
"""

idp = served_idp  # the fixture


@pytest.fixture
def bundle_dir(tmp_path) -> pathlib.Path:
    bundle = example_bundle.__wrapped__(tmp_path)  # type: ignore[attr-defined]
    (bundle / "carol.cedar").write_text(CAROL_READS_NOTHING)
    return bundle


class OAuthGateway:
    def __init__(self, sidecar_port: int, bundle: pathlib.Path, idp: TestIdp):
        self.sidecar_port = sidecar_port
        self.bundle = bundle
        self.idp = idp
        self.clock = FrozenClock(time.time())  # the SDK's middleware also checks `exp` on the real clock
        keys = RemoteJwks(RemoteSettings(jwks_uri=idp.jwks_uri, ca_file=idp.ca_file), self.clock)
        self.oauth = ResourceServer(resource=RESOURCE, issuer=idp.issuer, keys=keys, tenant="acme",
                                    clock=self.clock)
        self.events: list[GuardEvent] = []
        self.url = ""

    def token(self, user: str, key: ECKey = KEY_1, typ: str = "at+jwt", **claims: Any) -> str:
        now = int(self.clock.now())
        body = {"iss": self.idp.issuer, "aud": RESOURCE, "sub": user, "exp": now + 600, "iat": now,
                "client_id": "agent", **claims}
        return jwt.encode({"alg": "ES256", "kid": key.kid, "typ": typ}, body, key)

    @asynccontextmanager
    async def serving(self) -> AsyncIterator[McpProxy]:
        settings = ProxySettings(bundle=self.bundle, tenant=None, principal=None, downstream="http",
                                 oauth=self.oauth)
        async with gateway_over_http(settings, self.sidecar_port, self.events, Upstream().server) as (proxy, url):
            self.url = url
            yield proxy

    @asynccontextmanager
    async def client(self, token: str, mode: str) -> AsyncIterator[Client]:
        """The official client, sending the token as a bearer token on every request."""
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30) as http, \
                Client(streamable_http_client(self.url, http_client=http), mode=mode, cache=None) as client:
            yield client


@pytest.fixture
def gateway(server, bundle_dir, idp) -> OAuthGateway:
    return OAuthGateway(server[1], bundle_dir, idp)


def test_no_token_is_401_naming_the_metadata_which_names_the_issuer(gateway):
    async def main() -> tuple[Any, Any]:
        async with gateway.serving(), httpx.AsyncClient(timeout=30) as http:
            refused = await modern_post(gateway.url, 1, "tools/list", {})
            path = METADATA.removeprefix("https://gateway.test")
            metadata = await http.get(gateway.url.removesuffix("/mcp") + path)
            return refused, metadata

    refused, metadata = anyio.run(main)
    assert refused.status_code == 401
    assert f'resource_metadata="{METADATA}"' in refused.headers["www-authenticate"]
    assert refused.headers["www-authenticate"].startswith("Bearer ")
    assert metadata.status_code == 200
    document = metadata.json()
    assert document["resource"] == RESOURCE and document["authorization_servers"] == [gateway.idp.issuer]


@pytest.mark.parametrize("case", ["wrong_audience", "expired", "id_token", "wrong_issuer", "unknown_key",
                                  "no_subject", "bad_subject", "not_a_jwt", "future_iat"])
def test_a_token_that_is_not_for_this_gateway_is_401(gateway, case):
    tokens = {
        "wrong_audience": lambda: gateway.token("alice", aud="https://other.test/mcp"),
        "expired": lambda: gateway.token("alice", exp=int(gateway.clock.now()) - 3600),
        "id_token": lambda: gateway.token("alice", typ="JWT"),  # an ID token is no access token
        "wrong_issuer": lambda: gateway.token("alice", iss="https://evil.test"),
        "unknown_key": lambda: gateway.token("alice", key=ECKey.generate_key("P-256", parameters={"kid": "k9"})),
        "no_subject": lambda: gateway.token("alice", sub=None),
        "bad_subject": lambda: gateway.token("alice", sub="alice\nadmin"),
        "not_a_jwt": lambda: "x.y.z",
        "future_iat": lambda: gateway.token("alice", iat=int(gateway.clock.now()) + 3600),
    }

    async def main() -> Any:
        async with gateway.serving():
            return await modern_post(gateway.url, 1, "tools/call",
                                     {"name": "read_note", "arguments": {"note_id": "n1"}},
                                     headers={"authorization": f"Bearer {tokens[case]()}"})

    refused = anyio.run(main)
    assert refused.status_code == 401 and "invalid_token" in refused.headers["www-authenticate"]
    assert [e for e in gateway.events if e.kind == "authorize"] == []


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_two_users_are_decided_and_audited_as_themselves(gateway, sidecar, mode):
    async def main() -> None:
        async with gateway.serving():
            async with gateway.client(gateway.token("alice"), mode) as alice:
                assert (alice.session.discover_result is not None) == (mode == "auto")
                allowed = await alice.call_tool("read_note", {"note_id": "n1"}, meta={"io.toolauthz/run": "shared"})
                assert not allowed.is_error and allowed.structured_content["note_id"] == "n1"  # type: ignore[index]
            async with gateway.client(gateway.token("carol"), mode) as carol:
                denied = await carol.call_tool("read_note", {"note_id": "n1"}, meta={"io.toolauthz/run": "shared"})
                assert denied.is_error and "carol-reads-nothing" in text(denied)

    anyio.run(main)
    records = [r.event for r in sidecar.audit_log.query(AuditQuery(), limit=50) if r.event.kind == "authorize"]
    by_user = {(e.principal, e.result) for e in records}
    assert by_user == {('User::"alice"', "ALLOW"), ('User::"carol"', "DENY")}
    # The same run id chosen by two users is two runs.
    assert len({e.request_id for e in records}) == 2 and all(e.tenant == "acme" for e in records)


def test_a_rotated_key_is_fetched_once_the_refresh_interval_allows(gateway):
    async def main() -> None:
        async with gateway.serving():
            async with gateway.client(gateway.token("alice"), "auto") as alice:
                assert not (await alice.call_tool("read_note", {"note_id": "n1"})).is_error
            gateway.idp.publish(KEY_1, KEY_2)
            gateway.clock.advance(61)  # past the refresh interval: an unknown kid may refetch
            async with gateway.client(gateway.token("alice", key=KEY_2), "auto") as rotated:
                assert not (await rotated.call_tool("read_note", {"note_id": "n1"})).is_error

    anyio.run(main)
    assert gateway.idp.requests["/jwks"] == 2


def test_stdio_keeps_the_configured_identity_and_http_without_oauth_needs_one(tmp_path):
    from toolauthz.errors import RequestError

    oauth = ResourceServer(resource=RESOURCE, issuer="https://idp.test", keys=None, tenant="acme")  # type: ignore[arg-type]
    alice = Principal("User", "alice")
    with pytest.raises(RequestError, match="--tenant and --principal"):
        ProxySettings(bundle=tmp_path, tenant=None, principal=None, downstream="http").configured_caller()
    with pytest.raises(RequestError, match="--tenant and --principal"):  # stdio: oauth does not apply
        ProxySettings(bundle=tmp_path, tenant=None, principal=None, oauth=oauth).configured_caller()
    stdio = ProxySettings(bundle=tmp_path, tenant="acme", principal=alice, oauth=oauth).configured_caller()
    assert stdio is not None and stdio.principal == alice
    assert ProxySettings(bundle=tmp_path, tenant="acme", principal=alice, downstream="http",
                         oauth=oauth).configured_caller() is None  # HTTP with oauth: each token's caller
