"""Listeners: TLS and mTLS (the handshake refuses whoever the CA did not vouch for), the
caller identity handlers see, Unix sockets (mode, stale files, cleanup), per-listener
services, and the refusal to serve plaintext off loopback. Certificates are made here
(tests/certs.py)."""

from __future__ import annotations

import datetime
import logging
import os
import pathlib
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator

import grpc
import pytest
from certs import CertificateAuthority
from conftest import ROOT, make_request

from toolauthz.client import AsyncAuthzClient, AuthzClient, ClientTls
from toolauthz.errors import ToolAuthzError
from toolauthz.proto.toolauthz.v1 import approvals_pb2 as apb
from toolauthz.proto.toolauthz.v1 import approvals_pb2_grpc as apb_grpc
from toolauthz.proto.toolauthz.v1 import audit_pb2 as aupb
from toolauthz.proto.toolauthz.v1 import audit_pb2_grpc as aupb_grpc
from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb
from toolauthz.proto.toolauthz.v1 import authorizer_pb2_grpc as pb_grpc
from toolauthz.server.build import create_listener_server, create_server
from toolauthz.server.config import CallerSettings, ListenerSettings, Settings
from toolauthz.server.listener_notices import listener_notices
from toolauthz.server.listeners import parse_address, planned_http_listeners, planned_listeners
from toolauthz.service.audit import AuditService
from toolauthz.service.authorizer import ToolAuthorizerService
from toolauthz.service.callers import UNAUTHENTICATED, Caller, caller_of
from toolauthz.service.loopback import is_loopback_host

SPIFFE = "spiffe://acme.example/agent/support"
NOW = datetime.datetime.now(datetime.UTC)


@pytest.fixture(scope="module")
def ca() -> CertificateAuthority:
    return CertificateAuthority()


@pytest.fixture
def pki(tmp_path: pathlib.Path, ca: CertificateAuthority) -> dict[str, pathlib.Path]:
    """The CA file and the sidecar's certificate and key."""
    cert, key = ca.server().write(tmp_path / "pki", "server")
    return {"ca": ca.write(tmp_path / "pki" / "ca.pem"), "cert": cert, "key": key}


