""""Who approved the refund on order ord_777, and did it run?" in one command, from the
local store or from a running sidecar (`--server`), which print the same."""

from __future__ import annotations

import pytest
from conftest import make_request, order_entity, verify_request

from toolauthz.cli.main import main
from toolauthz.proto.toolauthz.v1 import approvals_pb2 as apb
from toolauthz.proto.toolauthz.v1 import approvals_pb2_grpc as apb_grpc
from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb

BOB = pb.TrustedContext(tenant="acme", principal=pb.Principal(type="User", id="bob"), request_id="ui")


def _refund(call_id: str, amount: int, order: str = "ord_777") -> pb.AuthorizeRequest:
    return make_request(call_id=call_id, args={"order_id": order, "amount_cents": amount},
                        entities=[order_entity(order, "alice")])


@pytest.fixture
def refunds(stub, channel, server):
    """On ord_777: a large refund approved by bob, verified and completed; a second one
    rejected; and a small refund of another order."""
    approvals = apb_grpc.ApprovalsStub(channel)
    approved = _refund("call_approved", 7000)
    pending = stub.Authorize(approved)
    approvals.DecideApproval(apb.DecideApprovalRequest(approval_id=pending.approval_id, verdict=apb.APPROVE,
                                                       reason="customer called\x1b[2J", approver=BOB))
    token = approvals.GetApproval(apb.GetApprovalRequest(approval_id=pending.approval_id,
                                                         context=approved.context)).token
    assert stub.Verify(verify_request(approved, token)).valid
    stub.ReportOutcome(pb.ReportOutcomeRequest(context=approved.context, call_id="call_approved",
                                               status=pb.COMPLETED))
    rejected = _refund("call_rejected", 9000)
    approvals.DecideApproval(apb.DecideApprovalRequest(approval_id=stub.Authorize(rejected).approval_id,
                                                       verdict=apb.REJECT, reason="duplicate", approver=BOB))
    stub.Authorize(_refund("call_other", 1000, order="ord_1"))
    return server[1]


def _printed(capsys, *argv: str) -> str:
    assert main(list(argv)) == 0
    return capsys.readouterr().out


def test_one_command_tells_who_approved_and_whether_it_ran(refunds, sidecar, capsys):
    out = _printed(capsys, "audit", "--data-dir", str(sidecar.settings.data_dir), "show",
                   "--resource", 'Order::"ord_777"', "--tool", "issue_refund")
    approved, rejected = out.split("\n\n")
    assert approved.startswith("call call_approved") and rejected.startswith("call call_rejected")
    assert approved.splitlines()[-1] == ('  summary: decision APPROVAL_REQUIRED; approved by User::"bob": '
                                         "customer called\\x1b[2J; token verified; outcome completed (it ran)")
    assert rejected.splitlines()[-1] == ('  summary: decision APPROVAL_REQUIRED; rejected by User::"bob": '
                                         "duplicate; never verified; no outcome reported")
    stages = [line.split()[1] for line in approved.splitlines()[2:-1] if not line.lstrip().startswith("on ")]
    assert stages == ["decision", "approval", "verification", "outcome"]
    assert "\x1b" not in out and "ord_1\"" not in out


def test_the_server_prints_what_the_store_prints(refunds, sidecar, capsys):
    server = f"127.0.0.1:{refunds}"
    commands = [["show", "--resource", "Order::ord_777"], ["show", "call_approved"],
                ["query", "--resource", "Order::ord_777"], ["query", "--kind", "approval", "--json"],
                ["export", "--format", "csv"], ["export", "--approver", "User::bob"]]
    remote = [_printed(capsys, "audit", "--server", server, *command) for command in commands]
    sidecar.close()  # the store alone now: the local path reads the same records
    local = [_printed(capsys, "audit", "--data-dir", str(sidecar.settings.data_dir), *command)
             for command in commands]
    assert remote == local
    assert all(text.count("\n") >= 2 for text in remote)


def test_the_server_path_refuses_what_needs_the_store(refunds, capsys):
    assert main(["audit", "--server", f"127.0.0.1:{refunds}", "verify"]) == 1
    assert "reads the store itself" in capsys.readouterr().err
    assert main(["audit", "--server", f"127.0.0.1:{refunds}", "show", "call_approved", "--resource",
                 "Order::ord_777"]) == 1
    assert "not both" in capsys.readouterr().err


def test_the_query_table_has_a_resource_column(refunds, sidecar, capsys):
    out = _printed(capsys, "audit", "--data-dir", str(sidecar.settings.data_dir), "query", "--kind", "authorize")
    header, *rows = out.splitlines()
    assert header.split()[7] == "resource"
    assert [row.split()[7] for row in rows] == ['Order::"ord_777"', 'Order::"ord_777"', 'Order::"ord_1"']
