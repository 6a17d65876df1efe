"""Which `Host` (and `Origin`) headers the gateway's HTTP endpoint answers: the DNS
rebinding defence, on every listen address.

A web page an attacker serves can make a browser on this machine send requests to
`rebind.attacker.example`, a name the attacker then points at the gateway's address.
The request arrives with the attacker's name in `Host`; refusing every name the gateway
was not configured to be reached by refuses it (421), on 127.0.0.2 as on 127.0.0.1.

The names allowed, any port each:

* the listen address itself (`127.0.0.2`, `[::1]`, `10.0.0.5`);
* on 127.0.0.1 and ::1, `localhost` and the other of the two as well (what the MCP
  SDK allows there);
* the host of `oauth.resource`, the gateway's public URL;
* every entry of `allowed_hosts` in the configuration: `name` (any port) or `name:port`.

An `Origin`, when a browser sends one, must be `http://` or `https://` one of the same.
"""

from __future__ import annotations

import ipaddress
import re
import urllib.parse
from collections.abc import Iterable

from mcp.server.transport_security import TransportSecuritySettings

from toolauthz.display.escape import display
from toolauthz.errors import RequestError

__all__ = ["transport_security", "check_allowed_hosts"]

_LOCAL_NAMES = ("127.0.0.1", "localhost", "[::1]")
# A DNS name or an IPv4 address (letters, digits, dots, hyphens), or a bracketed IPv6
# address, with an optional port: nothing that could widen the match (no `*`, no path).
_HOST = re.compile(r"^(?:[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?|\[[0-9A-Fa-f:.]{2,45}\])(?::[0-9]{1,5})?\Z")


def check_allowed_hosts(raw: object) -> tuple[str, ...]:
    """The configuration's `allowed_hosts`, lower-cased; RequestError names a bad entry."""
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(isinstance(entry, str) for entry in raw):
        raise RequestError("`allowed_hosts` must list host names (`name` or `name:port`)")
    for entry in raw:
        if not _HOST.fullmatch(entry):
            raise RequestError(f"allowed_hosts: `{display(entry[:80])}` is not a host name or `name:port`")
    return tuple(entry.lower() for entry in raw)


def _bracketed(host: str) -> str:
    try:
        return f"[{host}]" if ipaddress.ip_address(host).version == 6 else host
    except ValueError:
        return host


def transport_security(listen_host: str, allowed_hosts: Iterable[str] = (),
                       resource_url: str | None = None) -> TransportSecuritySettings:
    """The SDK's Host/Origin check, always on, for the names in the module docstring."""
    names = [_bracketed(listen_host.strip("[]")).lower()]
    if names[0] in _LOCAL_NAMES:
        names += [name for name in _LOCAL_NAMES if name not in names]
    if resource_url:
        resource = urllib.parse.urlsplit(resource_url)
        if resource.hostname:
            names.append(_bracketed(resource.hostname).lower())
            if resource.port is not None:
                names.append(f"{_bracketed(resource.hostname).lower()}:{resource.port}")
    hosts: list[str] = []
    for name in names:
        hosts += [name, f"{name}:*"]  # `name` alone: a Host header on the scheme's default port
    for entry in allowed_hosts:
        hosts += [entry] if _has_port(entry) else [entry, f"{entry}:*"]
    origins = [f"{scheme}://{host}" for host in hosts for scheme in ("http", "https")]
    return TransportSecuritySettings(enable_dns_rebinding_protection=True, allowed_hosts=list(dict.fromkeys(hosts)),
                                     allowed_origins=list(dict.fromkeys(origins)))


def _has_port(entry: str) -> bool:
    return re.search(r":[0-9]{1,5}\Z", entry) is not None and not entry.endswith("]")
