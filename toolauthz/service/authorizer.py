"""gRPC handlers of toolauthz.v1.ToolAuthorizer."""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from collections.abc import Callable, Collection
from contextlib import AbstractContextManager

from toolauthz.authorizer import Authorizer, AuthorizeResult
from toolauthz.batch import DEFAULT_LIMITS, BatchLimits, check_count, plan_batch
from toolauthz.errors import RequestError
from toolauthz.model import Decision, TrustedContext
from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb
from toolauthz.proto.toolauthz.v1 import authorizer_pb2_grpc as pb_grpc
from toolauthz.server.pump import DecisionPump
from toolauthz.service.access import About, Gate
from toolauthz.service.batching import settle_batch
from toolauthz.service.common import batch_call, proposed_call, status_mapped, timestamp, trusted_context
from toolauthz.service.congestion import CONGESTED_METADATA, drawn
from toolauthz.service.failures import Failure
from toolauthz.service.observe import Observation, grpc_transport, observed
from toolauthz.service.status import SidecarStatus, WorkerStatus
from toolauthz.telemetry import metrics, timeline
from toolauthz.tokens.keyring import KeyRing
from toolauthz.visibility import visible_tools

_DECISIONS = {Decision.ALLOW: pb.ALLOW, Decision.DENY: pb.DENY, Decision.APPROVAL_REQUIRED: pb.APPROVAL_REQUIRED}
_OUTCOMES = {pb.COMPLETED: "completed", pb.FAILED: "failed", pb.CANCELLED: "cancelled",
             pb.OUTCOME_UNKNOWN: "outcome_unknown"}


def still_wanted(context, gone: threading.Event):
    """Asked on the pump's thread before a token is minted: has the client cancelled
    (`gone`, set by the handler) or has its deadline passed?"""

    def wanted() -> bool:
        remaining = context.time_remaining()
        return not gone.is_set() and (remaining is None or remaining > 0)

    return wanted


def marked(context, share: float, draw: Callable[[], float] = random.random) -> None:
    """Marks a decision's gRPC answer congested with probability `share`: trailing
    metadata `toolauthz-congested: 1` on a successful answer, which the clients' throttles
    slow down on before the queue's bound refuses."""
    if drawn(share, draw):
        context.set_trailing_metadata(((CONGESTED_METADATA, "1"),))


def deadline_of(context) -> float | None:
    """When the client stops waiting, in time.monotonic() seconds (None: no deadline)."""
    remaining = context.time_remaining()
    return None if remaining is None else time.monotonic() + remaining


def admitted(pump: DecisionPump, context, plans: int = 1) -> str:
    """The request's peer (its connection), whose turn it takes in the decision pump's
    queue; first, before any work is spent on the request (its conversion, the caller's
    check), ResourceExhaustedError if the pump would refuse it now: its wait would be too
    long for the queue's bound or for its own deadline."""
    peer = context.peer()
    pump.check_admission(peer=peer, plans=plans, remaining=context.time_remaining())
    return peer


def _observed(rpc: str, context) -> AbstractContextManager[Observation]:
    """The request's observation, labelled with the transport its client declared."""
    return observed(rpc, grpc_transport(context.invocation_metadata()), lambda: context.invocation_metadata())


def _about(ctx: TrustedContext, call_id: str) -> About:
    return About(ctx.tenant, str(ctx.principal), call_id, ctx.request_id)


