"""The real Claude Agent SDK, and the Claude Code CLI it bundles, run offline against a
scripted Messages API on 127.0.0.1 and a live sidecar serving the coding-agent bundle
(examples/claude_code/policies). The hooks decide; the CLI executes Bash in a scratch
workspace, and every execution leaves a line in `runs.txt`, so executions are counted.
No hosted model is called."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import pathlib
import shutil

import pytest
from claude_agent_sdk import ClaudeAgentOptions, ClaudeSDKClient, ResultMessage, query
from conftest import ROOT

from examples.claude_agent.scripted_api import ScriptedCall, ScriptedMessagesApi, offline_env
from toolauthz.audit.store import AuditQuery
from toolauthz.client import AuthzClient, Principal, TrustedContext
from toolauthz.integrations.claude_agent import ClaudeAgentAuthz

BOB = TrustedContext("acme", Principal("User", "bob"), "approval-desk")


@pytest.fixture
def bundle_dir(tmp_path) -> pathlib.Path:
    target = tmp_path / "bundle"
    shutil.copytree(ROOT / "examples" / "claude_code" / "policies", target)
    return target


@pytest.fixture
def client(server):
    with AuthzClient(f"127.0.0.1:{server[1]}") as authz_client:
        yield authz_client


@pytest.fixture
def workspace(tmp_path) -> pathlib.Path:
    (tmp_path / "ws").mkdir()
    (tmp_path / "home").mkdir()
    return tmp_path


def runs(workspace: pathlib.Path) -> int:
    path = workspace / "ws" / "runs.txt"
    return len(path.read_text().splitlines()) if path.exists() else 0


def bash(call_id: str, command: str) -> ScriptedCall:
    return ScriptedCall(call_id, "Bash", json.dumps({"command": command}))


def options(authz: ClaudeAgentAuthz, api: ScriptedMessagesApi, workspace: pathlib.Path,
            **more) -> ClaudeAgentOptions:
    return ClaudeAgentOptions(cwd=str(workspace / "ws"), hooks=authz.hooks(), max_turns=4,
                              env=offline_env(api, str(workspace / "home")), **more)


def run(prompt: str, opts: ClaudeAgentOptions) -> ResultMessage:
    async def go() -> ResultMessage:
        result = None
        async for message in query(prompt=prompt, options=opts):
            if isinstance(message, ResultMessage):
                result = message
        assert result is not None
        return result

    return asyncio.run(asyncio.wait_for(go(), 120))


def alice(run_id: str = "coding-run-1") -> TrustedContext:
    return TrustedContext("acme", Principal("User", "alice"), run_id)


def test_allow_runs_once_and_the_outcome_is_reported(client, sidecar, workspace):
    authz = ClaudeAgentAuthz(client, alice())
    with ScriptedMessagesApi([bash("toolu_sdk_1", "echo ran >> runs.txt")]) as api:
        result = run("note that it ran", options(authz, api, workspace))
        assert result.stop_reason == "end_turn" and api.tool_results["toolu_sdk_1"][1] is False
        # The same response again (a replayed transcript, a new session): its token is spent.
        again = run("note that it ran", options(authz, api, workspace))
        assert api.tool_results["toolu_sdk_1"][1] is True
    assert again.stop_reason == "end_turn" and runs(workspace) == 1
    assert "already authorized and run once" in api.tool_results["toolu_sdk_1"][0]
    entry = sidecar.ledger.get("acme", "toolu_sdk_1")
    assert (entry.outcome, entry.tool, entry.principal) == ("completed", "bash", 'User::"alice"')
    kinds = [r.event.kind for r in sidecar.audit_log.query(AuditQuery(call_id="toolu_sdk_1"), limit=20)]
    assert kinds[:3] == ["authorize", "verify", "outcome"]


def test_deny_is_the_reason_the_model_sees_and_nothing_runs(client, sidecar, workspace):
    (workspace / "ws" / "scratch").mkdir()
    authz = ClaudeAgentAuthz(client, alice())
    with ScriptedMessagesApi([bash("toolu_sdk_2", "rm -rf scratch; echo ran >> runs.txt")]) as api:
        run("clean up", options(authz, api, workspace))
    text, is_error = api.tool_results["toolu_sdk_2"]
    assert is_error and "`bash-no-recursive-force-delete`" in text
    assert (workspace / "ws" / "scratch").is_dir() and runs(workspace) == 0
    assert sidecar.ledger.get("acme", "toolu_sdk_2").outcome == "failed"


def test_defer_then_resume_runs_only_once_an_approver_granted_it(client, sidecar, workspace):
    authz = ClaudeAgentAuthz(client, alice())
    with ScriptedMessagesApi([bash("toolu_sdk_3", "echo pushed >> runs.txt # git push")]) as api:
        opts = options(authz, api, workspace)
        first = run("publish", opts)
        assert first.stop_reason == "tool_deferred" and runs(workspace) == 0

        [pending] = client.list_approvals(tenant="acme")
        assert pending.call_id == "toolu_sdk_3"
        client.decide_approval(pending.approval_id, BOB, "approve", "release day")
        done = run("", dataclasses.replace(opts, resume=first.session_id))  # the same tool_use_id, re-checked
    assert done.stop_reason == "end_turn" and runs(workspace) == 1
    assert api.tool_results["toolu_sdk_3"][1] is False
    assert sidecar.ledger.get("acme", "toolu_sdk_3").outcome == "completed"


def test_resumed_before_the_approver_decided_nothing_runs(client, sidecar, workspace):
    """Resuming is not approving: the sidecar still says pending, so the call ends unrun
    (Claude Code honours a defer only once, so the second answer is a deny)."""
    authz = ClaudeAgentAuthz(client, alice())
    with ScriptedMessagesApi([bash("toolu_sdk_7", "echo pushed >> runs.txt # git push")]) as api:
        opts = options(authz, api, workspace)
        first = run("publish", opts)
        again = run("", dataclasses.replace(opts, resume=first.session_id))
    text, is_error = api.tool_results["toolu_sdk_7"]
    assert (first.stop_reason, again.stop_reason, runs(workspace)) == ("tool_deferred", "end_turn", 0)
    assert is_error and "needs approval by a person" in text
    assert sidecar.ledger.get("acme", "toolu_sdk_7").outcome == "cancelled"  # it never started


def test_a_rejected_approval_is_a_deny_on_resume(client, sidecar, workspace):
    authz = ClaudeAgentAuthz(client, alice())
    with ScriptedMessagesApi([bash("toolu_sdk_4", "echo pushed >> runs.txt # git push --force")]) as api:
        opts = options(authz, api, workspace)
        first = run("publish", opts)
        [pending] = client.list_approvals(tenant="acme")
        client.decide_approval(pending.approval_id, BOB, "reject", "no force pushes")
        run("", dataclasses.replace(opts, resume=first.session_id))
    text, is_error = api.tool_results["toolu_sdk_4"]
    assert is_error and "a person reviewed this tool call and rejected it; it was not run" in text
    assert runs(workspace) == 0 and sidecar.ledger.get("acme", "toolu_sdk_4").outcome == "failed"


def test_can_use_tool_allows_and_denies_from_the_sidecar(client, sidecar, workspace):
    authz = ClaudeAgentAuthz(client, alice("coding-run-2"))
    calls = [bash("toolu_sdk_5", "echo ran >> runs.txt"), bash("toolu_sdk_6", "rm -rf / --no-preserve-root")]

    async def go(api: ScriptedMessagesApi) -> None:
        opts = ClaudeAgentOptions(cwd=str(workspace / "ws"), can_use_tool=authz.can_use_tool, max_turns=4,
                                  env=offline_env(api, str(workspace / "home")))
        async with ClaudeSDKClient(options=opts) as sdk:
            await sdk.query("two things")
            async for message in sdk.receive_response():
                if isinstance(message, ResultMessage):
                    return

    with ScriptedMessagesApi(calls) as api:
        asyncio.run(asyncio.wait_for(go(api), 120))
    assert runs(workspace) == 1 and api.tool_results["toolu_sdk_5"][1] is False
    assert api.tool_results["toolu_sdk_6"][1] is True and "bash-no-recursive-force-delete" in \
        api.tool_results["toolu_sdk_6"][0]


def test_an_interrupted_turn_closes_its_allowed_calls_outcome_unknown(client, sidecar, workspace):
    """The turn is interrupted once the hook allowed a Bash call that blocks (it reads a
    FIFO nobody writes). Claude Code sends no post-tool event for it; `interrupted()`
    closes it `outcome_unknown`: allowed, so it may have started and acted."""
    authz = ClaudeAgentAuthz(client, alice("coding-run-3"))
    fifo = workspace / "ws" / "wait.fifo"
    os.mkfifo(fifo)
    allowed = asyncio.Event()
    decide = authz.pre_tool_use

    async def pre_tool_use(input_data, tool_use_id, context):
        answer = await decide(input_data, tool_use_id, context)
        allowed.set()
        return answer

    authz.pre_tool_use = pre_tool_use  # type: ignore[method-assign]

    async def go(api: ScriptedMessagesApi) -> list[str]:
        async with ClaudeSDKClient(options=options(authz, api, workspace)) as sdk:
            await sdk.query("wait")
            await allowed.wait()
            await sdk.interrupt()
            async for message in sdk.receive_response():
                del message
        return await authz.interrupted()

    call = bash("toolu_sdk_8", f"cat {fifo}; echo ran >> runs.txt")
    with ScriptedMessagesApi([call]) as api:
        closed = asyncio.run(asyncio.wait_for(go(api), 120))
    assert closed == ["toolu_sdk_8"] and runs(workspace) == 0
    assert sidecar.ledger.get("acme", "toolu_sdk_8").outcome == "outcome_unknown"
    assert authz.decider.unfinished() == []
