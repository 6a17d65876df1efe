"""Outside review, as an attacker, of ListVisible and GetCatalog over the real gRPC API.

Callers are named by the test-only metadata header of tests/test_roles.py (a stand-in
for the identity a listener proves). Each test would fail if the weakness it names
existed: another tenant's runtime or a non-runtime reading the catalog or the tool list,
a hostile name list costing one partial evaluation per name, a preview that writes an
audit record, an error that echoes a huge id back."""

from __future__ import annotations

import grpc
import pytest
from conftest import calls_audited, make_request
from test_roles import AGENT, AUDITOR, CALLERS, CONSOLE, GLOBEX_AGENT, STRANGER, as_, denied, with_callers

from toolauthz import visibility
from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb
from toolauthz.proto.toolauthz.v1 import authorizer_pb2_grpc as pb_grpc
from toolauthz.visibility import MAX_NAMES


@pytest.fixture
def sidecar(settings, clock):
    yield from with_callers(settings, clock, CALLERS)


def visible_request(tools: list[str], tenant: str = "acme", principal_id: str = "alice") -> pb.ListVisibleRequest:
    context = pb.TrustedContext(tenant=tenant, principal=pb.Principal(type="User", id=principal_id),
                                request_id="run-1")
    return pb.ListVisibleRequest(context=context, tools=tools)


def test_list_visible_of_another_tenant_is_refused_even_for_a_catalogued_tool(stub):
    # The globex runtime asks about acme: refused before any evaluation, as Authorize is.
    denied(stub.ListVisible, visible_request(["issue_refund"], tenant="acme"), metadata=as_(GLOBEX_AGENT))
    # The acme runtime cannot ask about globex's principals either.
    denied(stub.ListVisible, visible_request(["issue_refund"], tenant="globex"), metadata=as_(AGENT))


def test_a_hostile_name_list_costs_one_evaluation_per_catalogued_tool_at_most(stub, sidecar, monkeypatch):
    """4096 names (long, look-alike, repeated, control characters) from a fresh principal
    each time: the partial evaluations stay bounded by the catalog, not the request."""
    evaluated: list[str] = []
    real = visibility._may_allow

    def counted(bundle, ctx, principal, tool_slice):
        evaluated.append(tool_slice.tool.name)
        return real(bundle, ctx, principal, tool_slice)

    monkeypatch.setattr(visibility, "_may_allow", counted)
    catalogued = set(sidecar.bundles.current.tools)
    hostile = (["issue_refund"] * 1000 + ["issue_refund\n", "issue_refund\u200b", "issue_r\u0435fund", "ISSUE_REFUND",
               "x" * 100_000, "lookup_order\x00"] + [f"t{i}" for i in range(MAX_NAMES - 1006 - 1)] + ["lookup_order"])
    assert len(hostile) == MAX_NAMES
    answer = stub.ListVisible(visible_request(hostile, principal_id="mallory-1"), metadata=as_(AGENT))
    assert list(answer.visible) == ["issue_refund", "lookup_order"]  # look-alikes are not the tool
    assert sorted(evaluated) == ["issue_refund", "lookup_order"]
    assert len(evaluated) <= len(catalogued)


def test_list_visible_leaves_no_audit_record(stub, sidecar):
    before = calls_audited(sidecar)
    stub.ListVisible(visible_request(["issue_refund", "lookup_order"]), metadata=as_(AGENT))
    assert calls_audited(sidecar) == before


# Finding R-1 (fixed): ListVisible did not check its context as Authorize does (an empty
# tenant passed the tenant gate; a megabyte principal id was answered and cached whole).


BAD_CONTEXTS = [
    ("acme", "a" * 100_000, "run-1"),  # a principal id far past its allow-list
    ("acme", "alice\u200b", "run-1"),  # a zero-width look-alike of alice
    ("acme", "alice", "r" * 100_000),  # a request id far past its allow-list
    ("", "alice", "run-1"),  # no tenant at all
]


def bad_context(tenant: str, principal_id: str, request_id: str) -> pb.TrustedContext:
    return pb.TrustedContext(tenant=tenant, principal=pb.Principal(type="User", id=principal_id),
                             request_id=request_id)


@pytest.mark.parametrize(("tenant", "principal_id", "request_id"), BAD_CONTEXTS)
def test_authorize_refuses_each_bad_context(stub, tenant, principal_id, request_id):
    """The baseline: Authorize, for the same runtime, says INVALID_ARGUMENT to each."""
    request = make_request()
    request.context.CopyFrom(bad_context(tenant, principal_id, request_id))
    with pytest.raises(grpc.RpcError) as caught:
        stub.Authorize(request, metadata=as_(AGENT))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize(("tenant", "principal_id", "request_id"), BAD_CONTEXTS)
def test_list_visible_refuses_the_context_authorize_refuses(stub, tenant, principal_id, request_id):
    request = pb.ListVisibleRequest(context=bad_context(tenant, principal_id, request_id), tools=["issue_refund"])
    with pytest.raises(grpc.RpcError) as caught:
        stub.ListVisible(request, metadata=as_(AGENT))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert len(caught.value.details() or "") < 1024


