"""The audit trail from the auditor's side: one call's story, queries, export, verify,
and the QueryDecisions RPC."""

from __future__ import annotations

import json
import sqlite3

import pytest
from conftest import make_request, verify_request

from toolauthz.cli.main import main
from toolauthz.proto.toolauthz.v1 import approvals_pb2 as apb
from toolauthz.proto.toolauthz.v1 import approvals_pb2_grpc as apb_grpc
from toolauthz.proto.toolauthz.v1 import audit_pb2 as aupb
from toolauthz.proto.toolauthz.v1 import audit_pb2_grpc as aupb_grpc
from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb
from toolauthz.server.config import DATABASE_FILE

SECRET = "sk_live_DO_NOT_LOG_777"


@pytest.fixture
def history(stub, channel, sidecar):
    """A small refund run to completion, and a large one approved by bob and executed."""
    small = make_request(call_id="call_small")
    allowed = stub.Authorize(small)
    assert stub.Verify(verify_request(small, allowed.token)).valid
    stub.ReportOutcome(pb.ReportOutcomeRequest(context=small.context, call_id="call_small", status=pb.COMPLETED))

    large = make_request(call_id="call_large", args={"order_id": "ord_1", "amount_cents": 7000, "reason": SECRET})
    pending = stub.Authorize(large)
    approvals = apb_grpc.ApprovalsStub(channel)
    approvals.DecideApproval(apb.DecideApprovalRequest(
        approval_id=pending.approval_id, verdict=apb.APPROVE,
        approver=pb.TrustedContext(tenant="acme", principal=pb.Principal(type="User", id="bob"), request_id="ui")))
    token = approvals.GetApproval(apb.GetApprovalRequest(approval_id=pending.approval_id, context=large.context)).token
    assert stub.Verify(verify_request(large, token)).valid
    stub.ReportOutcome(pb.ReportOutcomeRequest(context=large.context, call_id="call_large", status=pb.FAILED,
                                               error_code="gateway_timeout"))
    stub.Authorize(make_request(tool="lookup_order", args={"order_id": "ord_1"}, call_id="call_lookup"))
    return sidecar


def closed(history) -> str:
    """Closing the sidecar signs the final checkpoint; returns the data dir."""
    history.close()
    return str(history.settings.data_dir)


def test_show_tells_one_calls_story_in_order(history, capsys):
    data = closed(history)
    assert main(["audit", "--data-dir", data, "show", "call_large"]) == 0
    out = capsys.readouterr().out
    lines = [line.split()[1] for line in out.splitlines()[2:-1] if not line.lstrip().startswith("on principal")]
    assert lines == ["decision", "approval", "verification", "outcome"], out
    assert "APPROVAL_REQUIRED because refund-own-order-large-needs-finance" in out
    assert 'APPROVE by User::"bob"' in out and "verification ok" in out and "failed gateway_timeout" in out
    assert SECRET not in out


def test_show_is_chronological_and_gives_the_approvers_reason(stub, channel, sidecar, capsys):
    request = make_request(call_id="call_replayed", args={"order_id": "ord_1", "amount_cents": 7000, "reason": "late"})
    pending = stub.Authorize(request)
    apb_grpc.ApprovalsStub(channel).DecideApproval(apb.DecideApprovalRequest(
        approval_id=pending.approval_id, verdict=apb.APPROVE, reason="customer called\x1b[2J, ok\nby finance",
        approver=pb.TrustedContext(tenant="acme", principal=pb.Principal(type="User", id="bob"), request_id="ui")))
    replayed = stub.Authorize(request)  # the same call again, after the approval: a replay
    assert replayed.token
    data = closed(sidecar)
    assert main(["audit", "--data-dir", data, "show", "call_replayed"]) == 0
    out = capsys.readouterr().out
    story = [line for line in out.splitlines()[2:-1] if not line.lstrip().startswith("on principal")]
    assert [line.split()[1] for line in story] == ["decision", "approval", "decision"], out
    assert "(replayed)" in story[2]
    assert 'APPROVE by User::"bob": customer called' in story[1] and "by finance" in story[1]
    assert "\x1b" not in out and len(out.splitlines()) == 7  # the reason's escape and newline are shown escaped


def test_verify_passes_untouched_and_names_an_edited_record(history, capsys):
    data = closed(history)
    assert main(["audit", "--data-dir", data, "verify"]) == 0
    assert capsys.readouterr().out.startswith("ok: ")
    db = sqlite3.connect(f"{data}/{DATABASE_FILE}")
    db.execute("DROP TRIGGER audit_record_no_update")
    db.execute("UPDATE audit_record SET result = 'ALLOW' WHERE seq = 4")  # seq 1: the bundle loaded at start-up
    db.commit()
    db.close()
    assert main(["audit", "--data-dir", data, "verify"]) == 1
    out = capsys.readouterr().out
    assert "seq 3: edited" in out  # the same record: the third of its chain


