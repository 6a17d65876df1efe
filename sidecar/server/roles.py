"""The settings of callers and approvers made into what the service layer enforces."""

from __future__ import annotations

import logging

from sidecar.clock import Clock
from sidecar.oidc import IdTokenVerifier, OidcSettings, read_jwks
from sidecar.server.config import Settings
from sidecar.service.roles import CallerGrant, RolePolicy

log = logging.getLogger("toolauthz.server")


def role_policy(settings: Settings) -> RolePolicy:
    if not settings.callers:
        log.info("no `callers` configured: roles are not enforced, every caller a listener admits may call "
                 "every RPC")
    return RolePolicy.of(CallerGrant(c.id, frozenset(c.roles), frozenset(c.tenants)) for c in settings.callers)


def id_token_verifier(settings: Settings, clock: Clock) -> IdTokenVerifier | None:
    """With `approvers.oidc`, the verifier of approvers' ID tokens (its JWKS read now:
    a sidecar that cannot check approvers refuses to start)."""
    oidc = settings.approvers.oidc
    if oidc is None:
        return None
    return IdTokenVerifier(OidcSettings(
        issuer=oidc.issuer, audience=oidc.audience, jwks=read_jwks(oidc.jwks_file),
        principal_claim=oidc.principal_claim, groups_claim=oidc.groups_claim, principal_type=oidc.principal_type,
        algorithms=tuple(oidc.algorithms), leeway_seconds=oidc.leeway_seconds), clock)
