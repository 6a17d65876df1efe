"""The addresses the sidecar serves: TCP (plaintext, TLS or mTLS) and Unix sockets.

`planned_listeners(settings)` is what `toolauthz serve` serves: the `listeners:` of the
config, or else `listen` (and `approvals_listen`) as plaintext listeners, the
development start. Each listener is checked before anything binds:

  * a TCP listener off loopback without TLS refuses to start unless it says
    `insecure: true` (anyone who reaches it may act as any principal);
  * TLS files must load, and the key must belong to the certificate;
  * a Unix socket address is absolute (`unix:///abs/path`); `identity` is for Unix
    sockets only, and TLS for TCP only.

A Unix socket is created with its mode before anyone can connect: grpc binds it inside
a fresh private directory (mode 0700) next to the target, the file gets its mode there,
and is then hard-linked into place, which fails rather than replaces anything that
appeared at the path meanwhile. Something already at the path is removed only if it is
a socket nobody answers on (a sidecar that was killed left it); anything else is refused.
The socket file is removed when its server stops, if it is still ours.

The HTTP/JSON API's listeners (`http_listeners`, or `http_listen`) are the same
settings under the same checks; `bind_http_socket` binds them, Unix sockets the same way.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import pathlib
import socket
import ssl
import stat
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from toolauthz.errors import ToolAuthzError
from toolauthz.server.config import SERVICES, ListenerSettings, Service, Settings, TlsSettings
from toolauthz.service.callers import Transport
from toolauthz.service.loopback import is_loopback_host
from toolauthz.service.running import AioServer

log = logging.getLogger("toolauthz.server")

UNIX_PREFIX = "unix:"
# sockaddr_un holds 108 bytes with the terminating NUL.
MAX_UNIX_PATH_BYTES = 107
# How long a connect to a socket file left at the path may take to tell whether
# something serves it.
STALE_PROBE_SECONDS = 2.0


@dataclass(frozen=True)
class TcpAddress:
    host: str  # IPv6 in brackets, as written
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def loopback(self) -> bool:
        return is_loopback_host(self.host.strip("[]"))


@dataclass(frozen=True)
class UnixAddress:
    path: pathlib.Path

    def __str__(self) -> str:
        return f"unix://{self.path}"


Address = TcpAddress | UnixAddress


def split_listen(listen: str) -> tuple[str, int]:
    """`host:port` (IPv6 hosts in brackets) -> (host, port)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ToolAuthzError(f"listen address must be HOST:PORT or unix:///ABSOLUTE/PATH, not `{listen}`")
    return host, int(port)


def parse_address(text: str) -> Address:
    """`HOST:PORT`, `unix:///abs/path` or `unix:/abs/path`."""
    if not text.startswith(UNIX_PREFIX):
        return TcpAddress(*split_listen(text))
    rest = text[len(UNIX_PREFIX):]
    if rest.startswith("//"):
        rest = rest[2:]
    if not rest.startswith("/") or "\x00" in rest:
        raise ToolAuthzError(f"a Unix socket address must be unix:///ABSOLUTE/PATH, not `{text}`")
    path = pathlib.Path(os.path.normpath(rest))
    if len(os.fsencode(path)) > MAX_UNIX_PATH_BYTES:
        raise ToolAuthzError(f"the Unix socket path `{path}` is longer than {MAX_UNIX_PATH_BYTES} bytes")
    return UnixAddress(path)


def planned_listeners(settings: Settings) -> tuple[ListenerSettings, ...]:
    """What `toolauthz serve` serves, every listener checked; raises ToolAuthzError."""
    if settings.listeners:
        if "listen" in settings.model_fields_set or settings.approvals_listen:
            raise ToolAuthzError("`listeners` replaces `listen` and `approvals_listen` (and --listen, "
                                 "TOOLAUTHZ_LISTEN): give the addresses in one place")
        listeners = settings.listeners
    else:
        approvals_apart = bool(settings.approvals_listen)
        listeners = (ListenerSettings(address=settings.listen,
                                      services=tuple(s for s in SERVICES if s != "approvals" or not approvals_apart)),)
        if approvals_apart:
            listeners += (ListenerSettings(address=settings.approvals_listen, services=("approvals",)),)
    _check_each_apart(listeners, check_listener, "listeners")
    return listeners


