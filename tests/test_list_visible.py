"""ListVisible over gRPC: which tools some call of a principal could be allowed, decided
by the loaded bundle; a preview that writes nothing, with bad requests refused."""

from __future__ import annotations

import grpc
import pytest
from conftest import calls_audited

from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb
from toolauthz.visibility import MAX_NAMES


def ask(stub, tools: list[str], principal: tuple[str, str] = ("User", "alice"),
        tenant: str = "acme") -> pb.ListVisibleResponse:
    context = pb.TrustedContext(tenant=tenant, principal=pb.Principal(type=principal[0], id=principal[1]),
                                request_id="run-1")
    return stub.ListVisible(pb.ListVisibleRequest(context=context, tools=tools))


def test_lists_the_tools_a_call_could_be_allowed_in_the_order_asked(stub, sidecar):
    answer = ask(stub, ["measure_runtime", "lookup_order", "nope", "issue_refund", "lookup_order"])
    # Each of the example's tools has a permit some call can meet; `nope` is not catalogued.
    assert list(answer.visible) == ["measure_runtime", "lookup_order", "issue_refund"]
    assert answer.policy_version == sidecar.bundles.current.version
    assert calls_audited(sidecar) == []  # a preview: nothing recorded (but the start-up bundle record)


@pytest.mark.parametrize(("principal", "tools", "fragment"), [
    (("Robot", "r1"), ["lookup_order"], "principal type `Robot`"),
    (("User", "alice"), ["t"] * (MAX_NAMES + 1), f"at most {MAX_NAMES}"),
    (("User", "al\u0001ice"), ["lookup_order"], ""),
])
def test_a_bad_request_is_invalid_argument(stub, principal, tools, fragment):
    with pytest.raises(grpc.RpcError) as caught:
        ask(stub, tools, principal)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert fragment in caught.value.details()
