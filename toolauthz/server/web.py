"""The web side of a sidecar: the HTTP/JSON API's listeners and the browser console,
served on a gRPC server's loop (as `create_server` and `start_listeners` start them).
Imported only when one is configured: Starlette, uvicorn and Jinja2 are then loaded, and
a sidecar serving gRPC alone never pays their memory."""

from __future__ import annotations

import pathlib

from toolauthz.console import Console, ConsoleDeps
from toolauthz.console.session import Sessions, load_or_create_secret
from toolauthz.console.signin import Authenticator, DevSignIn, OidcSignIn, ProxySignIn
from toolauthz.errors import ToolAuthzError
from toolauthz.server.config import ListenerSettings
from toolauthz.server.listeners import (
    TcpAddress,
    bind_http_socket,
    http_ssl_context,
    parse_address,
    port_of,
    split_listen,
    transport_of,
)
from toolauthz.server.notifications import dead_letters_of
from toolauthz.server.sidecar import Sidecar
from toolauthz.service.http_api import HttpApi, HttpListener, any_host, host_rule
from toolauthz.service.loopback import is_loopback_host
from toolauthz.service.running import AioServer


def start_http(sidecar: Sidecar, server: AioServer, listeners: tuple[ListenerSettings, ...],
               reuse_port: bool) -> tuple[str, ...]:
    """The HTTP/JSON API on each of `listeners`, on a gRPC server's loop, handing its work
    to the same pump; they stop with that server (Unix socket files removed then). Returns
    the addresses served (port 0 resolved); the first TCP one's port is `server.http_port`."""
    if not listeners:
        return ()
    settings = sidecar.settings
    api = HttpApi(sidecar.authorizer, sidecar.pump, sidecar.keyring, gate=sidecar.gate, desk=sidecar.approvals,
                  watches=sidecar.watches, audit_log=sidecar.audit_log,
                  max_body_bytes=settings.max_message_bytes, max_concurrent=settings.max_concurrent_rpcs,
                  batch_limits=settings.batch.limits())
    served = tuple(_serve_http(server, api, listener, reuse_port) for listener in listeners)
    server.http_port = next((port_of(address) for address in served if port_of(address)), None)
    return served


def _serve_http(server: AioServer, api: HttpApi, listener: ListenerSettings, reuse_port: bool) -> str:
    """Serves `api` on `listener`; returns the address served (port 0 resolved)."""
    address = parse_address(listener.address)
    tcp = isinstance(address, TcpAddress)
    tls = http_ssl_context(listener.tls) if listener.tls is not None else None
    sock, remove = bind_http_socket(listener, reuse_port and tcp)
    server.after_stop(remove)
    answers_host = host_rule(plaintext=tcp and tls is None,
                             loopback=isinstance(address, TcpAddress) and address.loopback)
    serving = server.run(lambda: HttpListener.start(api.app, sock, transport=transport_of(listener),
                                                    answers_host=answers_host, tls=tls))
    server.add_companion(serving.stop)
    return f"{address.host}:{serving.port}" if isinstance(address, TcpAddress) else str(address)


def console_of(sidecar: Sidecar) -> Console:
    """The browser console of `console_listen` over this sidecar's desk and audit log,
    with the authenticator `console.sign_in` names."""
    settings = sidecar.settings
    c = settings.console
    loopback = is_loopback_host(split_listen(settings.console_listen)[0].strip("[]"))
    authenticator: Authenticator
    if c.sign_in == "proxy" and c.proxy is not None:
        p = c.proxy
        authenticator = ProxySignIn(p.trusted, user_header=p.user_header, groups_header=p.groups_header,
                                    tenant_header=p.tenant_header, principal_type=p.principal_type, tenant=p.tenant)
    elif c.sign_in == "oidc" and c.oidc is not None and sidecar.approvals.id_tokens is not None:
        authenticator = OidcSignIn(sidecar.approvals.proof.prove_person, c.oidc.tenant)
    elif c.sign_in == "dev":
        authenticator = DevSignIn(loopback=loopback)
    else:
        raise ToolAuthzError(f"console.sign_in `{c.sign_in}` is not configured completely")
    deps = ConsoleDeps(sidecar.approvals, sidecar.audit_log, sidecar.audit_key.public_key, sidecar.status,
                       dead_letters=dead_letters_of(sidecar.store, settings.notifications))
    sessions = Sessions(load_or_create_secret(pathlib.Path(settings.data_dir)), c.session_seconds)
    return Console(deps, authenticator, sessions, auditor_groups=c.auditor_groups, loopback=loopback)


def start_console(sidecar: Sidecar, server: AioServer, reuse_port: bool) -> str:
    """The console on `console_listen`, on a gRPC server's loop (as the HTTP API is), so a
    decision made there pokes the same desk's watchers; stopped with that server. Returns
    the address served (port 0 resolved; `server.console_port`), or "" when it is off."""
    address = sidecar.settings.console_listen
    if not address:
        return ""
    console = console_of(sidecar)
    # Plaintext off loopback is allowed: the console then sits behind the reverse proxy
    # that terminates TLS (and, with `proxy` sign-in, authenticates people).
    listener = ListenerSettings(address=address, insecure=True)
    sock, _remove = bind_http_socket(listener, reuse_port)
    serving = server.run(lambda: HttpListener.start(console.app, sock, transport=transport_of(listener),
                                                    answers_host=any_host))
    server.add_companion(serving.stop)
    server.console_port = serving.port
    return f"{split_listen(address)[0]}:{serving.port}"
