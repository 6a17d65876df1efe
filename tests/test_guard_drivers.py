"""One Guard algorithm, two drivers: the blocking Guard and the AsyncGuard make the same
RPCs in the same order and end every scripted call with the same result.

The sidecar is a scripted fake here (duck-typed like AuthzClient / AsyncAuthzClient), so
each branch of the algorithm is reached exactly, without a server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
import pytest

from toolauthz.client import AsyncGuard, Guard, Principal, ProposedCall, ToolSet, TrustedContext
from toolauthz.client.results import CallResult
from toolauthz.client.sync import OutcomeReport
from toolauthz.proto.toolauthz.v1 import approvals_pb2 as apb
from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb

R = TypeVar("R")
CONTEXT = TrustedContext("acme", Principal("User", "alice"), "run-1")
ARGS = '{"order_id": "ord_1"}'


class FakeRpcError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode):
        super().__init__(code.name)
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return "scripted"


@dataclass
class Script:
    """What the fake sidecar answers, in order, and what it was asked."""

    authorize: list[pb.AuthorizeResponse | grpc.RpcError]
    verify: pb.VerifyResponse | grpc.RpcError = field(default_factory=lambda: pb.VerifyResponse(valid=True))
    watch: list[apb.Approval] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)

    def answer_authorize(self) -> pb.AuthorizeResponse:
        self.calls.append("Authorize")
        return _raise_or_return(self.authorize.pop(0))

    def answer_verify(self, token: str) -> pb.VerifyResponse:
        self.calls.append(f"Verify {token}")
        return _raise_or_return(self.verify)

    def answer_report(self, status: Any) -> OutcomeReport:
        self.calls.append(f"ReportOutcome {status}")
        return OutcomeReport("dec_1", unverified=False)


def _raise_or_return(answer: R | grpc.RpcError) -> R:
    if isinstance(answer, grpc.RpcError):
        raise answer
    return answer


class SyncStream:
    def __init__(self, approvals: list[apb.Approval]):
        self._approvals: Iterator[apb.Approval] = iter(approvals)

    def __iter__(self) -> SyncStream:
        return self

    def __next__(self) -> apb.Approval:
        return next(self._approvals)

    def cancel(self) -> bool:
        return True


class AsyncStream:
    def __init__(self, approvals: list[apb.Approval]):
        self._approvals: Iterator[apb.Approval] = iter(approvals)

    def __aiter__(self) -> AsyncIterator[apb.Approval]:
        return self

    async def __anext__(self) -> apb.Approval:
        try:
            return next(self._approvals)
        except StopIteration:
            raise StopAsyncIteration from None

    def cancel(self) -> bool:
        return True


class SyncSidecar:
    def __init__(self, script: Script):
        self.script = script

    def authorize(self, context: pb.TrustedContext, call: pb.ToolCall, *, timeout: float | None) -> Any:
        return self.script.answer_authorize()

    def verify(self, token: str, context: pb.TrustedContext, call: pb.ToolCall, *, timeout: float | None) -> Any:
        return self.script.answer_verify(token)

    def watch_approval(self, approval_id: str, context: pb.TrustedContext, *, timeout: float) -> SyncStream:
        self.script.calls.append(f"WatchApproval {approval_id}")
        return SyncStream(self.script.watch)

    def report_outcome(self, context: pb.TrustedContext, call_id: str, status: str, **kw: Any) -> OutcomeReport:
        return self.script.answer_report(status)


class AsyncSidecar(SyncSidecar):
    async def authorize(self, context: pb.TrustedContext, call: pb.ToolCall, *, timeout: float | None) -> Any:
        return self.script.answer_authorize()

    async def verify(self, token: str, context: pb.TrustedContext, call: pb.ToolCall, *,
                     timeout: float | None) -> Any:
        return self.script.answer_verify(token)

    def watch_approval(self, approval_id: str, context: pb.TrustedContext, *,  # type: ignore[override]
                       timeout: float) -> AsyncStream:
        self.script.calls.append(f"WatchApproval {approval_id}")
        return AsyncStream(self.script.watch)

    async def report_outcome(self, context: pb.TrustedContext, call_id: str, status: str,  # type: ignore[override]
                             **kw: Any) -> OutcomeReport:
        return self.script.answer_report(status)


def _tools() -> ToolSet:
    tools = ToolSet()
    tools.register("lookup_order", lambda args, call: {"order_id": args["order_id"]})
    return tools


ALLOW = pb.AuthorizeResponse(decision=pb.ALLOW, decision_id="d1", token="tok_1")
NEEDS_BOB = pb.AuthorizeResponse(decision=pb.APPROVAL_REQUIRED, decision_id="d1", approval_id="ap_1")
BOB = pb.Principal(type="User", id="bob")

SCRIPTS: dict[str, tuple[Script, float, tuple[str, str], list[str]]] = {
    # name: (script, approval_wait, (status, code), the RPCs made)
    "allowed": (Script([ALLOW]), 0.0, ("completed", ""),
                ["Authorize", "Verify tok_1", "ReportOutcome completed"]),
    "denied": (Script([pb.AuthorizeResponse(decision=pb.DENY, decision_id="d1")]), 0.0, ("failed", "denied"),
               ["Authorize", "ReportOutcome failed"]),
    "sidecar down": (Script([FakeRpcError(grpc.StatusCode.UNAVAILABLE)]), 0.0,
                     ("failed", "authorization_unavailable"), ["Authorize", "ReportOutcome failed"]),
    "refused by gRPC's core (CANCELLED)": (Script([FakeRpcError(grpc.StatusCode.CANCELLED)]), 0.0,
                                           ("failed", "authorization_unavailable"),
                                           ["Authorize", "ReportOutcome failed"]),
    "not verified": (Script([ALLOW], verify=pb.VerifyResponse(valid=False, code="digest_mismatch")), 0.0,
                     ("failed", "verification_failed"), ["Authorize", "Verify tok_1", "ReportOutcome failed"]),
    "approval pending": (Script([NEEDS_BOB]), 0.0, ("approval_pending", "approval_pending"), ["Authorize"]),
    "approved with a token": (
        Script([NEEDS_BOB], watch=[apb.Approval(approval_id="ap_1", status=apb.PENDING),
                                   apb.Approval(approval_id="ap_1", status=apb.APPROVED, approver=BOB,
                                                token="tok_2")]),
        5.0, ("completed", ""), ["Authorize", "WatchApproval ap_1", "Verify tok_2", "ReportOutcome completed"]),
    "approved, token by a second Authorize": (
        Script([NEEDS_BOB, pb.AuthorizeResponse(decision=pb.ALLOW, token="tok_3", replayed=True)],
               watch=[apb.Approval(approval_id="ap_1", status=apb.APPROVED, approver=BOB)]),
        5.0, ("completed", ""),
        ["Authorize", "WatchApproval ap_1", "Authorize", "Verify tok_3", "ReportOutcome completed"]),
    "rejected by bob": (Script([NEEDS_BOB], watch=[apb.Approval(approval_id="ap_1", status=apb.REJECTED)]), 5.0,
                        ("failed", "approval_rejected"), ["Authorize", "WatchApproval ap_1", "ReportOutcome failed"]),
    "watch ended undecided": (Script([NEEDS_BOB], watch=[apb.Approval(approval_id="ap_1", status=apb.PENDING)]),
                              5.0, ("approval_pending", "approval_pending"), ["Authorize", "WatchApproval ap_1"]),
}


def _copy(script: Script) -> Script:
    return Script(list(script.authorize), script.verify, list(script.watch))


def _run_sync(script: Script, approval_wait: float) -> CallResult:
    guard = Guard(SyncSidecar(script), CONTEXT, _tools(), approval_wait=approval_wait)  # type: ignore[arg-type]
    return guard.run("toolu_1", "lookup_order", ARGS)


def _run_async(script: Script, approval_wait: float) -> CallResult:
    guard = AsyncGuard(AsyncSidecar(script), CONTEXT, _tools(), approval_wait=approval_wait)  # type: ignore[arg-type]
    return asyncio.run(guard.run("toolu_1", "lookup_order", ARGS))


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_both_guards_follow_one_algorithm(name: str) -> None:
    script, approval_wait, (status, code), rpcs = SCRIPTS[name]
    sync_script, async_script = _copy(script), _copy(script)
    by_sync = _run_sync(sync_script, approval_wait)
    by_async = _run_async(async_script, approval_wait)
    assert (by_sync.status, by_sync.code) == (status, code)
    assert sync_script.calls == rpcs
    assert async_script.calls == rpcs
    assert by_async == by_sync


def test_a_sync_guard_refuses_a_coroutine_entities_provider_before_any_request() -> None:
    async def entities(call: ProposedCall) -> list[Any]:
        return []

    script = Script([ALLOW])
    context = TrustedContext("acme", Principal("User", "alice"), "run-1", entities=entities)
    result = Guard(SyncSidecar(script), context, _tools()).run("toolu_1", "lookup_order", ARGS)  # type: ignore[arg-type]
    assert (result.status, result.code, result.reported) == ("failed", "context_error", "not_reported")
    assert script.calls == []


def test_an_async_guard_awaits_a_coroutine_entities_provider() -> None:
    seen: list[str] = []

    async def entities(call: ProposedCall) -> list[Any]:
        seen.append(call.call_id)
        return []

    script = Script([ALLOW])
    context = TrustedContext("acme", Principal("User", "alice"), "run-1", entities=entities)
    guard = AsyncGuard(AsyncSidecar(script), context, _tools())  # type: ignore[arg-type]
    result = asyncio.run(guard.run("toolu_1", "lookup_order", ARGS))
    assert (result.status, seen) == ("completed", ["toolu_1"])
