"""Blocking client for the three toolauthz services (grpc).

Every call carries a deadline (`timeout`, default `AuthzClient.timeout`); the deadline
bounds the whole call, retries and backoff included. Retries follow
`toolauthz.client.retry` (only UNAVAILABLE; Verify never). Errors surface as
`grpc.RpcError` with the server's status code.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import grpc

from toolauthz.client import _convert as cv
from toolauthz.client.retry import RETRYABLE, RetryPolicy, attempts_for
from toolauthz.client.throttle import (
    DEFAULT_THROTTLE,
    THROTTLED,
    AdaptiveThrottle,
    Answer,
    ThrottlePolicy,
    marked,
)
from toolauthz.client.tracing import call_metadata, transport_metadata
from toolauthz.client.transport import ClientTls, open_channel
from toolauthz.proto.toolauthz.v1 import approvals_pb2 as apb
from toolauthz.proto.toolauthz.v1 import approvals_pb2_grpc as apb_grpc
from toolauthz.proto.toolauthz.v1 import audit_pb2 as aupb
from toolauthz.proto.toolauthz.v1 import audit_pb2_grpc as aupb_grpc
from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb
from toolauthz.proto.toolauthz.v1 import authorizer_pb2_grpc as pb_grpc

__all__ = ["AuthzClient", "OutcomeReport", "ApprovalStream", "DEFAULT_TIMEOUT", "DEFAULT_WATCH_TIMEOUT"]

DEFAULT_TIMEOUT = 5.0
DEFAULT_WATCH_TIMEOUT = 60.0
_MIN_ATTEMPT = 0.001  # below this much time left, another attempt is pointless


@dataclass(frozen=True)
class OutcomeReport:
    decision_id: str
    unverified: bool  # the call's token was never verified before this outcome
    already_recorded: bool = False  # ALREADY_EXISTS after a retried attempt: our first attempt landed


class ApprovalStream(Iterator[apb.Approval], Protocol):
    """A WatchApproval stream: the approval's states; `cancel()` ends it early."""

    def cancel(self) -> bool: ...


