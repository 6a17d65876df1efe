"""ID tokens of approvers: the person deciding an approval, as their identity provider
proves them, in the tenant the provider is bound to.

`IdTokenVerifier.verify(id_token, tenant)` accepts a compact JWS ID token only when every
check passes:

- the provider is bound to `tenant` (`tenants` lists it, or holds `*`), and with a
  `tenant_claim` configured the token's claim (a string, or a list of strings) names it;
- a `typ` header that is absent, `JWT` or `application/jwt` (never `at+jwt`: an access
  token is not a person's proof);
- an asymmetric algorithm from the configured list (never `none`, never HMAC), a `kid`
  of the provider's keys (toolauthz/identity/jwks.py: a file, a `jwks_uri` or OpenID discovery)
  whose key type fits that algorithm, a valid signature;
- the configured issuer and audience; with several audiences an `azp` equal to the
  configured audience (and any `azp` present equal to it);
- `exp` and `iat` present, `exp` not passed, `nbf` and `iat` not in the future (each with
  a small leeway, read from the injected clock), and `exp - iat` at most
  `max_lifetime_seconds`;
- a principal claim that is a valid principal id, and a groups claim that is a list of
  short strings.

Anything else raises `IdTokenRefused`, whose `reason` names the failed check and never
echoes the token, and whose `code` is what the audit trail records.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from toolauthz.clock import Clock
from toolauthz.errors import ForbiddenError, KeyFileError
from toolauthz.identity.jwks import ASYMMETRIC_ALGORITHMS, MAX_JWT_BYTES, JwtRefused, KeySource, verify_jwt
from toolauthz.model import PRINCIPAL_ID, Principal

if TYPE_CHECKING:
    from joserfc.errors import InvalidClaimError

MAX_ID_TOKEN_BYTES = MAX_JWT_BYTES
MAX_GROUPS = 256
MAX_GROUP_LENGTH = 256
MAX_LEEWAY_SECONDS = 60
DEFAULT_MAX_LIFETIME_SECONDS = 3600
ANY_TENANT = "*"
INVALID_ID_TOKEN = "invalid_id_token"
TENANT_NOT_BOUND = "id_token_tenant"  # the audit code of a token refused for the tenant it was used in
# An ID token's media type; an access token (`at+jwt`) or a logout token is no proof of a person.
_ID_TOKEN_TYPES = ("jwt", "application/jwt")


class IdTokenRefused(ForbiddenError):
    """The ID token does not prove who decides; `reason` is a short, stable phrase, `code`
    the audit trail's error code."""

    def __init__(self, reason: str, code: str = INVALID_ID_TOKEN):
        self.reason = reason
        self.code = code
        super().__init__(f"the ID token is refused: {reason}")


@dataclass(frozen=True)
class ProvenPerson:
    """Who the identity provider says is deciding, and the groups it says they are in."""

    principal: Principal
    groups: tuple[str, ...]


@dataclass(frozen=True)
class OidcSettings:
    issuer: str
    audience: str
    keys: KeySource  # toolauthz/identity/jwks.py: static_keys, keys_from_file or RemoteJwks
    # The tenants whose approvers this provider proves (`*`: any, only with a tenant
    # claim). None listed: no token is accepted in any tenant.
    tenants: tuple[str, ...] = ()
    tenant_claim: str = ""  # when set, the token's claim must name the tenant
    principal_claim: str = "sub"
    groups_claim: str = "groups"
    principal_type: str = "User"
    algorithms: tuple[str, ...] = ("RS256", "ES256", "EdDSA")
    leeway_seconds: int = 30
    max_lifetime_seconds: int = DEFAULT_MAX_LIFETIME_SECONDS  # the largest `exp - iat` accepted


