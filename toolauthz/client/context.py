"""What the runtime vouches for (trusted context) and what the model proposed (a call).

The trusted context is built from the runtime's own authenticated session and is frozen:
nothing in this package reads a tenant, a principal or a request id from a model's
arguments, and there is no API that would let it. Entities the runtime vouches for (an
order looked up through a client scoped to the signed-in customer) come from an
`entities` provider the runtime supplies, which is given the proposed call so that it can
look up the object the arguments *select*; the attributes it returns (owner, balance)
come from the runtime's own store, never from the arguments.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from toolauthz.errors import InputError
from toolauthz.model import CALL_ID, PRINCIPAL_ID, PRINCIPAL_TYPE, REQUEST_ID, TENANT
from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb
from toolauthz.strict_json import parse_strict_json

__all__ = ["Principal", "TrustedContext", "ProposedCall", "EntitiesProvider", "raw_json"]

MAX_ARGUMENT_BYTES = 1 << 20  # the sidecar's own ceiling for Verify


@dataclass(frozen=True)
class Principal:
    """A Cedar principal, e.g. `Principal("User", "alice")` is `User::"alice"`."""

    type: str
    id: str

    def __post_init__(self) -> None:
        _require(self.type, PRINCIPAL_TYPE, "principal type")
        _require(self.id, PRINCIPAL_ID, "principal id")

    def __str__(self) -> str:
        return f'{self.type}::"{self.id}"'

    def to_proto(self) -> pb.Principal:
        return pb.Principal(type=self.type, id=self.id)


@dataclass(frozen=True)
class ProposedCall:
    """One tool call as the model proposed it: untrusted, except `call_id` (the
    provider's tool-use id). `input_json` is the raw argument text exactly as produced;
    `arguments` is its strict parse, or None when it does not parse (the sidecar will
    deny such a call; an entities provider must cope with None and with any shape)."""

    call_id: str
    name: str
    input_json: bytes
    arguments: Any = field(default=None, compare=False)

    @classmethod
    def of(cls, call_id: str, name: str, input_json: bytes | str) -> ProposedCall:
        raw = raw_json(input_json)
        try:
            arguments = parse_strict_json(raw, max_bytes=MAX_ARGUMENT_BYTES)
        except InputError:
            arguments = None
        return cls(call_id, name, raw, arguments)

    def to_proto(self) -> pb.ToolCall:
        return pb.ToolCall(call_id=self.call_id, name=self.name, input_json=self.input_json)


# (call) -> Cedar entities (a list of entity dicts), or None for none. The async Guard
# also accepts a coroutine function.
EntitiesProvider = Callable[[ProposedCall], list | None | Awaitable[list | None]]


@dataclass(frozen=True)
class TrustedContext:
    """The runtime's authenticated session for one model run.

    `tenant` and `principal` identify who the run acts for; `request_id` names the run
    (the sidecar counts per-run limits by it). `entities` is optional: a callable that,
    given the proposed call, returns the Cedar entities the runtime vouches for.
    Construct it from your session, never from model output."""

    tenant: str
    principal: Principal
    request_id: str
    entities: EntitiesProvider | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.principal, Principal):
            raise TypeError("principal must be a toolauthz.client.Principal")
        _require(self.tenant, TENANT, "tenant")
        _require(self.request_id, REQUEST_ID, "request_id")

    def to_proto(self, entities: list | None = None) -> pb.TrustedContext:
        return pb.TrustedContext(tenant=self.tenant, principal=self.principal.to_proto(),
                                 request_id=self.request_id, entities_json=entities_json(entities))


def entities_json(entities: list | None) -> bytes:
    """Cedar entities as the sidecar takes them (`entities_json`); none: empty."""
    return json.dumps(entities, separators=(",", ":"), allow_nan=False).encode() if entities else b""


def raw_json(value: bytes | bytearray | memoryview | str) -> bytes:
    """The model's argument text as bytes, unchanged. A str is encoded as UTF-8; a lone
    surrogate in it is kept (as bytes that are not valid UTF-8) so that the sidecar
    refuses the call instead of this function silently repairing it."""
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise TypeError("tool arguments must be the raw JSON text (bytes or str), not a parsed object; "
                    "use json.dumps(...) only if your SDK gives you nothing else")


def check_call_id(call_id: str) -> None:
    _require(call_id, CALL_ID, "call_id")


def _require(value: str, pattern, what: str) -> None:
    if not isinstance(value, str) or not value:
        raise ValueError(f"missing {what}")
    if not pattern.fullmatch(value):
        raise ValueError(f"{what} must match `{pattern.pattern}`")