def test_query_filters_and_json_lines(history, capsys):
    data = closed(history)
    assert main(["audit", "--data-dir", data, "query", "--tool", "issue_refund", "--kind", "authorize", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["call_id"] for r in rows] == ["call_small", "call_large"]
    assert rows[1]["fields"] == {"/order_id": "ord_1", "/amount_cents": 7000}
    assert main(["audit", "--data-dir", data, "query", "--principal", 'User::"bob"']) == 0
    table = capsys.readouterr().out.splitlines()
    assert len(table) == 2 and "approval" in table[1]


def test_export_writes_every_record_without_secrets(history, tmp_path, capsys):
    data = closed(history)
    target = tmp_path / "audit.jsonl"
    assert main(["audit", "--data-dir", data, "export", "--output", str(target)]) == 0
    rows = [json.loads(line) for line in target.read_text().splitlines()]
    assert [r["seq"] for r in rows] == list(range(1, len(rows) + 1)) and len(rows) == 1 + 8  # and the start-up
    assert SECRET not in target.read_text()


def test_export_as_csv_one_row_per_record_formulas_defused(history, tmp_path, capsys):
    import csv

    data = closed(history)
    target = tmp_path / "audit.csv"
    assert main(["audit", "--data-dir", data, "export", "--format", "csv", "--kind", "outcome",
                 "--output", str(target)]) == 0
    rows = list(csv.DictReader(target.read_text(encoding="utf-8").splitlines()))
    assert [(r["call_id"], r["result"]) for r in rows] == [("call_small", "completed"), ("call_large", "failed")]
    assert json.loads(rows[1]["detail"])["error_code"] == "gateway_timeout" and SECRET not in target.read_text()
    assert main(["audit", "--data-dir", data, "export", "--format", "csv"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("seq,time,kind,result,") and len(lines) == 1 + 1 + 8  # the header, the start-up
    from toolauthz.cli.audit import _csv_cell

    assert _csv_cell("=HYPERLINK(1)") == "'=HYPERLINK(1)" and _csv_cell(["a"]) == '["a"]' and _csv_cell("ok") == "ok"


def test_query_decisions_rpc_filters_and_pages(history, channel):
    audit = aupb_grpc.AuditStub(channel)
    denied_or_allowed = list(audit.QueryDecisions(aupb.QueryDecisionsRequest(tenant="acme", kind="authorize")))
    assert [r.call_id for r in denied_or_allowed] == ["call_small", "call_large", "call_lookup"]
    first_page = list(audit.QueryDecisions(aupb.QueryDecisionsRequest(tenant="acme", limit=3)))
    second_page = list(audit.QueryDecisions(aupb.QueryDecisionsRequest(
        tenant="acme", limit=3, page_token=str(first_page[-1].seq))))
    assert [r.seq for r in first_page + second_page] == list(range(2, 8))  # seq 1: the start-up, in `_system`
    outcomes = list(audit.QueryDecisions(aupb.QueryDecisionsRequest(kind="outcome", result="failed")))
    codes = [(r.call_id, json.loads(r.detail_json)["error_code"]) for r in outcomes]
    assert codes == [("call_large", "gateway_timeout")]
    nobody = list(audit.QueryDecisions(aupb.QueryDecisionsRequest(tenant="globex")))
    assert nobody == []


def test_query_filter_values_any_case_or_refused_naming_the_allowed_ones(history, capsys):
    data = closed(history)
    assert main(["audit", "--data-dir", data, "query", "--result", "allow", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["call_id"], r["result"]) for r in rows] == [("call_small", "ALLOW"), ("call_lookup", "ALLOW")]
    for flag, value, named in (("--result", "allowed", "ALLOW, DENY"), ("--kind", "approvals", "approval, outcome"),
                               ("--principal", "alice", 'User::"alice"')):
        with pytest.raises(SystemExit) as exited:
            main(["audit", "--data-dir", data, "query", flag, value])
        assert exited.value.code == 2
        assert named in capsys.readouterr().err


@pytest.mark.parametrize("request_fields, named", [
    ({"result": "allowed"}, "ALLOW, DENY"), ({"kind": "approvals"}, "approval, outcome"),
    ({"principal": "alice"}, 'User::"alice"')])
def test_query_decisions_refuses_a_filter_value_no_record_holds(channel, request_fields, named):
    import grpc

    with pytest.raises(grpc.RpcError) as info:
        list(aupb_grpc.AuditStub(channel).QueryDecisions(aupb.QueryDecisionsRequest(**request_fields)))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and named in info.value.details()


def test_query_decisions_reads_a_result_in_any_case(history, channel):
    allowed = list(aupb_grpc.AuditStub(channel).QueryDecisions(aupb.QueryDecisionsRequest(result="allow")))
    assert [r.call_id for r in allowed] == ["call_small", "call_lookup"]


def test_who_approved_the_refund_on_an_order_and_did_it_run(history, capsys):
    data = closed(history)
    assert main(["audit", "--data-dir", data, "query", "--resource", "Order::ord_1", "--tool", "issue_refund",
                 "--approver", "User::bob", "--json"]) == 0
    approved = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["call_id"], r["kind"], r["result"]) for r in approved] == [("call_large", "approval", "APPROVE")]
    approval_id, decision_id = approved[0]["approval_id"], approved[0]["decision_id"]
    assert main(["audit", "--data-dir", data, "query", "--approval-id", approval_id, "--json"]) == 0
    story = [json.loads(line)["kind"] for line in capsys.readouterr().out.splitlines()]
    assert story == ["authorize", "approval", "outcome"]  # a verify record names the decision, not the approval
    assert main(["audit", "--data-dir", data, "query", "--decision-id", decision_id, "--kind", "outcome",
                 "--policy-version", approved[0]["policy_version"], "--json"]) == 0
    assert [json.loads(line)["result"] for line in capsys.readouterr().out.splitlines()] == ["failed"]
    assert main(["audit", "--data-dir", data, "query", "--policy", "refund-own-order-large-needs-finance",
                 "--json"]) == 0
    assert [json.loads(line)["call_id"] for line in capsys.readouterr().out.splitlines()] == ["call_large"]
    assert main(["audit", "--data-dir", data, "query", "--resource", 'Order::"ord_2"']) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1  # the header alone
    with pytest.raises(SystemExit) as exited:
        main(["audit", "--data-dir", data, "query", "--approver", "bob"])
    assert exited.value.code == 2 and 'User::"alice"' in capsys.readouterr().err


def test_query_decisions_rpc_takes_the_new_filters(history, channel):
    from toolauthz.client._convert import query_request

    audit = aupb_grpc.AuditStub(channel)
    approved = list(audit.QueryDecisions(query_request(resource='Order::"ord_1"', approver='User::"bob"')))
    assert [(r.call_id, r.kind) for r in approved] == [("call_large", "approval")]
    same_call = list(audit.QueryDecisions(query_request(approval_id=approved[0].approval_id, kind="outcome")))
    assert [(r.call_id, r.result) for r in same_call] == [("call_large", "failed")]
    by_decision = list(audit.QueryDecisions(query_request(decision_id=approved[0].decision_id)))
    assert len(by_decision) == 4 and {r.call_id for r in by_decision} == {"call_large"}
    by_policy = list(audit.QueryDecisions(query_request(policy_id="refund-own-order-large-needs-finance")))
    assert [r.call_id for r in by_policy] == ["call_large"]
    assert list(audit.QueryDecisions(query_request(error_code="not_call_owner"))) == []
    callers = {r.caller for r in audit.QueryDecisions(query_request(tenant="acme"))}
    for caller in callers:
        assert list(audit.QueryDecisions(query_request(caller=caller)))
    assert list(audit.QueryDecisions(query_request(caller="spiffe://nobody"))) == []
    assert list(audit.QueryDecisions(query_request(policy_version="no-such-version"))) == []


def test_query_decisions_rejects_a_bad_page_token(channel):
    import grpc

    with pytest.raises(grpc.RpcError) as info:
        list(aupb_grpc.AuditStub(channel).QueryDecisions(aupb.QueryDecisionsRequest(page_token="abc")))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_audit_commands_refuse_bad_input_clearly(history, tmp_path, capsys):
    data = closed(history)
    with pytest.raises(SystemExit) as refused:  # an argparse error, as every bad option value
        main(["audit", "--data-dir", data, "query", "--since", "yesterday"])
    assert refused.value.code == 2
    assert "`yesterday` is neither a duration such as `7d` nor an ISO 8601" in capsys.readouterr().err
    assert main(["audit", "--data-dir", str(tmp_path / "nowhere"), "verify"]) == 1
    assert "no audit store at" in capsys.readouterr().err
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "audit.db").write_bytes(b"")  # the two-file layout of earlier versions
    assert main(["audit", "--data-dir", str(tmp_path / "old"), "verify"]) == 1
    assert "audit.db` is the audit trail of an earlier version" in capsys.readouterr().err
    assert main(["audit", "--data-dir", data, "show", "no-such-call"]) == 1
    assert "no audit records for call `no-such-call`" in capsys.readouterr().err
