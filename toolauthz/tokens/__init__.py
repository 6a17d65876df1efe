"""Execution tokens and the keys that sign them.

    keys.py      one Ed25519 key file: load, generate, publish (PASERK, JWK)
    keyring.py   the key directory: which keys sign and verify, rotation
    claims.py    what a token is bound to, the verification codes, shared limits
    issue.py     minting a PASETO v4.public token for one call's digest
    verify.py    checking one, online (key ring) or offline (GetKeys)
"""

from toolauthz.tokens.claims import (
    BAD_SIGNATURE,
    CLAIMS_MISMATCH,
    DEFAULT_GRACE_SECONDS,
    EXPIRED,
    MALFORMED,
    MAX_LEEWAY_SECONDS,
    MAX_LIFETIME_SECONDS,
    NOT_YET_VALID,
    OK,
    UNKNOWN_KEY,
    WRONG_AUDIENCE,
    CallClaims,
    IssuedToken,
    Verification,
)
from toolauthz.tokens.issue import TokenIssuer
from toolauthz.tokens.verify import TokenVerifier, verify_offline

__all__ = [
    "BAD_SIGNATURE", "CLAIMS_MISMATCH", "DEFAULT_GRACE_SECONDS", "EXPIRED", "MALFORMED", "MAX_LEEWAY_SECONDS",
    "MAX_LIFETIME_SECONDS", "NOT_YET_VALID", "OK", "UNKNOWN_KEY", "WRONG_AUDIENCE", "CallClaims", "IssuedToken",
    "TokenIssuer", "TokenVerifier", "Verification", "verify_offline",
]