def check_listener(listener: ListenerSettings) -> Address:
    """The listener's address, or ToolAuthzError saying what is wrong with it."""
    address = parse_address(listener.address)
    where = f"listener `{listener.address}`"
    if not listener.services or len(set(listener.services)) != len(listener.services):
        raise ToolAuthzError(f"{where}: `services` must name each service at most once, and at least one")
    if isinstance(address, UnixAddress):
        if listener.tls is not None:
            raise ToolAuthzError(f"{where}: TLS is for TCP listeners; a Unix socket's file mode is its access "
                                 "control")
        if listener.insecure:
            raise ToolAuthzError(f"{where}: `insecure` is for TCP listeners")
        return address
    if listener.identity:
        raise ToolAuthzError(f"{where}: `identity` is for Unix sockets; a TCP caller's identity comes from its "
                             "client certificate (`tls.client_ca`)")
    if listener.tls is None and not address.loopback and not listener.insecure:
        raise ToolAuthzError(
            f"{where} is off loopback without TLS: anyone who reaches it could act as any principal and "
            f"approver. Give it `tls:` (with `client_ca:` to authenticate callers), listen on 127.0.0.1 or a "
            f"Unix socket, or say `insecure: true` in its entry of `listeners:` or `http_listeners:` (see "
            f"docs/threat-model.md)")
    if listener.tls is not None:
        load_tls(listener.tls)
    return address


def transport_of(listener: ListenerSettings) -> Transport:
    tls = listener.tls
    return Transport(listener.address, verifies_clients=tls is not None and tls.client_ca is not None,
                     identity=listener.identity)


# -- TLS ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class TlsFiles:
    certificate_chain: bytes
    private_key: bytes
    client_ca: bytes | None


