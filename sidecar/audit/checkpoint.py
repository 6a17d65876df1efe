"""Signed checkpoints of the audit chain: RFC 6962's signed tree head, over a chain.

A checkpoint `{count, head_hash, time}` signed with the audit key pins every record up to
`count`: a log that was truncated, or rewritten and re-hashed, no longer reaches the same
head. The audit key is not the token key, and the implicit assertion names the purpose,
so a checkpoint can never pass as an authorization token nor a token as a checkpoint.
Copies kept outside the database (shipped to a log collector) also catch an attacker who
deletes the checkpoints table itself.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyseto
import rfc8785

from sidecar.errors import ToolAuthzError

PURPOSE = b"toolauthz/audit-checkpoint/v1"
_HEX64 = re.compile(r"[0-9a-f]{64}")


class CheckpointError(ToolAuthzError):
    """A checkpoint token does not verify with the audit key or is malformed."""


@dataclass(frozen=True)
class Checkpoint:
    count: int
    head_hash: str
    time: float
    kid: str
    token: str = ""  # the signed form; the other fields are only trusted once it verifies


def sign_checkpoint(
    count: int, head_hash: str, time: float, private_key: Any, kid: str
) -> Checkpoint:
    """Sign the head of the chain; `private_key` is a pyseto v4.public private key."""
    payload: dict[str, Any] = {"count": count, "head_hash": head_hash, "time": float(time)}
    _check_payload(payload)
    token = pyseto.encode(
        private_key,
        rfc8785.dumps(payload),
        footer=rfc8785.dumps({"kid": kid}),
        implicit_assertion=PURPOSE,
    ).decode("ascii")
    return Checkpoint(count, head_hash, float(time), kid, token)


def verify_checkpoint(token: str, public_key: Any | Sequence[Any]) -> Checkpoint:
    """Return the checkpoint that `token` signs, or raise CheckpointError. Several public
    keys may be given (audit key rotation); pyseto tries each."""
    keys = list(public_key) if isinstance(public_key, (list, tuple)) else public_key
    try:
        decoded = pyseto.decode(keys, token, implicit_assertion=PURPOSE)  # type: ignore[arg-type]  # keys of the caller
        payload = json.loads(decoded.payload)  # type: ignore[arg-type]  # bytes: no deserializer given
        footer = json.loads(decoded.footer) if decoded.footer else {}  # type: ignore[arg-type]  # bytes, as above
    except (pyseto.PysetoError, ValueError, TypeError) as exc:
        raise CheckpointError("checkpoint does not verify with the audit key") from exc
    _check_payload(payload)
    kid = footer.get("kid") if isinstance(footer, dict) else None
    if not isinstance(kid, str):
        raise CheckpointError("checkpoint footer has no key id")
    count, head_hash, time = payload["count"], payload["head_hash"], float(payload["time"])
    return Checkpoint(count, head_hash, time, kid, token)


def _check_payload(p: Any) -> None:
    ok = (
        isinstance(p, dict)
        and isinstance(p.get("count"), int) and not isinstance(p["count"], bool)
        and p["count"] >= 0
        and isinstance(p.get("head_hash"), str) and _HEX64.fullmatch(p["head_hash"])
        and isinstance(p.get("time"), (int, float)) and not isinstance(p["time"], bool)
    )
    if not ok:
        raise CheckpointError("checkpoint payload is malformed")
