"""Minting execution tokens: PASETO v4.public, bound to one call by its digest.

The digest is the implicit assertion: it is signed but not carried, so a token verifies
only when the verifier supplies the digest of the exact call it is about to run. The
footer carries only `{"kid": "k4.pid.…"}`, an untrusted lookup key.
"""

from __future__ import annotations

import functools
import json
import secrets
from datetime import UTC, datetime
from typing import Any

import pyseto

from toolauthz.clock import Clock
from toolauthz.tokens.claims import MAX_LIFETIME_SECONDS, MAX_TOKEN_CHARS, CallClaims, IssuedToken, check_range
from toolauthz.tokens.keyring import KeyRing


@functools.lru_cache(maxsize=4)
def _rfc3339(epoch: int) -> str:
    # Cached: every token minted within one second carries the same iat/nbf/exp.
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@functools.lru_cache(maxsize=8)
def _footer(kid: str) -> bytes:
    return json.dumps({"kid": kid}, separators=(",", ":")).encode()


class TokenIssuer:
    def __init__(self, keyring: KeyRing, *, issuer: str, audience: str, lifetime_seconds: int = 60,
                 clock: Clock):
        check_range("lifetime_seconds", lifetime_seconds, 1, MAX_LIFETIME_SECONDS)
        if not issuer or not audience:
            raise ValueError("issuer and audience must not be empty")
        self._ring, self._iss, self._aud, self._life, self._clock = keyring, issuer, audience, lifetime_seconds, clock

    def issue(self, call: CallClaims, digest: str, *, decision_id: str, policy_version: str,
              approval_id: str | None = None, approver: str | None = None) -> IssuedToken:
        if not digest or not digest.isascii():
            raise ValueError("digest must be a non-empty ASCII string")
        signing = self._ring.signing
        now = int(self._clock.now())  # whole seconds: the registered claims carry no fraction
        jti = secrets.token_hex(16)  # 128 random bits
        claims: dict[str, Any] = {
            "iss": self._iss, "aud": self._aud, "sub": call.subject, "tenant": call.tenant, "tool": call.tool,
            "call_id": call.call_id, "dig": digest, "decision_id": decision_id,
            "policy_version": policy_version, "jti": jti,
            "iat": _rfc3339(now), "nbf": _rfc3339(now), "exp": _rfc3339(now + self._life),
        }
        if approval_id is not None:
            claims["approval_id"] = approval_id
        if approver is not None:
            claims["approver"] = approver
        token = pyseto.encode(
            signing.key, json.dumps(claims, separators=(",", ":")).encode(),
            footer=_footer(signing.kid),
            implicit_assertion=digest.encode("ascii"),
        ).decode("ascii")
        if len(token) > MAX_TOKEN_CHARS:  # the verifier would call it malformed
            raise ValueError(f"token would be {len(token)} characters, above {MAX_TOKEN_CHARS}")
        return IssuedToken(token, jti, float(now + self._life), signing.kid)
