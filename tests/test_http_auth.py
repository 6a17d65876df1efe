"""The HTTP/JSON API authenticates its callers as the gRPC listeners do: mTLS (the client
certificate's URI SAN is the caller) or a Unix socket (the listener's identity), under the
same `callers:` roles and the same listener checks."""

from __future__ import annotations

import http.client
import os
import pathlib
import shutil
import socket
import ssl
import stat
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import calls_audited, order_entity
from transports import Call, Context, _body, exchange

from tests.certs import CertificateAuthority
from toolauthz.audit.store import AuditQuery
from toolauthz.errors import ToolAuthzError
from toolauthz.server.build import build_sidecar, create_server
from toolauthz.server.config import ListenerSettings
from toolauthz.server.listeners import planned_http_listeners
from toolauthz.service.loopback import address_host_header, loopback_host_header

RUNTIME = "spiffe://acme.example/agent/support"
STRANGER = "spiffe://elsewhere.example/anyone"
ALICE = Context(entities=[order_entity("ord_1", "alice")])
REFUND = Call("toolu_1", "issue_refund", b'{"order_id": "ord_1", "amount_cents": 1500}')


def _with(settings: Any, **members: Any) -> Any:
    return type(settings).model_validate({**settings.model_dump(), **members})


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: pathlib.Path):
        super().__init__("localhost", timeout=30)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(30)
        self.sock.connect(os.fspath(self._path))


@pytest.fixture
def pki(tmp_path: pathlib.Path) -> dict[str, Any]:
    ca = CertificateAuthority()
    cert, key = ca.server().write(tmp_path / "pki", "server")
    return {"ca": ca, "ca_file": ca.write(tmp_path / "pki" / "ca.pem"), "cert": cert, "key": key,
            "dir": tmp_path / "pki"}


@pytest.fixture
def mtls_http(settings, clock, pki):
    """A sidecar with `callers:` and an mTLS HTTP listener; connect(identity) -> an HTTPS
    connection whose client certificate names `identity` (None: no certificate)."""
    configured = _with(settings, callers=[{"id": RUNTIME, "roles": ["runtime"], "tenants": ["acme"]}],
                       http_listeners=[{"address": "127.0.0.1:0", "tls": {
                           "cert": pki["cert"], "key": pki["key"], "client_ca": pki["ca_file"]}}])
    sidecar = build_sidecar(configured, clock=clock)
    server, _port = create_server(sidecar, "127.0.0.1:0")

    def connect(identity: str | None, ca: CertificateAuthority | None = None) -> http.client.HTTPSConnection:
        context = ssl.create_default_context(cafile=pki["ca_file"])
        if identity is not None:
            issued = (ca or pki["ca"]).issue(uris=(identity,))
            cert, key = issued.write(pki["dir"], f"client-{len(os.listdir(pki['dir']))}")
            context.load_cert_chain(cert, key)
        return http.client.HTTPSConnection("127.0.0.1", server.http_port, context=context, timeout=30)

    yield sidecar, connect
    server.stop(None).wait()
    sidecar.close()


@pytest.mark.parametrize("certificate", ["none", "another CA's"])
def test_an_mtls_http_listener_refuses_a_client_without_a_certificate_from_its_ca(mtls_http, certificate):
    sidecar, connect = mtls_http
    connection = connect(None) if certificate == "none" else connect(RUNTIME, CertificateAuthority("other"))
    # TLS 1.3 sends the client's certificate after the client considers the handshake
    # done: the server's refusal arrives as an alert on the first read.
    with pytest.raises((ssl.SSLError, ConnectionError, http.client.RemoteDisconnected)):
        exchange(connection, "GET", "/healthz")
    assert calls_audited(sidecar) == []


def test_the_client_certificate_is_the_caller_and_the_roles_decide(mtls_http):
    sidecar, connect = mtls_http
    status, allowed = exchange(connect(RUNTIME), "POST", "/v1/authorize", _body(ctx=ALICE, call=REFUND))
    assert (status, allowed["decision"]) == (200, "ALLOW")
    stranger = Call("toolu_2", REFUND.name, REFUND.input)
    status, refused = exchange(connect(STRANGER), "POST", "/v1/authorize", _body(ctx=ALICE, call=stranger))
    assert (status, refused["error"]["code"]) == (403, "PERMISSION_DENIED")
    records = {r.event.call_id: r.event for r in sidecar.audit_log.query(AuditQuery(), limit=10)}
    assert (records["toolu_1"].result, records["toolu_1"].caller) == ("ALLOW", RUNTIME)
    # Refused before its body was read: the record names the caller, not what the body says,
    # and goes to the system stream (an unlisted caller is bound to no tenant).
    assert (records[""].result, records[""].caller, records[""].tenant) == ("refused", STRANGER, "_system")
    assert "toolu_2" not in records


def test_an_mtls_http_listener_answers_any_host_name(mtls_http):
    """No web page can reach a TLS listener under a name it rebinds: the certificate
    would not match it. The Host rule is for plaintext TCP."""
    _sidecar, connect = mtls_http
    assert exchange(connect(RUNTIME), "GET", "/healthz", headers={"Host": "sidecar.internal"}) == \
        (200, {"status": "SERVING"})


