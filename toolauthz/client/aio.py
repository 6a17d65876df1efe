"""asyncio client for the three toolauthz services (grpc.aio); the same API as
`AuthzClient`, with the same deadlines and retry rules (see `toolauthz.client.retry`).

Create it inside a running event loop: `async with AsyncAuthzClient(addr) as client:`.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterator
from typing import Protocol

import grpc
import grpc.aio

from toolauthz.client import _convert as cv
from toolauthz.client.retry import RETRYABLE, RetryPolicy, attempts_for
from toolauthz.client.sync import _MIN_ATTEMPT, DEFAULT_TIMEOUT, DEFAULT_WATCH_TIMEOUT, OutcomeReport
from toolauthz.client.throttle import (
    DEFAULT_THROTTLE,
    THROTTLED,
    AdaptiveThrottle,
    Answer,
    ThrottlePolicy,
    congested,
)
from toolauthz.client.tracing import call_metadata, transport_metadata
from toolauthz.client.transport import ClientTls, open_aio_channel
from toolauthz.proto.toolauthz.v1 import approvals_pb2 as apb
from toolauthz.proto.toolauthz.v1 import approvals_pb2_grpc as apb_grpc
from toolauthz.proto.toolauthz.v1 import audit_pb2 as aupb
from toolauthz.proto.toolauthz.v1 import audit_pb2_grpc as aupb_grpc
from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb
from toolauthz.proto.toolauthz.v1 import authorizer_pb2_grpc as pb_grpc

__all__ = ["AsyncAuthzClient", "AsyncApprovalStream"]


class AsyncApprovalStream(Protocol):
    """A WatchApproval stream over grpc.aio: the approval's states; `cancel()` ends it early."""

    def __aiter__(self) -> AsyncIterator[apb.Approval]: ...

    def cancel(self) -> bool: ...


async def _marked(call) -> bool:
    """Whether a finished call's answer was marked; metadata that cannot be read is no
    mark (the answer and its token stand)."""
    try:
        return congested(await call.trailing_metadata())
    except Exception:  # noqa: BLE001 - a mark is advice, never a reason to lose an answer
        return False


