"""Safe display: whatever a model or a runtime wrote is shown escaped to the people who
read approvals and the audit trail, so that a resource id cannot forge lines of a page."""

from __future__ import annotations

import json

import pytest

from tests.conftest import make_request
from toolauthz.cli.main import main
from toolauthz.display.escape import bounded_message, display, display_uid, shown
from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb

FORGED_ID = 'tkt_9"\ncode ZZZZ-ZZZZ\nrequester User::"ceo"\x1b[8m'
TICKET_TOOL = """\
name: close_ticket
description: Close a support ticket.
side_effect: update
input_schema:
  $schema: https://json-schema.org/draft/2020-12/schema
  type: object
  properties:
    ticket_id: {type: string, pattern: "^tkt_"}
  required: [ticket_id]
  additionalProperties: false
resource: {type: Ticket, id: /ticket_id}
"""
TICKET_POLICY = """\
@id("closing-a-ticket-needs-finance")
@approval("finance")
permit (principal, action == Action::"tool:close_ticket", resource);
"""


@pytest.fixture
def bundle_dir(bundle_dir):
    """The example bundle plus a tool whose resource id the model writes, loosely pinned
    (`^tkt_` accepts anything after the prefix), behind an approval."""
    (bundle_dir / "tools" / "close_ticket.yaml").write_text(TICKET_TOOL)
    (bundle_dir / "tickets.cedar").write_text(TICKET_POLICY)
    with (bundle_dir / "schema.cedarschema").open("a") as schema:
        schema.write("entity Ticket in [Tenant];\n")
    return bundle_dir


def _forged_call(stub) -> pb.AuthorizeResponse:
    reply = stub.Authorize(make_request(tool="close_ticket", args={"ticket_id": FORGED_ID}, call_id="call_forged",
                                        entities=[]))
    assert reply.decision == pb.APPROVAL_REQUIRED, reply
    return reply


def _assert_one_line_per_field(out: str, lines: int) -> None:
    assert "\x1b" not in out
    assert "ZZZZ-ZZZZ" in out  # shown, escaped, on the line it belongs to
    assert len(out.splitlines()) == lines, out
    assert not any(line.startswith(("code ZZZZ", "requester User::\"ceo")) for line in out.splitlines())


def test_a_forged_resource_id_cannot_forge_lines_of_approvals_list_and_show(stub, server, capsys):
    reply = _forged_call(stub)
    address = f"127.0.0.1:{server[1]}"
    assert main(["approvals", "--server", address, "list"]) == 0
    _assert_one_line_per_field(capsys.readouterr().out, 2)  # the header and one row
    assert main(["approvals", "show", reply.approval_id, "--server", address]) == 0
    out = capsys.readouterr().out
    _assert_one_line_per_field(out, 7)
    assert f'close_ticket on Ticket::"{display(FORGED_ID)}"' in out
    assert [line.split()[0] for line in out.splitlines()].count("requester") == 1


def test_a_forged_resource_id_cannot_forge_lines_of_audit_show(stub, sidecar, capsys):
    _forged_call(stub)
    data = str(sidecar.settings.data_dir)
    sidecar.close()
    assert main(["audit", "show", "call_forged", "--data-dir", data]) == 0
    _assert_one_line_per_field(capsys.readouterr().out, 5)  # header (2), decision, its entities, summary
    assert main(["audit", "query", "--data-dir", data]) == 0
    assert "\x1b" not in capsys.readouterr().out


def test_an_unknown_call_id_is_escaped_by_audit_show(stub, sidecar, capsys):
    data = str(sidecar.settings.data_dir)
    sidecar.close()
    assert main(["audit", "--data-dir", data, "show", "x\x1b[8m"]) == 1
    assert "\x1b" not in capsys.readouterr().err


def test_principal_filters_and_options_are_accepted_after_the_verb_and_without_quotes(stub, sidecar, capsys):
    stub.Authorize(make_request(call_id="call_alice"))
    data = str(sidecar.settings.data_dir)
    sidecar.close()
    assert main(["audit", "query", "--data-dir", data, "--principal", "User::alice", "--json"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["call_id"] for r in records] == ["call_alice"]
    assert main(["audit", "verify", "--data-dir", data]) == 0
    assert capsys.readouterr().out.startswith("ok: ")


def test_a_principal_without_quotes_is_accepted_only_when_unambiguous(capsys):
    assert main(["authorize", "--tenant", "acme", "--principal", "User::alice", "--tool", "lookup_order",
                 "--input", '{"order_id": "ord_1"}']) == 0
    capsys.readouterr()
    for ambiguous in ('User::al"ice', "User::al ice", "User::alice\n"):
        with pytest.raises(SystemExit):
            main(["authorize", "--tenant", "acme", "--principal", ambiguous, "--tool", "x", "--input", "{}"])
        assert "principal must look like" in capsys.readouterr().err


# ---- display -----------------------------------------------------------------------------

def test_display_renders_every_dangerous_character_visibly():
    out = display(FORGED_ID)
    assert out == 'tkt_9\\"\\ncode ZZZZ-ZZZZ\\nrequester User::\\"ceo\\"\\x1b[8m'
    assert display("a\u200bb\u202ec\x00d\ttab\\`") == "a\\u200bb\\u202ec\\x00d\\ttab\\\\\\`"
    assert display("plain ord_1 café") == "plain ord_1 café"


def test_display_uid_escapes_the_id_only():
    assert display_uid(f'Ticket::"{FORGED_ID}"') == f'Ticket::"{display(FORGED_ID)}"'
    assert display_uid('Order::"ord_1"') == 'Order::"ord_1"'
    assert display_uid("not\na uid") == "not\\na uid"


def test_shown_keeps_a_short_prefix_and_counts_the_rest():
    assert shown("A" * 100_000) == "A" * 64 + "… (99936 more characters)"
    assert shown("ok\n") == "ok\\n"
    assert len(bounded_message("x" * 100_000)) < 1100
    assert json.loads(bounded_message('{"a": "b"}')) == {"a": "b"}


def test_log_lines_escape_what_a_caller_wrote():
    import logging

    from toolauthz.display.escape import EscapingFormatter

    formatter = EscapingFormatter("%(levelname)s %(message)s")
    record = logging.LogRecord("toolauthz", logging.WARNING, __file__, 1, "tool %s failed", (FORGED_ID,), None)
    line = formatter.format(record)
    assert "\n" not in line and "\x1b" not in line and line.startswith("WARNING tool tkt_9")
    try:
        raise ValueError(FORGED_ID)
    except ValueError:
        import sys
        record = logging.LogRecord("toolauthz", logging.ERROR, __file__, 1, "boom", (), sys.exc_info())
    assert "\x1b" not in formatter.format(record)