def _read(path: pathlib.Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ToolAuthzError(f"cannot read the TLS {what} `{path}`: {exc.strerror}") from None


def load_tls(tls: TlsSettings) -> TlsFiles:
    """The listener's PEM files, checked: a certificate chain, the private key of its
    first certificate, and the client CA's certificates if given."""
    chain, key = _read(tls.cert, "certificate"), _read(tls.key, "key")
    try:
        leaf = x509.load_pem_x509_certificates(chain)[0]
    except ValueError:
        raise ToolAuthzError(f"`{tls.cert}` holds no PEM certificate") from None
    try:
        private = serialization.load_pem_private_key(key, password=None)
    except (ValueError, TypeError):
        raise ToolAuthzError(f"`{tls.key}` holds no unencrypted PEM private key") from None
    raw = serialization.PublicFormat.SubjectPublicKeyInfo
    if (leaf.public_key().public_bytes(serialization.Encoding.DER, raw)
            != private.public_key().public_bytes(serialization.Encoding.DER, raw)):
        raise ToolAuthzError(f"the key `{tls.key}` does not belong to the certificate `{tls.cert}`")
    client_ca = None
    if tls.client_ca is not None:
        client_ca = _read(tls.client_ca, "client CA")
        try:
            x509.load_pem_x509_certificates(client_ca)
        except ValueError:
            raise ToolAuthzError(f"`{tls.client_ca}` holds no PEM certificate") from None
    return TlsFiles(chain, key, client_ca)


def server_credentials(tls: TlsSettings) -> grpc.ServerCredentials:
    """With a client CA, the handshake requires a client certificate that CA signed (and
    that is valid now): a caller without one never reaches a handler."""
    files = load_tls(tls)
    return grpc.ssl_server_credentials([(files.private_key, files.certificate_chain)],
                                       root_certificates=files.client_ca,
                                       require_client_auth=files.client_ca is not None)


# -- binding ----------------------------------------------------------------------------

def open_listener(server: AioServer, listener: ListenerSettings) -> str:
    """Binds `listener` on `server` (not started yet); returns the address it serves,
    port 0 resolved. A Unix socket file is removed once the server stops."""
    address = check_listener(listener)
    if isinstance(address, UnixAddress):
        server.after_stop(bind_unix_socket(server, address.path, listener.mode))
        return str(address)
    if listener.tls is not None:
        port = server.add_secure_port(str(address), server_credentials(listener.tls))
    else:
        port = server.add_insecure_port(str(address))
    return f"{address.host}:{port}"


def port_of(bound: str) -> int:
    """The TCP port of an address `open_listener` returned; 0 for a Unix socket."""
    return 0 if bound.startswith(UNIX_PREFIX) else split_listen(bound)[1]


def remove_stale_socket(path: pathlib.Path) -> None:
    """Makes way at `path`: nothing there is fine; a socket nobody answers on is removed;
    a socket that answers is an OSError (in use); anything else is refused."""
    try:
        found = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(found.st_mode):
        raise ToolAuthzError(f"`{path}` exists and is not a socket; refusing to replace it")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(STALE_PROBE_SECONDS)
        try:
            probe.connect(os.fspath(path))
        except ConnectionRefusedError:
            pass  # stale: no process listens on it
        except TimeoutError:
            raise OSError(f"cannot listen on unix://{path}: a process holds the socket") from None
        except OSError as exc:
            raise ToolAuthzError(f"cannot tell whether the socket `{path}` is in use ({exc.strerror}); "
                                 "remove it if no sidecar serves it") from None
        else:
            raise OSError(f"cannot listen on unix://{path}: another process serves it")
    again = os.lstat(path)
    if (again.st_dev, again.st_ino) != (found.st_dev, found.st_ino):
        raise ToolAuthzError(f"`{path}` changed while it was checked; refusing to replace it")
    log.warning("removing the stale socket %s (no process serves it)", path)
    os.unlink(path)


def bind_unix_socket(server: AioServer, path: pathlib.Path, mode: int) -> Callable[[], None]:
    """Binds `server` to a Unix socket at `path` with `mode` (see the module's doc);
    returns the function that removes the file."""
    return place_unix_socket(path, mode, lambda staged: server.add_insecure_port(f"unix:{staged}"))


def place_unix_socket(path: pathlib.Path, mode: int, bind_at: Callable[[pathlib.Path], object]) -> Callable[[], None]:
    """Creates a Unix socket at `path` with `mode` (see the module's doc): `bind_at`
    binds the socket at a path in a fresh private directory, which then gets `mode` and
    is hard-linked into place. Returns the function that removes the file."""
    remove_stale_socket(path)
    try:
        staging = pathlib.Path(tempfile.mkdtemp(prefix=".tz", dir=path.parent))  # mode 0700
    except OSError as exc:
        raise OSError(f"cannot listen on unix://{path}: {exc.strerror} in `{path.parent}`") from None
    staged = staging / "s"
    try:
        if len(os.fsencode(staged)) > MAX_UNIX_PATH_BYTES:
            raise ToolAuthzError(f"the directory of the Unix socket `{path}` is too long a path "
                                 f"(the socket is created in `{staging}` first)")
        bind_at(staged)
        os.chmod(staged, mode)
        try:
            os.link(staged, path)
        except FileExistsError:
            raise OSError(f"cannot listen on unix://{path}: something appeared at the path") from None
        except OSError as exc:
            raise OSError(f"cannot listen on unix://{path}: {exc.strerror}") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(staged)
        with contextlib.suppress(OSError):
            staging.rmdir()
    ours = os.lstat(path)

    def remove() -> None:
        with contextlib.suppress(FileNotFoundError):
            now = os.lstat(path)
            if (now.st_dev, now.st_ino) == (ours.st_dev, ours.st_ino):
                os.unlink(path)

    return remove


# -- the HTTP/JSON API's listeners ----------------------------------------------------------

def planned_http_listeners(settings: Settings) -> tuple[ListenerSettings, ...]:
    """Where the HTTP/JSON API listens: `http_listeners`, or else `http_listen` as one
    plaintext loopback listener; every one checked. Raises ToolAuthzError."""
    if settings.http_listeners and settings.http_listen:
        raise ToolAuthzError("`http_listeners` replaces `http_listen` (and TOOLAUTHZ_HTTP_LISTEN): give the HTTP "
                             "addresses in one place")
    listeners = settings.http_listeners or (
        (ListenerSettings(address=settings.http_listen, services=HTTP_SERVICES),) if settings.http_listen else ())
    _check_each_apart(listeners, check_http_listener, "HTTP listeners")
    return listeners


def _check_each_apart(listeners: Iterable[ListenerSettings], check: Callable[[ListenerSettings], Address],
                      what: str) -> None:
    """Every listener checked, and no two on one address (port 0 excepted: each binds a
    port of its own). Raises ToolAuthzError."""
    seen: set[Address] = set()
    for listener in listeners:
        address = check(listener)
        if address in seen and not (isinstance(address, TcpAddress) and address.port == 0):
            raise ToolAuthzError(f"two {what} on `{address}`")
        seen.add(address)


# The HTTP API serves the authorizer's RPCs (Authorize, Verify, ReportOutcome, GetKeys).
HTTP_SERVICES: tuple[Service, ...] = ("authorizer",)


def check_http_listener(listener: ListenerSettings) -> Address:
    """`check_listener` for an entry of `http_listeners`, whose `services` (if given) may
    name the authorizer only."""
    if "services" in listener.model_fields_set and listener.services != HTTP_SERVICES:
        raise ToolAuthzError(f"HTTP listener `{listener.address}`: the HTTP API serves the authorizer only; "
                             "leave out `services` or say [authorizer]")
    return check_listener(listener)


def http_ssl_context(tls: TlsSettings) -> ssl.SSLContext:
    """The HTTP listener's TLS, checked as `load_tls` checks gRPC's. With a client CA the
    handshake requires a client certificate that CA signed and that is valid now, as
    gRPC's does: a caller without one never reaches a handler."""
    files = load_tls(tls)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(tls.cert, tls.key)
    if files.client_ca is not None:
        # The CA's bytes as checked, not the file read again.
        context.load_verify_locations(cadata=files.client_ca.decode("ascii", "replace"))
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def bind_http_socket(listener: ListenerSettings, reuse_port: bool) -> tuple[socket.socket, Callable[[], None]]:
    """A listening socket for an HTTP listener (port 0 picks one), with the function that
    removes its Unix socket file (nothing for TCP). Raises ToolAuthzError or OSError."""
    address = check_http_listener(listener)
    if isinstance(address, UnixAddress):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            remove = place_unix_socket(address.path, listener.mode, lambda staged: sock.bind(os.fspath(staged)))
            sock.listen(2048)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        return sock, remove
    return _bind_tcp(address, listener, reuse_port), lambda: None


def _bind_tcp(address: TcpAddress, listener: ListenerSettings, reuse_port: bool) -> socket.socket:
    host = address.host.strip("[]")
    try:
        infos = socket.getaddrinfo(host, address.port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise OSError(f"cannot listen on {address}: {exc.strerror}") from None
    family, _type, _proto, _name, sockaddr = infos[0]
    if (address.loopback and listener.tls is None and not listener.insecure
            and not ipaddress.ip_address(sockaddr[0]).is_loopback):  # `localhost` resolving elsewhere
        raise ToolAuthzError(f"HTTP listener `{address}` resolves to `{sockaddr[0]}`, not a loopback address")
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:  # the workers of `--workers N` share the port, as they share the gRPC one
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(sockaddr)
        sock.listen(2048)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot listen on {address}: {exc.strerror}") from None
    return sock
