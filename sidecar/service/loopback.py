"""Loopback addresses and `Host` rules for the HTTP API's plaintext TCP listeners.

`http_listen` is the simple form of the HTTP API's listener: plaintext and loopback only,
since its callers are unauthenticated and off loopback anyone who reaches the port could
ask for tokens as any principal (`http_listeners` with TLS or a Unix socket authenticate
them). A plaintext listener answers only requests whose `Host` is a loopback name (or, on
an `insecure` listener off loopback, an IP address), so that a web page cannot reach it by
rebinding a DNS name to the address.
"""

from __future__ import annotations

import ipaddress

from sidecar.errors import ToolAuthzError

__all__ = ["address_host_header", "is_loopback_host", "loopback_host", "loopback_host_header"]

_LOOPBACK_NAMES = frozenset({"localhost"})


def is_loopback_host(host: str) -> bool:
    """`localhost` (any case) or a loopback IP address; a host name that might resolve
    anywhere is not."""
    if host.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def loopback_host(address: str) -> tuple[str, int]:
    """`HOST:PORT` whose host is a loopback address or `localhost` -> (host, port), or
    ToolAuthzError. `http_listen` authenticates no caller: off loopback, anyone who
    reaches the port could ask for tokens as any principal."""
    host, sep, port = address.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ToolAuthzError(f"http_listen must be HOST:PORT, not `{address}`")
    if not is_loopback_host(host):
        raise ToolAuthzError(
            f"http_listen `{address}` is not a loopback address: `http_listen` serves loopback only, "
            "since it authenticates no caller (use 127.0.0.1, ::1 or localhost, or `http_listeners` with "
            "mTLS or a Unix socket)")
    return host, int(port)


def _host_of(value: str) -> str:
    return value.rpartition("]")[0].lstrip("[") if value.startswith("[") else value.partition(":")[0]


def loopback_host_header(value: str) -> bool:
    return is_loopback_host(_host_of(value))


def address_host_header(value: str) -> bool:
    """A loopback name or an IP address: a `Host` no DNS name can be rebound to."""
    host = _host_of(value)
    if is_loopback_host(host):
        return True
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