class IdTokenVerifier:
    def __init__(self, settings: OidcSettings, clock: Clock):
        unknown = [alg for alg in settings.algorithms if alg not in ASYMMETRIC_ALGORITHMS]
        if unknown or not settings.algorithms:
            raise KeyFileError(f"approvers' ID token algorithms must be among {', '.join(ASYMMETRIC_ALGORITHMS)}")
        if not 0 <= settings.leeway_seconds <= MAX_LEEWAY_SECONDS:
            raise KeyFileError(f"the ID token leeway must be 0..{MAX_LEEWAY_SECONDS} seconds")
        if settings.max_lifetime_seconds <= 0:
            raise KeyFileError("the ID token's largest lifetime must be positive")
        if ANY_TENANT in settings.tenants and not settings.tenant_claim:
            raise KeyFileError("an identity provider bound to every tenant (`*`) needs a `tenant_claim`")
        self._settings = settings
        self._clock = clock

    @property
    def settings(self) -> OidcSettings:
        return self._settings

    def verify(self, id_token: str, tenant: str) -> ProvenPerson:
        """The person `id_token` proves, for deciding in `tenant`. May block for a key
        fetch (toolauthz/identity/jwks.py): call it off the event loop."""
        s = self._settings
        if not id_token:
            raise IdTokenRefused("missing: deciding an approval needs the ID token of the person deciding")
        if len(id_token) > MAX_ID_TOKEN_BYTES or not id_token.isascii():
            raise IdTokenRefused("malformed")
        if tenant not in s.tenants and ANY_TENANT not in s.tenants:
            raise IdTokenRefused("the identity provider is not bound to this tenant", TENANT_NOT_BOUND)
        try:
            verified = verify_jwt(id_token, s.keys, s.algorithms)
        except JwtRefused as exc:
            raise IdTokenRefused(exc.reason) from None
        typ = verified.header.get("typ", "JWT")
        if not isinstance(typ, str) or typ.lower() not in _ID_TOKEN_TYPES:
            raise IdTokenRefused("not an ID token (`typ`)")
        claims = verified.claims
        self._check_claims(claims)
        self._check_tenant(claims, tenant)
        principal_id = claims.get(s.principal_claim)
        if not isinstance(principal_id, str) or not PRINCIPAL_ID.fullmatch(principal_id):
            raise IdTokenRefused(f"claim `{s.principal_claim}` is not a valid principal id")
        return ProvenPerson(Principal(s.principal_type, principal_id), _groups(claims.get(s.groups_claim, [])))

    def _check_claims(self, claims: dict[str, Any]) -> None:
        from joserfc.errors import ExpiredTokenError, InvalidClaimError, JoseError, MissingClaimError
        from joserfc.jwt import JWTClaimsRegistry

        s = self._settings
        registry = JWTClaimsRegistry(
            now=lambda: int(self._clock.now()), leeway=s.leeway_seconds,
            iss={"essential": True, "value": s.issuer}, aud={"essential": True, "value": s.audience},
            exp={"essential": True}, iat={"essential": True})
        try:
            registry.validate(claims)
        except ExpiredTokenError:
            raise IdTokenRefused("expired") from None
        except MissingClaimError as exc:
            raise IdTokenRefused(f"missing claim `{exc.claim[:64]}`") from None
        except InvalidClaimError as exc:
            raise IdTokenRefused(_invalid_claim(exc)) from None
        except JoseError:
            raise IdTokenRefused("invalid claims") from None
        exp, iat = claims["exp"], claims["iat"]
        if not _is_time(exp) or not _is_time(iat) or exp - iat > s.max_lifetime_seconds:
            raise IdTokenRefused(f"lives longer than {s.max_lifetime_seconds} seconds (`exp - iat`)")
        audiences = claims["aud"] if isinstance(claims["aud"], list) else [claims["aud"]]
        azp = claims.get("azp")
        if (len(audiences) > 1 or azp is not None) and azp != s.audience:
            raise IdTokenRefused("`azp` is not this audience")

    def _check_tenant(self, claims: dict[str, Any], tenant: str) -> None:
        name = self._settings.tenant_claim
        if not name:
            return
        value = claims.get(name)
        named = [value] if isinstance(value, str) else value if isinstance(value, list) else []
        if tenant not in [v for v in named if isinstance(v, str)]:
            raise IdTokenRefused(f"claim `{name}` does not name this tenant", TENANT_NOT_BOUND)


def _is_time(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


_CLAIM_REASONS = {"iss": "wrong issuer", "aud": "wrong audience", "nbf": "not yet valid",
                  "iat": "issued in the future", "exp": "invalid `exp`"}


def _invalid_claim(exc: InvalidClaimError) -> str:
    return _CLAIM_REASONS.get(exc.claim, f"invalid claim `{exc.claim[:64]}`")


def _groups(value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or len(value) > MAX_GROUPS or \
            not all(isinstance(g, str) and 0 < len(g) <= MAX_GROUP_LENGTH for g in value):
        raise IdTokenRefused(f"the groups claim must be a list of at most {MAX_GROUPS} non-empty strings "
                             f"of at most {MAX_GROUP_LENGTH} characters")
    return tuple(dict.fromkeys(value))