class AsyncAuthzClient:
    """AuthzClient's twin for asyncio, with the same arguments (`transport_label` too)."""

    def __init__(self, target: str | grpc.aio.Channel, *, approvals_target: str | grpc.aio.Channel | None = None,
                 timeout: float = DEFAULT_TIMEOUT, retry: RetryPolicy | None = None,
                 options: list[tuple[str, object]] | None = None, tls: ClientTls | None = None,
                 transport_label: str | None = None, throttle: ThrottlePolicy | None = DEFAULT_THROTTLE):
        if timeout <= 0:
            raise ValueError("timeout must be positive")
        self._declared = transport_metadata(transport_label)
        self.timeout = float(timeout)
        self.retry = retry or RetryPolicy()
        self.throttle = None if throttle is None else AdaptiveThrottle(throttle)
        self._tls = tls
        self._owned: list[grpc.aio.Channel] = []
        channel = self._channel(target, options)
        approvals_channel = channel if approvals_target is None else self._channel(approvals_target, options)
        self._authz = pb_grpc.ToolAuthorizerStub(channel)
        self._audit = aupb_grpc.AuditStub(channel)
        self._approvals = apb_grpc.ApprovalsStub(approvals_channel)

    def _channel(self, target, options) -> grpc.aio.Channel:
        if isinstance(target, str):
            channel = open_aio_channel(target, self._tls, options)
            self._owned.append(channel)
            return channel
        return target

    async def close(self) -> None:
        for channel in self._owned:
            await channel.close()
        self._owned.clear()

    async def __aenter__(self) -> AsyncAuthzClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def _unary(self, name: str, method, request, timeout: float | None):
        if self.throttle is None or name not in THROTTLED:
            return await self._attempts(name, method, request, timeout)
        with self.throttle.counted() as answer:  # a plain `with`: it only counts, around the await
            return await self._attempts(name, method, request, timeout, answer)

    async def _attempts(self, name: str, method, request, timeout: float | None, answer: Answer | None = None):
        """`answer`: a throttled call's, told whether the response was marked congested."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        attempts = attempts_for(self.retry, name)
        attempt, metadata = 1, call_metadata(self._declared)
        while True:
            remaining = deadline - time.monotonic()
            try:
                call = method(request, timeout=max(remaining, _MIN_ATTEMPT), metadata=metadata)
                response = await call
                if answer is not None:
                    answer.congested = await _marked(call)
                return response, attempt
            except grpc.RpcError as exc:
                if attempt >= attempts or exc.code() not in RETRYABLE:
                    raise
                pause = self.retry.delay(attempt)
                if deadline - time.monotonic() - pause < _MIN_ATTEMPT:
                    raise
                await asyncio.sleep(pause)
                attempt += 1

    # -- ToolAuthorizer ----------------------------------------------------------------

    async def authorize(self, context, call, *, timeout: float | None = None) -> pb.AuthorizeResponse:
        request = cv.authorize_request(context, call, await _resolved(cv.entities_for(context, call)))
        return (await self._unary("Authorize", self._authz.Authorize, request, timeout))[0]

    async def authorize_batch(self, context, calls, *, entities=None,
                              timeout: float | None = None) -> list[pb.BatchAnswer]:
        entities = [await _resolved(item) for item in cv.batch_entities(context, calls, entities)]
        request = cv.batch_request(context, calls, entities)
        response, _ = await self._unary("AuthorizeBatch", self._authz.AuthorizeBatch, request, timeout)
        return list(response.answers)

    async def verify(self, token: str, context, call, *, timeout: float | None = None) -> pb.VerifyResponse:
        request = pb.VerifyRequest(token=token, context=cv.context_msg(context), call=cv.call_msg(call))
        return (await self._unary("Verify", self._authz.Verify, request, timeout))[0]

    async def get_keys(self, *, timeout: float | None = None) -> pb.GetKeysResponse:
        return (await self._unary("GetKeys", self._authz.GetKeys, pb.GetKeysRequest(), timeout))[0]

    async def report_outcome(self, context, call_id: str, status, *, error_code: str = "",
                             output_digest: str = "", timeout: float | None = None) -> OutcomeReport:
        request = cv.outcome_request(context, call_id, status, error_code, output_digest)
        attempts = {"n": 0}

        async def method(req, timeout, metadata=None):
            attempts["n"] += 1
            return await self._authz.ReportOutcome(req, timeout=timeout, metadata=metadata)

        try:
            response, _ = await self._unary("ReportOutcome", method, request, timeout)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.ALREADY_EXISTS and attempts["n"] > 1:
                return OutcomeReport("", False, already_recorded=True)
            raise
        return OutcomeReport(response.decision_id, response.unverified)

    async def report_refusal(self, context, call_id: str, tool: str, code: str, detail: str = "", *,
                             timeout: float | None = None) -> str:
        request = cv.refusal_request(context, call_id, tool, code, detail)
        response, _ = await self._unary("ReportRefusal", self._authz.ReportRefusal, request, timeout)
        return response.decision_id

    async def list_visible(self, context, tools: list[str], *,
                           timeout: float | None = None) -> pb.ListVisibleResponse:
        """Which of `tools` some call by the context's principal could be allowed (a
        preview for a tool list; every call is still authorized)."""
        request = pb.ListVisibleRequest(context=cv.context_msg(context), tools=tools)
        return (await self._unary("ListVisible", self._authz.ListVisible, request, timeout))[0]

    async def get_status(self, *, timeout: float | None = None) -> pb.GetStatusResponse:
        return (await self._unary("GetStatus", self._authz.GetStatus, pb.GetStatusRequest(), timeout))[0]

    async def get_catalog(self, known_digest: str = "", *, timeout: float | None = None) -> pb.GetCatalogResponse:
        """The serving bundle's tool files (`unchanged` when `known_digest` is still the serving one's)."""
        request = pb.GetCatalogRequest(known_digest=known_digest)
        return (await self._unary("GetCatalog", self._authz.GetCatalog, request, timeout))[0]

    # -- Approvals ---------------------------------------------------------------------

    async def list_approvals(self, *, tenant: str = "", status="", group: str = "", limit: int = 0,
                             timeout: float | None = None) -> list[apb.Approval]:
        request = cv.list_request(tenant, status, group, limit)
        response, _ = await self._unary("ListApprovals", self._approvals.ListApprovals, request, timeout)
        return list(response.approvals)

    async def get_approval(self, approval_id: str, context=None, *, timeout: float | None = None) -> apb.Approval:
        request = cv.get_approval_request(approval_id, context)
        return (await self._unary("GetApproval", self._approvals.GetApproval, request, timeout))[0]

    async def decide_approval(self, approval_id: str, approver, verdict, reason: str = "", *, id_token: str = "",
                              timeout: float | None = None) -> apb.Approval:
        request = cv.decide_request(approval_id, approver, verdict, reason, id_token)
        return (await self._unary("DecideApproval", self._approvals.DecideApproval, request, timeout))[0]

    def watch_approval(self, approval_id: str, context=None, *,
                       timeout: float = DEFAULT_WATCH_TIMEOUT) -> AsyncApprovalStream:
        """An async iterator of `Approval` (a grpc.aio stream call: `.cancel()` ends it)."""
        request = cv.get_approval_request(approval_id, context)
        return self._approvals.WatchApproval(request, timeout=timeout, metadata=call_metadata(self._declared))

    # -- Audit -------------------------------------------------------------------------

    async def query_decisions(self, *, timeout: float | None = None, **filters) -> list[aupb.AuditRecord]:
        request = cv.query_request(**filters)
        wanted = request.limit or 100
        records: list[aupb.AuditRecord] = []

        async def method(req, timeout, metadata=None):
            if records:
                req = aupb.QueryDecisionsRequest()
                req.CopyFrom(request)
                req.page_token = str(records[-1].seq)
                req.limit = wanted - len(records)
                if req.limit <= 0:
                    return records
            async for record in self._audit.QueryDecisions(req, timeout=timeout, metadata=metadata):
                records.append(record)
            return records

        return (await self._unary("QueryDecisions", method, request, timeout))[0]

    async def iter_decisions(self, *, page_size: int = 100, timeout: float | None = None,
                             **filters) -> AsyncIterator[aupb.AuditRecord]:
        token = str(filters.pop("page_token", "") or "")
        while True:
            page = await self.query_decisions(timeout=timeout, limit=page_size, page_token=token, **filters)
            for record in page:
                yield record
            if len(page) < page_size:
                return
            token = str(page[-1].seq)


async def _resolved(entities):
    """A coroutine provider's entities, awaited; a plain provider's, as they are."""
    return await entities if inspect.isawaitable(entities) else entities