class ToolAuthorizerService(pb_grpc.ToolAuthorizerServicer):
    """Authorize, AuthorizeBatch, Verify, ReportOutcome and ReportRefusal are coroutines on the server's event loop that
    hand their work to the decision pump (toolauthz/server/pump.py); GetKeys and GetStatus are
    plain handlers, which the server runs on its thread pool."""

    def __init__(self, authorizer: Authorizer, pump: DecisionPump, keyring: KeyRing,
                 status: Callable[[], SidecarStatus], *, gate: Gate, batch_limits: BatchLimits = DEFAULT_LIMITS):
        self._authorizer = authorizer
        self._batch_limits = batch_limits
        self._pump = pump
        self._keyring = keyring
        self._status = status
        self._gate = gate

    def _tools(self) -> Collection[str]:
        return self._authorizer.bundles.current.tools

    @status_mapped
    async def Authorize(self, request: pb.AuthorizeRequest, context) -> pb.AuthorizeResponse:
        peer = admitted(self._pump, context)
        with _observed("Authorize", context) as seen:
            ctx, call, gone = trusted_context(request.context), proposed_call(request.call), threading.Event()
            steps = timeline.begin(call.call_id, round(seen.started * 1e9))  # None unless a bench asked for timelines
            access = await self._gate.admit_async(context, "Authorize", _about(ctx, call.call_id))
            wanted, caller, deadline = still_wanted(context, gone), access.caller.id, deadline_of(context)
            try:
                result = await self._pump.answer(seen.plan(
                    lambda: self._authorizer.plan_authorize(ctx, call, wanted, caller=caller, deadline=deadline)),
                    peer=peer, remaining=context.time_remaining())
            except asyncio.CancelledError:
                gone.set()  # the client cancelled: if the decision is still to be made, no token
                raise
            timeline.mark(steps, "resumed")
            tool, outcome = seen.decided(self._tools(), ctx, call, result, caller=caller)
            seen.annotate(decision_id=result.decision_id, tool=tool, result=outcome, replayed=result.replayed)
        response = _authorize_response(result)
        marked(context, self._pump.congestion(peer))
        timeline.mark(steps, "returned")
        return response

    @status_mapped
    async def AuthorizeBatch(self, request: pb.AuthorizeBatchRequest, context) -> pb.AuthorizeBatchResponse:
        peer = admitted(self._pump, context)  # its members are counted as it is queued
        with _observed("AuthorizeBatch", context) as seen:
            ctx, limits, gone = trusted_context(request.context), self._batch_limits, threading.Event()
            access = await self._gate.admit_async(context, "AuthorizeBatch", _about(ctx, ""))
            check_count(len(request.calls), limits)  # before converting what may be a flood of calls
            calls = [batch_call(c) for c in request.calls]
            wanted, caller, deadline = still_wanted(context, gone), access.caller.id, deadline_of(context)
            try:
                settled = settle_batch(await self._pump.answer_group(seen.plan(
                    lambda: plan_batch(self._authorizer, ctx, calls, limits, wanted, caller=caller,
                                       deadline=deadline)), len(calls),
                    peer=peer, remaining=context.time_remaining()))
            except asyncio.CancelledError:
                gone.set()  # the client cancelled: decisions still to be made get no token
                raise
            answers = []
            for item, answer in zip(calls, settled, strict=True):
                if isinstance(answer, Failure):
                    error = pb.CallError(code=answer.status.name, message=answer.message)
                    answers.append(pb.BatchAnswer(error=error))
                    continue
                seen.decided(self._tools(), ctx, item.call, answer, caller=caller)
                answers.append(pb.BatchAnswer(response=_authorize_response(answer)))
            seen.annotate(calls=len(calls))
        marked(context, self._pump.congestion(peer))
        return pb.AuthorizeBatchResponse(answers=answers)

    @status_mapped
    async def Verify(self, request: pb.VerifyRequest, context) -> pb.VerifyResponse:
        peer = admitted(self._pump, context)
        with _observed("Verify", context) as seen:
            token, ctx, call = request.token, trusted_context(request.context), proposed_call(request.call)
            caller = (await self._gate.admit_async(context, "Verify", _about(ctx, call.call_id))).caller.id
            result = await self._pump.answer(seen.plan(
                lambda: self._authorizer.plan_verify(token, ctx, call, caller=caller)),
                peer=peer, remaining=context.time_remaining())
            seen.verified(self._tools(), ctx, call, result)
        return pb.VerifyResponse(valid=result.valid, code=result.code, decision_id=result.decision_id)

    @status_mapped
    def GetKeys(self, request, context) -> pb.GetKeysResponse:
        self._gate.admit(context, "GetKeys")
        keys = self._keyring.public_keys(self._authorizer.clock.now())
        return pb.GetKeysResponse(keys=[
            pb.PublicKey(kid=k.kid, paserk=k.paserk, jwk_json=json.dumps(k.jwk, sort_keys=True), state=k.state)
            for k in keys])

    @status_mapped
    async def ReportOutcome(self, request: pb.ReportOutcomeRequest, context) -> pb.ReportOutcomeResponse:
        peer = admitted(self._pump, context)
        ctx, call_id, error_code, digest = (trusted_context(request.context), request.call_id, request.error_code,
                                            request.output_digest)
        caller = (await self._gate.admit_async(context, "ReportOutcome", _about(ctx, call_id))).caller.id
        status = _OUTCOMES.get(request.status)
        if status is None:
            raise RequestError("status must be COMPLETED, FAILED, CANCELLED or OUTCOME_UNKNOWN")
        with _observed("ReportOutcome", context) as seen:
            result = await self._pump.answer(seen.plan(
                lambda: self._authorizer.plan_report_outcome(ctx, call_id, status, error_code, digest, caller=caller)),
                peer=peer, remaining=context.time_remaining())
            seen.annotate(decision_id=result.decision_id, result=status)
        return pb.ReportOutcomeResponse(decision_id=result.decision_id, unverified=result.unverified)

    @status_mapped
    async def ReportRefusal(self, request: pb.ReportRefusalRequest, context) -> pb.ReportRefusalResponse:
        peer = admitted(self._pump, context)
        ctx, call_id = trusted_context(request.context), request.call_id
        caller = (await self._gate.admit_async(context, "ReportRefusal", _about(ctx, call_id))).caller.id
        tool, code, detail = request.tool, request.code, request.detail
        with _observed("ReportRefusal", context) as seen:
            decision_id = await self._pump.answer(seen.plan(
                lambda: self._authorizer.plan_report_refusal(ctx, call_id, tool, code, detail, caller=caller)),
                peer=peer, remaining=context.time_remaining())
            seen.annotate(decision_id=decision_id, tool=metrics.tool_label(tool, self._tools()), result="refused")
        return pb.ReportRefusalResponse(decision_id=decision_id)

    @status_mapped
    def ListVisible(self, request: pb.ListVisibleRequest, context) -> pb.ListVisibleResponse:
        """A preview for a tool list (toolauthz/visibility.py): no token, no record."""
        ctx = trusted_context(request.context)
        self._gate.admit(context, "ListVisible", _about(ctx, ""))
        bundle = self._authorizer.bundles.current
        with _observed("ListVisible", context):
            visible = visible_tools(bundle, ctx, list(request.tools))
        return pb.ListVisibleResponse(visible=visible, policy_version=bundle.version)

    @status_mapped
    def GetStatus(self, request, context) -> pb.GetStatusResponse:
        self._gate.admit(context, "GetStatus")
        status = self._status()
        policy, pump = status.policy, status.pump
        return pb.GetStatusResponse(
            policy_version=policy.version, loaded_at=timestamp(policy.loaded_at),
            last_reload_error=policy.last_reload_error, bundle_dir=policy.bundle_dir,
            shadow_effects=dict(policy.shadow_effects), reloads=policy.reloads, decisions=pump.answered,
            decision_batches=pump.batches, decisions_waiting=pump.waiting,
            workers=[_worker_message(w) for w in status.workers], answered_by_pid=status.answered_by,
            bundle_revision=policy.revision, bundle_digest=policy.digest, bundle_signer=policy.signer,
            notices=list(policy.notices))

    @status_mapped
    def GetCatalog(self, request, context) -> pb.GetCatalogResponse:
        """The serving bundle's tool files, the bytes it was verified and parsed from."""
        self._gate.admit(context, "GetCatalog")
        bundle = self._authorizer.bundles.current
        response = pb.GetCatalogResponse(bundle_digest=bundle.digest, policy_version=bundle.version,
                                         revision=bundle.revision)
        if request.known_digest and request.known_digest == bundle.digest:
            response.unchanged = True
            return response
        files = bundle.snapshot.tool_files() if bundle.snapshot is not None else {}
        response.files.extend(pb.CatalogFile(name=name, content=data) for name, data in files.items())
        return response


def _authorize_response(result: AuthorizeResult) -> pb.AuthorizeResponse:
    response = pb.AuthorizeResponse(
        decision=_DECISIONS[result.decision], decision_id=result.decision_id, reasons=list(result.reasons),
        errors=[pb.DecisionError(code=e.code, message=e.message) for e in result.errors],
        policy_version=result.policy_version, digest=result.digest, approval_id=result.approval_id,
        replayed=result.replayed)
    if result.token is not None:
        response.token = result.token.token
        response.expires_at.CopyFrom(timestamp(result.token.expires_at))
    if result.approval_expires_at is not None:
        response.approval_expires_at.CopyFrom(timestamp(result.approval_expires_at))
    return response


def _worker_message(worker: WorkerStatus) -> pb.WorkerStatus:
    policy, pump = worker.policy, worker.pump
    return pb.WorkerStatus(
        index=worker.index, pid=worker.pid, policy_version=policy.version, loaded_at=timestamp(policy.loaded_at),
        reloads=policy.reloads, last_reload_error=policy.last_reload_error, decisions=pump.answered,
        decision_batches=pump.batches, decisions_waiting=pump.waiting, shadow_effects=dict(policy.shadow_effects))
