"""Retained call inputs, sealed: what `toolauthz policy impact` replays, encrypted at rest.

A tool that opts in (`audit.retain_input: 7d`) has each decided call's canonical input,
its trusted entities, principal, request id and run counts kept for replay. They are
sealed with AES-256-GCM (`cryptography`) under the retention key, a file beside the other
keys and never in the database, with the tenant, call id and tool as associated data: a
sealed input copied onto another tenant's or call's row does not open. The database sees
only the tenant, call id, tool, times and the decision it was given.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from toolauthz.errors import KeyFileError, ToolAuthzError
from toolauthz.files.bounded import FileRefused, read_bounded

KEY_BYTES = 32
NONCE_BYTES = 12
# A retained call is at most this large, sealed: an input is already bounded by the
# tool's max_input_bytes (at most 1 MiB) and the entities by the request's limit; a call
# whose total exceeds this is decided as any other, but not retained.
MAX_RETAINED_BYTES = 256 * 1024
_PURPOSE = b"toolauthz/retained-input/v1\x00"


class RetentionError(ToolAuthzError):
    """A retained input does not open with this key for this tenant and call."""


@dataclass(frozen=True)
class RetainedCall:
    """What a replay needs of one call, as it was decided."""

    tenant: str
    call_id: str
    tool: str
    principal_type: str
    principal_id: str
    request_id: str
    input_json: bytes  # canonical JSON of the validated input
    entities_json: bytes  # the runtime's entities, as sent
    run_calls: int
    run_tool_calls: int
    # The usage meters' values the decision saw, by name (a call kept before meters: {}).
    usage: Mapping[str, int] = field(default_factory=dict)


def _aad(tenant: str, call_id: str, tool: str) -> bytes:
    return _PURPOSE + json.dumps([tenant, call_id, tool]).encode()


def seal(key: bytes, call: RetainedCall) -> bytes | None:
    """nonce || AES-GCM ciphertext of the call, bound to its tenant, call id and tool;
    None when it is over MAX_RETAINED_BYTES (it is then not retained)."""
    body = json.dumps({"principal": [call.principal_type, call.principal_id], "request_id": call.request_id,
                       "input": call.input_json.decode("utf-8", "surrogatepass"),
                       "entities": call.entities_json.decode("utf-8", "surrogatepass"),
                       "run": [call.run_calls, call.run_tool_calls], "usage": dict(call.usage)}).encode()
    if len(body) + NONCE_BYTES + 16 > MAX_RETAINED_BYTES:
        return None
    nonce = os.urandom(NONCE_BYTES)
    return nonce + AESGCM(key).encrypt(nonce, body, _aad(call.tenant, call.call_id, call.tool))


def unseal(key: bytes, tenant: str, call_id: str, tool: str, sealed: bytes) -> RetainedCall:
    if len(sealed) > MAX_RETAINED_BYTES or len(sealed) < NONCE_BYTES + 16:
        raise RetentionError("a retained input of an impossible size")
    try:
        body = AESGCM(key).decrypt(sealed[:NONCE_BYTES], sealed[NONCE_BYTES:], _aad(tenant, call_id, tool))
    except InvalidTag:
        raise RetentionError("a retained input does not open with this key for its tenant and call") from None
    data: dict[str, Any] = json.loads(body)
    (ptype, pid), (calls, tool_calls) = data["principal"], data["run"]
    return RetainedCall(tenant, call_id, tool, ptype, pid, data["request_id"],
                        data["input"].encode("utf-8", "surrogatepass"),
                        data["entities"].encode("utf-8", "surrogatepass"), calls, tool_calls,
                        {str(k): int(v) for k, v in data.get("usage", {}).items()})


def load_retention_key(path: str | os.PathLike[str], *, create: bool = False) -> bytes:
    """The 32-byte key of a key file (mode 0600, as the other keys); with `create`, a
    new one is written when there is none."""
    p = os.fspath(path)
    if create and not os.path.lexists(p):
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
        try:
            os.write(fd, AESGCM.generate_key(bit_length=256))
            os.fsync(fd)
        finally:
            os.close(fd)

    def private_mode(st: os.stat_result) -> None:
        if st.st_mode & 0o077:
            raise KeyFileError(f"retention key `{p}` must not be accessible by group or others (chmod 600)")

    try:
        data = read_bounded(p, KEY_BYTES, private_mode)
    except FileNotFoundError:
        raise KeyFileError(f"retention key `{p}` does not exist") from None
    except (OSError, FileRefused) as exc:
        raise KeyFileError(f"retention key `{p}` is unusable: {exc}") from None
    if len(data) != KEY_BYTES:
        raise KeyFileError(f"retention key `{p}` must hold exactly {KEY_BYTES} bytes")
    return data
