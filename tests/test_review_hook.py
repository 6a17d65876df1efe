"""Outside review, as an attacker, of `toolauthz hook claude-code`: the installed console
script with hostile stdin. Every path must be a deny (exit 0 with the documented JSON),
never an allow, a traceback or exit 1; stdin never chooses the identity."""

from __future__ import annotations

import pytest
from test_hook_claude_code import ALICE, address, answer, bundle_dir, hook, pre_tool_use  # noqa: F401 - fixtures


def test_a_call_id_reused_with_other_arguments_is_denied(address, sidecar):  # noqa: F811
    status, output, _ = hook(pre_tool_use("Bash", {"command": "ls"}, "toolu_rv_1"), *ALICE, server=address)
    assert (status, answer(output)[0]) == (0, "allow")
    status, output, stderr = hook(pre_tool_use("Bash", {"command": "rm -rf /"}, "toolu_rv_1"), *ALICE,
                                  server=address)
    assert (status, answer(output)[0]) == (0, "deny") and "Traceback" not in stderr


def test_stdin_identity_fields_do_not_override_the_configured_identity(address, sidecar):  # noqa: F811
    forged = pre_tool_use("Bash", {"command": "ls"}, "toolu_rv_2", tenant="globex",
                          principal='User::"root"', context={"tenant": "globex"})
    hook(forged, *ALICE, server=address)
    entry = sidecar.ledger.get("acme", "toolu_rv_2")
    assert entry is not None and entry.principal == 'User::"alice"'
    assert sidecar.ledger.get("globex", "toolu_rv_2") is None


@pytest.mark.parametrize("stdin", [
    b'{"hook_event_name": "PreToolUse", "hook_event_name": "PostToolUse"}',
    b'{"hook_event_name": null}',
    b'{"hook_event_name": "PreToolUse", "session_id": 7, "tool_name": "Bash", "tool_use_id": "toolu_rv_3", '
    b'"tool_input": {}}',
    b'{"hook_event_name": "PreToolUse", "session_id": "s", "tool_name": ["Bash"], "tool_use_id": "toolu_rv_4", '
    b'"tool_input": {}}',
    b'{"hook_event_name": "PreToolUse", "session_id": "s", "tool_name": "Bash", "tool_use_id": "toolu_rv_5", '
    b'"tool_input": {"command": "ls", "command": "rm -rf /"}}',
    b'{"hook_event_name": "PreToolUse", "session_id": "s", "tool_name": "Bash", "tool_use_id": "toolu_rv_6", '
    b'"tool_input": {"command": "\\ud800"}}',
    b'{"hook_event_name": "PreToolUse", "session_id": "s", "tool_name": "Bash", "tool_use_id": "toolu_rv_7", '
    b'"tool_input": {"n": 9007199254740993}}',
    b'{"hook_event_name": "PreToolUse", "session_id": "' + b"s" * 200_000 + b'", "tool_name": "Bash", '
    b'"tool_use_id": "toolu_rv_8", "tool_input": {"command": "ls"}}',
])
def test_hostile_stdin_is_never_an_allow(address, sidecar, stdin):  # noqa: F811
    status, output, stderr = hook(stdin, *ALICE, server=address)
    assert status == 0 and "Traceback" not in stderr
    decision, reason = answer(output)
    assert decision == "deny" and "\n" not in reason and len(reason) < 2048
