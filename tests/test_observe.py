"""One instrumentation point per decision, whatever the transport (toolauthz/service/observe.py):
gRPC, gRPC declared `mcp` by its client, the HTTP API and the console move the same
counters, labelled by transport, and an HTTP call continues the caller's trace as one
span tree with its steps."""

from __future__ import annotations

import json

import pytest
from conftest import make_request, order_entity
from console_pages import browser, console_for, post_form, propose, sign_in
from prometheus_client import REGISTRY
from transports import Call, Context, HttpTransport, OpenApiSchemas, _body, openapi

from toolauthz.client import AuthzClient
from toolauthz.client import tracing as client_tracing
from toolauthz.proto.toolauthz.v1 import approvals_pb2 as apb
from toolauthz.proto.toolauthz.v1 import approvals_pb2_grpc as apb_grpc
from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb
from toolauthz.proto.toolauthz.v1 import authorizer_pb2_grpc as pb_grpc
from toolauthz.service import observe

ALICE = Context(entities=[order_entity("ord_1", "alice")])
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN = "00f067aa0ba902b7"


@pytest.fixture
def settings(settings):
    return settings.model_copy(update={"http_listen": "127.0.0.1:0"})


@pytest.fixture
def http(server) -> HttpTransport:
    srv, _port = server
    return HttpTransport(srv.http_port, OpenApiSchemas(openapi()))


def decisions(transport: str, result: str = "allow") -> float:
    return REGISTRY.get_sample_value("toolauthz_decisions_total", {
        "tool": "issue_refund", "result": result, "transport": transport}) or 0.0