class AuthzClient:
    """`AuthzClient("127.0.0.1:50051")`, `AuthzClient("unix:///run/toolauthz.sock")` or
    `AuthzClient(channel)`; `tls=ClientTls(ca=..., cert=..., key=...)` for a TLS listener.

    `approvals_target` is the Approvals service's address when it listens on its own
    (default: the same channel). A client given an address owns its channel(s) and
    closes them in `close()` / on leaving a `with` block; a given channel is the caller's.
    `transport_label="mcp"`: this client fronts the MCP gateway, and the sidecar's metrics
    label its calls `transport="mcp"` (metadata `toolauthz-transport: mcp`; a label only).
    """

    def __init__(self, target: str | grpc.Channel, *, approvals_target: str | grpc.Channel | None = None,
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
        self._owned: list[grpc.Channel] = []
        channel = self._channel(target, options)
        approvals_channel = channel if approvals_target is None else self._channel(approvals_target, options)
        self._authz = pb_grpc.ToolAuthorizerStub(channel)
        self._audit = aupb_grpc.AuditStub(channel)
        self._approvals = apb_grpc.ApprovalsStub(approvals_channel)

    def _channel(self, target, options) -> grpc.Channel:
        if isinstance(target, str):
            channel = open_channel(target, self._tls, options)
            self._owned.append(channel)
            return channel
        return target

    def close(self) -> None:
        for channel in self._owned:
            channel.close()
        self._owned.clear()

    def __enter__(self) -> AuthzClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- plumbing ----------------------------------------------------------------------

    def _deadline(self, timeout: float | None) -> float:
        return time.monotonic() + (self.timeout if timeout is None else timeout)

    def _unary(self, name: str, method, request, timeout: float | None):
        """Returns (response, attempt number that produced it); a call that starts a
        decision passes the client's throttle first (`toolauthz.client.throttle`)."""
        if self.throttle is None or name not in THROTTLED:
            return self._attempts(name, method, request, timeout)
        with self.throttle.counted() as answer:
            return self._attempts(name, method, request, timeout, answer)

    def _attempts(self, name: str, method, request, timeout: float | None, answer: Answer | None = None):
        """`answer`: a throttled call's, told whether the response was marked congested."""
        deadline = self._deadline(timeout)
        attempts = attempts_for(self.retry, name)
        attempt, metadata = 1, call_metadata(self._declared)
        while True:
            remaining = deadline - time.monotonic()
            try:
                if answer is None:
                    return method(request, timeout=max(remaining, _MIN_ATTEMPT), metadata=metadata), attempt
                response, call = method.with_call(request, timeout=max(remaining, _MIN_ATTEMPT), metadata=metadata)
                answer.congested = marked(call)
                return response, attempt
            except grpc.RpcError as exc:
                if attempt >= attempts or exc.code() not in RETRYABLE:
                    raise
                pause = self.retry.delay(attempt)
                if deadline - time.monotonic() - pause < _MIN_ATTEMPT:
                    raise
                time.sleep(pause)
                attempt += 1

    # -- ToolAuthorizer ----------------------------------------------------------------

    def authorize(self, context, call, *, timeout: float | None = None) -> pb.AuthorizeResponse:
        """The decision for one proposed call. Retried at most once, on UNAVAILABLE only
        (safe: the same call id and digest replays the original decision). A
        `TrustedContext`'s entities provider is asked for this call's entities."""
        request = cv.authorize_request(context, call, _ready(cv.entities_for(context, call)))
        return self._unary("Authorize", self._authz.Authorize, request, timeout)[0]

    def authorize_batch(self, context, calls, *, entities=None,
                        timeout: float | None = None) -> list[pb.BatchAnswer]:
        """The decisions for the parallel tool calls of one model turn, in one RPC: one
        `BatchAnswer` per call, in order, holding the call's `response` (as `authorize`
        returns it) or its own `error` (`code`, a gRPC status name, and a model-safe
        `message`). `calls`: ProposedCall, ToolCall or BatchCall; `entities`: each call's
        Cedar entities (or None), in the same order, or from the `TrustedContext`'s
        entities provider (one or the other). A
        failure of the whole batch raises `grpc.RpcError`, and then no call has a token.
        Retried as `authorize` is (each call id replays its decision)."""
        entities = [_ready(item) for item in cv.batch_entities(context, calls, entities)]
        request = cv.batch_request(context, calls, entities)
        return list(self._unary("AuthorizeBatch", self._authz.AuthorizeBatch, request, timeout)[0].answers)

    def verify(self, token: str, context, call, *, timeout: float | None = None) -> pb.VerifyResponse:
        """Checks and CONSUMES the token for this exact call. Never retried."""
        request = pb.VerifyRequest(token=token, context=cv.context_msg(context), call=cv.call_msg(call))
        return self._unary("Verify", self._authz.Verify, request, timeout)[0]

    def get_keys(self, *, timeout: float | None = None) -> pb.GetKeysResponse:
        return self._unary("GetKeys", self._authz.GetKeys, pb.GetKeysRequest(), timeout)[0]

    def report_outcome(self, context, call_id: str, status, *, error_code: str = "", output_digest: str = "",
                       timeout: float | None = None) -> OutcomeReport:
        """Records the one terminal outcome of a call (`status`: "completed", "failed",
        "cancelled", "outcome_unknown" or the enum). ALREADY_EXISTS on the first attempt
        raises (someone else reported this call); after a retried attempt it is success."""
        request = cv.outcome_request(context, call_id, status, error_code, output_digest)
        attempts = {"n": 0}

        def method(req, timeout, metadata=None):
            attempts["n"] += 1
            return self._authz.ReportOutcome(req, timeout=timeout, metadata=metadata)

        try:
            response, _ = self._unary("ReportOutcome", method, request, timeout)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.ALREADY_EXISTS and attempts["n"] > 1:
                return OutcomeReport("", False, already_recorded=True)
            raise
        return OutcomeReport(response.decision_id, response.unverified)

    def report_refusal(self, context, call_id: str, tool: str, code: str, detail: str = "", *,
                       timeout: float | None = None) -> str:
        """Audits a call the runtime refused on its own before Authorize (`code`: one the
        sidecar allow-lists, `tool_changed`); `detail`: at most 512 characters, never
        argument values. Returns the audit record's id."""
        request = cv.refusal_request(context, call_id, tool, code, detail)
        return self._unary("ReportRefusal", self._authz.ReportRefusal, request, timeout)[0].decision_id

    def get_status(self, *, timeout: float | None = None) -> pb.GetStatusResponse:
        return self._unary("GetStatus", self._authz.GetStatus, pb.GetStatusRequest(), timeout)[0]

    def get_catalog(self, known_digest: str = "", *, timeout: float | None = None) -> pb.GetCatalogResponse:
        """The serving bundle's tool files (`unchanged` when `known_digest` is still the serving one's)."""
        request = pb.GetCatalogRequest(known_digest=known_digest)
        return self._unary("GetCatalog", self._authz.GetCatalog, request, timeout)[0]

    # -- Approvals ---------------------------------------------------------------------

    def list_approvals(self, *, tenant: str = "", status="", group: str = "", limit: int = 0,
                       timeout: float | None = None) -> list[apb.Approval]:
        request = cv.list_request(tenant, status, group, limit)
        return list(self._unary("ListApprovals", self._approvals.ListApprovals, request, timeout)[0].approvals)

    def get_approval(self, approval_id: str, context=None, *, timeout: float | None = None) -> apb.Approval:
        """With the requester's context, an approved approval carries its token."""
        request = cv.get_approval_request(approval_id, context)
        return self._unary("GetApproval", self._approvals.GetApproval, request, timeout)[0]

    def decide_approval(self, approval_id: str, approver, verdict, reason: str = "", *, id_token: str = "",
                        timeout: float | None = None) -> apb.Approval:
        """`approver` is the approving person's trusted context (from the approval
        tool's own session); `verdict` "approve"/"reject"; `id_token`: the person's ID
        token, required when the sidecar proves approvers by their identity provider.
        Never retried."""
        request = cv.decide_request(approval_id, approver, verdict, reason, id_token)
        return self._unary("DecideApproval", self._approvals.DecideApproval, request, timeout)[0]

    def watch_approval(self, approval_id: str, context=None, *,
                       timeout: float = DEFAULT_WATCH_TIMEOUT) -> ApprovalStream:
        """The current state, then every change until a terminal state. The returned
        stream is an iterator of `Approval` with `.cancel()`; it ends with
        DEADLINE_EXCEEDED after `timeout` seconds. Not retried."""
        request = cv.get_approval_request(approval_id, context)
        return self._approvals.WatchApproval(request, timeout=timeout, metadata=call_metadata(self._declared))

    # -- Audit -------------------------------------------------------------------------

    def query_decisions(self, *, timeout: float | None = None, **filters) -> list[aupb.AuditRecord]:
        """One page of matching audit records, in order (filters: tenant, principal,
        tool, call_id, request_id, result, kind, resource, approver, approval_id,
        decision_id, error_code, policy_id, policy_version, caller, time_from, time_to,
        limit, page_token). On UNAVAILABLE it resumes after the last record received."""
        request = cv.query_request(**filters)
        wanted = request.limit or 100
        records: list[aupb.AuditRecord] = []

        def method(req, timeout, metadata=None):
            if records:  # resume after what we already have
                req = aupb.QueryDecisionsRequest()
                req.CopyFrom(request)
                req.page_token = str(records[-1].seq)
                req.limit = wanted - len(records)
                if req.limit <= 0:
                    return records
            for record in self._audit.QueryDecisions(req, timeout=timeout, metadata=metadata):
                records.append(record)
            return records

        return self._unary("QueryDecisions", method, request, timeout)[0]

    def iter_decisions(self, *, page_size: int = 100, timeout: float | None = None,
                       **filters) -> Iterator[aupb.AuditRecord]:
        """Every matching record, page by page (each page has its own deadline)."""
        token = str(filters.pop("page_token", "") or "")
        while True:
            page = self.query_decisions(timeout=timeout, limit=page_size, page_token=token, **filters)
            yield from page
            if len(page) < page_size:
                return
            token = str(page[-1].seq)


def _ready(entities):
    """The sync client cannot await a coroutine provider's result: refuse it loudly
    (closing the coroutine, so that no "never awaited" warning hides the mistake)."""
    if inspect.isawaitable(entities):
        close = getattr(entities, "close", None)
        if close is not None:
            close()
        raise TypeError("the entities provider returned an awaitable: use AsyncAuthzClient for a coroutine provider")
    return entities
