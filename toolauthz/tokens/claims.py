"""What a token is bound to and what checking one answers: the claims, the codes and
the limits that the issuer and the verifier share. The wire format is PASETO v4.public
(toolauthz/tokens/issue.py, toolauthz/tokens/verify.py)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

MAX_LIFETIME_SECONDS = 600
MAX_LEEWAY_SECONDS = 5
DEFAULT_GRACE_SECONDS = MAX_LIFETIME_SECONDS + MAX_LEEWAY_SECONDS  # for retired keys
MAX_TOKEN_CHARS = 8 * 1024
MAX_FOOTER_BYTES = 512
HEADER = "v4.public."
SIG_BYTES = 64
KID_PATTERN = re.compile(r"k4\.pid\.[A-Za-z0-9_-]{44}")  # PASERK id: base64url of a 33-byte hash
# [0-9], not \d: \d also matches non-ASCII digits.
RFC3339 = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?(Z|[+-][0-9]{2}:[0-9]{2})")

OK = "ok"
MALFORMED = "malformed"
UNKNOWN_KEY = "unknown_key"
BAD_SIGNATURE = "bad_signature"
EXPIRED = "expired"
NOT_YET_VALID = "not_yet_valid"
WRONG_AUDIENCE = "wrong_audience"
CLAIMS_MISMATCH = "claims_mismatch"



@dataclass(frozen=True)
class CallClaims:
    """What a token is bound to besides the digest."""

    tenant: str
    principal_type: str
    principal_id: str
    tool: str
    call_id: str

    @property
    def subject(self) -> str:
        """Cedar-style entity uid, e.g. `User::"alice"`, with `\\` and `"` escaped."""
        escaped = self.principal_id.replace("\\", "\\\\").replace('"', '\\"')
        return f'{self.principal_type}::"{escaped}"'


@dataclass(frozen=True)
class IssuedToken:
    token: str
    jti: str
    expires_at: float
    kid: str


@dataclass(frozen=True)
class Verification:
    code: str
    claims: dict[str, Any] | None = None
    jti: str | None = None
    decision_id: str | None = None
    detail: str = ""  # why, for logs; never contains the token or the claims

    @property
    def ok(self) -> bool:
        return self.code == OK



def check_range(name: str, value: int, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{name} must be an integer from {low} to {high}, not `{value}`")
