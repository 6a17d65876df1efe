"""The console's session: one signed cookie, and the CSRF token it carries.

The cookie holds a small JSON object (the CSRF token, when the session ends, and the
signed-in person or their ID token) signed with itsdangerous (HMAC-SHA1 over a key
derived from the secret): the browser can read nothing secret in it and can change
nothing without the signature failing, which reads as no session at all. The secret is a
file in the data directory, created once (atomically: every worker of `--workers N` and
every restart reads the same one), so a session is good on whichever worker a request
reaches. Expiry is read from the injected clock.

CSRF: the synchronizer-token pattern. Every session holds a random token; every form
that changes something carries it in a hidden `csrf_token` field, and a POST whose field
does not equal the session's (compared in constant time) is refused with 403 before any
work. A cross-site page can neither read the token nor send the cookie (SameSite=Strict),
nor set a cookie of its own for the console's host (the `__Host-` prefix).
"""

from __future__ import annotations

import hmac
import os
import pathlib
import secrets
from typing import Any

from itsdangerous import BadSignature, URLSafeSerializer

# `__Host-`: the browser keeps it only if Secure, Path=/ and without Domain, so no sibling
# domain can plant a session of its own (and the CSRF token it knows) in a person's browser.
COOKIE = "__Host-toolauthz_console"
CSRF_FIELD = "csrf_token"
SECRET_FILE = "console-secret"
_SALT = "toolauthz.console.session.v1"


def load_or_create_secret(data_dir: pathlib.Path) -> bytes:
    """The console's signing secret from `<data_dir>/console-secret`, created (0600) if
    absent. Created by linking a finished temporary file into place, so that a process
    racing another never reads a half-written secret: whoever links first wins."""
    path = data_dir / SECRET_FILE
    if not path.exists():
        staged = data_dir / f".{SECRET_FILE}.{os.getpid()}.{secrets.token_hex(4)}"
        descriptor = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(descriptor, secrets.token_hex(32).encode("ascii"))
        finally:
            os.close(descriptor)
        try:
            os.link(staged, path)
        except FileExistsError:
            pass  # another worker made it first: use theirs
        finally:
            staged.unlink()
    secret = path.read_bytes().strip()
    if len(secret) < 32:
        raise ValueError(f"the console secret `{path}` is too short: delete it to make a new one")
    return secret


class Sessions:
    def __init__(self, secret: bytes, max_age_seconds: float):
        self._serializer = URLSafeSerializer(secret, salt=_SALT)
        self.max_age_seconds = max_age_seconds

    def load(self, cookie: str | None, now: float) -> dict[str, Any]:
        """The session the cookie holds; a new one (with a fresh CSRF token) when there is
        no cookie, or its signature fails, or it has expired."""
        if cookie:
            try:
                data = self._serializer.loads(cookie)
            except BadSignature:
                data = None
            if isinstance(data, dict) and isinstance(data.get("csrf"), str) \
                    and isinstance(data.get("exp"), (int, float)) and now < data["exp"]:
                return data
        return self.fresh(now)

    def fresh(self, now: float, **values: Any) -> dict[str, Any]:
        """A new session (new CSRF token): at sign-in and sign-out, so that a token seen
        before signing in is worth nothing after."""
        return {"csrf": secrets.token_urlsafe(32), "exp": now + self.max_age_seconds, **values}

    def dump(self, session: dict[str, Any]) -> str:
        return self._serializer.dumps(session)


def csrf_ok(session: dict[str, Any], sent: object) -> bool:
    expected = session.get("csrf")
    return isinstance(sent, str) and isinstance(expected, str) and bool(sent) \
        and hmac.compare_digest(sent.encode("utf-8", "replace"), expected.encode("ascii"))
