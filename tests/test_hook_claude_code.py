"""`toolauthz hook claude-code`, run the way Claude Code runs it: the installed console
script in a subprocess, the documented hook JSON on stdin, against a live sidecar serving
the coding-agent bundle (examples/claude_code/policies). Every answer is the documented
JSON on stdout with exit status 0, never a traceback."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys

import pytest
from conftest import ROOT

from toolauthz.audit.store import AuditQuery
from toolauthz.client import AuthzClient, Principal, TrustedContext

CONSOLE_SCRIPT = pathlib.Path(sys.executable).parent / "toolauthz"
BOB = TrustedContext("acme", Principal("User", "bob"), "approval-desk")


@pytest.fixture
def bundle_dir(tmp_path) -> pathlib.Path:
    target = tmp_path / "bundle"
    shutil.copytree(ROOT / "examples" / "claude_code" / "policies", target)
    return target


@pytest.fixture
def address(server) -> str:
    return f"127.0.0.1:{server[1]}"


def pre_tool_use(tool_name: str, tool_input, tool_use_id: str, **more) -> dict:
    return {"session_id": "sess-1", "transcript_path": "/tmp/t.jsonl", "cwd": "/workspace",
            "permission_mode": "default", "hook_event_name": "PreToolUse", "tool_name": tool_name,
            "tool_input": tool_input, "tool_use_id": tool_use_id, **more}


def hook(stdin: bytes | str | dict, *args: str, server: str | None = None,
         env: dict | None = None) -> tuple[int, dict | None, str]:
    """Runs the hook; (exit status, the parsed stdout or None when empty, stderr)."""
    data = json.dumps(stdin) if isinstance(stdin, dict) else stdin
    flags = ["--server", server] if server else []
    base = {k: v for k, v in os.environ.items() if not k.startswith("TOOLAUTHZ_")}
    done = subprocess.run([str(CONSOLE_SCRIPT), "hook", "claude-code", *flags, *args],
                          input=data.encode() if isinstance(data, str) else data, capture_output=True, timeout=60,
                          env={**base, **(env or {})})
    out = done.stdout.decode()
    return done.returncode, json.loads(out) if out.strip() else None, done.stderr.decode()


def answer(output: dict) -> tuple[str, str]:
    specific = output["hookSpecificOutput"]
    assert specific["hookEventName"] == "PreToolUse"
    return specific["permissionDecision"], specific["permissionDecisionReason"]


ALICE = ("--tenant", "acme", "--principal", 'User::"alice"')


def events(sidecar, call_id):
    return [(r.event.kind, r.event.result) for r in sidecar.audit_log.query(AuditQuery(call_id=call_id), limit=50)]


def test_allow_spends_the_token_and_post_tool_use_reports_the_outcome(address, sidecar):
    status, output, stderr = hook(pre_tool_use("Bash", {"command": "ls -la"}, "toolu_cc_1"), *ALICE, server=address)
    assert status == 0 and answer(output)[0] == "allow", stderr
    assert events(sidecar, "toolu_cc_1") == [("authorize", "ALLOW"), ("verify", "ok")]
    entry = sidecar.ledger.get("acme", "toolu_cc_1")
    assert entry.principal == 'User::"alice"' and entry.tool == "bash" and entry.request_id == "sess-1"

    post = {**pre_tool_use("Bash", {"command": "ls -la"}, "toolu_cc_1"), "hook_event_name": "PostToolUse",
            "tool_response": {"stdout": "total 0", "stderr": "", "interrupted": False}}
    status, output, stderr = hook(post, *ALICE, server=address)
    assert (status, output) == (0, None), stderr
    assert sidecar.ledger.get("acme", "toolu_cc_1").outcome == "completed"

    # The same tool use again (a replayed transcript): its token is spent, nothing is allowed.
    status, output, _ = hook(pre_tool_use("Bash", {"command": "ls -la"}, "toolu_cc_1"), *ALICE, server=address)
    assert answer(output) == ("deny", "this tool call was already authorized and run once; it is not run again")


def test_deny_carries_the_policy_and_closes_the_call(address, sidecar):
    status, output, _ = hook(pre_tool_use("Bash", {"command": "rm -rf /"}, "toolu_cc_2"), *ALICE, server=address)
    decision, reason = answer(output)
    assert (status, decision) == (0, "deny") and "`bash-no-recursive-force-delete`" in reason
    assert sidecar.ledger.get("acme", "toolu_cc_2").outcome == "failed"
    assert events(sidecar, "toolu_cc_2") == [("authorize", "DENY"), ("outcome", "failed")]

    _, output, _ = hook(pre_tool_use("Edit", {"file_path": "/workspace/.env", "old_string": "a", "new_string": "b"},
                                     "toolu_cc_3"), *ALICE, server=address)
    assert answer(output)[0] == "deny" and "`edit-never-secrets-or-git`" in answer(output)[1]


def test_approval_pending_is_ask_or_deny_and_only_the_approver_allows_it(address, sidecar):
    push = pre_tool_use("Bash", {"command": "git push origin main"}, "toolu_cc_4")
    _, output, _ = hook(push, *ALICE, "--on-pending", "ask", server=address)
    decision, reason = answer(output)
    [pending] = AuthzClient(address).list_approvals(tenant="acme")
    assert decision == "ask" and pending.approval_id in reason and pending.call_id == "toolu_cc_4"

    _, output, _ = hook(push, *ALICE, server=address)  # the default: nothing runs on the terminal's say
    assert answer(output)[0] == "deny" and "has not been run" in answer(output)[1]

    with AuthzClient(address) as client:
        client.decide_approval(pending.approval_id, BOB, "approve", "reviewed")
    _, output, _ = hook(push, *ALICE, server=address)  # resumed with the same tool_use_id (defer, resume=)
    assert answer(output)[0] == "allow"
    assert sidecar.ledger.get("acme", "toolu_cc_4").verified_jti


def test_sidecar_down_is_deny(tmp_path):
    with socket.socket() as held:  # bound, never listening: nothing answers there
        held.bind(("127.0.0.1", 0))
        status, output, stderr = hook(pre_tool_use("Bash", {"command": "ls"}, "toolu_cc_5"), *ALICE, "--timeout",
                                      "2", server=f"127.0.0.1:{held.getsockname()[1]}")
    assert status == 0 and "Traceback" not in stderr
    assert answer(output) == ("deny", "the tool call could not be authorized right now (the policy sidecar is "
                                      "unreachable); it was not run")


@pytest.mark.parametrize(("stdin", "why"), [
    (b"not json", "the hook input on stdin is not JSON"),
    (b"\xff\xfe{}", "the hook input on stdin is not JSON"),
    (b"[1, 2]", "the hook input on stdin is not a JSON object"),
    (b"", "the hook input on stdin is not JSON"),
    (json.dumps({"hook_event_name": "PreToolUse", "session_id": "s", "tool_name": "Bash"}),
     "the hook input has no `tool_use_id` string"),
    (json.dumps({"hook_event_name": "Stop", "session_id": "s"}), "unsupported hook event `\"Stop\"`"),
    (json.dumps(pre_tool_use("Bash", ["ls"], "toolu_cc_6")), "tool_input must be a JSON object"),
    ('{"hook_event_name": "PreToolUse", "session_id": "s", "tool_name": "Bash", "tool_use_id": "toolu_cc_7", '
     '"tool_input": {"command": NaN}}', "the tool call is malformed and was not run"),
    (json.dumps(pre_tool_use("Bash\n", {"command": "ls"}, "toolu_cc_8")), "has no catalog name"),
    (json.dumps(pre_tool_use("Bash", {"command": "ls"}, "toolu cc\u202e")), "call_id must match"),
    (b"{" * 1_100_000, "larger than 1048576 bytes"),
    (b'{"tool_input": ' + b"[" * 500_000, "nested too deeply"),
])
def test_malformed_stdin_is_deny_with_a_clear_reason(address, sidecar, stdin, why):
    status, output, stderr = hook(stdin, *ALICE, server=address)
    decision, reason = answer(output)
    assert (status, decision) == (0, "deny") and why in reason and "Traceback" not in stderr
    assert "\n" not in reason
    assert not sidecar.ledger.get("acme", "toolu_cc_6") and not sidecar.ledger.get("acme", "toolu_cc_8")


def test_identity_comes_from_the_configuration_never_from_stdin(address, sidecar):
    forged = pre_tool_use("Bash", {"command": "ls"}, "toolu_cc_9", tenant="globex", principal='User::"bob"',
                          user="bob")
    _, output, _ = hook(forged, server=address)  # no identity configured: refused, whatever stdin says
    assert answer(output)[0] == "deny" and "no identity configured" in answer(output)[1]
    assert sidecar.ledger.get("acme", "toolu_cc_9") is None

    env = {"TOOLAUTHZ_TENANT": "acme", "TOOLAUTHZ_PRINCIPAL": "User::alice", "TOOLAUTHZ_SERVER": address}
    _, output, _ = hook(forged, env=env)
    assert answer(output)[0] == "allow" and sidecar.ledger.get("acme", "toolu_cc_9").principal == 'User::"alice"'


def test_a_rejected_approval_is_deny_and_closes_the_call(address, sidecar):
    push = pre_tool_use("Bash", {"command": "git push --force"}, "toolu_cc_10")
    _, output, _ = hook(push, *ALICE, server=address)
    assert answer(output)[0] == "deny"
    with AuthzClient(address) as client:
        [pending] = client.list_approvals(tenant="acme")
        client.decide_approval(pending.approval_id, BOB, "reject", "no force pushes")
    _, output, _ = hook(push, *ALICE, server=address)
    assert answer(output) == ("deny", "a person reviewed this tool call and rejected it; it was not run")
    assert sidecar.ledger.get("acme", "toolu_cc_10").outcome == "failed"


@pytest.mark.parametrize(("failure", "outcome"), [({"error": "exit 1"}, "failed"),
                                                  ({"error": "interrupted", "is_interrupt": True}, "outcome_unknown")])
def test_a_failed_or_interrupted_tool_is_reported_as_such(address, sidecar, failure, outcome):
    call = pre_tool_use("Bash", {"command": "make test"}, "toolu_cc_11")
    assert answer(hook(call, *ALICE, server=address)[1])[0] == "allow"
    status, output, _ = hook({**call, "hook_event_name": "PostToolUseFailure", **failure}, *ALICE, server=address)
    assert (status, output) == (0, None)
    assert sidecar.ledger.get("acme", "toolu_cc_11").outcome == outcome


def test_the_coding_bundle_passes_its_own_policy_suite():
    done = subprocess.run([str(CONSOLE_SCRIPT), "test", str(ROOT / "examples" / "claude_code" / "policies")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 failed" in done.stdout and "9 of 9 policies reached" in done.stdout, done.stdout


def test_unreadable_tls_files_are_deny_not_a_traceback(address, tmp_path):
    status, output, stderr = hook(pre_tool_use("Bash", {"command": "ls"}, "toolu_cc_12"), *ALICE, "--ca",
                                  str(tmp_path / "missing.pem"), server=address)
    assert status == 0 and answer(output)[0] == "deny" and "Traceback" not in stderr
    assert "TLS files are unusable" in answer(output)[1]


def test_approval_wait_allows_once_the_approver_decides_while_the_hook_waits(address, sidecar):
    """The hook waits on the approval (Claude Code waits on the hook): the approver's
    decision, whether it lands before or after the hook starts watching, is what allows it."""
    push = pre_tool_use("Bash", {"command": "git push origin release"}, "toolu_cc_13")
    assert answer(hook(push, *ALICE, server=address)[1])[0] == "deny"  # the request is open
    with AuthzClient(address) as client:
        [pending] = client.list_approvals(tenant="acme")
        base = {k: v for k, v in os.environ.items() if not k.startswith("TOOLAUTHZ_")}
        with subprocess.Popen([str(CONSOLE_SCRIPT), "hook", "claude-code", "--server", address, *ALICE,
                               "--approval-wait", "60"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, env=base) as waiting:
            waiting.stdin.write(json.dumps(push).encode())
            waiting.stdin.close()
            client.decide_approval(pending.approval_id, BOB, "approve", "release")
            out, err = waiting.stdout.read(), waiting.stderr.read()
            waiting.wait(timeout=90)
    assert waiting.returncode == 0 and answer(json.loads(out))[0] == "allow", err
    assert sidecar.ledger.get("acme", "toolu_cc_13").verified_jti


def test_approval_wait_over_without_a_decision_is_the_pending_answer(address, sidecar):
    push = pre_tool_use("Bash", {"command": "git push origin hotfix"}, "toolu_cc_14")
    _, output, _ = hook(push, *ALICE, "--approval-wait", "0.5", server=address)
    assert answer(output)[0] == "deny" and "has not been run" in answer(output)[1]
    assert not sidecar.ledger.get("acme", "toolu_cc_14").verified_jti


@pytest.mark.parametrize(("claude_name", "catalog"), [
    ("Bash", "bash"), ("Edit", "edit"), ("WebFetch", "web_fetch"), ("MultiEdit", "multi_edit"),
    ("NotebookEdit", "notebook_edit"), ("mcp__github__create_issue", "mcp__github__create_issue"),
])
def test_claude_tool_names_map_one_to_one(claude_name, catalog):
    from toolauthz.integrations.claude_hooks import catalog_name

    assert catalog_name(claude_name) == catalog


@pytest.mark.parametrize("refused", ["bash", "Web_Fetch", "webFetch", "Bash\n", "Bash\u200b", "mcp__srv__Tool",
                                     "mcp__a-b__x", "mcp_github_x", "B" * 65, "", "Ваsh"])
def test_names_of_no_form_are_refused(refused):
    from toolauthz.integrations.claude_hooks import catalog_name

    with pytest.raises(ValueError):
        catalog_name(refused)
