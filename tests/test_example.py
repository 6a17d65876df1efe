"""The support-agent example, run as a test: every scenario line, exact execution counts."""

from __future__ import annotations

import io
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from examples.support_agent.scenario import MAX_STEPS, run_scenario  # noqa: E402 - importable only once ROOT is on sys.path


def test_the_scenario_trace_and_its_counts():
    out = io.StringIO()
    report = run_scenario(out)
    trace = out.getvalue()
    assert trace == report.trace.text + "\n"
    assert report.ok, trace

    expected_lines = [
        # an allowed order lookup
        "toolu_01 authorize -> ALLOW  [lookup-own-order]",
        'tool_result toolu_01 (ok): {"order_id": "ord_1001", "status": "shipped"',
        # arguments rejected by the schema, with zero executions
        "toolu_02 authorize -> DENY  [invalid_input]",
        "toolu_02 outcome -> failed invalid_input  [ReportOutcome: not_in_ledger]",
        # another customer's order denied: the same turn (one AuthorizeBatch), so both calls
        # are decided and ended before the turn's results go back to the model, in its order
        "toolu_03 authorize -> DENY  [policy_denied]",
        "tool_result toolu_02 (error): Not allowed, the call was not executed: input at `/` fails "
        "`additionalProperties`.",
        "(not executed; issue_refund implementation runs so far: 0)",
        "tool_result toolu_03 (error): Not allowed, the call was not executed: no policy permits this call.",
        # a small refund allowed and executed once
        "toolu_04 authorize -> ALLOW  [refund-own-order-small]",
        'tool_result toolu_04 (ok): {"refund_id": "rf_1"}',
        # a large refund waiting for approval, approved by bob, executed
        "toolu_05 authorize -> APPROVAL_REQUIRED, approval ",
        "[finance desk] alice tries to approve her own refund: refused (PERMISSION_DENIED)",
        "[finance desk] bob (group finance) approves it through the Approvals API",
        'toolu_05 approval -> APPROVED by User::"bob"; the token came with it',
        'tool_result toolu_05 (ok): {"refund_id": "rf_2"}',
        # a replayed call id blocked
        "toolu_04 replay: the recorded result (completed) is returned; NOT executed again",
        # the step limit
        "tool_result toolu_06 (error): Not executed: the run reached its step limit.",
        f"loop stopped by guard `max_steps` after {MAX_STEPS} model steps",
        # after a restart, the sidecar's ledger blocks the replay too
        "toolu_04 authorize -> ALLOW (replayed), no token: already executed",
        # the audit stories
        "toolu_02  issue_refund by User::\"alice\" on -",
        "(no outcome: refused before the ledger, so there is no call to close)",
        'approval      APPROVE by User::"bob"',
        "toolu_06: no records (never sent to the sidecar)",
    ]
    for line in expected_lines:
        assert line in trace, line
    # the order of the scenario
    positions = [trace.index(line) for line in expected_lines[:19]]
    assert positions == sorted(positions)
    assert "[FAILED]" not in trace and trace.count("[ok]") == len(report.checks) == 9

    # execution counts, exactly
    assert dict(report.backend.executions) == {"lookup_order": 1, "issue_refund": 2}
    assert [(r.refund_id, r.order_id, r.amount_cents, r.idempotency_key) for r in report.backend.refunds] == [
        ("rf_1", "ord_1001", 1500, "toolu_04"), ("rf_2", "ord_1001", 6000, "toolu_05")]
    assert report.backend.orders["acme"]["ord_1001"].refundable_cents == 10_000 - 7_500

    # each call's audit story, in order
    story = {cid: [(r.kind, r.result) for r in recs] for cid, recs in report.stories.items()}
    assert story["toolu_01"] == [("authorize", "ALLOW"), ("verify", "ok"), ("outcome", "completed")]
    assert story["toolu_02"] == [("authorize", "DENY")]
    assert story["toolu_03"] == [("authorize", "DENY"), ("outcome", "failed")]
    assert story["toolu_04"] == [("authorize", "ALLOW"), ("verify", "ok"), ("outcome", "completed"),
                                 ("authorize", "ALLOW")]
    assert story["toolu_05"] == [("authorize", "APPROVAL_REQUIRED"), ("approval", "refused"),
                                 ("approval", "APPROVE"), ("verify", "ok"), ("outcome", "completed")]
    assert story["toolu_06"] == []


def test_the_transcript_has_the_messages_api_shape():
    report = run_scenario(None)
    messages = report.loop.messages
    assert [m["role"] for m in messages] == ["user"] + ["assistant", "user"] * MAX_STEPS
    step2 = messages[3]
    assert [b["type"] for b in step2["content"]] == ["text", "tool_use", "tool_use"]  # verbatim
    results = messages[4]["content"]
    assert [(r["tool_use_id"], r["is_error"]) for r in results] == [("toolu_02", True), ("toolu_03", True)]
    for message in messages[2::2]:
        for result in message["content"]:
            assert set(result) == {"type", "tool_use_id", "content", "is_error"}
            assert "Traceback" not in result["content"] and "v4.public" not in result["content"]


def test_one_command_runs_it():
    for command in ([sys.executable, "-m", "examples.support_agent"],
                    [sys.executable, "examples/support_agent/run.py"]):
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "summary" in done.stdout and "[FAILED]" not in done.stdout, done.stdout
        assert done.stderr == "", done.stderr
