"""The startup log's account of each listener: who its callers are, and what they may do.

One line per listener, from its transport (toolauthz/service/callers.py: what the listener
proves about a caller) and the `callers` of the config (toolauthz/service/roles.py: what a
proven caller may call). A line is a warning when whoever reaches the listener may act as
any principal and approver; otherwise it is information.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

from toolauthz.display.escape import shown
from toolauthz.server.config import CallerSettings, ListenerSettings
from toolauthz.server.listeners import UNIX_PREFIX, transport_of

ANY_PRINCIPAL = "may call every RPC of its services as any principal and approver"


def listener_notices(listeners: Iterable[ListenerSettings], callers: Sequence[CallerSettings], *,
                     http: bool = False) -> list[tuple[int, str]]:
    """(log level, line) for each listener; `http`: the HTTP API's listeners."""
    return [_notice(listener, callers, http) for listener in listeners]


def _notice(listener: ListenerSettings, callers: Sequence[CallerSettings], http: bool) -> tuple[int, str]:
    transport = transport_of(listener)
    what = (f"HTTP listener {shown(listener.address)}" if http
            else f"listener {shown(listener.address)} ({', '.join(listener.services)})")
    if transport.identity:
        return _socket_notice(what, transport.identity, callers)
    if transport.verifies_clients:
        who = "callers are identified by their client certificate (URI SAN, else CN), which `client_ca` signed"
        if not callers:
            return logging.WARNING, f"{what}: {who}; with no `callers` configured, each {ANY_PRINCIPAL}"
        return logging.INFO, (f"{what}: {who}; each may call what its entry of `callers` grants "
                              f"({len(callers)} configured), any other GetKeys only")
    how = ("TLS without `client_ca`" if listener.tls is not None
           else "a Unix socket without `identity`" if listener.address.startswith(UNIX_PREFIX) else "plaintext")
    if not callers:
        return logging.WARNING, (f"{what}: callers are not authenticated ({how}): whoever reaches it "
                                 f"{ANY_PRINCIPAL} (development mode; see docs/threat-model.md)")
    return logging.INFO, (f"{what}: callers are not authenticated ({how}): with `callers` configured, they may "
                          f"call GetKeys only")


def _socket_notice(what: str, identity: str, callers: Sequence[CallerSettings]) -> tuple[int, str]:
    who = f"every caller is `{shown(identity)}` (whoever may open the socket file)"
    if not callers:
        return logging.WARNING, f"{what}: {who}; with no `callers` configured, it {ANY_PRINCIPAL}"
    entry = next((c for c in callers if c.id == identity), None)
    if entry is None:
        return logging.INFO, f"{what}: {who}, which `callers` does not list: GetKeys only"
    return logging.INFO, (f"{what}: {who}: roles {', '.join(entry.roles)} in tenants "
                          f"{', '.join(shown(t) for t in entry.tenants)}")
