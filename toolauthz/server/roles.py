"""The settings of callers and approvers made into what the service layer enforces."""

from __future__ import annotations

import logging

from toolauthz.clock import Clock
from toolauthz.identity.jwks import KeySource, RemoteJwks, RemoteSettings, keys_from_file
from toolauthz.identity.oidc import IdTokenVerifier, OidcSettings
from toolauthz.server.config import OidcApproverSettings, Settings
from toolauthz.service.roles import CallerGrant, RolePolicy

log = logging.getLogger("toolauthz.server")


def role_policy(settings: Settings) -> RolePolicy:
    if not settings.callers:
        log.info("no `callers` configured: roles are not enforced, every caller a listener admits may call "
                 "every RPC")
    return RolePolicy.of(CallerGrant(c.id, frozenset(c.roles), frozenset(c.tenants)) for c in settings.callers)


def id_token_verifier(settings: Settings, clock: Clock) -> IdTokenVerifier | None:
    """With `approvers.oidc`, the verifier of approvers' ID tokens. A `jwks_file` is read
    now (a sidecar that cannot check approvers refuses to start); keys behind a URL are
    fetched on first use (toolauthz/identity/jwks.py), so a provider that is down refuses tokens
    rather than stopping the sidecar."""
    oidc = settings.approvers.oidc
    if oidc is None:
        return None
    if len(oidc.tenants) > 1 and not oidc.tenant_claim:
        log.warning("approvers.oidc is bound to tenants %s without a tenant_claim: every person its ID tokens "
                    "prove may approve in each of them (as the policies allow)", ", ".join(oidc.tenants))
    return IdTokenVerifier(OidcSettings(
        issuer=oidc.issuer, audience=oidc.audience, keys=approver_keys(oidc, clock), tenants=oidc.tenants,
        tenant_claim=oidc.tenant_claim, principal_claim=oidc.principal_claim, groups_claim=oidc.groups_claim,
        principal_type=oidc.principal_type, algorithms=tuple(oidc.algorithms), leeway_seconds=oidc.leeway_seconds,
        max_lifetime_seconds=oidc.max_lifetime_seconds), clock)


def approver_keys(oidc: OidcApproverSettings, clock: Clock) -> KeySource:
    if oidc.jwks_file is not None:
        return keys_from_file(oidc.jwks_file)
    return RemoteJwks(RemoteSettings(
        jwks_uri=oidc.jwks_uri, issuer=oidc.issuer if oidc.discovery else "", ca_file=oidc.ca_file,
        refresh_interval_seconds=oidc.refresh_interval_seconds, max_age_seconds=oidc.max_key_age_seconds,
        timeout_seconds=oidc.fetch_timeout_seconds, max_bytes=oidc.max_jwks_bytes), clock)
