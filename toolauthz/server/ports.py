"""The TCP ports the workers share: an address in use is refused, port 0 is resolved to
one port that every worker joins (SO_REUSEPORT)."""

from __future__ import annotations

import contextlib
import errno
import socket
from collections.abc import Iterator

from toolauthz.server.config import ListenerSettings
from toolauthz.server.listeners import UNIX_PREFIX, split_listen


def with_reserved_port(reserved: contextlib.ExitStack, listener: ListenerSettings) -> ListenerSettings:
    """The listener with its port held for the workers (port 0 resolved); a Unix socket
    listener as it is."""
    if listener.address.startswith(UNIX_PREFIX):
        return listener
    return listener.model_copy(update={"address": reserved_address(reserved, listener.address)})


def reserved_address(reserved: contextlib.ExitStack, address: str) -> str:
    """`HOST:PORT` with its port held for the workers until `reserved` closes (port 0
    resolved to the port chosen)."""
    host, port = split_listen(address)
    return f"{host}:{reserved.enter_context(reserved_port(host, port))}"


@contextlib.contextmanager
def reserved_port(host: str, port: int) -> Iterator[int]:
    """Refuse an address in use; for port 0, hold a port every worker can join.

    The workers bind with SO_REUSEPORT, which also lets them join a port some other
    program happens to listen on with that option: so first bind without it, which fails
    if anyone holds the port. For port 0, a socket bound (not listening) with
    SO_REUSEPORT keeps the chosen port ours until the workers listen on it; a socket
    that does not listen receives no connections."""
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    bind_host = host.strip("[]")
    if port:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC does
            try:
                probe.bind((bind_host, port))
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise OSError(f"cannot listen on {host}:{port}: the address is in use") from None
                raise OSError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
        yield port
        return
    with socket.socket(family, socket.SOCK_STREAM) as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            holder.bind((bind_host, 0))
        except OSError as exc:
            raise OSError(f"cannot listen on {host}:0: {exc.strerror}") from None
        yield holder.getsockname()[1]