def counts(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def _call(k: int, prefix: str) -> Call:
    return Call(f"{prefix}_{k}", "issue_refund", b'{"order_id": "ord_1", "amount_cents": 1500}')


def test_n_calls_on_each_transport_move_the_decision_counters_by_n(server, channel, http):
    before = {t: decisions(t) for t in ("grpc", "mcp", "http", "console")}
    stub = pb_grpc.ToolAuthorizerStub(channel)
    for k in range(3):
        assert stub.Authorize(make_request(call_id=f"grpc_{k}", request_id=f"g{k}")).decision == pb.ALLOW
    # A label off the allow-list counts as plain gRPC.
    assert stub.Authorize(make_request(call_id="spoof", request_id="s"),
                          metadata=[("toolauthz-transport", "console")]).decision == pb.ALLOW
    _srv, port = server
    with AuthzClient(f"127.0.0.1:{port}", transport_label="mcp") as gateway:
        for k in range(2):
            request = make_request(call_id=f"mcp_{k}", request_id=f"m{k}")
            assert gateway.authorize(request.context, request.call).decision == pb.ALLOW
    for k in range(5):
        assert http.authorize(ALICE, _call(k, "http")).decision == "ALLOW"
    batch = [{"call": {"call_id": f"hb_{k}", "name": "issue_refund", "input": {"order_id": "ord_1",
                                                                                 "amount_cents": 1500}},
              "entities": ALICE.entities} for k in range(2)]
    context = {k: v for k, v in Context(request_id="hb").as_json().items() if k != "entities"}
    status, answer = http.exchange("POST", "/v1/authorize-batch", json.dumps({"context": context,
                                                                               "calls": batch}).encode())
    assert status == 200 and [a["response"]["decision"] for a in answer["answers"]] == ["ALLOW", "ALLOW"]
    moved = {t: decisions(t) - before[t] for t in before}
    assert moved == {"grpc": 4, "mcp": 2, "http": 7, "console": 0}


def test_verify_and_latency_are_counted_per_transport(channel, http):
    ok_http, rpc_http = (counts("toolauthz_verifications_total", code="ok", transport="http"),
                         counts("toolauthz_rpc_duration_seconds_count", rpc="Verify", transport="http"))
    authorize_http = counts("toolauthz_rpc_duration_seconds_count", rpc="Authorize", transport="http")
    call = _call(0, "verify")
    decided = http.authorize(ALICE, call)
    assert http.verify(decided.token, ALICE, call).valid
    assert counts("toolauthz_verifications_total", code="ok", transport="http") == ok_http + 1
    assert counts("toolauthz_rpc_duration_seconds_count", rpc="Verify", transport="http") == rpc_http + 1
    assert counts("toolauthz_rpc_duration_seconds_count", rpc="Authorize", transport="http") == authorize_http + 1


def test_the_client_and_the_sidecar_agree_on_the_declarable_transports():
    assert set(client_tracing.DECLARABLE_TRANSPORTS) == observe.DECLARABLE_TRANSPORTS
    assert client_tracing.TRANSPORT_METADATA == observe.TRANSPORT_METADATA
    assert observe.grpc_transport([("toolauthz-transport", "mcp")]) == "mcp"
    for spoofed in ("http", "console", "MCP", "grpc", "x" * 1000):
        assert observe.grpc_transport([("toolauthz-transport", spoofed)]) == "grpc"
    with pytest.raises(ValueError, match="transport_label must be one of mcp"):
        AuthzClient("127.0.0.1:1", transport_label="console")


def test_approvals_decided_in_the_console_and_over_grpc_are_counted_by_transport(sidecar, channel):
    console = console_for(sidecar, sign_in="dev")
    before = {t: counts("toolauthz_approvals_decided_total", verdict="approved", transport=t)
              for t in ("console", "grpc")}
    _, first = propose(sidecar, call_id="toolu_console")
    client = browser(console)
    sign_in(client, "bob")
    page = f"/approvals/{first.approval_id}"
    assert post_form(client, page, f"{page}/decide", verdict="APPROVE").status_code == 303
    _, second = propose(sidecar, call_id="toolu_grpc")
    approvals = apb_grpc.ApprovalsStub(channel)
    approver = pb.TrustedContext(tenant="acme", principal=pb.Principal(type="User", id="bob"))
    decided = approvals.DecideApproval(apb.DecideApprovalRequest(approval_id=second.approval_id, approver=approver,
                                                                  verdict=apb.APPROVE))
    assert decided.status == apb.APPROVED
    moved = {t: counts("toolauthz_approvals_decided_total", verdict="approved", transport=t) - before[t]
             for t in before}
    assert moved == {"console": 1, "grpc": 1}


def test_an_http_call_with_a_traceparent_is_one_span_tree_in_the_callers_trace(spans, http):
    status, answer = http.exchange("POST", "/v1/authorize", _body(ctx=ALICE, call=_call(0, "traced")),
                                   headers={"traceparent": f"00-{TRACE_ID}-{PARENT_SPAN}-01"})
    assert (status, answer["decision"]) == (200, "ALLOW")
    finished = spans.get_finished_spans()
    in_trace = [s for s in finished if format(s.context.trace_id, "032x") == TRACE_ID]
    assert len(in_trace) == len(finished)  # every span of the request is in the caller's trace
    [rpc] = [s for s in in_trace if s.name == "toolauthz.Authorize"]
    assert format(rpc.parent.span_id, "016x") == PARENT_SPAN and rpc.parent.is_remote
    assert rpc.attributes["toolauthz.decision_id"] == answer["decision_id"]
    assert rpc.attributes["toolauthz.result"] == "allow"
    children = {s.name for s in in_trace if s.parent is not None and s.parent.span_id == rpc.context.span_id}
    assert children == {"validate", "evaluate", "sign", "store"}
    roots = [s for s in in_trace if s.parent is None or s.parent.is_remote]
    assert roots == [rpc]


def test_an_http_call_without_a_traceparent_starts_one_trace(spans, http):
    status, _answer = http.exchange("POST", "/v1/authorize", _body(ctx=ALICE, call=_call(1, "untraced")))
    assert status == 200
    finished = spans.get_finished_spans()
    assert len({s.context.trace_id for s in finished}) == 1
    assert [s.name for s in finished if s.parent is None] == ["toolauthz.Authorize"]
