"""Outside review over real mTLS: who may read the bundle's tool files (GetCatalog) and
ask which tools are visible (ListVisible) on a TLS gRPC listener that proves its callers
by certificate. An approver, an auditor, a certificate of no configured caller and a CN
spelled like a runtime's SPIFFE id are refused; a runtime of another tenant is refused
ListVisible about this tenant."""

from __future__ import annotations

import os
import pathlib
from typing import Any

import grpc
import pytest
import test_http_auth

from toolauthz.client import ClientTls
from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb
from toolauthz.proto.toolauthz.v1 import authorizer_pb2_grpc as pb_grpc
from toolauthz.server.build import build_sidecar, create_listener_server
from toolauthz.server.config import ListenerSettings

RUNTIME, GLOBEX = "spiffe://acme.example/agent", "spiffe://globex.example/agent"
CONSOLE, AUDITOR = "spiffe://acme.example/console", "spiffe://acme.example/audit"
pki = test_http_auth.pki


@pytest.fixture
def address(settings, clock, pki):
    tls = {"cert": pki["cert"], "key": pki["key"], "client_ca": pki["ca_file"]}
    configured = type(settings).model_validate({**settings.model_dump(), "callers": [
        {"id": RUNTIME, "roles": ["runtime"], "tenants": ["acme"]},
        {"id": GLOBEX, "roles": ["runtime"], "tenants": ["globex"]},
        {"id": CONSOLE, "roles": ["approver"], "tenants": ["acme"]},
        {"id": AUDITOR, "roles": ["auditor"], "tenants": ["*"]}]})
    sidecar = build_sidecar(configured, clock=clock)
    server, listening = create_listener_server(sidecar, ListenerSettings(address="127.0.0.1:0", tls=tls))
    yield listening
    server.stop(None).wait()
    sidecar.close()


def issue(pki: dict[str, Any], **names: Any) -> tuple[pathlib.Path, pathlib.Path]:
    return pki["ca"].issue(**names).write(pki["dir"], f"client-{len(os.listdir(pki['dir']))}")


def call_as(pki, address: str, rpc: str, request, **names: Any):
    cert, key = issue(pki, **names)
    with grpc.secure_channel(address, ClientTls(ca=pki["ca_file"], cert=cert, key=key).credentials()) as channel:
        return getattr(pb_grpc.ToolAuthorizerStub(channel), rpc)(request, timeout=30)


def visible(tenant: str = "acme") -> pb.ListVisibleRequest:
    context = pb.TrustedContext(tenant=tenant, principal=pb.Principal(type="User", id="alice"), request_id="run-1")
    return pb.ListVisibleRequest(context=context, tools=["issue_refund"])


@pytest.mark.parametrize("names", [{"uris": (CONSOLE,)}, {"uris": (AUDITOR,)}, {"uris": ("spiffe://nobody/x",)},
                                   {"common_name": RUNTIME}], ids=["approver", "auditor", "unknown", "cn-lookalike"])
def test_only_a_runtime_certificate_reads_the_catalog_or_the_tool_list(address, pki, names):
    for rpc, request in (("GetCatalog", pb.GetCatalogRequest()), ("ListVisible", visible())):
        with pytest.raises(grpc.RpcError) as refused:
            call_as(pki, address, rpc, request, **names)
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED, rpc


def test_a_runtime_certificate_reads_them_and_another_tenants_runtime_is_refused_the_list(address, pki):
    catalog = call_as(pki, address, "GetCatalog", pb.GetCatalogRequest(), uris=(RUNTIME,))
    assert catalog.files and catalog.bundle_digest
    assert call_as(pki, address, "GetCatalog", pb.GetCatalogRequest(known_digest=catalog.bundle_digest),
                   uris=(RUNTIME,)).unchanged
    assert list(call_as(pki, address, "ListVisible", visible(), uris=(RUNTIME,)).visible) == ["issue_refund"]
    with pytest.raises(grpc.RpcError) as refused:
        call_as(pki, address, "ListVisible", visible("acme"), uris=(GLOBEX,))
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED


def test_plaintext_to_the_tls_listener_reads_nothing(address):
    with grpc.insecure_channel(address) as channel, pytest.raises(grpc.RpcError) as refused:
        pb_grpc.ToolAuthorizerStub(channel).GetCatalog(pb.GetCatalogRequest(), timeout=10)
    assert refused.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
