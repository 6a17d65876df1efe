"""Public keys of an identity provider by `kid`, and signed JWTs checked against them.

One key source serves every verifier of third-party JWTs: approvers' ID tokens
(toolauthz/identity/oidc.py), the console's OIDC sign-in and the MCP gateway's bearer access tokens.

Interface (stable; import from `toolauthz.identity.jwks`):

- `KeySource`: `key(kid) -> joserfc Key` (may block up to the fetch timeout, so call it
  from a worker thread) and `await key_async(kid)` (never blocks the event loop: a fetch
  runs on a thread). Both raise `JwtRefused` with a stable `reason`.
- `static_keys(document)` / `keys_from_file(path)`: a fixed JWK Set, checked at once
  (`KeyFileError` on a bad one). An unknown `kid` is refused; nothing is fetched.
- `RemoteJwks(RemoteSettings(...), clock)`: keys fetched over HTTPS from `jwks_uri`, or
  from the `jwks_uri` of `<issuer>/.well-known/openid-configuration` (whose `issuer` must
  equal the configured one). See RemoteJwks for the caching and refresh rules.
- `verify_jwt(token, keys, algorithms)` / `await verify_jwt_async(...)`: the header's
  `alg` within `algorithms` (asymmetric ones only), its `kid`'s key of the type the
  algorithm needs, a valid signature; returns the header and the claims, unchecked (the
  caller checks `iss`, `aud`, `exp`, `typ`...). Anything else raises `JwtRefused`.

Every refusal is a `JwtRefused` (a ForbiddenError, PERMISSION_DENIED over gRPC) whose
`reason` is a short fixed phrase that never echoes the token or the fetched document.
"""

from __future__ import annotations

import asyncio
import json
import logging
import pathlib
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from toolauthz.clock import Clock
from toolauthz.display.escape import display, shown
from toolauthz.errors import ForbiddenError, KeyFileError

if TYPE_CHECKING:
    from joserfc.jwk import Key

# joserfc is imported where a token or a key is read, not here: a sidecar with no
# identity provider, no bundle signature and no MCP OAuth never loads it.

log = logging.getLogger("toolauthz.jwks")

# Each accepted algorithm and the key type (`kty`, and EC curve) it must be verified with.
KEY_FOR_ALGORITHM: Mapping[str, tuple[str, str]] = {
    "RS256": ("RSA", ""), "RS384": ("RSA", ""), "RS512": ("RSA", ""),
    "PS256": ("RSA", ""), "PS384": ("RSA", ""), "PS512": ("RSA", ""),
    "ES256": ("EC", "P-256"), "ES384": ("EC", "P-384"), "ES512": ("EC", "P-521"),
    "EdDSA": ("OKP", ""),
}
ASYMMETRIC_ALGORITHMS = tuple(KEY_FOR_ALGORITHM)
MAX_JWT_BYTES = 16 * 1024
MAX_KID_LENGTH = 256
MAX_KEYS = 64
UNKNOWN_KID = "unknown `kid`"
KEYS_UNAVAILABLE = "the identity provider's keys are unavailable"


class JwtRefused(ForbiddenError):
    """A JWT (or the keys to check it) is refused; `reason` is a short, stable phrase."""

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(f"the token is refused: {reason}")


class KeySource(Protocol):
    def key(self, kid: str) -> Key:
        """The public key named `kid`; raises JwtRefused. May block for a fetch."""

    async def key_async(self, kid: str) -> Key:
        """As `key`, without blocking the event loop."""


def public_keys(document: object, where: str) -> dict[str, Key]:
    """The JWK Set's signing keys by `kid`. Symmetric keys, private keys, keys without a
    `kid` and a repeated `kid` are refused (ValueError naming the problem): an HMAC secret
    must never verify a token, and a public key never be mistaken for one. Keys marked
    `"use": "enc"` are skipped: they sign nothing."""
    from joserfc.errors import JoseError
    from joserfc.jwk import import_key

    raw = document.get("keys") if isinstance(document, dict) else None
    if not isinstance(raw, list) or not raw:
        raise ValueError(f"{where} must hold a non-empty `keys` list")
    if len(raw) > MAX_KEYS:
        raise ValueError(f"{where} holds more than {MAX_KEYS} keys")
    keys: dict[str, Key] = {}
    for entry in raw:
        if not isinstance(entry, dict) or entry.get("kty") not in ("RSA", "EC", "OKP"):
            raise ValueError(f"{where} may hold RSA, EC and OKP public keys only")
        kid = entry.get("kid")
        if not isinstance(kid, str) or not _valid_kid(kid) or kid in keys:
            raise ValueError(f"every key of {where} needs its own `kid`")
        if entry.get("use", "sig") != "sig":
            continue
        try:
            key = import_key(entry)
        except (JoseError, ValueError, TypeError) as exc:
            raise ValueError(f"key `{shown(kid)}` of {where} cannot be read: {exc}") from None
        if key.is_private:
            raise ValueError(f"key `{shown(kid)}` of {where} is private: publish public keys only")
        keys[kid] = key
    if not keys:
        raise ValueError(f"{where} holds no signing key")
    return keys


