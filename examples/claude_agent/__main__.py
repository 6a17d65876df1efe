"""A Claude Agent SDK agent governed by the sidecar, offline:
`.venv/bin/python -m examples.claude_agent` (from the repository root).

The SDK's bundled Claude Code CLI talks to a scripted Messages API on 127.0.0.1
(scripted_api.py); the sidecar runs in this process with the coding-agent bundle
(examples/claude_code/policies). Alice's agent, in a temporary workspace:

    run 1  Bash `echo ... >> notes.txt`            allowed by the PreToolUse hook, executed
           Bash `rm -rf build`                     denied: the model reads the policy's id
    run 2  Bash `... # git push`                   needs security: the hook defers, the run ends
           bob (security) approves through the Approvals API; the session is resumed and the
           same tool use runs, once
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import pathlib
import sys
import tempfile
from collections.abc import Iterator

from claude_agent_sdk import ClaudeAgentOptions, ResultMessage, query

from examples.claude_agent.scripted_api import ScriptedCall, ScriptedMessagesApi, offline_env
from toolauthz.client import AuthzClient, Principal, TrustedContext
from toolauthz.integrations.claude_agent import ClaudeAgentAuthz
from toolauthz.server.build import build_sidecar, create_server
from toolauthz.server.config import Settings

ROOT = pathlib.Path(__file__).resolve().parents[2]
BUNDLE = ROOT / "examples" / "claude_code" / "policies"
BOB = TrustedContext("acme", Principal("User", "bob"), "security-desk")


@contextlib.contextmanager
def local_sidecar() -> Iterator[str]:
    logging.getLogger("toolauthz").setLevel(logging.ERROR)  # "generated a development key" is expected
    with tempfile.TemporaryDirectory(prefix="toolauthz-example-") as tmp:
        sidecar = build_sidecar(Settings(bundle=BUNDLE, data_dir=pathlib.Path(tmp) / "data", listen="127.0.0.1:0"))
        server, port = create_server(sidecar, "127.0.0.1:0")
        try:
            yield f"127.0.0.1:{port}"
        finally:
            server.stop(grace=2).wait()
            sidecar.close()


async def run(prompt: str, options: ClaudeAgentOptions) -> ResultMessage:
    result = None
    async for message in query(prompt=prompt, options=options):
        if isinstance(message, ResultMessage):
            result = message
    assert result is not None
    return result


def bash(call_id: str, command: str) -> ScriptedCall:
    return ScriptedCall(call_id, "Bash", json.dumps({"command": command}))


async def main(address: str, tmp: pathlib.Path) -> int:
    workspace, home = tmp / "workspace", tmp / "home"
    (workspace / "build").mkdir(parents=True)
    home.mkdir()
    with AuthzClient(address) as client:
        # The identity is the runtime's (its signed-in user), never the agent's input.
        authz = ClaudeAgentAuthz(client, TrustedContext("acme", Principal("User", "alice"), "coding-session-1"))
        with ScriptedMessagesApi([bash("toolu_cc_01", "echo started >> notes.txt"),
                                  bash("toolu_cc_02", "rm -rf build")]) as api:
            options = ClaudeAgentOptions(cwd=str(workspace), hooks=authz.hooks(), max_turns=4,
                                         env=offline_env(api, str(home)))
            await run("tidy up", options)
            for call_id, (text, is_error) in api.tool_results.items():
                print(f"run 1: {call_id} {'refused' if is_error else 'ran'}: {text or '(no output)'}")

        with ScriptedMessagesApi([bash("toolu_cc_03", "echo pushed >> notes.txt # git push origin main")]) as api:
            options = ClaudeAgentOptions(cwd=str(workspace), hooks=authz.hooks(), max_turns=4,
                                         env=offline_env(api, str(home)))
            first = await run("publish", options)
            print(f"run 2: stopped with `{first.stop_reason}`; notes: {(workspace / 'notes.txt').read_text().split()}")
            [pending] = client.list_approvals(tenant="acme")
            client.decide_approval(pending.approval_id, BOB, "approve", "release day")
            print(f"       bob (security) approved {pending.approval_id} for {pending.call_id}")
            resumed = await run("", dataclasses.replace(options, resume=first.session_id))
            print(f"       resumed: stopped with `{resumed.stop_reason}`; "
                  f"notes: {(workspace / 'notes.txt').read_text().split()}")
    notes = (workspace / "notes.txt").read_text().split()
    ok = notes == ["started", "pushed"] and (workspace / "build").is_dir()
    print("every call ran at most once, and only as the sidecar allowed" if ok else "unexpected result")
    return 0 if ok else 1


if __name__ == "__main__":
    with local_sidecar() as sidecar_address, tempfile.TemporaryDirectory(prefix="claude-agent-") as scratch:
        sys.exit(asyncio.run(main(sidecar_address, pathlib.Path(scratch))))