def test_a_runtime_of_one_tenant_is_not_answered_for_an_empty_tenant(stub):
    with pytest.raises(grpc.RpcError) as caught:
        stub.ListVisible(visible_request(["issue_refund", "lookup_order"], tenant=""), metadata=as_(GLOBEX_AGENT))
    assert caught.value.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.PERMISSION_DENIED)


def test_the_visibility_cache_never_keeps_an_oversized_principal_id(stub):
    visibility._CACHE.clear()
    try:
        stub.ListVisible(visible_request(["issue_refund"], principal_id="m" * 1_000_000), metadata=as_(AGENT))
    except grpc.RpcError as refused:
        assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert max((len(key[3]) for key in visibility._CACHE), default=0) <= 256


def test_more_names_than_the_cap_is_invalid_argument_before_any_evaluation(stub, monkeypatch):
    monkeypatch.setattr(visibility, "_may_allow", lambda *a: pytest.fail("evaluated an oversized request"))
    with pytest.raises(grpc.RpcError) as caught:
        stub.ListVisible(visible_request(["issue_refund"] * (MAX_NAMES + 1)), metadata=as_(AGENT))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_only_a_runtime_reads_the_catalog_and_it_holds_tool_files_only(stub, sidecar):
    for outsider in (CONSOLE, AUDITOR, STRANGER):
        denied(stub.GetCatalog, pb.GetCatalogRequest(), metadata=as_(outsider))
    denied(stub.GetCatalog, pb.GetCatalogRequest())  # unauthenticated
    answer = stub.GetCatalog(pb.GetCatalogRequest(), metadata=as_(AGENT))
    names = [f.name for f in answer.files]
    assert names and all(n.startswith("tools/") and n.count("/") == 1 for n in names)
    # No policy, entity, signature or key material rides along with the catalog.
    assert not any(n.endswith((".cedar", ".sig", ".key", ".pem")) for n in names)
    assert sum(len(f.content) for f in answer.files) < 4 * 1024 * 1024  # under the gRPC message limit


def test_a_catalog_larger_than_one_message_is_a_clean_error_and_the_server_serves_on(settings, clock, bundle_dir):
    """The snapshot admits 64 MB of files, a gRPC message 4 MB: a bundle whose tool files
    outgrow one message must give the gateway a clear status (it then lists nothing: fail
    closed), never a crash, and the sidecar keeps deciding."""
    from toolauthz.server.build import build_sidecar, create_server

    tool = bundle_dir / "tools" / "lookup_order.yaml"
    tool.write_text(tool.read_text() + "\n# " + "x" * (5 << 20) + "\n")
    car = build_sidecar(settings, clock=clock)
    server, port = create_server(car, "127.0.0.1:0")
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}",
                                   options=[("grpc.max_receive_message_length", 64 << 20)]) as channel:
            stub = pb_grpc.ToolAuthorizerStub(channel)
            try:
                answer = stub.GetCatalog(pb.GetCatalogRequest())
                assert answer.ByteSize() <= settings.max_message_bytes
            except grpc.RpcError as refused:
                assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, refused.details()
            assert stub.Authorize(make_request()).decision == pb.ALLOW
    finally:
        server.stop(None).wait()
        car.close()


def _empty_tenant_requests() -> list[tuple[str, object]]:
    request = make_request()
    request.context.tenant = ""
    context = request.context
    return [
        ("Authorize", request),
        ("AuthorizeBatch", pb.AuthorizeBatchRequest(context=context, calls=[pb.BatchCall(call=request.call)])),
        ("Verify", pb.VerifyRequest(token="v4.public.x", context=context, call=request.call)),
        ("ReportOutcome", pb.ReportOutcomeRequest(context=context, call_id="toolu_1", status=pb.COMPLETED)),
        ("ReportRefusal", pb.ReportRefusalRequest(context=context, call_id="toolu_1", tool="issue_refund",
                                                  code="tool_changed", detail="x")),
    ]


@pytest.mark.parametrize(("rpc", "request_message"), _empty_tenant_requests(), ids=lambda v: v if isinstance(v, str)
                         else "")
def test_an_empty_tenant_never_gets_past_the_gate_into_a_decision_or_record(stub, sidecar, rpc, request_message):
    """The gate checks a caller's tenants only when the request names one: every RPC that
    takes a context must refuse an empty tenant itself, and write no decision."""
    before = calls_audited(sidecar)
    with pytest.raises(grpc.RpcError) as caught:
        answer = getattr(stub, rpc)(request_message, metadata=as_(GLOBEX_AGENT))
        if rpc == "AuthorizeBatch":  # a batch answers each call: the call must be an error
            assert answer.answers[0].WhichOneof("answer") == "error"
            raise grpc.RpcError  # the per-call error is this RPC's refusal
    if isinstance(caught.value, grpc.Call):
        assert caught.value.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.PERMISSION_DENIED)
    assert [r for r in calls_audited(sidecar) if r not in before and r.event.result != "refused"] == []
