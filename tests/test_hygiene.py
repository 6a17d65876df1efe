"""Input hygiene: names match their patterns in full, malformed bytes and tampered page
tokens are the caller's fault, errors echo only a short escaped prefix, and whatever a
model or a runtime wrote is displayed escaped."""

from __future__ import annotations

import grpc
import pytest

from tests.conftest import make_request
from toolauthz.errors import RequestError
from toolauthz.model import CALL_ID, PRINCIPAL_ID, PRINCIPAL_TYPE, REQUEST_ID, TENANT, Principal, TrustedContext
from toolauthz.proto.toolauthz.v1 import approvals_pb2 as apb
from toolauthz.proto.toolauthz.v1 import approvals_pb2_grpc as apb_grpc
from toolauthz.proto.toolauthz.v1 import audit_pb2 as aupb
from toolauthz.proto.toolauthz.v1 import audit_pb2_grpc as aupb_grpc
from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb

SMUGGLED_TAILS = ["\n", "\r", "\x00", "\u200b"]
FORGED_ID = 'tkt_9"\ncode ZZZZ-ZZZZ\nrequester User::"ceo"\x1b[8m'


# ---- names match their patterns in full -------------------------------------------------

@pytest.mark.parametrize("pattern, good", [(TENANT, "acme"), (PRINCIPAL_TYPE, "User"), (PRINCIPAL_ID, "alice"),
                                           (CALL_ID, "dup1"), (REQUEST_ID, "run-1")])
@pytest.mark.parametrize("tail", SMUGGLED_TAILS)
def test_every_name_pattern_refuses_a_smuggled_tail(pattern, good, tail):
    assert pattern.fullmatch(good)
    assert not pattern.match(good + tail)  # also safe for a caller that uses .match
    assert not pattern.fullmatch(good + tail)


@pytest.mark.parametrize("tail", SMUGGLED_TAILS)
@pytest.mark.parametrize("field", ["tenant", "principal id", "request_id"])
def test_a_trusted_context_with_a_smuggled_tail_is_refused(field, tail):
    names = {"tenant": "acme", "principal id": "alice", "request_id": "run-1"}
    names[field] += tail
    ctx = TrustedContext(names["tenant"], Principal("User", names["principal id"]), names["request_id"])
    with pytest.raises(RequestError, match=field):
        ctx.check()


@pytest.mark.parametrize("tail", SMUGGLED_TAILS)
def test_a_call_id_with_a_trailing_newline_is_not_a_second_call(stub, tail):
    stub.Authorize(make_request(call_id="dup1"))
    with pytest.raises(grpc.RpcError) as info:
        stub.Authorize(make_request(call_id="dup1" + tail, args={"order_id": "ord_1", "amount_cents": 1}))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as info:
        stub.Authorize(make_request(tenant="acme" + tail))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_a_schema_pattern_ending_in_dollar_refuses_a_trailing_newline(stub):
    """`^ord_[A-Za-z0-9]{1,32}$` is an ECMA-262 regex in JSON Schema: `$` ends the input."""
    reply = stub.Authorize(make_request(args={"order_id": "ord_1\n", "amount_cents": 1500}))
    assert reply.decision == pb.DENY
    assert [e.code for e in reply.errors] == ["invalid_input"]


# ---- malformed bytes and tampered page tokens ------------------------------------------

MALFORMED = b"\xff\xff\xff\xff"


@pytest.mark.parametrize("method", ["/toolauthz.v1.ToolAuthorizer/Authorize", "/toolauthz.v1.ToolAuthorizer/Verify",
                                    "/toolauthz.v1.ToolAuthorizer/AuthorizeBatch",
                                    "/toolauthz.v1.ToolAuthorizer/ReportOutcome",
                                    "/toolauthz.v1.ToolAuthorizer/GetKeys",
                                    "/toolauthz.v1.Approvals/GetApproval", "/toolauthz.v1.Approvals/DecideApproval"])
def test_malformed_protobuf_is_invalid_argument(channel, method):
    call = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
    with pytest.raises(grpc.RpcError) as info:
        call(MALFORMED, timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not a valid `toolauthz.v1." in info.value.details()
    assert "Error" not in info.value.details()  # no exception class


@pytest.mark.parametrize("method", ["/toolauthz.v1.Audit/QueryDecisions", "/toolauthz.v1.Approvals/WatchApproval"])
def test_malformed_protobuf_on_a_stream_is_invalid_argument(channel, method):
    call = channel.unary_stream(method, request_serializer=None, response_deserializer=None)
    with pytest.raises(grpc.RpcError) as info:
        list(call(MALFORMED, timeout=10))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize("token", ["\u00b2", "9" * 20, "1" * 5000, "-1", "+1", "01", " 1", "1\n", "\u0661"])
def test_a_tampered_page_token_is_invalid_argument(channel, token):
    with pytest.raises(grpc.RpcError) as info:
        list(aupb_grpc.AuditStub(channel).QueryDecisions(aupb.QueryDecisionsRequest(page_token=token), timeout=10))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_the_largest_seq_is_a_valid_page_token(channel):
    assert list(aupb_grpc.AuditStub(channel).QueryDecisions(
        aupb.QueryDecisionsRequest(page_token=str((1 << 63) - 1)), timeout=10)) == []


# ---- errors echo a short escaped prefix -------------------------------------------------

def test_a_huge_approval_id_is_not_copied_into_not_found(channel):
    approvals = apb_grpc.ApprovalsStub(channel)
    huge = "A" * 100_000
    with pytest.raises(grpc.RpcError) as info:
        approvals.GetApproval(apb.GetApprovalRequest(approval_id=huge), timeout=10)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert len(info.value.details()) < 300


def test_an_approval_id_with_control_characters_is_escaped_in_not_found(channel):
    approvals = apb_grpc.ApprovalsStub(channel)
    with pytest.raises(grpc.RpcError) as info:
        approvals.GetApproval(apb.GetApprovalRequest(approval_id=FORGED_ID), timeout=10)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert "\n" not in info.value.details() and "\x1b" not in info.value.details()


def test_an_unknown_tool_name_is_escaped_in_the_models_message(stub):
    reply = stub.Authorize(make_request(tool="x\x1b[8m\nfake"))
    assert [e.code for e in reply.errors] == ["unknown_tool"]
    assert "\x1b" not in reply.errors[0].message and "\n" not in reply.errors[0].message
