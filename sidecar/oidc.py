"""ID tokens of approvers: the person deciding an approval, as their identity provider
proves them.

`IdTokenVerifier.verify` accepts a compact JWS ID token only when every check passes:
an asymmetric algorithm from the configured list (never `none`, never HMAC, so a public
key can never be used as an HMAC secret), a `kid` of the configured JWKS whose key type
fits that algorithm, a valid signature, the configured issuer and audience, `exp`
present and not passed, `nbf` and `iat` not in the future (each with a small leeway, read
from the injected clock), a principal claim that is a valid principal id, and a groups
claim that is a list of short strings. Anything else raises `IdTokenRefused`, whose
`reason` names the failed check and never echoes the token.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from joserfc import jws, jwt
from joserfc.errors import ExpiredTokenError, InvalidClaimError, JoseError, MissingClaimError
from joserfc.jwk import ECKey, Key, OKPKey, RSAKey, import_key
from joserfc.jwt import JWTClaimsRegistry

from sidecar.clock import Clock
from sidecar.errors import ForbiddenError, KeyFileError
from sidecar.model import PRINCIPAL_ID, Principal

# Each accepted algorithm and the key type (and EC curve) it must be verified with.
_KEY_FOR_ALGORITHM: Mapping[str, tuple[type[Key], str]] = {
    "RS256": (RSAKey, ""), "RS384": (RSAKey, ""), "RS512": (RSAKey, ""),
    "PS256": (RSAKey, ""), "PS384": (RSAKey, ""), "PS512": (RSAKey, ""),
    "ES256": (ECKey, "P-256"), "ES384": (ECKey, "P-384"), "ES512": (ECKey, "P-521"),
    "EdDSA": (OKPKey, ""),
}
ASYMMETRIC_ALGORITHMS = tuple(_KEY_FOR_ALGORITHM)
MAX_ID_TOKEN_BYTES = 16 * 1024
MAX_GROUPS = 256
MAX_GROUP_LENGTH = 256
MAX_LEEWAY_SECONDS = 60


class IdTokenRefused(ForbiddenError):
    """The ID token does not prove who decides; `reason` is a short, stable phrase."""

    def __init__(self, reason: str):
        self.reason = reason
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
    jwks: Mapping[str, Any]  # a JWK Set: {"keys": [...]}, public keys only, each with a `kid`
    principal_claim: str = "sub"
    groups_claim: str = "groups"
    principal_type: str = "User"
    algorithms: tuple[str, ...] = ("RS256", "ES256", "EdDSA")
    leeway_seconds: int = 30


def read_jwks(path: pathlib.Path) -> dict[str, Any]:
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise KeyFileError(f"cannot read the approvers' JWKS `{path}`: {exc}") from None
    if not isinstance(loaded, dict):
        raise KeyFileError(f"the approvers' JWKS `{path}` must hold a JSON object with `keys`")
    return loaded


class IdTokenVerifier:
    def __init__(self, settings: OidcSettings, clock: Clock):
        unknown = [alg for alg in settings.algorithms if alg not in _KEY_FOR_ALGORITHM]
        if unknown or not settings.algorithms:
            raise KeyFileError(f"approvers' ID token algorithms must be among {', '.join(ASYMMETRIC_ALGORITHMS)}")
        if not 0 <= settings.leeway_seconds <= MAX_LEEWAY_SECONDS:
            raise KeyFileError(f"the ID token leeway must be 0..{MAX_LEEWAY_SECONDS} seconds")
        self._settings = settings
        self._clock = clock
        self._keys = _public_keys(settings.jwks)

    @property
    def settings(self) -> OidcSettings:
        return self._settings

    def verify(self, id_token: str) -> ProvenPerson:
        s = self._settings
        if not id_token:
            raise IdTokenRefused("missing: deciding an approval needs the ID token of the person deciding")
        if len(id_token) > MAX_ID_TOKEN_BYTES or not id_token.isascii():
            raise IdTokenRefused("malformed")
        alg, key = self._key_for(id_token)
        try:
            claims = jwt.decode(id_token, key, algorithms=[alg]).claims
        except JoseError:
            raise IdTokenRefused("bad signature") from None
        except ValueError:
            raise IdTokenRefused("malformed") from None
        self._check_claims(claims)
        principal_id = claims.get(s.principal_claim)
        if not isinstance(principal_id, str) or not PRINCIPAL_ID.fullmatch(principal_id):
            raise IdTokenRefused(f"claim `{s.principal_claim}` is not a valid principal id")
        return ProvenPerson(Principal(s.principal_type, principal_id), _groups(claims.get(s.groups_claim, [])))

    def _key_for(self, id_token: str) -> tuple[str, Key]:
        """The token's algorithm and the key it must verify with, read from its header
        before any signature is checked, and both held to the configured lists."""
        try:
            header = jws.extract_compact(id_token.encode("ascii")).headers()
        except (JoseError, ValueError, TypeError):
            raise IdTokenRefused("malformed") from None
        alg, kid = header.get("alg"), header.get("kid")
        if not isinstance(alg, str) or alg not in self._settings.algorithms:
            raise IdTokenRefused("algorithm not accepted")
        key = self._keys.get(kid) if isinstance(kid, str) else None
        if key is None:
            raise IdTokenRefused("unknown `kid`")
        kind, curve = _KEY_FOR_ALGORITHM[alg]
        if not isinstance(key, kind) or (curve and key.get("crv") != curve) or key.get("alg", alg) != alg:
            raise IdTokenRefused("the key of this `kid` does not fit the algorithm")
        return alg, key

    def _check_claims(self, claims: dict[str, Any]) -> None:
        s = self._settings
        registry = JWTClaimsRegistry(
            now=lambda: int(self._clock.now()), leeway=s.leeway_seconds,
            iss={"essential": True, "value": s.issuer}, aud={"essential": True, "value": s.audience},
            exp={"essential": True})
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


def _public_keys(jwks: Mapping[str, Any]) -> dict[str, Key]:
    """The JWKS's keys by `kid`. Symmetric keys, private keys and keys without a `kid`
    are refused at load: an HMAC secret must never verify an approver's token."""
    raw = jwks.get("keys")
    if not isinstance(raw, list) or not raw:
        raise KeyFileError("the approvers' JWKS must hold a non-empty `keys` list")
    keys: dict[str, Key] = {}
    for entry in raw:
        if not isinstance(entry, dict) or entry.get("kty") not in ("RSA", "EC", "OKP"):
            raise KeyFileError("the approvers' JWKS may hold RSA, EC and OKP public keys only")
        kid = entry.get("kid")
        if not isinstance(kid, str) or not kid or kid in keys:
            raise KeyFileError("every key of the approvers' JWKS needs its own `kid`")
        try:
            key = import_key(entry)
        except (JoseError, ValueError, TypeError) as exc:
            raise KeyFileError(f"key `{kid[:64]}` of the approvers' JWKS cannot be read: {exc}") from None
        if key.is_private:
            raise KeyFileError(f"key `{kid[:64]}` of the approvers' JWKS is private: publish public keys only")
        keys[kid] = key
    return keys