def _valid_kid(kid: str) -> bool:
    return 0 < len(kid) <= MAX_KID_LENGTH and kid.isprintable()


class StaticKeys:
    """A fixed JWK Set (a file an operator publishes, or a test's keys)."""

    def __init__(self, keys: Mapping[str, Key]):
        self._keys = dict(keys)

    def key(self, kid: str) -> Key:
        found = self._keys.get(kid)
        if found is None:
            raise JwtRefused(UNKNOWN_KID)
        return found

    async def key_async(self, kid: str) -> Key:
        return self.key(kid)


def static_keys(document: Mapping[str, Any], where: str = "the JWKS") -> StaticKeys:
    try:
        return StaticKeys(public_keys(dict(document), where))
    except ValueError as exc:
        raise KeyFileError(str(exc)) from None


def keys_from_file(path: pathlib.Path) -> StaticKeys:
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise KeyFileError(f"cannot read the JWKS `{path}`: {exc}") from None
    if not isinstance(loaded, dict):
        raise KeyFileError(f"the JWKS `{path}` must hold a JSON object with `keys`")
    return static_keys(loaded, f"the JWKS `{path}`")


@dataclass(frozen=True)
class RemoteSettings:
    """Where and how to fetch the keys. Exactly one of `jwks_uri` and `issuer` (which
    means OpenID discovery); both are `https://` URLs. `ca_file`: the CA bundle that
    alone is trusted for these fetches (default: the system's)."""

    jwks_uri: str = ""
    issuer: str = ""
    ca_file: pathlib.Path | None = None
    refresh_interval_seconds: float = 60.0  # at most one fetch per interval, whatever the kids asked
    max_age_seconds: float = 3600.0  # fetched keys are trusted this long without a successful refetch
    timeout_seconds: float = 5.0  # each fetch, as a whole
    max_bytes: int = 256 * 1024  # each response body

    def __post_init__(self) -> None:
        if bool(self.jwks_uri) == bool(self.issuer):
            raise KeyFileError("give the keys' `jwks_uri` or the `issuer` to discover them, not both")
        for url in (self.jwks_uri, self.issuer):
            if url and not url.startswith("https://"):
                raise KeyFileError(f"`{shown(url)}` is not an https:// URL: keys are fetched over HTTPS only")
        if not (0 < self.timeout_seconds <= 60 and 0 < self.max_bytes <= 4 * 1024 * 1024
                and 0 < self.refresh_interval_seconds <= self.max_age_seconds):
            raise KeyFileError("the JWKS fetch needs 0 < timeout <= 60 s, 0 < max_bytes <= 4 MiB and "
                               "0 < refresh_interval <= max_age")