@pytest.fixture
def sock_dir() -> Iterator[pathlib.Path]:
    """A short directory: a socket path holds at most 107 bytes."""
    path = pathlib.Path(tempfile.mkdtemp(prefix="tz", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def mtls_listener(pki: dict[str, pathlib.Path], **extra: object) -> ListenerSettings:
    return ListenerSettings(address="127.0.0.1:0", tls={"cert": pki["cert"], "key": pki["key"],
                                                        "client_ca": pki["ca"]}, **extra)


@pytest.fixture
def serve(sidecar):
    """serve(listener) -> address it serves; every server is stopped at the end."""
    started = []

    def start(listener: ListenerSettings) -> str:
        server, bound = create_listener_server(sidecar, listener)
        started.append(server)
        return bound

    yield start
    for server in started:
        server.stop(None).wait()


@pytest.fixture
def callers_seen(monkeypatch) -> list[Caller]:
    """What `caller_of` says inside a plain (GetKeys), a coroutine (Authorize) and a
    streaming (QueryDecisions) handler."""
    seen: list[Caller] = []
    get_keys, authorize, query = (ToolAuthorizerService.GetKeys, ToolAuthorizerService.Authorize,
                                  AuditService.QueryDecisions)

    def plain(self, request, context):
        seen.append(caller_of(context))
        return get_keys(self, request, context)

    async def coroutine(self, request, context):
        seen.append(caller_of(context))
        return await authorize(self, request, context)

    async def streaming(self, request, context):
        seen.append(caller_of(context))
        async for record in query(self, request, context):
            yield record

    monkeypatch.setattr(ToolAuthorizerService, "GetKeys", plain)
    monkeypatch.setattr(ToolAuthorizerService, "Authorize", coroutine)
    monkeypatch.setattr(AuditService, "QueryDecisions", streaming)
    return seen


def tls_channel(address: str, pki: dict[str, pathlib.Path], client=None, tmp_path=None) -> grpc.Channel:
    cert = key = None
    if client is not None:
        cert, key = client.write(tmp_path, "client")
    return grpc.secure_channel(address, ClientTls(ca=pki["ca"], cert=cert, key=key).credentials())


def status_of(channel: grpc.Channel) -> grpc.StatusCode | None:
    try:
        pb_grpc.ToolAuthorizerStub(channel).GetKeys(pb.GetKeysRequest(), timeout=10)
    except grpc.RpcError as exc:
        return exc.code()
    return None


# -- TLS and mTLS -------------------------------------------------------------------------

def test_plaintext_to_a_tls_listener_fails(serve, pki, callers_seen):
    address = serve(ListenerSettings(address="127.0.0.1:0", tls={"cert": pki["cert"], "key": pki["key"]}))
    with grpc.insecure_channel(address) as channel:
        assert status_of(channel) == grpc.StatusCode.UNAVAILABLE
    assert callers_seen == []


def test_tls_without_client_certificates_serves_unauthenticated_callers(serve, pki, callers_seen):
    address = serve(ListenerSettings(address="127.0.0.1:0", tls={"cert": pki["cert"], "key": pki["key"]}))
    with tls_channel(address, pki) as channel:
        assert status_of(channel) is None
    assert callers_seen == [UNAUTHENTICATED]


@pytest.mark.parametrize("client", ["none", "other CA", "expired", "not yet valid"])
def test_mtls_refuses_a_caller_without_a_certificate_its_ca_signed(serve, pki, ca, tmp_path, callers_seen, client):
    issued = {"none": None,
              "other CA": CertificateAuthority("another CA").issue(uris=(SPIFFE,)),
              "expired": ca.issue(uris=(SPIFFE,), not_before=NOW - datetime.timedelta(days=10),
                                  not_after=NOW - datetime.timedelta(days=1)),
              "not yet valid": ca.issue(uris=(SPIFFE,), not_before=NOW + datetime.timedelta(days=1),
                                        not_after=NOW + datetime.timedelta(days=10))}[client]
    address = serve(mtls_listener(pki))
    with tls_channel(address, pki, issued, tmp_path) as channel:
        assert status_of(channel) == grpc.StatusCode.UNAVAILABLE
    assert callers_seen == []  # never reached a handler


@pytest.mark.parametrize(("names", "expected"), [
    ({"uris": (SPIFFE,), "common_name": "ignored when a URI SAN names the caller"}, SPIFFE),
    ({"common_name": "approval-console", "dns": ("console.acme.example",)}, "cn:approval-console"),
])
def test_a_verified_client_certificate_names_the_caller_in_every_kind_of_handler(
        serve, pki, ca, tmp_path, callers_seen, names, expected):
    address = serve(mtls_listener(pki))
    with tls_channel(address, pki, ca.issue(**names), tmp_path) as channel:
        pb_grpc.ToolAuthorizerStub(channel).GetKeys(pb.GetKeysRequest(), timeout=10)
        assert pb_grpc.ToolAuthorizerStub(channel).Authorize(make_request(), timeout=10).decision == pb.ALLOW
        list(aupb_grpc.AuditStub(channel).QueryDecisions(aupb.QueryDecisionsRequest(limit=1), timeout=10))
    assert callers_seen == [Caller(expected, True)] * 3


def test_a_certificate_with_two_uri_sans_names_no_single_caller(serve, pki, ca, tmp_path, callers_seen):
    address = serve(mtls_listener(pki))
    with tls_channel(address, pki, ca.issue(uris=(SPIFFE, "spiffe://acme.example/admin")), tmp_path) as channel:
        assert status_of(channel) is None
    assert callers_seen == [UNAUTHENTICATED]


def test_the_sdk_clients_speak_mtls(serve, pki, ca, tmp_path, callers_seen):
    import asyncio

    address = serve(mtls_listener(pki))
    cert, key = ca.issue(uris=(SPIFFE,)).write(tmp_path, "agent")
    tls = ClientTls(ca=pki["ca"], cert=cert, key=key)
    with AuthzClient(address, tls=tls) as client:
        assert client.get_keys().keys

    async def run() -> None:
        async with AsyncAuthzClient(address, tls=tls) as client:
            assert (await client.get_keys()).keys

    asyncio.run(run())
    assert callers_seen == [Caller(SPIFFE, True)] * 2


def test_the_server_name_can_differ_from_the_target_host(sidecar, tmp_path, ca, callers_seen):
    cert, key = ca.issue(dns=("sidecar.internal",)).write(tmp_path, "named")
    server, bound = create_listener_server(sidecar, ListenerSettings(address="127.0.0.1:0",
                                                                     tls={"cert": cert, "key": key}))
    try:
        ca_file = ca.write(tmp_path / "ca.pem")
        with AuthzClient(bound, tls=ClientTls(ca=ca_file), timeout=5) as client:
            with pytest.raises(grpc.RpcError):  # 127.0.0.1 is not in the certificate
                client.get_keys()
        with AuthzClient(bound, tls=ClientTls(ca=ca_file, server_name="sidecar.internal")) as client:
            assert client.get_keys().keys
    finally:
        server.stop(None).wait()


def test_a_client_certificate_needs_its_key():
    with pytest.raises(ValueError, match="needs its key"):
        ClientTls(cert="client.pem")


def test_a_key_that_does_not_belong_to_the_certificate_refuses_to_start(sidecar, pki, ca, tmp_path):
    _, other_key = ca.server().write(tmp_path, "other")
    with pytest.raises(ToolAuthzError, match="does not belong"):
        create_listener_server(sidecar, ListenerSettings(address="127.0.0.1:0",
                                                         tls={"cert": pki["cert"], "key": other_key}))


# -- plaintext off loopback ---------------------------------------------------------------

@pytest.mark.parametrize("address", ["0.0.0.0:0", "[::]:0", "sidecar.example:50051"])
def test_a_plaintext_listener_off_loopback_refuses_to_start(sidecar, address):
    with pytest.raises(ToolAuthzError, match="off loopback without TLS"):
        create_listener_server(sidecar, ListenerSettings(address=address))
    with pytest.raises(ToolAuthzError, match="off loopback without TLS"):
        planned_listeners(Settings(listen=address))


@pytest.mark.parametrize("host", ["127.0.0.1", "127.9.9.9", "[::1]", "localhost", "LOCALHOST", "LocalHost",
                                  "0.0.0.0", "[::]", "10.0.0.1", "localhost.example", "sidecar.example"])
def test_the_listeners_and_the_http_api_agree_on_what_is_loopback(host):
    # One rule (service/loopback.py): a gRPC listener and the HTTP API's Host check
    # never disagree about whether an address may serve unauthenticated callers.
    assert parse_address(f"{host}:50051").loopback == is_loopback_host(host.strip("[]"))
    assert parse_address(f"{host}:50051").loopback == (host.strip("[]").lower() == "localhost"
                                                      or host.startswith(("127.", "[::1]")))


def test_a_plaintext_listener_off_loopback_starts_when_it_says_insecure(serve):
    bound = serve(ListenerSettings(address="0.0.0.0:0", insecure=True))
    with grpc.insecure_channel(f"127.0.0.1:{bound.rsplit(':', 1)[1]}") as channel:
        assert status_of(channel) is None


def test_two_listeners_on_one_address_refuse_to_start():
    with pytest.raises(ToolAuthzError, match="two listeners on `127.0.0.1:50051`"):
        planned_listeners(Settings(listen="127.0.0.1:50051", approvals_listen="127.0.0.1:50051"))
    with pytest.raises(ToolAuthzError, match="two HTTP listeners on `127.0.0.1:8080`"):
        planned_http_listeners(Settings(http_listeners=[ListenerSettings(address="127.0.0.1:8080"),
                                                        ListenerSettings(address="127.0.0.1:8080")]))
    # Port 0: each binds a port of its own.
    assert len(planned_listeners(Settings(listen="127.0.0.1:0", approvals_listen="127.0.0.1:0"))) == 2


def test_one_line_per_listener_says_what_its_callers_may_do(pki):
    development = planned_listeners(Settings(listen="127.0.0.1:50051", approvals_listen="127.0.0.1:50052"))
    assert [(x.address, x.services) for x in development] == [
        ("127.0.0.1:50051", ("authorizer", "audit")), ("127.0.0.1:50052", ("approvals",))]
    callers = [CallerSettings(id="spiffe://acme.example/rt", roles=["runtime"], tenants=["acme"])]
    socket = ListenerSettings(address="unix:///run/t.sock", identity="spiffe://acme.example/rt")
    stranger = ListenerSettings(address="unix:///run/s.sock", identity="spiffe://elsewhere/x")

    # Development: no callers, plaintext. Whoever reaches it may do anything.
    assert listener_notices(development, []) == [
        (logging.WARNING, "listener 127.0.0.1:50051 (authorizer, audit): callers are not authenticated (plaintext): "
         "whoever reaches it may call every RPC of its services as any principal and approver (development mode; "
         "see docs/threat-model.md)"),
        (logging.WARNING, "listener 127.0.0.1:50052 (approvals): callers are not authenticated (plaintext): "
         "whoever reaches it may call every RPC of its services as any principal and approver (development mode; "
         "see docs/threat-model.md)")]
    # The same plaintext listener with callers configured: GetKeys only, said so.
    [(level, line)] = listener_notices(development[:1], callers)
    assert (level, line) == (logging.INFO, "listener 127.0.0.1:50051 (authorizer, audit): callers are not "
                             "authenticated (plaintext): with `callers` configured, they may call GetKeys only")
    assert "any principal" not in line
    # mTLS with callers, and without.
    assert listener_notices([mtls_listener(pki)], callers, http=True) == [(logging.INFO, (
        "HTTP listener 127.0.0.1:0: callers are identified by their client certificate (URI SAN, else CN), which "
        "`client_ca` signed; each may call what its entry of `callers` grants (1 configured), any other GetKeys "
        "only"))]
    [(level, line)] = listener_notices([mtls_listener(pki)], [])
    assert level == logging.WARNING and line.endswith("with no `callers` configured, each may call every RPC of "
                                                      "its services as any principal and approver")
    # A Unix socket: its identity's entry, or none.
    assert listener_notices([socket, stranger], callers) == [
        (logging.INFO, "listener unix:///run/t.sock (authorizer, approvals, audit): every caller is "
         "`spiffe://acme.example/rt` (whoever may open the socket file): roles runtime in tenants acme"),
        (logging.INFO, "listener unix:///run/s.sock (authorizer, approvals, audit): every caller is "
         "`spiffe://elsewhere/x` (whoever may open the socket file), which `callers` does not list: GetKeys only")]
    tls_only = ListenerSettings(address="127.0.0.1:0", tls={"cert": pki["cert"], "key": pki["key"]})
    assert "(TLS without `client_ca`): with `callers` configured, they may call GetKeys only" in \
        listener_notices([tls_only], callers)[0][1]


def test_listeners_replace_listen_rather_than_add_to_it(pki):
    with pytest.raises(ToolAuthzError, match="replaces `listen`"):
        planned_listeners(Settings(listen="127.0.0.1:1", listeners=[mtls_listener(pki)]))
    assert planned_listeners(Settings(listeners=[mtls_listener(pki)])) == (mtls_listener(pki),)


@pytest.mark.parametrize(("listener", "message"), [
    ({"address": "127.0.0.1:0", "identity": "x"}, "`identity` is for Unix sockets"),
    ({"address": "unix:relative.sock"}, "unix:///ABSOLUTE/PATH"),
    ({"address": "unix:///run/t.sock", "insecure": True}, "`insecure` is for TCP"),
    ({"address": "127.0.0.1:0", "services": []}, "at least one"),
    ({"address": "127.0.0.1"}, "HOST:PORT"),
])
def test_a_listener_that_makes_no_sense_is_refused(listener, message):
    with pytest.raises(ToolAuthzError, match=message):
        planned_listeners(Settings(listeners=[listener]))


# -- services per listener ----------------------------------------------------------------

def test_a_listener_serves_only_its_services(serve):
    address = serve(ListenerSettings(address="127.0.0.1:0", services=("authorizer",)))
    with grpc.insecure_channel(address) as channel:
        with pytest.raises(grpc.RpcError) as info:
            apb_grpc.ApprovalsStub(channel).ListApprovals(apb.ListApprovalsRequest(), timeout=10)
        assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
        with pytest.raises(grpc.RpcError) as info:
            list(aupb_grpc.AuditStub(channel).QueryDecisions(aupb.QueryDecisionsRequest(), timeout=10))
        assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert status_of(channel) is None


# -- Unix sockets --------------------------------------------------------------------------

@pytest.mark.parametrize("mode", [None, 0o600])
def test_a_unix_socket_has_its_mode_and_is_removed_at_shutdown(sidecar, sock_dir, mode, callers_seen):
    path = sock_dir / "toolauthz.sock"
    extra = {} if mode is None else {"mode": mode}
    server, bound = create_listener_server(sidecar, ListenerSettings(address=f"unix://{path}", identity="runtime-1",
                                                                     **extra))
    try:
        assert bound == f"unix://{path}"
        assert stat.S_ISSOCK(os.lstat(path).st_mode)
        assert stat.S_IMODE(os.lstat(path).st_mode) == (0o660 if mode is None else mode)
        assert os.listdir(sock_dir) == ["toolauthz.sock"]  # the staging directory is gone
        with AuthzClient(f"unix://{path}") as client:
            assert client.get_keys().keys
    finally:
        server.stop(None).wait()
    assert not path.exists()
    assert callers_seen == [Caller("runtime-1", True)]


def test_a_unix_socket_without_identity_serves_unauthenticated_callers(serve, sock_dir, callers_seen):
    address = serve(ListenerSettings(address=f"unix://{sock_dir / 's'}"))
    with AuthzClient(address) as client:
        client.get_keys()
    assert callers_seen == [UNAUTHENTICATED]


def test_a_stale_socket_is_replaced(serve, sock_dir):
    path = sock_dir / "toolauthz.sock"
    with socket.socket(socket.AF_UNIX) as killed:  # a sidecar that died left its socket file
        killed.bind(str(path))
    assert stat.S_ISSOCK(os.lstat(path).st_mode)
    serve(ListenerSettings(address=f"unix://{path}"))
    with AuthzClient(f"unix://{path}") as client:
        assert client.get_keys().keys


def test_a_socket_someone_serves_is_not_taken_over(serve, sidecar, sock_dir):
    path = sock_dir / "toolauthz.sock"
    serve(ListenerSettings(address=f"unix://{path}"))
    with pytest.raises(OSError, match="another process serves it"):
        create_listener_server(sidecar, ListenerSettings(address=f"unix://{path}"))
    with AuthzClient(f"unix://{path}") as client:  # the first one still serves
        assert client.get_keys().keys


@pytest.mark.parametrize("kind", ["file", "directory", "symlink"])
def test_anything_but_a_socket_at_the_path_is_refused(sidecar, sock_dir, kind):
    path = sock_dir / "toolauthz.sock"
    if kind == "file":
        path.write_text("keep me")
    elif kind == "directory":
        path.mkdir()
    else:
        path.symlink_to(sock_dir / "elsewhere")
    with pytest.raises(ToolAuthzError, match="is not a socket"):
        create_listener_server(sidecar, ListenerSettings(address=f"unix://{path}"))
    if kind == "file":
        assert path.read_text() == "keep me"
    assert sorted(os.listdir(sock_dir)) == ["toolauthz.sock"]


def test_the_socket_file_is_left_alone_at_shutdown_if_it_was_replaced(sidecar, sock_dir):
    path = sock_dir / "toolauthz.sock"
    server, _ = create_listener_server(sidecar, ListenerSettings(address=f"unix://{path}"))
    path.unlink()
    path.write_text("someone else's")
    server.stop(None).wait()
    assert path.read_text() == "someone else's"


def test_create_server_takes_a_unix_address(sidecar, sock_dir):
    server, port = create_server(sidecar, f"unix://{sock_dir / 's'}")
    try:
        assert port == 0
        with AuthzClient(f"unix://{sock_dir / 's'}") as client:
            assert client.get_keys().keys
    finally:
        server.stop(None).wait()
    assert os.listdir(sock_dir) == []


def test_serve_listen_unix_end_to_end(bundle_dir, tmp_path, sock_dir):
    """`toolauthz serve --listen unix:/path`: serves (here asked for 2 workers: one process
    binds a socket path), the SDK reaches it, one line says callers are not
    authenticated, and the socket is gone after SIGTERM."""
    path = sock_dir / "toolauthz.sock"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "toolauthz.cli", "serve", "--bundle", str(bundle_dir),
                             "--listen", f"unix:{path}", "--data-dir", str(tmp_path / "data"), "--workers", "2"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert f"on unix://{path}, data in" in line, proc.stderr.read() if proc.poll() is not None else line
        request = make_request()
        with AuthzClient(f"unix://{path}") as client:
            assert client.authorize(request.context, request.call).decision == pb.ALLOW
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        stderr = proc.stderr.read()
        proc.stdout.close()
        proc.stderr.close()
    assert [x for x in stderr.splitlines() if "not authenticated" in x] == [
        next(x for x in stderr.splitlines() if f"listener unix:{path} (authorizer, approvals, audit): callers are "
             "not authenticated (a Unix socket without `identity`): whoever reaches it may call every RPC" in x)]
    assert not path.exists()


def test_a_listener_that_fails_to_start_removes_the_sockets_already_made(sidecar, sock_dir):
    from toolauthz.server.serving import start_listeners

    (sock_dir / "taken").write_text("not a socket")
    with pytest.raises(ToolAuthzError):
        start_listeners(sidecar, [ListenerSettings(address=f"unix://{sock_dir / 'first'}"),
                                  ListenerSettings(address=f"unix://{sock_dir / 'taken'}")])
    assert os.listdir(sock_dir) == ["taken"]


def test_stopping_listeners_waits_for_every_one(sidecar, sock_dir):
    from toolauthz.server.serving import start_listeners

    serving = start_listeners(sidecar, [ListenerSettings(address="127.0.0.1:0"),
                                        ListenerSettings(address=f"unix://{sock_dir / 's'}")])
    assert serving.addresses[1] == f"unix://{sock_dir / 's'}"
    done = threading.Event()
    threading.Thread(target=lambda: (serving.stop(None), done.set()), daemon=True).start()
    assert done.wait(30)
    assert os.listdir(sock_dir) == []


# -- the approvals CLI over mTLS ------------------------------------------------------------

def test_the_approvals_cli_takes_tls_files_from_flags_or_the_environment(serve, pki, ca, tmp_path, monkeypatch,
                                                                       capsys):
    from toolauthz.cli.main import main

    address = serve(mtls_listener(pki, services=("approvals",)))
    cert, key = ca.issue(uris=("spiffe://acme.example/approval-console",)).write(tmp_path, "console")
    assert main(["approvals", "--server", address, "list"]) == 1  # plaintext to a TLS listener
    assert "unavailable" in capsys.readouterr().err
    assert main(["approvals", "--server", address, "--ca", str(pki["ca"]), "list"]) == 1  # no client certificate
    assert "unavailable" in capsys.readouterr().err
    assert main(["approvals", "--server", address, "--ca", str(pki["ca"]), "--cert", str(cert), "--key", str(key),
                 "list"]) == 0
    monkeypatch.setenv("TOOLAUTHZ_SERVER", address)
    monkeypatch.setenv("TOOLAUTHZ_CA", str(pki["ca"]))
    monkeypatch.setenv("TOOLAUTHZ_CERT", str(cert))
    monkeypatch.setenv("TOOLAUTHZ_KEY", str(key))
    assert main(["approvals", "list"]) == 0
    assert main(["approvals", "list", "--key", str(tmp_path / "missing.key")]) == 1
    assert "missing.key" in capsys.readouterr().err


def test_approvals_listen_is_served_by_toolauthz_serve(sidecar, settings):
    """`approvals_listen` moves the Approvals service to its own listener, which `serve`
    starts beside the main one."""
    from toolauthz.server.serving import start_listeners

    planned = planned_listeners(settings.model_copy(update={"approvals_listen": "127.0.0.1:0"}))
    serving = start_listeners(sidecar, planned)
    try:
        main, approvals = serving.addresses
        with grpc.insecure_channel(approvals) as channel:
            apb_grpc.ApprovalsStub(channel).ListApprovals(apb.ListApprovalsRequest(), timeout=10)
        with grpc.insecure_channel(main) as channel:
            with pytest.raises(grpc.RpcError) as info:
                apb_grpc.ApprovalsStub(channel).ListApprovals(apb.ListApprovalsRequest(), timeout=10)
            assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
            assert status_of(channel) is None
    finally:
        serving.stop(None)


def test_the_audit_cli_reads_a_sidecar_over_mtls(serve, pki, ca, sidecar, tmp_path, capsys):
    from toolauthz.cli.main import main
    from toolauthz.service.common import proposed_call, trusted_context

    request = make_request(call_id="call_tls")
    sidecar.authorizer.authorize(trusted_context(request.context), proposed_call(request.call))
    address = serve(mtls_listener(pki, services=("audit",)))
    cert, key = ca.issue(uris=("spiffe://sec.example/audit",)).write(tmp_path, "auditor")
    assert main(["audit", "--server", address, "query", "--json"]) == 1  # plaintext to a TLS listener
    assert "unavailable" in capsys.readouterr().err
    assert main(["audit", "--server", address, "--ca", str(pki["ca"]), "--cert", str(cert), "--key", str(key),
                 "show", "call_tls"]) == 0
    assert capsys.readouterr().out.startswith("call call_tls in tenant acme: issue_refund")