@pytest.fixture
def sock_dir() -> Iterator[pathlib.Path]:
    """A short directory: a socket path holds at most 107 bytes."""
    path = pathlib.Path(tempfile.mkdtemp(prefix="tz", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_unix_socket_http_listener_has_its_mode_and_identity_and_is_removed_at_stop(settings, clock, sock_dir):
    path = sock_dir / "http.sock"
    configured = _with(settings, callers=[{"id": RUNTIME, "roles": ["runtime"], "tenants": ["acme"]}],
                       http_listeners=[{"address": f"unix://{path}", "mode": 0o600, "identity": RUNTIME}])
    sidecar = build_sidecar(configured, clock=clock)
    server, _port = create_server(sidecar, "127.0.0.1:0")
    try:
        assert stat.S_ISSOCK(os.lstat(path).st_mode) and stat.S_IMODE(os.lstat(path).st_mode) == 0o600
        assert server.http_port is None
        status, allowed = exchange(_UnixConnection(path), "POST", "/v1/authorize", _body(ctx=ALICE, call=REFUND))
        assert (status, allowed["decision"]) == (200, "ALLOW")
        [record] = calls_audited(sidecar)
        assert record.event.caller == RUNTIME
    finally:
        server.stop(None).wait()
        sidecar.close()
    assert not os.path.lexists(path)
    assert os.listdir(sock_dir) == []  # no staging directory left behind


def test_a_unix_socket_http_listener_without_identity_is_unauthenticated(settings, clock, sock_dir):
    path = sock_dir / "http.sock"
    configured = _with(settings, callers=[{"id": RUNTIME, "roles": ["runtime"], "tenants": ["acme"]}],
                       http_listeners=[{"address": f"unix://{path}"}])
    sidecar = build_sidecar(configured, clock=clock)
    server, _port = create_server(sidecar, "127.0.0.1:0")
    try:
        status, refused = exchange(_UnixConnection(path), "POST", "/v1/authorize", _body(ctx=ALICE, call=REFUND))
        assert (status, refused["error"]["code"]) == (403, "PERMISSION_DENIED")
        [record] = calls_audited(sidecar)
        assert (record.event.result, record.event.caller) == ("refused", "unauthenticated")
    finally:
        server.stop(None).wait()
        sidecar.close()


@pytest.mark.parametrize("address", ["0.0.0.0:0", "192.168.1.10:8080", "example.com:80", "[::]:0"])
def test_a_non_loopback_plaintext_http_listener_refuses_to_start_without_insecure(settings, address):
    with pytest.raises(ToolAuthzError, match="off loopback without TLS"):
        planned_http_listeners(_with(settings, http_listeners=[{"address": address}]))
    [listener] = planned_http_listeners(_with(settings, http_listeners=[{"address": address, "insecure": True}]))
    assert listener.insecure


def test_http_listeners_are_checked_as_grpc_listeners_are(settings, pki, sock_dir):
    with pytest.raises(ToolAuthzError, match="replaces `http_listen`"):
        planned_http_listeners(_with(settings, http_listen="127.0.0.1:0",
                                     http_listeners=[{"address": "127.0.0.1:0"}]))
    with pytest.raises(ToolAuthzError, match="serves the authorizer only"):
        planned_http_listeners(_with(settings, http_listeners=[{"address": "127.0.0.1:0",
                                                                "services": ["approvals"]}]))
    with pytest.raises(ToolAuthzError, match="`identity` is for Unix sockets"):
        planned_http_listeners(_with(settings, http_listeners=[{"address": "127.0.0.1:0", "identity": RUNTIME}]))
    with pytest.raises(ToolAuthzError, match="TLS is for TCP listeners"):
        planned_http_listeners(_with(settings, http_listeners=[{"address": f"unix://{sock_dir}/s", "tls": {
            "cert": pki["cert"], "key": pki["key"]}}]))
    assert planned_http_listeners(_with(settings, http_listen="127.0.0.1:8080")) == (
        ListenerSettings(address="127.0.0.1:8080", services=("authorizer",)),)


def test_a_plaintext_listener_answers_no_dns_name():
    """Off loopback (insecure), a Host may be an IP address, which no page can rebind."""
    assert loopback_host_header("127.0.0.1:80") and not loopback_host_header("10.0.0.5:80")
    assert address_host_header("10.0.0.5:8080") and address_host_header("[fd00::1]:8080")
    assert address_host_header("localhost:8080")
    assert not address_host_header("attacker.example:8080") and not address_host_header("")


def test_with_workers_the_unix_socket_is_served_by_worker_0_and_the_tcp_port_by_all(bundle_dir, tmp_path, sock_dir):
    """One process binds a socket path (a second worker binding it would fail to start);
    every worker binds the TCP port the parent chose."""
    import re
    import signal

    import yaml
    from test_workers import Workers

    path = sock_dir / "http.sock"
    config = tmp_path / "toolauthz.yaml"
    config.write_text(yaml.safe_dump({"generate_missing_keys": True, "http_listeners": [
        {"address": "127.0.0.1:0"}, {"address": f"unix://{path}", "identity": RUNTIME}]}))
    workers = Workers("--config", str(config), "--bundle", str(bundle_dir), "--listen", "127.0.0.1:0",
                      "--data-dir", str(tmp_path / "d"), "--workers", "2")
    try:
        assert len(workers.wait_serving()) == 2
        line = next(x for x in workers.out if "serving" in x)
        port = int(re.search(r"HTTP on 127\.0\.0\.1:(\d+), unix://", line).group(1))
        assert port != 0
        for _ in range(4):  # fresh connections, spread over the workers by the kernel
            assert exchange(http.client.HTTPConnection("127.0.0.1", port, timeout=30), "GET", "/healthz") == \
                (200, {"status": "SERVING"})
        assert exchange(_UnixConnection(path), "GET", "/healthz") == (200, {"status": "SERVING"})
        workers.proc.send_signal(signal.SIGTERM)
        assert workers.wait() == 0
        assert not os.path.lexists(path)
    finally:
        workers.kill()
