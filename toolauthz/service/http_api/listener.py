"""The HTTP listener: uvicorn on the gRPC server's event loop, and what it proves about
each connection before the application reads a byte of a request's body.

Callers are authenticated as on the gRPC listeners (service/callers.py): on a TLS
listener with a client CA, the verified client certificate's URI SAN (else its CN); on a
Unix socket, the listener's identity; on plaintext TCP no one (`unauthenticated`). The
listener puts the connection's `HttpPeer` in each request's scope (`_IdentifyingH11`), so
the roles gate knows the caller from the request's head alone. Plaintext TCP is the
listener a web page in the machine's browser can reach: its requests must name a
loopback `Host` (or, off loopback, an IP address), so that no DNS name can be rebound to it.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass

import uvicorn
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from toolauthz.service.callers import UNAUTHENTICATED, Caller, Transport, caller_through
from toolauthz.service.loopback import address_host_header, loopback_host_header

__all__ = ["HostRule", "HttpListener", "HttpPeer", "any_host", "host_rule", "peer_of"]

# Which `Host` a request must name: any (TLS and Unix sockets, which no web page can
# reach under a name of its choosing), a loopback one (plaintext loopback), or a
# loopback one or an IP address (plaintext off loopback, `insecure: true`).
HostRule = Callable[[str], bool]


def any_host(_host: str) -> bool:
    return True


def host_rule(*, plaintext: bool, loopback: bool) -> HostRule:
    if not plaintext:
        return any_host
    return loopback_host_header if loopback else address_host_header


@dataclass(frozen=True)
class HttpPeer:
    """What the listener proved about a connection: its caller, and the `Host` rule."""

    caller: Caller
    answers_host: HostRule


# A request without the listener's peer (an app driven by something else) proves no
# caller and gets the strictest Host rule.
_UNPROVEN = HttpPeer(UNAUTHENTICATED, loopback_host_header)
_PEER = "toolauthz.peer"


def peer_of(request: Request) -> HttpPeer:
    peer = request.scope.get(_PEER)
    return peer if isinstance(peer, HttpPeer) else _UNPROVEN


def _identifying(app: ASGIApp, peer: HttpPeer) -> ASGIApp:
    async def with_peer(scope: Scope, receive: Receive, send: Send) -> None:
        scope[_PEER] = peer
        await app(scope, receive, send)
    return with_peer


def _identifying_protocol(transport: Transport, answers_host: HostRule) -> type[H11Protocol]:
    """uvicorn's h11 protocol, which puts the connection's HttpPeer in each request's
    scope. asyncio calls `connection_made` once the TLS handshake has verified the client
    certificate, so the certificate is read once per connection."""

    class _IdentifyingH11(H11Protocol):
        def connection_made(self, connection: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(connection)
            ssl_object = connection.get_extra_info("ssl_object")
            der = ssl_object.getpeercert(binary_form=True) if isinstance(ssl_object, ssl.SSLObject) else None
            certificates = [ssl.DER_cert_to_PEM_cert(der).encode("ascii")] if der else []
            self.app = _identifying(self.app, HttpPeer(caller_through(transport, certificates), answers_host))

    return _IdentifyingH11


class _Server(uvicorn.Server):
    """uvicorn's server with an event set once it listens."""

    def __init__(self, config: uvicorn.Config):
        super().__init__(config)
        self.listening = asyncio.Event()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        self.listening.set()


class HttpListener:
    """uvicorn serving an HttpApi (or the console) on the running event loop (the gRPC
    server's), so that every transport shares one loop, one decision pump and one desk."""

    def __init__(self, server: _Server, task: asyncio.Task[None], port: int):
        self._server = server
        self._task = task
        self.port = port

    @classmethod
    async def start(cls, app: ASGIApp, sock: socket.socket, *, transport: Transport, answers_host: HostRule,
                    tls: ssl.SSLContext | None = None) -> HttpListener:
        """Serves `app` (an HttpApi's, or the console's) on `sock` (bound and listening;
        the listener owns it from here), with
        `tls` if given; callers are proven as `transport` says. Raises OSError when it
        cannot serve."""
        config = uvicorn.Config(app, http=_identifying_protocol(transport, answers_host), ws="none",
                                lifespan="off", log_config=None, access_log=False, proxy_headers=False,
                                server_header=False, timeout_graceful_shutdown=5,
                                ssl_context_factory=None if tls is None else (lambda _config, _default: tls))
        server = _Server(config)
        task = asyncio.create_task(server.serve(sockets=[sock]))
        listening = asyncio.create_task(server.listening.wait())
        await asyncio.wait({task, listening}, return_when=asyncio.FIRST_COMPLETED)
        if not server.listening.is_set():
            listening.cancel()
            sock.close()
            task.result()  # raises what stopped it
            raise OSError(f"cannot serve HTTP on {transport.address}")
        name = sock.getsockname()
        return cls(server, task, name[1] if isinstance(name, tuple) else 0)

    async def stop(self, grace: float | None) -> None:
        """Stops taking requests; those in flight get `grace` seconds (None: none)."""
        self._server.config.timeout_graceful_shutdown = None if grace is None else max(1, round(grace))
        self._server.should_exit = True
        if grace is None:
            self._server.force_exit = True
        await self._task
