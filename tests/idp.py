"""An identity provider the tests serve over HTTPS: OpenID discovery and a JWKS, on
127.0.0.1 port 0, with a certificate of a CA made in the test (tests/certs.py).

    idp = TestIdp(tmp_path)              # serving; idp.issuer, idp.jwks_uri, idp.ca_file
    idp.publish(key1, key2)              # the JWKS now holds these public keys
    idp.respond("/jwks", b"...", 500)    # any body and status for a path
    idp.requests["/jwks"]                # how many GETs each path has had
    idp.close()
"""

from __future__ import annotations

import http.server
import json
import pathlib
import ssl
import threading
from collections import Counter

from certs import CertificateAuthority
from joserfc.jwk import Key

JWKS_PATH = "/jwks"
DISCOVERY_PATH = "/.well-known/openid-configuration"


class TestIdp:
    __test__ = False  # not a test class, whatever pytest thinks of its name

    def __init__(self, directory: pathlib.Path):
        ca = CertificateAuthority("test IdP CA")
        self.ca_file = ca.write(directory / "idp-ca.pem")
        cert_file, key_file = ca.server().write(directory, "idp-server")
        self.requests: Counter[str] = Counter()
        self._routes: dict[str, tuple[int, bytes, dict[str, str]]] = {}
        self._lock = threading.Lock()
        self._server = _QuietServer(("127.0.0.1", 0), self._handler())
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert_file, key_file)
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self.issuer = f"https://127.0.0.1:{self._server.server_address[1]}"
        self.jwks_uri = self.issuer + JWKS_PATH
        self.discovery(issuer=self.issuer, jwks_uri=self.jwks_uri)
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    def respond(self, path: str, body: bytes, status: int = 200, headers: dict[str, str] | None = None) -> None:
        with self._lock:
            self._routes[path] = (status, body, headers or {"Content-Type": "application/json"})

    def discovery(self, **document: object) -> None:
        self.respond(DISCOVERY_PATH, json.dumps(document).encode())

    def publish(self, *keys: Key) -> None:
        self.respond(JWKS_PATH, json.dumps({"keys": [k.as_dict(private=False) for k in keys]}).encode())

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def _handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        idp = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                with idp._lock:
                    idp.requests[self.path] += 1
                    status, body, headers = idp._routes.get(self.path, (404, b"{}", {}))
                self.send_response(status)
                for name, value in headers.items():
                    if value:
                        self.send_header(name, value)
                if "Content-Length" not in headers:  # given as "": sent without one, ended by closing
                    self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        return Handler


class _QuietServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        """Clients that hang up early (a size cap, a refused certificate) are what some
        tests do: not worth a traceback."""
