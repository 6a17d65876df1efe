"""Runs and call ids: what the sidecar's `request_id` and each call's id are, in both
MCP protocol eras.

The sidecar groups calls into runs (`request_id`: run limits, the audit's story of one
model run) and needs a call id per call that a replay repeats exactly and nothing else
does (single use, "a replayed request runs nothing", approval resumption).

The run of a request, first match wins:

1. `_meta["io.toolauthz/run"]`, chosen by the client (any era): 1-64 of
   `[A-Za-z0-9_-]`, starting with a letter or digit; anything else is refused
   (INVALID_PARAMS), never read as a different run;
2. the session, on the 2025-11-25 era: the `Mcp-Session-Id` the SDK issued (HTTP) or
   the stdio connection (a ULID drawn when the proxy starts);
3. otherwise (a 2026-07-28 request over HTTP without a run): a new run for this one
   request, minted by the proxy (a ULID).

Every `tools/call` result carries its run in `_meta["io.toolauthz/run"]`, so a client
may pass it back to continue the run (and resume an approval). The sidecar's
`request_id` is `mcp-<caller>-<run>`, `<caller>` a digest of the tenant and principal:
two users who pick the same run id never share a run, its limits or a call.

A call's id is `mcp-<caller>-<run>-<request>`, where `<request>`
spells the JSON-RPC request id with its type, so `7` (`n7`) and `"7"` (`s7`) are two
calls; ids that are not short plain strings are hashed (`h<sha256>`, typed too).
"""

from __future__ import annotations

import hashlib
import re
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import mcp_types as types
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from ulid import ULID

from toolauthz.client import Principal

__all__ = ["RUN_META_KEY", "Caller", "Run", "run_of", "call_id", "BoundedMap", "is_modern", "session_header"]

RUN_META_KEY = "io.toolauthz/run"
_RUN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}\Z")
_SESSION = re.compile(r"^[A-Za-z0-9_-]{1,128}\Z")
_PLAIN_REQUEST_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}\Z")

K = TypeVar("K")
V = TypeVar("V")


@dataclass(frozen=True)
class Caller:
    """Who a call acts for: from the proxy's configuration or a verified bearer token,
    never from the MCP client's arguments."""

    tenant: str
    principal: Principal

    @property
    def tag(self) -> str:
        text = f"{self.tenant}\0{self.principal.type}\0{self.principal.id}"
        return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Run:
    caller: Caller
    name: str  # the run as the client sees it (its handle)

    @property
    def request_id(self) -> str:
        """The sidecar's request_id: the caller's tag first, so that two users who pick
        the same run id have two runs (with their own run limits)."""
        return f"mcp-{self.caller.tag}-{self.name}"

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.caller.tag, self.caller.tenant, self.name)


def is_modern(ctx: Any) -> bool:
    return getattr(ctx, "protocol_version", None) in MODERN_PROTOCOL_VERSIONS


def run_of(ctx: Any, caller: Caller, connection: str | None) -> Run:
    """The run of one request (see the module docstring); MCPError INVALID_PARAMS for a
    malformed run id. `connection` is the stdio connection's id, None over HTTP."""
    meta = ctx.meta or {}
    chosen = meta.get(RUN_META_KEY) if isinstance(meta, dict) else None
    if chosen is not None:
        if not isinstance(chosen, str) or not _RUN.fullmatch(chosen):
            raise MCPError(types.INVALID_PARAMS, f"`_meta.{RUN_META_KEY}` must be 1-64 of A-Z a-z 0-9 _ - "
                                                 "(starting with a letter or digit)")
        return Run(caller, chosen)
    if connection is not None:
        return Run(caller, connection)
    if not is_modern(ctx):
        session = session_header(ctx)
        if session is not None:
            return Run(caller, session)
    return Run(caller, str(ULID()))


def session_header(ctx: Any) -> str | None:
    headers = getattr(getattr(ctx, "request", None), "headers", None)
    session = headers.get("mcp-session-id") if headers is not None else None
    return session if isinstance(session, str) and _SESSION.fullmatch(session) else None


def call_id(run: Run, request_id: Any) -> str:
    """The call id of one JSON-RPC request in a run: its type is part of it."""
    if isinstance(request_id, bool) or not isinstance(request_id, (int, str)):
        kind, text = "o", repr(request_id)
    elif isinstance(request_id, int):
        kind, text = "n", str(request_id)
    else:
        kind, text = "s", request_id
    if kind != "o" and _PLAIN_REQUEST_ID.fullmatch(text):
        part = kind + text
    else:
        part = "h" + hashlib.sha256(f"{kind}:{text}".encode()).hexdigest()[:32]
    return f"{run.request_id}-{part}"


class BoundedMap(Generic[K, V]):
    """A dict that forgets its oldest entry beyond `limit`: per-run state a caller can
    create at will (runs, pending approvals) must not grow without bound."""

    def __init__(self, limit: int):
        self.limit = limit
        self._items: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        return self._items.get(key)

    def set(self, key: K, value: V) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self.limit:
            self._items.popitem(last=False)

    def pop(self, key: K) -> V | None:
        return self._items.pop(key, None)

    def values(self) -> list[V]:
        return list(self._items.values())

    def setdefault_with(self, key: K, make: Callable[[], V]) -> V:
        value = self._items.get(key)
        if value is None:
            value = make()
            self.set(key, value)
        return value

    def __len__(self) -> int:
        return len(self._items)
