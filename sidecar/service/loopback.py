"""Loopback addresses: where the HTTP API may listen, and whom it answers.

The HTTP API has no authentication of its own yet (it will take the gRPC listeners':
mTLS or a Unix socket). Until then it binds loopback only, since off loopback anyone who
reaches the port could ask for tokens as any principal; and it answers only requests
whose `Host` names a loopback host, so that a web page cannot reach it by rebinding a
DNS name to 127.0.0.1.
"""

from __future__ import annotations

import ipaddress

from sidecar.errors import ToolAuthzError

__all__ = ["loopback_host", "loopback_host_header"]

_LOOPBACK_NAMES = frozenset({"localhost"})


def _is_loopback(host: str) -> bool:
    if host.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def loopback_host(address: str) -> tuple[str, int]:
    """`HOST:PORT` whose host is a loopback address or `localhost` -> (host, port), or
    ToolAuthzError. The HTTP API has no authentication of its own yet: off loopback,
    anyone who reaches the port could ask for tokens as any principal."""
    host, sep, port = address.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ToolAuthzError(f"http_listen must be HOST:PORT, not `{address}`")
    if not _is_loopback(host):
        raise ToolAuthzError(
            f"http_listen `{address}` is not a loopback address: the HTTP API listens on loopback only "
            "until it has the gRPC listeners' authentication (use 127.0.0.1, ::1 or localhost)")
    return host, int(port)


def loopback_host_header(value: str) -> bool:
    host = value.rpartition("]")[0].lstrip("[") if value.startswith("[") else value.partition(":")[0]
    return _is_loopback(host)
