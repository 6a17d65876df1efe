"""Who calls and who decides: callers and their roles, approvers' identity provider, and
how people sign in to the console."""

from __future__ import annotations

import pathlib
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from toolauthz.server.config.base import TENANT_PATTERN, StrictModel

Role = Literal["runtime", "approver", "auditor"]


class CallerSettings(StrictModel):
    """A caller identity (as its listener proves it) and what it may do: its roles, in
    its tenants ("*": every tenant). See docs/contract.md, "Callers and roles"."""

    id: str = Field(min_length=1, max_length=1024)
    """The caller identity its listener proves: a certificate's URI SAN, `cn:NAME`, or a Unix socket's
    `identity`."""
    roles: tuple[Role, ...] = Field(min_length=1)
    """What it may do: `runtime` (authorize, verify, report), `approver`, `auditor`."""
    tenants: tuple[Annotated[str, Field(pattern=TENANT_PATTERN)], ...] = Field(min_length=1)
    """The tenants it acts for; `*`: every tenant."""


class OidcApproverSettings(StrictModel):
    """The identity provider whose ID tokens prove who decides an approval, and the
    tenants it is trusted for (docs/contract.md, "Callers and roles")."""

    issuer: str = Field(min_length=1)
    """The identity provider's issuer (`iss`), an https:// URL with `discovery`."""
    audience: str = Field(min_length=1)
    """The `aud` (client id) ID tokens must carry."""
    tenants: tuple[Annotated[str, Field(pattern=TENANT_PATTERN)], ...] = Field(min_length=1)
    """The tenants whose approvers it proves; `*` (any tenant) only with a tenant claim."""
    tenant_claim: str = ""
    """when set, the ID token's claim must name the approval's tenant"""
    jwks_file: pathlib.Path | None = None
    """Its keys: exactly one of a file, a URL, or OpenID discovery from the issuer."""
    jwks_uri: str = ""
    """The provider's key set URL (https://)."""
    discovery: bool = False
    """Find the key set through the issuer's OpenID discovery document."""
    ca_file: pathlib.Path | None = None
    """the CA that alone is trusted for fetching keys (default: the system's)"""
    refresh_interval_seconds: int = Field(60, ge=1, le=3600)
    """Seconds between fetches of the key set."""
    max_key_age_seconds: int = Field(3600, ge=60, le=7 * 24 * 3600)
    """Keys fetched longer ago than this are not trusted (no ID token verifies until a fetch succeeds)."""
    fetch_timeout_seconds: float = Field(5.0, gt=0, le=60)
    """The deadline of one key set fetch."""
    max_jwks_bytes: int = Field(256 * 1024, ge=1024, le=4 * 1024 * 1024)
    """The largest key set document read."""
    principal_claim: str = Field("sub", min_length=1)
    """The claim that names the person (their principal id)."""
    groups_claim: str = Field("groups", min_length=1)
    """The claim that lists the person's groups."""
    principal_type: str = Field("User", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    """The Cedar entity type of the person."""
    algorithms: tuple[Literal["RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512",
                              "EdDSA"], ...] = Field(("RS256", "ES256", "EdDSA"), min_length=1)
    """The signature algorithms accepted."""
    leeway_seconds: int = Field(30, ge=0, le=60)
    """Clock skew allowed when an ID token's times are checked."""
    max_lifetime_seconds: int = Field(3600, ge=60, le=7 * 24 * 3600)
    """the largest `exp - iat` accepted"""

    @model_validator(mode="after")
    def _one_key_source(self) -> OidcApproverSettings:
        given = [bool(self.jwks_file), bool(self.jwks_uri), self.discovery]
        if sum(given) != 1:
            raise ValueError("approvers.oidc needs exactly one of `jwks_file`, `jwks_uri` and `discovery: true`")
        for name, url in (("jwks_uri", self.jwks_uri), ("issuer", self.issuer if self.discovery else "")):
            if url and not url.startswith("https://"):
                raise ValueError(f"approvers.oidc.{name} must be an https:// URL: keys are fetched over HTTPS only")
        if self.refresh_interval_seconds > self.max_key_age_seconds:
            raise ValueError("approvers.oidc.refresh_interval_seconds must not exceed max_key_age_seconds")
        if "*" in self.tenants and not self.tenant_claim:
            raise ValueError("approvers.oidc.tenants `*` (every tenant) needs a `tenant_claim` naming the "
                             "person's tenant in each ID token")
        return self

    def binds(self, tenant: str) -> bool:
        return tenant in self.tenants or "*" in self.tenants


class ApproverSettings(StrictModel):
    """Who may decide an approval, proven by an identity provider's ID token."""

    oidc: OidcApproverSettings | None = None


_HEADER = r"^[A-Za-z0-9-]{1,64}$"


class ConsoleProxySettings(StrictModel):
    """Sign-in by a reverse proxy's headers, believed only from `trusted` addresses."""

    trusted: tuple[str, ...] = Field(min_length=1)
    """CIDRs of the proxies, e.g. 10.0.0.5/32"""
    user_header: str = Field("X-Forwarded-User", pattern=_HEADER)
    """The header that names the signed-in person."""
    groups_header: str = Field("X-Forwarded-Groups", pattern=_HEADER)
    """comma-separated"""
    tenant_header: str = Field("X-Forwarded-Tenant", pattern=_HEADER)
    """The header that names the person's tenant."""
    principal_type: str = Field("User", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    """The Cedar entity type of the person."""
    tenant: str = Field("", pattern=r"^([A-Za-z0-9][A-Za-z0-9._-]{0,127})?$")
    """The tenant of everyone this proxy signs in (one console per tenant), for a proxy that cannot send a
    tenant header (oauth2-proxy's flags): the header is then not read."""

    @field_validator("trusted")
    @classmethod
    def _networks(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        import ipaddress

        for cidr in value:
            try:
                ipaddress.ip_network(cidr, strict=False)
            except ValueError:
                raise ValueError(f"`{cidr}` is not an address or CIDR") from None
        return value


class ConsoleOidcSettings(StrictModel):
    """Sign-in with an ID token of `approvers.oidc`'s identity provider; the token proves
    the person and their groups, the console's configuration their tenant."""

    tenant: str = Field(pattern=TENANT_PATTERN.replace(r"\*|", ""))
    """The tenant of everyone this console signs in."""


class ConsoleSettings(StrictModel):
    """The browser console (toolauthz/console/, docs/console.md), served on `console_listen`."""

    sign_in: Literal["dev", "proxy", "oidc"] = "dev"
    """How people sign in: `dev` (anyone as anyone, loopback only), `proxy` (a reverse proxy's headers),
    `oidc` (an ID token)."""
    proxy: ConsoleProxySettings | None = None
    oidc: ConsoleOidcSettings | None = None
    auditor_groups: tuple[str, ...] = ("auditors",)
    """Members of any of these groups may use the audit explorer and the policy status."""
    session_seconds: int = Field(8 * 3600, ge=60, le=7 * 24 * 3600)
    """How long a console session lasts."""
