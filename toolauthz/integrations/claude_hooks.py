"""The decision behind a Claude tool use: what a `PreToolUse` hook (Claude Code's command
hook, the Claude Agent SDK's hook callback) answers for one proposed call, and the
outcome its `PostToolUse` hook reports.

A hook *decides*; it cannot *verify at execution*. Claude Code runs the tool itself once
the hook said allow, so there is no point just before execution where a token could be
checked against the bytes about to run. What the hook can do is done here: authorize the
exact input with the configured identity, and on ALLOW spend the token at once (Verify),
so that the call id's one execution is recorded in the sidecar's ledger and a replayed
`tool_use_id` is refused. docs/frameworks.md lists what this does and does not guarantee.

Identity comes from the configuration the hook was given (tenant, principal, run id),
never from the hook's input: that input is written by the agent and its model.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import grpc

from toolauthz.client import AuthzClient, ProposedCall, TrustedContext
from toolauthz.proto.toolauthz.v1 import approvals_pb2 as apb
from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb

__all__ = ["ALLOW", "ASK", "DEFER", "DENY", "HookAnswer", "ToolUseDecider", "catalog_name", "post_tool_outcome",
           "tool_input_json"]

log = logging.getLogger("toolauthz.integrations")

ALLOW, DENY, ASK, DEFER = "allow", "deny", "ask", "defer"
PENDING_ANSWERS = frozenset({ASK, DENY, DEFER})

# Model-safe texts: the reason of a deny is shown to the model, of an ask to the person.
UNAVAILABLE = "the tool call could not be authorized right now (the policy sidecar is unreachable); it was not run"
NOT_AUTHORIZED = "the tool call could not be authorized; it was not run"
ALREADY_RUN = "this tool call was already authorized and run once; it is not run again"
NOT_VERIFIED = "the tool call's authorization could not be confirmed; it was not run"
REJECTED = "a person reviewed this tool call and rejected it; it was not run"
EXPIRED = "the approval request for this tool call expired; it was not run"
# What a post-tool hook reports, with the error code it carries.
OUTCOMES = {"completed": "", "failed": "execution_error", "outcome_unknown": "interrupted"}


def _pending(approval_id: str) -> str:
    return (f"this tool call needs approval by a person before it can run; approval request {approval_id} "
            "is open in toolauthz, and it has not been run")


def _refused(answer: pb.AuthorizeResponse) -> str:
    parts = [e.message.rstrip(".") for e in answer.errors if e.message]
    if answer.reasons:
        parts.append("refused by policy " + ", ".join(f"`{r}`" for r in answer.reasons))
    return "not allowed by policy, the tool call was not run: " + ("; ".join(parts) or "refused by policy")


@dataclass(frozen=True)
class HookAnswer:
    """What the hook answers: `decision` is allow, deny, ask or defer; `reason` is
    model-safe (a deny's reason reaches the model, an ask's the person at the terminal)."""

    decision: str
    reason: str
    approval_id: str = ""
    decision_id: str = ""

    def pre_tool_use_output(self) -> dict[str, Any]:
        """The documented `PreToolUse` hook output (Claude Code and the Agent SDK)."""
        return {"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": self.decision,
                                       "permissionDecisionReason": self.reason}}


_BUILT_IN = re.compile(r"(?:[A-Z][a-z0-9]*)+")
_MCP_TOOL = re.compile(r"mcp__[a-z0-9]+(?:_[a-z0-9]+)*__[a-z0-9_]+")
_WORD = re.compile(r"[A-Z][a-z0-9]*")


def catalog_name(tool_name: str) -> str:
    """The bundle's name for a Claude tool. Catalog names are lowercase snake case, Claude
    Code's built-in tools are CamelCase: `Bash` is `bash`, `WebFetch` is `web_fetch`,
    `MultiEdit` is `multi_edit`. An MCP tool keeps its name when it is already lowercase
    (`mcp__github__create_issue`). Both rules are one-to-one, and no name of one form can
    be the name of the other (only MCP names hold `__`), so two Claude tools never share a
    policy by accident; anything else is refused."""
    if not isinstance(tool_name, str):
        raise ValueError("the tool name is not a string")
    if _BUILT_IN.fullmatch(tool_name):
        name = "_".join(word.lower() for word in _WORD.findall(tool_name))
    elif _MCP_TOOL.fullmatch(tool_name):
        name = tool_name
    else:
        raise ValueError(f"tool `{json.dumps(tool_name)[1:-1][:100]}` has no catalog name (a CamelCase built-in "
                         "or a lowercase mcp__server__tool name)")
    if len(name) > 64:
        raise ValueError("the tool name is longer than a catalog name may be")
    return name


def post_tool_outcome(event: Mapping[str, Any]) -> str:
    """The outcome a post-tool hook event reports: an interrupted tool had started."""
    if event.get("hook_event_name") == "PostToolUse":
        return "completed"
    return "outcome_unknown" if event.get("is_interrupt") is True else "failed"


def tool_input_json(tool_input: Any) -> bytes:
    """The tool input as the sidecar authorizes it. A hook receives the input already
    parsed, so its JSON text is the best there is (integers survive; the sidecar parses
    strictly and validates against the tool's pinned schema). A non-object is refused."""
    if not isinstance(tool_input, Mapping):
        raise ValueError("tool_input must be a JSON object")
    return json.dumps(tool_input, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode(
        "utf-8", "surrogatepass")


class ToolUseDecider:
    """Answers PreToolUse for one configured identity.

    `on_pending` is the answer while a person has not approved the call: `deny` (the
    default: nothing runs on the framework's own say), `ask` (the person at the terminal
    decides: the sidecar's approver is not consulted, see docs/frameworks.md) or `defer`
    (the Agent SDK ends the run; resumed with the same `tool_use_id`, the hook asks the
    sidecar again and allows only once an approver granted it)."""

    def __init__(self, client: AuthzClient, context: TrustedContext, *, on_pending: str = DENY,
                 approval_wait: float = 0.0, rpc_timeout: float | None = None):
        if on_pending not in PENDING_ANSWERS:
            raise ValueError(f"on_pending must be one of {sorted(PENDING_ANSWERS)}, not `{on_pending}`")
        self.client = client
        self.context = context
        self.on_pending = on_pending
        if not approval_wait >= 0:
            raise ValueError("approval_wait must be zero or more seconds")
        self.approval_wait = approval_wait
        self.rpc_timeout = rpc_timeout
        # Calls this decider allowed whose outcome no post-tool hook has reported yet.
        self._open: set[str] = set()
        self._open_lock = threading.Lock()

    def decide(self, tool_use_id: str, tool_name: Any, tool_input: Any) -> HookAnswer:
        """Authorize, and on ALLOW spend the token. Any failure is a deny."""
        try:
            call = ProposedCall.of(tool_use_id, catalog_name(tool_name), tool_input_json(tool_input))
        except (TypeError, ValueError) as exc:
            return HookAnswer(DENY, f"the tool call is malformed and was not run: {exc}")
        try:
            answer = self.client.authorize(self.context, call, timeout=self.rpc_timeout)
        except grpc.RpcError as exc:
            log.warning("authorize failed for %s: %s", tool_use_id, exc.code())
            if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
                return HookAnswer(DENY, NOT_AUTHORIZED + f": {(exc.details() or '')[:300]}")
            return HookAnswer(DENY, UNAVAILABLE)
        except Exception:  # fail closed: whatever broke, no allow
            log.exception("authorize failed for %s", tool_use_id)
            return HookAnswer(DENY, NOT_AUTHORIZED)
        if answer.decision == pb.DENY:
            self._close(call.call_id, "denied")
            return HookAnswer(DENY, _refused(answer), decision_id=answer.decision_id)
        if answer.decision == pb.APPROVAL_REQUIRED:
            return self._awaiting(answer, call)
        if answer.decision != pb.ALLOW:
            return HookAnswer(DENY, NOT_AUTHORIZED, decision_id=answer.decision_id)
        if not answer.token:  # a replayed ALLOW whose token was spent: it already ran
            return HookAnswer(DENY, ALREADY_RUN, decision_id=answer.decision_id)
        return self._spend(answer, call)

    def _awaiting(self, answer: pb.AuthorizeResponse, call: ProposedCall) -> HookAnswer:
        """APPROVAL_REQUIRED, replayed the same whether the person has not decided yet or
        rejected the call: the approval's own state (the watch) tells, waiting up to
        `approval_wait` seconds for the decision. Approved: asked again, the sidecar
        answers ALLOW with a token, spent at once. Rejected or expired: closed `failed`.
        Anything else is still pending."""
        call_id = call.call_id
        status = self._approval_status(answer.approval_id)
        if status == apb.APPROVED:
            return self._approved(call)
        if status in (apb.REJECTED, apb.EXPIRED):
            code = "approval_rejected" if status == apb.REJECTED else "approval_expired"
            self._close(call_id, code)
            reason = REJECTED if status == apb.REJECTED else EXPIRED
            return HookAnswer(DENY, reason, approval_id=answer.approval_id, decision_id=answer.decision_id)
        if self.on_pending == DEFER and answer.replayed:
            # Claude Code honours `defer` once: a resumed session that defers the same call
            # again loses it ("tool result missing"). Resumed before the approver decided,
            # the call ends here, not run (`cancelled`: it never started), with a reason the
            # model can act on; a later approval of it can no longer run anything.
            self._report(call_id, "cancelled", "resumed_before_approval")
            return HookAnswer(DENY, _pending(answer.approval_id) + "; the run was resumed before that, so it "
                              "was cancelled", approval_id=answer.approval_id, decision_id=answer.decision_id)
        return HookAnswer(self.on_pending, _pending(answer.approval_id), approval_id=answer.approval_id,
                          decision_id=answer.decision_id)

    def _approval_status(self, approval_id: str) -> int:
        """The approval's state: its current one (the watch's first message), or with
        `approval_wait` the first decided one within that many seconds. Unknown (an
        error, the wait over) is PENDING: nothing runs on it."""
        wait = self.approval_wait or self.rpc_timeout or 5.0
        try:
            stream = self.client.watch_approval(approval_id, self.context, timeout=wait)
        except (grpc.RpcError, ValueError):
            return apb.PENDING
        try:
            for approval in stream:
                if approval.status != apb.PENDING or not self.approval_wait:
                    return approval.status
        except grpc.RpcError as exc:
            log.info("approval %s not decided: %s", approval_id, exc.code())
        finally:
            stream.cancel()
        return apb.PENDING

    def _approved(self, call: ProposedCall) -> HookAnswer:
        try:
            answer = self.client.authorize(self.context, call, timeout=self.rpc_timeout)
        except Exception:  # fail closed: approved, but no token to spend
            log.exception("authorize after approval failed for %s", call.call_id)
            return HookAnswer(DENY, UNAVAILABLE)
        if answer.decision != pb.ALLOW or not answer.token:
            reason = ALREADY_RUN if answer.decision == pb.ALLOW else NOT_AUTHORIZED
            return HookAnswer(DENY, reason, approval_id=answer.approval_id, decision_id=answer.decision_id)
        return self._spend(answer, call)

    def _spend(self, answer: pb.AuthorizeResponse, call: ProposedCall) -> HookAnswer:
        """Verify consumes the token: the ledger then holds this call id's one execution."""
        try:
            verified = self.client.verify(answer.token, self.context, call, timeout=self.rpc_timeout)
        except Exception as exc:  # noqa: BLE001 - never retried (it consumes the token): not run
            log.warning("verify failed for %s: %s", call.call_id, exc)
            return HookAnswer(DENY, NOT_VERIFIED, decision_id=answer.decision_id)
        if not verified.valid:
            reason = ALREADY_RUN if verified.code == "already_used" else NOT_VERIFIED
            return HookAnswer(DENY, reason, decision_id=answer.decision_id)
        with self._open_lock:
            self._open.add(call.call_id)
        return HookAnswer(ALLOW, "allowed by toolauthz policy", approval_id=answer.approval_id,
                          decision_id=answer.decision_id)

    def unfinished(self) -> list[str]:
        """The calls this decider allowed that have no reported outcome yet."""
        with self._open_lock:
            return sorted(self._open)

    def interrupted(self) -> list[str]:
        """After the runtime interrupted a turn: every call allowed and not reported ends
        `outcome_unknown`. Claude Code sends no post-tool event for a tool it interrupts
        (or for one it never started after the allow), and a call that was allowed may
        have started: it may have acted, so it is reconciled, never retried. Returns the
        call ids closed."""
        closed = self.unfinished()
        for call_id in closed:
            self.report(call_id, "outcome_unknown")
        return closed

    def _close(self, call_id: str, code: str) -> None:
        """A refusal honoured is an outcome too (`failed` with `code`), as the Guard records
        it. Denials refused before the ledger (unknown tool, invalid input) are answered
        NOT_FOUND, which changes nothing here."""
        self._report(call_id, "failed", code)

    def _report(self, call_id: str, outcome: str, code: str) -> None:
        try:
            self.client.report_outcome(self.context, call_id, outcome, error_code=code, timeout=self.rpc_timeout)
        except grpc.RpcError as exc:
            log.info("call %s not closed: %s", call_id, exc.code())

    def report(self, tool_use_id: str, outcome: str) -> bool:
        """The outcome of a call this hook allowed, from `PostToolUse` (`completed`) or
        `PostToolUseFailure` (`failed`, or `outcome_unknown` when the tool was interrupted:
        it started, so it may have acted). False when the sidecar did not take it (not in
        its ledger, already reported, unreachable). Never raises."""
        if outcome not in OUTCOMES:
            raise ValueError(f"unknown outcome `{outcome}`")
        with self._open_lock:
            self._open.discard(tool_use_id)
        try:
            self.client.report_outcome(self.context, tool_use_id, outcome, error_code=OUTCOMES[outcome],
                                       timeout=self.rpc_timeout)
        except grpc.RpcError as exc:
            log.warning("outcome of %s not recorded: %s", tool_use_id, exc.code())
            return False
        except ValueError as exc:  # an unusable call id: never in the ledger
            log.warning("outcome of an unusable call id not recorded: %s", exc)
            return False
        return True
