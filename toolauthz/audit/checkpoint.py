"""Signed checkpoints of the audit trail: RFC 6962's signed tree head, over its chains.

A checkpoint signs `{count, root, chains, time}` with the audit key: `root` is the Merkle
root over every chain's head (`merkle.py`), so one signature pins every record of every
chain up to its head; a chain that was truncated, dropped, or rewritten and re-hashed no
longer reaches the head the root commits. The heads themselves are stored beside the
token (`Checkpoint.heads`) and trusted only once they hash to the signed root.
A checkpoint of the single chain the trail had before (`{count, head_hash, time}`, the
first purpose) still verifies: it pins the legacy chain up to `count`. The audit key is
not the token key, and the implicit assertion names the purpose, so a checkpoint can
never pass as an authorization token nor a token as a checkpoint.
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

from toolauthz.audit.merkle import ChainHead, heads_root, records_in
from toolauthz.audit.records import LEGACY_CHAIN
from toolauthz.errors import ToolAuthzError

PURPOSE = b"toolauthz/audit-checkpoint/v1"  # one chain: {count, head_hash, time}
HEADS_PURPOSE = b"toolauthz/audit-checkpoint/v2"  # every chain: {count, root, chains, time}
_HEX64 = re.compile(r"[0-9a-f]{64}")


class CheckpointError(ToolAuthzError):
    """A checkpoint token does not verify with the audit key or is malformed."""


@dataclass(frozen=True)
class Checkpoint:
    """`count` records in all; `head_hash`: the Merkle root over `heads` (a checkpoint
    of the legacy chain: that chain's head hash, and no heads)."""

    count: int
    head_hash: str
    time: float
    kid: str
    token: str = ""  # the signed form; the other fields are only trusted once it verifies
    heads: tuple[ChainHead, ...] = ()
    version: int = 1  # 1: of the legacy chain (PURPOSE); 2: of every chain (HEADS_PURPOSE)

    def pinned(self) -> tuple[ChainHead, ...]:
        """The chain heads this checkpoint pins (once verified)."""
        if self.version == 2:
            return self.heads
        return (ChainHead(LEGACY_CHAIN, self.count, self.head_hash),) if self.count else ()


def sign_heads(heads: Sequence[ChainHead], time: float, private_key: Any, kid: str) -> Checkpoint:
    """Sign every chain's head at once: the Merkle root over them, and how many records
    and chains that covers."""
    ordered = tuple(sorted(heads))
    names = [head.chain for head in ordered]
    if len(set(names)) != len(names):
        raise CheckpointError("a checkpoint names each chain once")
    root = heads_root(ordered)
    payload: dict[str, Any] = {"count": records_in(ordered), "root": root, "chains": len(ordered),
                               "time": float(time)}
    _check_heads_payload(payload)
    token = pyseto.encode(private_key, rfc8785.dumps(payload), footer=rfc8785.dumps({"kid": kid}),
                          implicit_assertion=HEADS_PURPOSE).decode("ascii")
    return Checkpoint(payload["count"], root, float(time), kid, token, ordered, 2)


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


def verify_checkpoint(token: str, public_key: Any | Sequence[Any],
                      heads: Sequence[ChainHead] = ()) -> Checkpoint:
    """Return the checkpoint that `token` signs, or raise CheckpointError. Several public
    keys may be given (audit key rotation); pyseto tries each. A checkpoint of every
    chain comes back with `heads`, once they hash to the root it signs; the heads must
    be given for it (they are stored beside the token, not in it)."""
    keys = list(public_key) if isinstance(public_key, (list, tuple)) else public_key
    for purpose in (HEADS_PURPOSE, PURPOSE):
        try:
            decoded = pyseto.decode(keys, token, implicit_assertion=purpose)  # type: ignore[arg-type]  # caller's keys
            payload = json.loads(decoded.payload)  # type: ignore[arg-type]  # bytes: no deserializer given
            footer = json.loads(decoded.footer) if decoded.footer else {}  # type: ignore[arg-type]  # bytes, as above
            break
        except (pyseto.PysetoError, ValueError, TypeError):
            continue
    else:
        raise CheckpointError("checkpoint does not verify with the audit key")
    kid = footer.get("kid") if isinstance(footer, dict) else None
    if not isinstance(kid, str):
        raise CheckpointError("checkpoint footer has no key id")
    if purpose == PURPOSE:
        _check_payload(payload)
        return Checkpoint(payload["count"], payload["head_hash"], float(payload["time"]), kid, token)
    _check_heads_payload(payload)
    ordered = tuple(sorted(heads))
    if len(ordered) != payload["chains"] or records_in(ordered) != payload["count"] or \
            heads_root(ordered) != payload["root"]:
        raise CheckpointError("the chain heads stored with the checkpoint are not the ones it signs")
    return Checkpoint(payload["count"], payload["root"], float(payload["time"]), kid, token, ordered, 2)


def _check_heads_payload(p: Any) -> None:
    ok = (
        isinstance(p, dict)
        and all(isinstance(p.get(name), int) and not isinstance(p[name], bool) and p[name] >= 0
                for name in ("count", "chains"))
        and isinstance(p.get("root"), str) and _HEX64.fullmatch(p["root"])
        and isinstance(p.get("time"), (int, float)) and not isinstance(p["time"], bool)
    )
    if not ok:
        raise CheckpointError("checkpoint payload is malformed")


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
