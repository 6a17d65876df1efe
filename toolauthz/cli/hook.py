"""`toolauthz hook claude-code`: a Claude Code command hook that asks the sidecar about each
tool use (built-in tools such as Bash, Edit and WebFetch, and MCP tools alike).

Claude Code runs the hook once per event with the event's JSON on stdin:

    PreToolUse          authorize; print the decision (allow, deny with the reason, ask or defer)
    PostToolUse         report the allowed call `completed`
    PostToolUseFailure  report it `failed` (`outcome_unknown` when it was interrupted)

Who the agent acts for comes from the flags or the environment that the hook was
configured with (`--tenant`, `--principal`), never from stdin: the input is written by
the agent. The session id names the run unless `--run-id` is given.

It fails closed: any problem with stdin, the configuration or the sidecar is a deny
with a one-line reason, exit status 0 and the documented JSON (a hook that crashes or
exits 1 would let the tool run). Should even that be impossible, it exits 2, which
Claude Code also treats as a deny.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from toolauthz.cli.approvals import DEFAULT_SERVER, SERVER_ENV, client_tls
from toolauthz.cli.options import TLS_ENV, TLS_HELP, parse_principal
from toolauthz.client import AuthzClient, Principal, TrustedContext
from toolauthz.integrations.claude_hooks import DENY, PENDING_ANSWERS, HookAnswer, ToolUseDecider, post_tool_outcome

TENANT_ENV = "TOOLAUTHZ_TENANT"
PRINCIPAL_ENV = "TOOLAUTHZ_PRINCIPAL"
MAX_INPUT_BYTES = 1 << 20  # a hook's input past this is refused unread (the sidecar's own argument ceiling)
REASON_LIMIT = 300


def add_hook_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    hook = sub.add_parser("hook", help="answer an agent's tool-use hooks from the sidecar (Claude Code)")
    kinds = hook.add_subparsers(dest="hook_kind", required=True)
    claude = kinds.add_parser("claude-code", help="a Claude Code command hook: PreToolUse, PostToolUse and "
                                                   "PostToolUseFailure JSON on stdin (docs/frameworks.md)")
    claude.add_argument("--server", default=None,
                        help=f"the sidecar's HOST:PORT or unix:///path (default: ${SERVER_ENV}, else {DEFAULT_SERVER})")
    claude.add_argument("--tenant", default=None, help=f"the tenant the agent acts in (default: ${TENANT_ENV})")
    claude.add_argument("--principal", default=None,
                        help=f'who the agent acts for, e.g. User::"alice" (default: ${PRINCIPAL_ENV})')
    claude.add_argument("--run-id", default=None, help="the run's request id (default: the hook's session_id)")
    claude.add_argument("--on-pending", choices=sorted(PENDING_ANSWERS), default=DENY,
                        help="the answer while a call waits for an approver: deny (default), ask (the person at "
                             "the terminal decides instead) or defer (claude -p: the run ends and resumes later)")
    claude.add_argument("--approval-wait", type=float, default=0.0,
                        help="seconds to wait for an approver's decision before answering --on-pending "
                             "(default 0; keep it below the hook's own timeout)")
    claude.add_argument("--timeout", type=float, default=5.0, help="seconds per sidecar request (default 5)")
    for name, env in TLS_ENV.items():
        claude.add_argument(f"--{name}", default=None, help=f"{TLS_HELP[name]}; default ${env}")
    claude.set_defaults(func=run_claude_code)


class HookInputError(Exception):
    """The hook's input or configuration cannot be used: a deny with this message."""


def run_claude_code(args: argparse.Namespace) -> int:
    try:
        event = _read_event(sys.stdin.buffer)
        name = event.get("hook_event_name")
        if name == "PreToolUse":
            answer = _pre_tool_use(args, event)
            print(json.dumps(answer.pre_tool_use_output()))
        elif name in ("PostToolUse", "PostToolUseFailure"):
            _decider(args, event).report(_text(event, "tool_use_id"), post_tool_outcome(event))
        else:
            raise HookInputError(f"unsupported hook event `{_shown(name)}`: configure it for PreToolUse, "
                                 "PostToolUse or PostToolUseFailure")
    except HookInputError as exc:
        print(json.dumps(HookAnswer(DENY, f"toolauthz hook: {exc}").pre_tool_use_output()))
    return 0


def _pre_tool_use(args: argparse.Namespace, event: dict[str, Any]) -> HookAnswer:
    tool_use_id, tool_name = _text(event, "tool_use_id"), _text(event, "tool_name")
    if "tool_input" not in event:
        raise HookInputError("the hook input has no `tool_input`")
    return _decider(args, event).decide(tool_use_id, tool_name, event["tool_input"])


def _decider(args: argparse.Namespace, event: dict[str, Any]) -> ToolUseDecider:
    tenant = args.tenant or os.environ.get(TENANT_ENV)
    principal_text = args.principal or os.environ.get(PRINCIPAL_ENV)
    if not tenant or not principal_text:
        raise HookInputError(f"no identity configured: give --tenant and --principal (or ${TENANT_ENV} and "
                             f"${PRINCIPAL_ENV})")
    try:
        parsed = parse_principal(principal_text)
        context = TrustedContext(tenant, Principal(parsed.type, parsed.id), args.run_id or _text(event, "session_id"))
    except (argparse.ArgumentTypeError, ValueError) as exc:
        raise HookInputError(f"the configured identity is unusable: {exc}") from None
    try:
        client = AuthzClient(args.server or os.environ.get(SERVER_ENV) or DEFAULT_SERVER, timeout=args.timeout,
                             tls=client_tls(args))
    except (OSError, ValueError) as exc:
        raise HookInputError(f"the sidecar's address or TLS files are unusable: {_shown(str(exc))}") from None
    if not args.approval_wait >= 0:
        raise HookInputError("--approval-wait must be zero or more seconds")
    return ToolUseDecider(client, context, on_pending=args.on_pending, approval_wait=args.approval_wait,
                          rpc_timeout=args.timeout)


def _read_event(stream: Any) -> dict[str, Any]:
    data = stream.read(MAX_INPUT_BYTES + 1)
    if len(data) > MAX_INPUT_BYTES:
        raise HookInputError(f"the hook input is larger than {MAX_INPUT_BYTES} bytes")
    try:
        event = json.loads(data)
    except (UnicodeDecodeError, ValueError):
        raise HookInputError("the hook input on stdin is not JSON") from None
    except RecursionError:
        raise HookInputError("the hook input on stdin is nested too deeply") from None
    if not isinstance(event, dict):
        raise HookInputError("the hook input on stdin is not a JSON object")
    return event


def _text(event: dict[str, Any], key: str) -> str:
    value = event.get(key)
    if not isinstance(value, str) or not value:
        raise HookInputError(f"the hook input has no `{key}` string")
    return value


def _shown(value: Any) -> str:
    """A value from stdin, quoted for a one-line reason: JSON escapes every control character."""
    return json.dumps(value, ensure_ascii=True)[:REASON_LIMIT]


def main(argv: list[str]) -> int:
    """The fast path of the console script: `toolauthz hook ...` parses and imports only
    this (a hook runs before every tool use, so it starts without the server's imports)."""
    parser = argparse.ArgumentParser(prog="toolauthz")
    add_hook_command(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except Exception as exc:  # noqa: BLE001 - the last line of failing closed: exit 2 blocks the tool
        print(f"toolauthz hook: internal error ({type(exc).__name__}); the tool call is blocked", file=sys.stderr)
        return 2
