"""Checking a token locally, against the keys GetKeys publishes.

    checker = OfflineVerifier(client)
    verification = checker.check(token, context, call)   # .ok, .code, .claims

This proves the token was issued by the sidecar for this exact call (signature, digest,
times, audience, claims), without a round trip. It cannot prove the token was not used
already: single use is the sidecar's ledger, so a runtime that executes must still call
Verify (the Guard always does). Use an offline check where a replay is harmless, e.g. a
downstream service double-checking that the call it received was authorized.
"""

from __future__ import annotations

import time

from toolauthz.client.context import ProposedCall, TrustedContext
from toolauthz.client.sync import AuthzClient
from toolauthz.digest import call_digest
from toolauthz.errors import InputError
from toolauthz.strict_json import parse_strict_json
from toolauthz.tokens import CallClaims, Verification, verify_offline

__all__ = ["OfflineVerifier"]


class OfflineVerifier:
    def __init__(self, client: AuthzClient, *, audience: str = "toolauthz-runtime", issuer: str = "toolauthz",
                 refresh_seconds: float = 300.0, leeway_seconds: int = 5):
        self._client = client
        self._audience = audience
        self._issuer = issuer
        self._refresh = refresh_seconds
        self._leeway = leeway_seconds
        self._keys: list[dict] = []
        self._fetched = float("-inf")

    def keys(self, *, refresh: bool = False) -> list[dict]:
        if refresh or time.monotonic() - self._fetched > self._refresh:
            response = self._client.get_keys()
            self._keys = [{"kid": k.kid, "paserk": k.paserk} for k in response.keys]
            self._fetched = time.monotonic()
        return self._keys

    def check(self, token: str, context: TrustedContext, call: ProposedCall, *,
              now: float | None = None) -> Verification:
        try:
            value = parse_strict_json(call.input_json, max_bytes=1 << 20)
            digest = call_digest(tool=call.name, input=value, principal_type=context.principal.type,
                                 principal_id=context.principal.id, tenant=context.tenant, call_id=call.call_id)
        except InputError:
            return Verification("bad_signature", detail="the call's input does not parse")
        expected = CallClaims(context.tenant, context.principal.type, context.principal.id, call.name, call.call_id)
        result = verify_offline(token, public_keys=self.keys(), digest=digest, expected=expected,
                                audience=self._audience, issuer=self._issuer, now=now,
                                leeway_seconds=self._leeway)
        if result.code == "unknown_key":  # a key rotated in since the last refresh
            result = verify_offline(token, public_keys=self.keys(refresh=True), digest=digest, expected=expected,
                                    audience=self._audience, issuer=self._issuer, now=now,
                                    leeway_seconds=self._leeway)
        return result
