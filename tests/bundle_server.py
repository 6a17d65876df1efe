"""A bundle server the tests run: HTTPS on 127.0.0.1 (port 0), serving one archive with
an ETag, that a test can make hostile (`respond`), stop and start again on its port.

    server = BundleServer(ca, tmp_path).start()
    server.publish(archive)                 # a new archive, a new ETag
    server.respond = lambda h: h.redirect("https://elsewhere.example/b.tar.gz")
    server.url                              # https://127.0.0.1:PORT/bundle.tar.gz
"""

from __future__ import annotations

import hashlib
import http.server
import pathlib
import ssl
import threading
from collections.abc import Callable

from tests.certs import CertificateAuthority

PATH = "/bundle.tar.gz"


class Handler(http.server.BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args) -> None:
        pass

    def do_GET(self) -> None:
        owner = self.server.owner
        owner.requests.append({k.lower(): v for k, v in self.headers.items()})
        if owner.bearer and self.headers.get("Authorization") != f"Bearer {owner.bearer}":
            self.send(401, b"no")
        elif owner.respond is not None:
            owner.respond(self)
        elif self.path != PATH:
            self.send(404, b"")
        elif owner.honour_etag and self.headers.get("If-None-Match") == owner.etag:
            self.send_response(304)
            self.send_header("ETag", owner.etag)
            self.send_header("Content-Length", "0")
            self.end_headers()
        else:
            self.send(200, owner.archive, {"ETag": owner.etag, "Content-Type": "application/gzip"})

    def send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def redirect(self, location: str) -> None:
        self.send(302, b"", {"Location": location})


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    owner: BundleServer


class BundleServer:
    def __init__(self, ca: CertificateAuthority, directory: pathlib.Path, *,
                 client_ca: CertificateAuthority | None = None):
        cert, key = ca.server().write(directory, "bundle-server")
        self._tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._tls.load_cert_chain(cert, key)
        if client_ca is not None:  # mTLS: a client certificate of this CA is required
            self._tls.verify_mode = ssl.CERT_REQUIRED
            self._tls.load_verify_locations(cadata=client_ca.pem.decode())
        self.port = 0
        self.archive = b""
        self.etag = ""
        self.honour_etag = True
        self.bearer = ""  # when set, a request without `Authorization: Bearer <it>` gets 401
        self.respond: Callable[[Handler], None] | None = None
        self.requests: list[dict[str, str]] = []
        self.stopping = threading.Event()  # ends a trickling answer at teardown
        self._http: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}{PATH}"

    def publish(self, archive: bytes, etag: str | None = None) -> None:
        self.archive = archive
        self.etag = etag if etag is not None else f'"{hashlib.sha256(archive).hexdigest()[:16]}"'

    def start(self) -> BundleServer:
        self._http = _Server(("127.0.0.1", self.port), Handler, bind_and_activate=False)
        self._http.owner = self
        self._http.server_bind()
        self._http.server_activate()
        self._http.socket = self._tls.wrap_socket(self._http.socket, server_side=True)
        self.port = self._http.server_address[1]
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Nothing listens on the port until `start` again (an outage)."""
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None
        if self._thread is not None:
            self._thread.join()
