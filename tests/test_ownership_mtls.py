"""Calls owned by their caller over real mTLS, on the HTTP/JSON API; and the two namespaces
of certificate identities (URI SAN, subject CN) on both kinds of listener: a CN that reads
like a SPIFFE id is never that SPIFFE identity."""

from __future__ import annotations

import http.client
import json
import os
import pathlib
import ssl
from typing import Any

import grpc
import pytest
import test_http_auth
from conftest import order_entity
from transports import Call, Context, _body, exchange

from tests.conftest import make_request
from toolauthz.audit.store import AuditQuery
from toolauthz.client import ClientTls
from toolauthz.proto.toolauthz.v1 import authorizer_pb2_grpc as pb_grpc
from toolauthz.server.build import build_sidecar, create_listener_server, create_server
from toolauthz.server.config import ListenerSettings

X, Y = "spiffe://acme.example/agent/support", "spiffe://acme.example/agent/billing"
ALICE = Context(entities=[order_entity("ord_1", "alice")])
REFUND = Call("toolu_1", "issue_refund", b'{"order_id": "ord_1", "amount_cents": 1500}')
pki = test_http_auth.pki  # the fixture: a CA, its file, and the server's certificate


def _issue(pki: dict[str, Any], **names: Any) -> tuple[pathlib.Path, pathlib.Path]:
    return pki["ca"].issue(**names).write(pki["dir"], f"client-{len(os.listdir(pki['dir']))}")


@pytest.fixture
def mtls_sidecar(settings, clock, pki):
    """Two runtimes of acme, X and Y, on an mTLS HTTP listener and an mTLS gRPC listener."""
    tls = {"cert": pki["cert"], "key": pki["key"], "client_ca": pki["ca_file"]}
    configured = type(settings).model_validate({**settings.model_dump(), "callers": [
        {"id": X, "roles": ["runtime"], "tenants": ["acme"]}, {"id": Y, "roles": ["runtime"], "tenants": ["acme"]}],
        "http_listeners": [{"address": "127.0.0.1:0", "tls": tls}]})
    sidecar = build_sidecar(configured, clock=clock)
    http_server, _port = create_server(sidecar, "127.0.0.1:0")
    grpc_server, address = create_listener_server(sidecar, ListenerSettings(address="127.0.0.1:0", tls=tls))
    yield sidecar, http_server.http_port, address
    grpc_server.stop(None).wait()
    http_server.stop(None).wait()
    sidecar.close()


def https(pki: dict[str, Any], port: int, **names: Any) -> http.client.HTTPSConnection:
    context = ssl.create_default_context(cafile=pki["ca_file"])
    context.load_cert_chain(*_issue(pki, **names))
    return http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=30)


def post(pki: dict[str, Any], port: int, path: str, body: bytes, **names: Any) -> tuple[int, Any]:
    return exchange(https(pki, port, **names), "POST", path, body)


def test_over_http_only_the_caller_and_run_of_a_call_verify_report_or_replay_it(mtls_sidecar, pki):
    sidecar, port, _address = mtls_sidecar
    status, decided = post(pki, port, "/v1/authorize", _body(ctx=ALICE, call=REFUND), uris=(X,))
    assert (status, decided["decision"]) == (200, "ALLOW")
    cancel = json.dumps({"context": ALICE.as_json(), "call_id": "toolu_1", "status": "cancelled"}).encode()
    verify = _body(ctx=ALICE, call=REFUND, token=decided["token"])
    other_run = Context(request_id="run-2", entities=ALICE.entities)
    for path, body, caller in (("/v1/outcome", cancel, Y), ("/v1/verify", verify, Y),
                               ("/v1/authorize", _body(ctx=ALICE, call=REFUND), Y),
                               ("/v1/verify", _body(ctx=other_run, call=REFUND, token=decided["token"]), X)):
        status, refused = post(pki, port, path, body, uris=(caller,))
        assert (status, refused["error"]["code"]) == (403, "PERMISSION_DENIED"), path
    run = {name: value for name, value in ALICE.as_json().items() if name != "entities"}
    batch = json.dumps({"context": run, "calls": [
        {"call": {"call_id": "toolu_1", "name": REFUND.name, "input": json.loads(REFUND.input)},
         "entities": ALICE.entities}]}).encode()
    status, answered = post(pki, port, "/v1/authorize-batch", batch, uris=(Y,))
    assert (status, answered["answers"][0]["error"]["code"]) == (200, "PERMISSION_DENIED")
    entry = sidecar.ledger.get("acme", "toolu_1")
    assert (entry.caller, entry.outcome, entry.verified_jti) == (X, "", "")
    refusals = sidecar.audit_log.query(AuditQuery(error_code="not_call_owner"), limit=10)
    assert [(r.event.kind, r.event.caller) for r in refusals] == [
        ("outcome", Y), ("verify", Y), ("authorize", Y), ("verify", X), ("authorize", Y)]
    status, verified = post(pki, port, "/v1/verify", verify, uris=(X,))
    assert (status, verified["code"]) == (200, "ok")


SPIFFE_LOOKALIKE = {"common_name": X}  # no URI SAN: the CN alone names the caller


def test_a_cn_that_reads_as_a_spiffe_id_is_not_that_identity_over_grpc(mtls_sidecar, pki):
    sidecar, _port, address = mtls_sidecar
    cert, key = _issue(pki, **SPIFFE_LOOKALIKE)
    with grpc.secure_channel(address, ClientTls(ca=pki["ca_file"], cert=cert, key=key).credentials()) as channel:
        with pytest.raises(grpc.RpcError) as refused:
            pb_grpc.ToolAuthorizerStub(channel).Authorize(make_request(), timeout=10)
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    [record] = sidecar.audit_log.query(AuditQuery(result="refused"), limit=5)
    assert (record.event.caller, record.event.error_codes) == (f"cn:{X}", ("caller_unknown",))


def test_a_cn_that_reads_as_a_spiffe_id_is_not_that_identity_over_http(mtls_sidecar, pki):
    sidecar, port, _address = mtls_sidecar
    status, refused = post(pki, port, "/v1/authorize", _body(ctx=ALICE, call=REFUND), **SPIFFE_LOOKALIKE)
    assert (status, refused["error"]["code"]) == (403, "PERMISSION_DENIED")
    [record] = sidecar.audit_log.query(AuditQuery(result="refused"), limit=5)
    assert record.event.caller == f"cn:{X}"


@pytest.mark.parametrize("uri", ["cn:agent", "CN:agent"])
def test_a_uri_san_in_the_cn_namespace_names_no_caller(mtls_sidecar, pki, uri):
    """Otherwise a URI SAN `cn:agent` would be the certificate whose CN is `agent`."""
    sidecar, port, address = mtls_sidecar
    status, _refused = post(pki, port, "/v1/authorize", _body(ctx=ALICE, call=REFUND), uris=(uri,))
    cert, key = _issue(pki, uris=(uri,))
    with grpc.secure_channel(address, ClientTls(ca=pki["ca_file"], cert=cert, key=key).credentials()) as channel:
        with pytest.raises(grpc.RpcError) as refused:
            pb_grpc.ToolAuthorizerStub(channel).Authorize(make_request(call_id="toolu_2"), timeout=10)
    assert status == 403 and refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    records = sidecar.audit_log.query(AuditQuery(result="refused"), limit=5)
    # Refusals of one caller and RPC in one minute are one record (service/refusals.py).
    assert records and {r.event.caller for r in records} == {"unauthenticated"}
