"""Loopback addresses and `Host` rules for the HTTP API's plaintext TCP listeners.

`http_listen` is the simple form of the HTTP API's listener: plaintext and loopback only,
since its callers are unauthenticated and off loopback anyone who reaches the port could
ask for tokens as any principal (`http_listeners` with TLS or a Unix socket authenticate
them). A plaintext listener answers only requests whose `Host` is a loopback name (or, on
an `insecure` listener off loopback, an IP address), so that a web page cannot reach it by
rebinding a DNS name to the address.

A `Host` value is read as RFC 9110 (section 7.2) defines it, `uri-host [":" port]` with
RFC 3986's host: a bracketed IPv6 address, or a name or IPv4 address of unreserved
characters. Anything else is no host at all, and answers no rule: userinfo
(`localhost:80@evil`, which a lax split reads as `localhost`), a path or trailing text,
percent-encoding, a port that is not a number of at most 65535.
"""

from __future__ import annotations

import ipaddress
import re

from toolauthz.errors import ToolAuthzError

__all__ = ["address_host_header", "host_of_header", "is_loopback_host", "loopback_host", "loopback_host_header"]

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


# RFC 3986: IP-literal / IPv4address / reg-name, then an optional port of digits. A
# reg-name's percent-encoding and sub-delims are left out: no name this checks needs them.
_HOST_HEADER = re.compile(r"(?:\[(?P<literal>[0-9A-Fa-f:.]+)\]|(?P<name>[A-Za-z0-9._~-]+))(?::(?P<port>[0-9]*))?")


def host_of_header(value: str) -> str | None:
    """The host a `Host` header value names (an IPv6 address without its brackets), or
    None when the value is not `host [":" port]`."""
    match = _HOST_HEADER.fullmatch(value)
    if match is None:
        return None
    port = match["port"]
    if port and (len(port) > 5 or int(port) > 65535):
        return None
    literal = match["literal"]
    if literal is None:
        return str(match["name"])
    try:
        return literal if ipaddress.ip_address(literal).version == 6 else None
    except ValueError:
        return None


def loopback_host_header(value: str) -> bool:
    host = host_of_header(value)
    return host is not None and is_loopback_host(host)


def address_host_header(value: str) -> bool:
    """A loopback name or an IP address: a `Host` no DNS name can be rebound to."""
    host = host_of_header(value)
    if host is None:
        return False
    if is_loopback_host(host):
        return True
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
