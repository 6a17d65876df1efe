"""Checking execution tokens: shape, key, signature over the call's digest, times and
claims, in that order; a bad token is an answer (a code), never an exception. Single use
is the ledger's job (consume `jti` atomically): this module never says `already_used`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

import pyseto
from pyseto import Key, KeyInterface

from toolauthz.clock import Clock
from toolauthz.tokens.claims import (
    BAD_SIGNATURE,
    CLAIMS_MISMATCH,
    EXPIRED,
    HEADER,
    KID_PATTERN,
    MALFORMED,
    MAX_FOOTER_BYTES,
    MAX_LEEWAY_SECONDS,
    MAX_TOKEN_CHARS,
    NOT_YET_VALID,
    OK,
    RFC3339,
    SIG_BYTES,
    UNKNOWN_KEY,
    WRONG_AUDIENCE,
    CallClaims,
    Verification,
    check_range,
)
from toolauthz.tokens.keyring import KeyRing
from toolauthz.tokens.keys import KeyInfo, b64url_decode_strict


def _parse_time(value: object) -> float | None:
    if not isinstance(value, str) or not RFC3339.fullmatch(value):
        return None
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None


def _strict_json(data: bytes) -> Any:
    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        if len({k for k, _ in pairs}) != len(pairs):
            raise ValueError("duplicate key")
        return dict(pairs)

    def no_constant(name: str) -> Any:
        raise ValueError(f"`{name}` is not JSON")

    # Decode as UTF-8 first: json.loads(bytes) would also guess UTF-16 and UTF-32.
    return json.loads(data.decode("utf-8"), object_pairs_hook=no_duplicates, parse_constant=no_constant)


def _parse_footer_kid(token: object) -> tuple[str | None, str]:
    """Step a: the shape of the token. Returns (kid, "") or (None, why)."""
    if not isinstance(token, str):
        return None, "token is not a string"
    if len(token) > MAX_TOKEN_CHARS:
        return None, f"token is longer than {MAX_TOKEN_CHARS} characters"
    if not token.startswith(HEADER):
        return None, "token is not `v4.public`"
    parts = token.split(".")
    if len(parts) not in (3, 4):
        return None, "token does not have 3 or 4 parts"
    if len(parts) == 3:
        return None, "token has no footer"
    body, footer = b64url_decode_strict(parts[2]), b64url_decode_strict(parts[3])
    if body is None or footer is None:
        return None, "token is not canonical unpadded base64url"
    if len(body) <= SIG_BYTES:
        return None, "token is too short to hold a signature"
    if len(footer) > MAX_FOOTER_BYTES:
        return None, f"footer is longer than {MAX_FOOTER_BYTES} bytes"
    try:
        doc = _strict_json(footer)
    except ValueError:  # also UnicodeDecodeError and JSONDecodeError
        return None, "footer is not JSON"
    if not isinstance(doc, dict) or set(doc) != {"kid"} or not isinstance(doc["kid"], str) \
            or not KID_PATTERN.fullmatch(doc["kid"]):
        return None, "footer must be exactly {\"kid\": \"k4.pid.…\"}"
    return doc["kid"], ""


def _verify(token: object, digest: str, expected: CallClaims, *, lookup: Callable[[str], KeyInterface | None],
            now: float, audience: str, issuer: str, leeway: int) -> Verification:
    """Steps a to g; the one code path behind TokenVerifier and verify_offline."""
    kid, why = _parse_footer_kid(token)
    if kid is None:
        return Verification(MALFORMED, detail=why)
    key = lookup(kid)
    if key is None:
        return Verification(UNKNOWN_KEY, detail=f"no key `{kid}` verifies now")
    if not isinstance(digest, str) or not digest.isascii():
        return Verification(BAD_SIGNATURE, detail="digest is not ASCII, so it cannot match")
    try:
        # No deserializer: pyseto then skips its own exp/nbf check, which reads the
        # system clock; the injected clock rules below.
        payload = pyseto.decode(key, token,  # type: ignore[arg-type]  # a str: _parse_footer_kid found a kid
                                implicit_assertion=digest.encode("ascii")).payload
    except pyseto.VerifyError:
        return Verification(BAD_SIGNATURE, detail="signature does not verify for this digest")
    except Exception:  # noqa: BLE001 - attacker-shaped input: any other failure is a malformed token, never a crash
        return Verification(MALFORMED, detail="token cannot be verified")
    try:
        claims = _strict_json(payload)  # type: ignore[arg-type]  # bytes: no deserializer given
    except ValueError:
        return Verification(MALFORMED, detail="claims are not JSON")
    if not isinstance(claims, dict):
        return Verification(MALFORMED, detail="claims are not a JSON object")
    exp, nbf, iat = (_parse_time(claims.get(name)) for name in ("exp", "nbf", "iat"))
    if exp is None or nbf is None or iat is None:
        missing = next(name for name, t in (("exp", exp), ("nbf", nbf), ("iat", iat)) if t is None)
        return Verification(MALFORMED, detail=f"claim `{missing}` is missing or not an RFC 3339 time")
    if not isinstance(claims.get("jti"), str) or not claims["jti"]:
        return Verification(MALFORMED, detail="claim `jti` is missing")
    if exp < now - leeway:  # exactly at exp + leeway is still valid
        return Verification(EXPIRED, detail="token has expired")
    if nbf > now + leeway:
        return Verification(NOT_YET_VALID, detail="token is not valid yet (nbf)")
    if iat > now + leeway:
        return Verification(NOT_YET_VALID, detail="token was issued in the future (iat)")
    if claims.get("aud") != audience:
        return Verification(WRONG_AUDIENCE, detail="token is for another audience")
    if claims.get("iss") != issuer:
        return Verification(CLAIMS_MISMATCH, detail="token is from another issuer")
    want = {"sub": expected.subject, "tenant": expected.tenant, "tool": expected.tool,
            "call_id": expected.call_id, "dig": digest}
    for name, value in want.items():
        if claims.get(name) != value:
            return Verification(CLAIMS_MISMATCH, detail=f"claim `{name}` does not match the call")
    decision_id = claims.get("decision_id")
    return Verification(OK, claims, claims["jti"], decision_id if isinstance(decision_id, str) else None)


class TokenVerifier:
    """Checks a token against the key ring; a bad token is an answer, never an exception."""

    def __init__(self, keyring: KeyRing, *, issuer: str, audience: str, leeway_seconds: int = 5, clock: Clock):
        check_range("leeway_seconds", leeway_seconds, 0, MAX_LEEWAY_SECONDS)
        if not issuer or not audience:
            raise ValueError("issuer and audience must not be empty")
        self._ring, self._iss, self._aud, self._leeway, self._clock = keyring, issuer, audience, leeway_seconds, clock

    def verify(self, token: str, digest: str, expected: CallClaims) -> Verification:
        now = self._clock.now()
        return _verify(token, digest, expected, lookup=lambda kid: self._ring.verification_key(kid, now),
                       now=now, audience=self._aud, issuer=self._iss, leeway=self._leeway)


def verify_offline(token: str, *, public_keys: Sequence[Mapping[str, Any] | KeyInfo], digest: str,
                   expected: CallClaims, audience: str, issuer: str, now: float | None = None,
                   leeway_seconds: int = 5) -> Verification:
    """Verify a token locally against the keys GetKeys returned (their `paserk` values).

    This checks signature, digest, times and claims exactly as the sidecar does, but it
    cannot enforce single use: only the sidecar's Verify consumes the token id. A runtime
    that executes on an offline `ok` alone accepts replays within the token's lifetime.
    Refresh the key list regularly; an entry's `verifies_until`, when present, is honoured.
    """
    check_range("leeway_seconds", leeway_seconds, 0, MAX_LEEWAY_SECONDS)
    at = time.time() if now is None else now
    keys: dict[str, tuple[KeyInterface, float | None]] = {}
    for entry in public_keys:
        e = entry.to_dict() if isinstance(entry, KeyInfo) else entry
        paserk = e.get("paserk")
        if not isinstance(paserk, str) or not paserk.startswith("k4.public."):
            raise ValueError("every public key needs a `paserk` of type `k4.public`")
        key = Key.from_paserk(paserk)
        kid = key.to_paserk_id()  # derived, so a wrong `kid` in the list cannot misdirect
        if e.get("kid") not in (None, kid):
            raise ValueError(f"public key `{paserk}` is listed with kid `{e.get('kid')}`, not `{kid}`")
        until = e.get("verifies_until")
        if until is not None and (isinstance(until, bool) or not isinstance(until, (int, float))):
            raise ValueError(f"public key `{kid}` has a `verifies_until` that is not a number")
        keys[kid] = (key, until)

    def lookup(kid: str) -> KeyInterface | None:
        key, until = keys.get(kid, (None, None))
        return key if until is None or at <= until else None

    return _verify(token, digest, expected, lookup=lookup, now=at, audience=audience, issuer=issuer,
                   leeway=leeway_seconds)