class RemoteJwks:
    """Keys fetched over HTTPS and cached.

    - The first lookup fetches (nothing is fetched at construction, so an identity
      provider that is down does not stop the sidecar from starting).
    - An unknown `kid` refetches, but fetches (successful or not) are at least
      `refresh_interval_seconds` apart: a stream of random kids costs one fetch per
      interval, never one each.
    - Keys are trusted for `max_age_seconds` after the fetch that brought them; then the
      next lookup refetches, and until a fetch succeeds every token is refused. A failed
      fetch (network, TLS, a status other than 200, a redirect, a body over `max_bytes`,
      a document that is not a valid JWK Set, a discovery document of another issuer)
      never replaces the keys: they stay trusted until their `max_age_seconds` ends.
    - Fetching holds a lock, so concurrent lookups of an unknown kid make one fetch.
    """

    def __init__(self, settings: RemoteSettings, clock: Clock):
        self._settings = settings
        self._clock = clock
        self._lock = threading.Lock()
        self._keys: dict[str, Key] = {}
        self._fetched_at: float | None = None  # of the keys held
        self._attempted_at: float | None = None  # of the last fetch, successful or not
        self._context = ssl.create_default_context(
            cafile=str(settings.ca_file) if settings.ca_file is not None else None)
        self._opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=self._context),
                                                   _NoRedirects())

    @property
    def settings(self) -> RemoteSettings:
        return self._settings

    def key(self, kid: str) -> Key:
        if not isinstance(kid, str) or not _valid_kid(kid):
            raise JwtRefused(UNKNOWN_KID)
        found = self._cached(kid)
        if found is not None:
            return found
        with self._lock:
            found = self._cached(kid)  # another thread may have fetched meanwhile
            if found is None and self._may_fetch():
                self._refresh()
                found = self._cached(kid)
            if found is not None:
                return found
            raise JwtRefused(UNKNOWN_KID if self._fresh() else KEYS_UNAVAILABLE)

    async def key_async(self, kid: str) -> Key:
        found = self._cached(kid) if isinstance(kid, str) else None
        return found if found is not None else await asyncio.to_thread(self.key, kid)

    # A clock set back counts as time gone by: keys then age out, and a fetch is allowed.
    def _fresh(self) -> bool:
        return self._fetched_at is not None and \
            0 <= self._clock.now() - self._fetched_at < self._settings.max_age_seconds

    def _cached(self, kid: str) -> Key | None:
        return self._keys.get(kid) if self._fresh() else None

    def _may_fetch(self) -> bool:
        return self._attempted_at is None or \
            not 0 <= self._clock.now() - self._attempted_at < self._settings.refresh_interval_seconds

    def _refresh(self) -> None:
        self._attempted_at = self._clock.now()
        try:
            keys = public_keys(self._fetch_document(), "the fetched JWKS")
        # URLError, HTTPError, TLS errors and timeouts are OSErrors; a broken HTTP exchange
        # is an HTTPException; a bad document a ValueError. Whatever else a fetch raises,
        # it is a failed fetch too: the token is refused, never an internal error.
        except Exception as exc:  # noqa: BLE001 - the boundary of a fetch
            log.warning("cannot fetch the identity provider's keys: %s", display(str(exc)[:300]))
            return
        self._keys, self._fetched_at = keys, self._attempted_at

    def _fetch_document(self) -> object:
        s = self._settings
        deadline = time.monotonic() + s.timeout_seconds
        if not s.issuer:
            return self._get_json(s.jwks_uri, deadline)
        discovered = self._get_json(s.issuer.rstrip("/") + "/.well-known/openid-configuration", deadline)
        if not isinstance(discovered, dict) or discovered.get("issuer") != s.issuer:
            raise ValueError("the discovery document names another issuer")
        jwks_uri = discovered.get("jwks_uri")
        if not isinstance(jwks_uri, str) or not jwks_uri.startswith("https://"):
            raise ValueError("the discovery document's `jwks_uri` is not an https:// URL")
        return self._get_json(jwks_uri, deadline)

    def _get_json(self, url: str, deadline: float) -> object:
        """The JSON body of a GET of `url`: status 200, at most `max_bytes`, read before
        `deadline` (checked between reads, each of which waits at most the timeout)."""
        limit = self._settings.max_bytes
        request = urllib.request.Request(url, headers={"Accept": "application/json"})
        with self._opener.open(request, timeout=self._settings.timeout_seconds) as response:
            if response.status != 200:
                raise ValueError(f"status {response.status}")
            declared = response.headers.get("Content-Length")
            if declared is not None and declared.isdigit() and int(declared) > limit:
                raise ValueError(f"the response is larger than {limit} bytes")
            body = bytearray()
            while chunk := response.read1(64 * 1024):
                body += chunk
                if len(body) > limit:
                    raise ValueError(f"the response is larger than {limit} bytes")
                if time.monotonic() > deadline:
                    raise TimeoutError("the fetch took longer than its timeout")
        try:
            return json.loads(body)
        except (ValueError, RecursionError):
            raise ValueError("the response is not JSON") from None


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect is a failed fetch: it could lead anywhere, plain HTTP included."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


@dataclass(frozen=True)
class VerifiedJwt:
    header: dict[str, Any]
    claims: dict[str, Any]


def _header(token: str, algorithms: tuple[str, ...]) -> tuple[dict[str, Any], str, str]:
    if not token or len(token) > MAX_JWT_BYTES or not token.isascii() or token.count(".") != 2:
        raise JwtRefused("malformed")
    from joserfc import jws
    from joserfc.errors import JoseError

    try:
        header = dict(jws.extract_compact(token.encode("ascii")).headers())
    except (JoseError, ValueError, TypeError):
        raise JwtRefused("malformed") from None
    alg, kid = header.get("alg"), header.get("kid")
    if not isinstance(alg, str) or alg not in algorithms or alg not in KEY_FOR_ALGORITHM:
        raise JwtRefused("algorithm not accepted")
    if not isinstance(kid, str):
        raise JwtRefused(UNKNOWN_KID)
    return header, alg, kid


def _checked(token: str, header: dict[str, Any], alg: str, key: Key) -> VerifiedJwt:
    from joserfc import jwt
    from joserfc.errors import JoseError

    kind, curve = KEY_FOR_ALGORITHM[alg]
    if key.key_type != kind or (curve and key.get("crv") != curve) or key.get("alg", alg) != alg:
        raise JwtRefused("the key of this `kid` does not fit the algorithm")
    try:
        claims = jwt.decode(token, key, algorithms=[alg]).claims
    except JoseError:
        raise JwtRefused("bad signature") from None
    except ValueError:
        raise JwtRefused("malformed") from None
    if not isinstance(claims, dict):
        raise JwtRefused("malformed")
    return VerifiedJwt(header, claims)


def verify_jwt(token: str, keys: KeySource, algorithms: tuple[str, ...]) -> VerifiedJwt:
    """A compact JWS whose signature the key named by its `kid` verifies, with an `alg`
    from `algorithms`; the claims are returned unchecked. May block for a key fetch."""
    header, alg, kid = _header(token, algorithms)
    return _checked(token, header, alg, keys.key(kid))


async def verify_jwt_async(token: str, keys: KeySource, algorithms: tuple[str, ...]) -> VerifiedJwt:
    header, alg, kid = _header(token, algorithms)
    return _checked(token, header, alg, await keys.key_async(kid))
