"""ReportRefusal: a call the runtime refused on its own (the MCP proxy's `tool_changed`),
recorded as one audit record and nothing else."""

from __future__ import annotations

import grpc
import pytest
from conftest import make_request

from toolauthz.audit.store import AuditQuery
from toolauthz.client import AuthzClient
from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb

PINNED = "changed=description pinned=" + "a" * 64 + " advertised=" + "b" * 64


def refusal(tool: str = "issue_refund", code: str = "tool_changed", detail: str = PINNED, *,
            call_id: str = "toolu_1", tenant: str = "acme") -> pb.ReportRefusalRequest:
    return pb.ReportRefusalRequest(context=make_request(tenant=tenant).context, call_id=call_id, tool=tool,
                                   code=code, detail=detail)


def records(sidecar, call_id: str = "toolu_1") -> list:
    return [r.event for r in sidecar.audit_log.query(AuditQuery(call_id=call_id), limit=10)]


def test_a_refusal_is_one_audit_record_with_the_caller_and_the_code_and_no_ledger_row(stub, sidecar):
    response = stub.ReportRefusal(refusal())
    [event] = records(sidecar)
    assert (event.kind, event.result, event.error_codes) == ("authorize", "refused", ("tool_changed",))
    assert (event.decision_id, event.tool, event.tenant, event.principal, event.request_id) == (
        response.decision_id, "issue_refund", "acme", 'User::"alice"', "run-1")
    assert event.caller and event.detail == {"reported_by": "runtime", "detail": PINNED, "catalogued_tool": True}
    assert (event.digest, event.jti, event.resource, event.fields, event.approval_id) == ("", "", "", {}, "")
    assert sidecar.ledger.get("acme", "toolu_1") is None

    # No ledger row: the same call id proposed afterwards is decided as a new call.
    decided = stub.Authorize(make_request())
    assert decided.decision == pb.ALLOW and decided.token and not decided.replayed
    assert [(e.kind, e.result) for e in records(sidecar)] == [("authorize", "refused"), ("authorize", "ALLOW")]
    assert records(sidecar)[1].caller == event.caller


def test_an_uncatalogued_tool_and_the_detail_are_recorded_cut_short_and_escaped(stub, sidecar):
    stub.ReportRefusal(refusal(tool="evil\n\x1b[8m" + "x" * 200, detail="one\nfake line \x1b[8m\u202e"))
    [event] = records(sidecar)
    assert event.tool == "evil\\n\\x1b[8m" + "x" * 55 and event.detail["catalogued_tool"] is False
    assert event.detail["detail"] == "one\\nfake line \\x1b[8m\\u202e"


@pytest.mark.parametrize("change", [
    {"code": "policy_denied"}, {"code": "TOOL_CHANGED"}, {"code": ""}, {"code": "tool_changed "},
    {"detail": "x" * 513}, {"call_id": ""}, {"call_id": "bad id"}, {"tool": ""}, {"tenant": ""},
])
def test_a_code_outside_the_allow_list_or_a_bad_request_is_invalid_and_records_nothing(stub, sidecar, change):
    with pytest.raises(grpc.RpcError) as err:
        stub.ReportRefusal(refusal(**change))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
    assert sidecar.audit_log.head()[0] == 1  # record 1: the bundle loaded at start-up


def test_the_detail_may_be_512_characters(stub, sidecar):
    stub.ReportRefusal(refusal(detail="d" * 512))
    assert records(sidecar)[0].detail["detail"] == "d" * 512


def test_the_sdk_reports_a_refusal(server, sidecar):
    _srv, port = server
    with AuthzClient(f"127.0.0.1:{port}") as client:
        decision_id = client.report_refusal(make_request().context, "toolu_1", "issue_refund", "tool_changed",
                                            PINNED)
    [event] = records(sidecar)
    assert event.decision_id == decision_id and event.error_codes == ("tool_changed",)
