"""An approval of a metered call keeps the meter values the call was decided on: the
approver sees them (gRPC and console, rendered like the amount they sum), and deciding
the call again at approval time (a reloaded bundle) reads them, not zero."""

from __future__ import annotations

import grpc
import pytest
from conftest import make_request
from console_pages import browser, console_for, sign_in
from test_approvals import decide, reload_with

from toolauthz.proto.toolauthz.v1 import approvals_pb2 as apb
from toolauthz.proto.toolauthz.v1 import approvals_pb2_grpc as apb_grpc
from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb


@pytest.fixture
def approvals(channel) -> apb_grpc.ApprovalsStub:
    return apb_grpc.ApprovalsStub(channel)


def large_after_small(stub) -> tuple[pb.AuthorizeRequest, pb.AuthorizeResponse]:
    """alice refunds 15.00, then asks for 60.00 (finance must approve)."""
    assert stub.Authorize(make_request(call_id="small")).decision == pb.ALLOW
    request = make_request(call_id="large", args={"order_id": "ord_1", "amount_cents": 6000})
    response = stub.Authorize(request)
    assert response.decision == pb.APPROVAL_REQUIRED
    return request, response


@pytest.mark.both_stores
def test_the_approver_sees_the_meters_the_call_was_decided_on(stub, approvals, sidecar):
    _, response = large_after_small(stub)
    seen = approvals.GetApproval(apb.GetApprovalRequest(approval_id=response.approval_id))
    assert [(f.label, f.value) for f in seen.usage] == [("refund_cents_24h", "15.00 EUR")]
    assert sidecar.approvals.get(response.approval_id).usage == {"refund_cents_24h": 1500}


def test_the_console_shows_the_meters_on_the_approval_page(stub, sidecar):
    _, response = large_after_small(stub)
    client = browser(console_for(sidecar, sign_in="dev"))
    sign_in(client, "bob")
    html = client.get(f"/approvals/{response.approval_id}").text
    assert 'data-testid="approval-usage"' in html
    assert '<td class="code">refund_cents_24h</td><td class="code" data-testid="usage-value">15.00 EUR</td>' in html


def test_an_approval_decided_after_a_reload_is_decided_again_on_the_meters_it_saw(stub, approvals, sidecar,
                                                                                  bundle_dir):
    """The budget lowered to 70.00 while 60.00 waits for approval on 15.00 already spent:
    75.00 is over it, so the approval is refused as `policy_changed`. Decided again on a
    meter of zero, the call would have looked within budget."""
    _, response = large_after_small(stub)
    refunds = bundle_dir / "refunds.cedar"
    reload_with(sidecar, bundle_dir, "refunds.cedar", refunds.read_text().replace("> 500000 }", "> 7000 }"))
    with pytest.raises(grpc.RpcError) as info:
        decide(approvals, response.approval_id)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert info.value.details().startswith("policy_changed: ")


def test_an_approval_within_the_lowered_budget_still_stands(stub, approvals, sidecar, bundle_dir):
    _, response = large_after_small(stub)
    refunds = bundle_dir / "refunds.cedar"
    reload_with(sidecar, bundle_dir, "refunds.cedar", refunds.read_text().replace("> 500000 }", "> 7500 }"))
    assert decide(approvals, response.approval_id).status == apb.APPROVED
