"""The gateway as an OAuth 2.1 resource server (the MCP authorization spec), for its
Streamable HTTP endpoint.

- Protected Resource Metadata (RFC 9728) at `/.well-known/oauth-protected-resource<path>`
  names the resource (the gateway's URI) and its authorization server (the issuer).
- A request without a valid bearer token gets 401 with
  `WWW-Authenticate: Bearer ..., resource_metadata="<that URL>"`, before any MCP handling.
- A bearer token is a JWT access token (RFC 9068): header `typ` `at+jwt`, a signature of
  one of the configured algorithms by a key of the identity provider's JWKS (toolauthz.identity.jwks:
  `jwks_uri`, cached, refetched for an unknown `kid`), `iss` the configured issuer, `aud`
  containing the gateway's resource URI (a token minted for another resource is refused),
  `exp` required and not passed, `nbf` and `iat` not in the future (with a small leeway).
  ID-token rules (`nonce`, `azp`, `at_hash`) do not apply and are not asked for.
- Who a call acts for comes from the token only: the principal from a configured claim
  (`sub` by default), the tenant from a configured claim or fixed in the configuration.
  Never from the MCP client's arguments or `_meta`.

The SDK's bearer middleware calls `verify_token`; the proxy reads the verified caller off
the HTTP request of each MCP request (`caller_of`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken

from toolauthz.client import Principal
from toolauthz.clock import Clock, SystemClock
from toolauthz.identity.jwks import JwtRefused, KeySource, verify_jwt_async
from toolauthz.mcp_proxy.runs import Caller
from toolauthz.model import PRINCIPAL_ID, PRINCIPAL_TYPE, TENANT

__all__ = ["ResourceServer", "AccessTokenVerifier", "caller_of", "ACCESS_TOKEN_TYPES"]

log = logging.getLogger("toolauthz.mcp_proxy")
ACCESS_TOKEN_TYPES = ("at+jwt", "application/at+jwt")  # RFC 9068 section 2.1
MAX_LEEWAY_SECONDS = 60


@dataclass(frozen=True)
class ResourceServer:
    """The `oauth` section of the gateway's configuration."""

    resource: str  # the gateway's resource URI, e.g. https://tools.example/mcp: the tokens' audience
    issuer: str  # the authorization server: the tokens' `iss`, named in the metadata
    keys: KeySource
    algorithms: tuple[str, ...] = ("RS256", "ES256", "EdDSA")
    principal_claim: str = "sub"
    principal_type: str = "User"
    tenant_claim: str | None = None  # else every token's tenant is `tenant`
    tenant: str | None = None
    leeway_seconds: int = 30
    scopes_supported: tuple[str, ...] = ()
    clock: Clock = field(default_factory=SystemClock)

    def __post_init__(self) -> None:
        if (self.tenant_claim is None) == (self.tenant is None):
            raise ValueError("oauth needs exactly one of `tenant_claim` and `tenant`")
        if self.tenant is not None and not TENANT.fullmatch(self.tenant):
            raise ValueError("oauth.tenant is not a valid tenant name")
        if not PRINCIPAL_TYPE.fullmatch(self.principal_type):
            raise ValueError("oauth.principal_type is not a valid entity type")
        if not 0 <= self.leeway_seconds <= MAX_LEEWAY_SECONDS:
            raise ValueError(f"oauth.leeway_seconds must be 0 to {MAX_LEEWAY_SECONDS}")
        if not self.resource.startswith(("https://", "http://")) or not self.issuer:
            raise ValueError("oauth needs the gateway's `resource` URL and the `issuer`")


class AccessTokenVerifier:
    """The SDK's TokenVerifier: an AccessToken for a good token, None for any other."""

    def __init__(self, settings: ResourceServer):
        self.settings = settings

    async def verify_token(self, token: str) -> AccessToken | None:
        try:
            return await self._verify(token)
        except JwtRefused as refused:
            log.info("bearer token refused: %s", refused.reason)  # the reason is a fixed phrase, never the token
            return None

    async def _verify(self, token: str) -> AccessToken:
        s = self.settings
        verified = await verify_jwt_async(token, s.keys, s.algorithms)
        typ = verified.header.get("typ")
        if not isinstance(typ, str) or typ.lower() not in ACCESS_TOKEN_TYPES:
            raise JwtRefused("not an access token (typ at+jwt)")
        claims = verified.claims
        if claims.get("iss") != s.issuer:
            raise JwtRefused("wrong issuer")
        audience = claims.get("aud")
        audiences = [audience] if isinstance(audience, str) else audience
        if not isinstance(audiences, list) or s.resource not in audiences:
            raise JwtRefused("issued for another resource")
        now = s.clock.now()
        exp = claims.get("exp")
        if not isinstance(exp, (int, float)) or isinstance(exp, bool) or exp <= now - s.leeway_seconds:
            raise JwtRefused("expired")
        for name in ("nbf", "iat"):
            value = claims.get(name)
            if value is not None and (not _number(value) or value > now + s.leeway_seconds):
                raise JwtRefused(f"`{name}` in the future")
        caller = self._caller(claims)
        scope = claims.get("scope")
        return AccessToken(token=token, client_id=str(claims.get("client_id") or "-"),
                           scopes=scope.split() if isinstance(scope, str) else [], expires_at=int(exp),
                           resource=s.resource, subject=str(claims.get("sub") or ""),
                           claims={"iss": s.issuer, "tenant": caller.tenant,
                                   "principal_type": caller.principal.type, "principal_id": caller.principal.id})

    def _caller(self, claims: dict[str, Any]) -> Caller:
        s = self.settings
        principal = claims.get(s.principal_claim)
        if not isinstance(principal, str) or not PRINCIPAL_ID.fullmatch(principal):
            raise JwtRefused("no usable principal claim")
        tenant = s.tenant if s.tenant_claim is None else claims.get(s.tenant_claim)
        if not isinstance(tenant, str) or not TENANT.fullmatch(tenant):
            raise JwtRefused("no usable tenant claim")
        return Caller(tenant, Principal(s.principal_type, principal))


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def caller_of(ctx: Any) -> Caller | None:
    """The caller a verified bearer token proved for this MCP request, or None."""
    request = getattr(ctx, "request", None)
    scope = getattr(request, "scope", None)
    user = scope.get("user") if isinstance(scope, dict) else None
    if not isinstance(user, AuthenticatedUser) or user.access_token.claims is None:
        return None
    claims = user.access_token.claims
    return Caller(claims["tenant"], Principal(claims["principal_type"], claims["principal_id"]))
