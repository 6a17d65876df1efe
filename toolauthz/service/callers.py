"""Who is calling: the identity the transport proved, never a field of the request.

`caller_of(context)` is the one place a handler learns its caller. With a client
certificate verified by a TLS listener the id is the certificate's URI SAN (e.g.
`spiffe://acme.example/agent/support`) or else its subject CN, prefixed `cn:` (e.g.
`cn:approval-console`); on a Unix socket it is the listener's configured identity; on a
plaintext development listener it is `UNAUTHENTICATED`, and every audit record says so.

The two certificate namespaces never meet: a CN reading `spiffe://acme.example/agent/support`
is the caller `cn:spiffe://acme.example/agent/support`, never the SPIFFE identity, and a
URI SAN of the scheme `cn` (which would read as a CN's id) names no caller.

How a handler knows its listener: every listener has a gRPC server of its own, and the
services of that server are registered through `TransportRegistration`, which hands each
handler a `TransportContext`: the call's own context plus the `Transport` it came
through. A context without one (a servicer driven directly, health, reflection) is
`UNAUTHENTICATED`.

A Unix socket's peer credentials (SO_PEERCRED) are not exposed by grpc python: the
socket file's mode is the access control, and whoever may open the file acts as the
listener's `identity`.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
from cryptography import x509
from cryptography.x509.oid import NameOID

log = logging.getLogger("toolauthz.callers")

# An id longer than this, or holding a control character, is no identity: it would be
# written into every audit record and log line of the caller.
MAX_CALLER_ID = 512
# The namespace of the ids that a certificate's subject CN names (one without URI SAN).
CN_PREFIX = "cn:"


@dataclass(frozen=True)
class Caller:
    id: str
    authenticated: bool


UNAUTHENTICATED = Caller("unauthenticated", False)


@dataclass(frozen=True)
class Transport:
    """What a listener proves about its callers. `verifies_clients`: a TLS listener
    with `client_ca`, whose handshake refused every caller without a certificate that CA
    signed. `identity`: the caller id of a Unix socket listener ("" for none)."""

    address: str
    verifies_clients: bool = False
    identity: str = ""

    @property
    def authenticates(self) -> bool:
        return self.verifies_clients or bool(self.identity)


def caller_of(context: Any) -> Caller:
    """The caller of the RPC behind `context` (a grpc ServicerContext)."""
    transport = context.transport if isinstance(context, TransportContext) else None
    if transport is None:
        return UNAUTHENTICATED
    return caller_through(transport, context.auth_context().get("x509_pem_cert") or []
                          if transport.verifies_clients else [])


def caller_through(transport: Transport, certificates: Sequence[bytes]) -> Caller:
    """The caller of a connection through `transport`, given the PEM client certificates
    its TLS handshake verified (the gRPC and the HTTP listeners alike)."""
    if transport.verifies_clients:
        # The handshake verified the certificate; without one no call gets this far.
        return caller_of_certificate(certificates[0]) if len(certificates) == 1 else UNAUTHENTICATED
    if transport.identity:
        return Caller(transport.identity, True)
    return UNAUTHENTICATED


@functools.lru_cache(maxsize=1024)
def caller_of_certificate(pem: bytes) -> Caller:
    """The id a verified client certificate names: its one URI SAN, else `cn:` and its one
    subject CN. A certificate with several URI SANs (or CNs) names no single caller, and
    one whose name is unusable (or a URI SAN in the CNs' namespace) names none: all are
    UNAUTHENTICATED."""
    try:
        certificate = x509.load_pem_x509_certificate(pem)
    except ValueError:
        log.warning("a verified client certificate could not be parsed; the caller is unauthenticated")
        return UNAUTHENTICATED
    try:
        uris = certificate.extensions.get_extension_for_class(
            x509.SubjectAlternativeName).value.get_values_for_type(x509.UniformResourceIdentifier)
    except x509.ExtensionNotFound:
        uris = []
    names = uris or [str(a.value) for a in certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    if len(names) != 1 or not _usable(names[0]):
        log.warning("a client certificate names %d usable identities (%s); the caller is unauthenticated",
                    len(names), "URI SANs" if uris else "subject CNs")
        return UNAUTHENTICATED
    if not uris:
        return Caller(CN_PREFIX + names[0], True)
    if names[0][:len(CN_PREFIX)].lower() == CN_PREFIX:
        log.warning("a client certificate's URI SAN is in the `cn:` namespace of subject CNs; "
                    "the caller is unauthenticated")
        return UNAUTHENTICATED
    return Caller(names[0], True)


def _usable(name: str) -> bool:
    return 0 < len(name) <= MAX_CALLER_ID and name.isprintable() and name == name.strip()


class TransportContext:
    """A handler's ServicerContext with the Transport of its listener; everything else is
    the call's own context."""

    __slots__ = ("_context", "transport")

    def __init__(self, context: Any, transport: Transport):
        self._context = context
        self.transport = transport

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)


def _tagged(behavior: Callable[..., Any], transport: Transport) -> Callable[..., Any]:
    """`behavior` called with a TransportContext, of the same kind (coroutine, async
    generator or plain function), since grpc.aio runs each kind its own way."""
    if inspect.isasyncgenfunction(behavior):
        async def streaming(request: Any, context: Any) -> AsyncIterator[Any]:
            async with aclosing(behavior(request, TransportContext(context, transport))) as messages:
                async for message in messages:
                    yield message
        return streaming
    if inspect.iscoroutinefunction(behavior):
        async def unary_async(request: Any, context: Any) -> Any:
            return await behavior(request, TransportContext(context, transport))
        return unary_async

    def plain(request: Any, context: Any) -> Any:
        return behavior(request, TransportContext(context, transport))
    return plain


if TYPE_CHECKING:  # generic in grpc's stubs only
    Handler = grpc.RpcMethodHandler[Any, Any]


def _with_transport(handler: Handler, transport: Transport) -> Handler:
    kinds = ("unary_unary", "unary_stream", "stream_unary", "stream_stream")
    # grpc's handlers are namedtuples; the stubs declare only the abstract class.
    tagged: Handler = handler._replace(**{  # type: ignore[attr-defined]
        kind: _tagged(getattr(handler, kind), transport) for kind in kinds if getattr(handler, kind) is not None})
    return tagged


class _TransportGenericHandler(grpc.GenericRpcHandler):
    def __init__(self, inner: grpc.GenericRpcHandler, transport: Transport):
        self._inner, self._transport = inner, transport

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> Handler | None:
        handler = self._inner.service(handler_call_details)
        return None if handler is None else _with_transport(handler, self._transport)


class TransportRegistration:
    """A view of a grpc server (or of another such view) for the generated
    `add_*Servicer_to_server` functions: the handlers it registers receive a
    TransportContext naming `transport`."""

    def __init__(self, server: Any, transport: Transport):
        self._server, self._transport = server, transport

    def add_generic_rpc_handlers(self, handlers: Iterable[grpc.GenericRpcHandler]) -> None:
        self._server.add_generic_rpc_handlers(tuple(_TransportGenericHandler(h, self._transport) for h in handlers))

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Handler]) -> None:
        self._server.add_registered_method_handlers(
            service, {name: _with_transport(h, self._transport) for name, h in handlers.items()})
