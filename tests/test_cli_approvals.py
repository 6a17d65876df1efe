"""`toolauthz approvals` against a scripted Approvals service: what a person reads before
approving cannot be forged by the strings an approval carries, and the server address
comes from `--server` (before or after the verb) or $TOOLAUTHZ_SERVER."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from toolauthz.cli.main import main
from toolauthz.display.escape import display as _shown
from toolauthz.proto.toolauthz.v1 import approvals_pb2 as apb
from toolauthz.proto.toolauthz.v1 import approvals_pb2_grpc as apb_grpc
from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb

# A resource id that, printed raw, would end its line and forge the lines below it (a
# short code, a requester) and then hide the rest of the screen (ESC [8m: concealed).
FORGED_ID = 'tkt_9"\ncode ZZZZ-ZZZZ\nrequester User::"ceo"\x1b[8m'
HOSTILE = ["\x1b", "\n", "\r", "\u200b", "\u202e", "\u2066", "\x00", "\x7f", "\u2028"]


def _forged_approval() -> apb.Approval:
    return apb.Approval(
        approval_id="ap_1", status=apb.PENDING, tenant="acme\x1b[2J", tool="close_ticket",
        resource=f'Ticket::"{FORGED_ID}"', short_code="ABCD-EFGH", group="support", policy_id="p1",
        requester=pb.Principal(type="User", id='mallory"\nrequester User::"ceo"'),
        expires_at=Timestamp(seconds=1_800_000_000),
        arguments_json='{"note": "fine\\u202e\\u001b[8m", "ticket_id": "tkt_9\\"\\ncode ZZZZ-ZZZZ"}',
        approver=pb.Principal(type="User", id="bob\u200b"), reason="ok\r\nreason: approved by ceo",
        usage=[apb.ShownField(label="refund_cents_24h", value="15.00 EUR\ndecided by User::\"ceo\"")])


class ScriptedApprovals(apb_grpc.ApprovalsServicer):
    def __init__(self) -> None:
        self.requests: list[str] = []

    def ListApprovals(self, request: apb.ListApprovalsRequest, context: Any) -> apb.ListApprovalsResponse:
        self.requests.append(f"ListApprovals {apb.ApprovalStatus.Name(request.status)}")
        return apb.ListApprovalsResponse(approvals=[_forged_approval()])

    def GetApproval(self, request: apb.GetApprovalRequest, context: Any) -> apb.Approval:
        self.requests.append(f"GetApproval {request.approval_id}")
        return _forged_approval()

    def DecideApproval(self, request: apb.DecideApprovalRequest, context: Any) -> apb.Approval:
        approver = request.approver.principal
        self.requests.append(f"DecideApproval {request.approval_id} {apb.Verdict.Name(request.verdict)} "
                             f'{request.approver.tenant} {approver.type}::"{approver.id}" {request.reason}')
        return _forged_approval()


@pytest.fixture
def approvals_server() -> Iterator[tuple[str, ScriptedApprovals]]:
    servicer = ScriptedApprovals()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    apb_grpc.add_ApprovalsServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}", servicer
    finally:
        server.stop(None)


@pytest.mark.parametrize("verb", [["show", "ap_1"], ["list"]])
def test_no_field_can_forge_a_line_or_hide_the_screen(approvals_server: tuple[str, ScriptedApprovals],
                                                      capsys: pytest.CaptureFixture[str], verb: list[str]) -> None:
    address, _ = approvals_server
    assert main(["approvals", "--server", address, *verb]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\r" not in out
    lines = out.splitlines()  # splits at every line boundary Python knows, U+2028 and \x1c too
    # show: its 9 labelled lines; list: the header and one row
    assert len(lines) == (9 if verb[0] == "show" else 2)
    assert not any(line.startswith(("code ZZZZ", "requester User::\"ceo\"", "decided by User::\"ceo\""))
                   for line in lines)
    assert 'Ticket::"tkt_9\\"\\ncode ZZZZ-ZZZZ\\nrequester User::\\"ceo\\"\\x1b[8m"' in out
    assert 'User::"mallory\\"\\nrequester User::\\"ceo\\""' in out
    assert "\\u202e" in out  # the arguments' reordering character, as its code


def test_a_decided_approval_shows_its_approver_and_reason_escaped(approvals_server: tuple[str, ScriptedApprovals],
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    address, servicer = approvals_server
    assert main(["approvals", "approve", "ap_1", "--as", 'User::"bob"', "--tenant", "acme", "--reason", "fine",
                 "--server", address]) == 0
    assert servicer.requests == ['DecideApproval ap_1 APPROVE acme User::"bob" fine']
    out = capsys.readouterr().out
    assert 'decided by User::"bob\\u200b"  ok\\r\\nreason: approved by ceo' in out
    assert 'usage      refund_cents_24h: 15.00 EUR\\ndecided by User::"ceo"' in out  # one line
    assert len(out.splitlines()) == 9


def test_the_server_address_after_the_verb_and_from_the_environment(approvals_server: tuple[str, ScriptedApprovals],
                                                                    monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    address, servicer = approvals_server
    assert main(["approvals", "list", "--server", address, "--status", "approved"]) == 0
    monkeypatch.setenv("TOOLAUTHZ_SERVER", address)
    assert main(["approvals", "show", "ap_1"]) == 0
    # An explicit --server beats the environment: nothing listens on port 1.
    assert main(["approvals", "--server", "127.0.0.1:1", "show", "ap_2"]) == 1
    assert "unavailable" in capsys.readouterr().err
    assert servicer.requests == ["ListApprovals APPROVED", "GetApproval ap_1"]


def test_approvals_list_has_a_header_and_an_expiry_column(approvals_server: tuple[str, ScriptedApprovals],
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    address, _ = approvals_server
    assert main(["approvals", "--server", address, "list"]) == 0
    header, row = capsys.readouterr().out.splitlines()
    assert header.split() == ["APPROVAL", "CODE", "STATUS", "EXPIRES", "TENANT", "TOOL", "RESOURCE", "REQUESTER",
                              "ARGUMENTS"]
    assert row.split()[:4] == ["ap_1", "ABCD-EFGH", "pending", "2027-01-15T08:00:00Z"]
    assert header.index("EXPIRES") == row.index("2027-01-15T08:00:00Z")  # aligned under its header


def test_a_table_refuses_a_cell_that_was_not_escaped() -> None:
    from toolauthz.cli.table import table
    with pytest.raises(ValueError, match="escaped"):
        table(["A", "B"], [["ok", "forged\nrow"]])


@pytest.mark.parametrize("char", HOSTILE)
def test_shown_escapes_every_invisible_or_line_breaking_character(char: str) -> None:
    shown = _shown(f"a{char}b")
    assert char not in shown and shown.isprintable() and shown.startswith("a\\") and shown.endswith("b")


def test_shown_keeps_printable_text_and_escapes_quotes_and_backslashes() -> None:
    assert _shown("Zoë 42 ✓") == "Zoë 42 ✓"
    assert _shown('say "hi" \\o/') == 'say \\"hi\\" \\\\o/'
    assert _shown("\U0001f600\U000e0001") == "\U0001f600\\U000e0001"  # an emoji stays; a tag character does not
