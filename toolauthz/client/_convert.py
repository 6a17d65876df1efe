"""Argument coercions shared by the sync and async clients."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from toolauthz.client.context import ProposedCall, TrustedContext, entities_json
from toolauthz.proto.toolauthz.v1 import approvals_pb2 as apb
from toolauthz.proto.toolauthz.v1 import audit_pb2 as aupb
from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb

OUTCOMES = {"completed": pb.COMPLETED, "failed": pb.FAILED, "cancelled": pb.CANCELLED,
            "outcome_unknown": pb.OUTCOME_UNKNOWN}
APPROVAL_STATUSES = {"": apb.APPROVAL_STATUS_UNSPECIFIED, "pending": apb.PENDING, "approved": apb.APPROVED,
                     "rejected": apb.REJECTED, "expired": apb.EXPIRED}
VERDICTS = {"approve": apb.APPROVE, "reject": apb.REJECT}


def context_msg(context: TrustedContext | pb.TrustedContext | None) -> pb.TrustedContext | None:
    if context is None or isinstance(context, pb.TrustedContext):
        return context
    if isinstance(context, TrustedContext):
        return context.to_proto()
    raise TypeError("context must be a toolauthz.client.TrustedContext or a toolauthz.v1.TrustedContext")


def entities_for(context, call) -> Any:
    """What the context's entities provider returns for `call` (a list, None, or, from a
    coroutine provider, an awaitable the async client awaits); None without a provider.
    The provider is the runtime's and may fail: its exception propagates, and no request
    is sent (fail closed: never an Authorize without the entities the runtime meant)."""
    if not isinstance(context, TrustedContext) or context.entities is None:
        return None
    proposed = call if isinstance(call, ProposedCall) else ProposedCall.of(call.call_id, call.name, call.input_json)
    return context.entities(proposed)


def authorize_request(context, call, entities: list | None) -> pb.AuthorizeRequest:
    """The Authorize request with the entities the provider gave (`entities_for`)."""
    if isinstance(context, TrustedContext):
        return pb.AuthorizeRequest(context=context.to_proto(entities), call=call_msg(call))
    return pb.AuthorizeRequest(context=context_msg(context), call=call_msg(call))


def batch_entities(context, calls: Sequence, entities: Sequence[list | None] | None) -> list:
    """Each call's entities from the context's provider, or the `entities` given; both at
    once is ambiguous and refused. A BatchCall carries its own (the provider skips it).
    Items may be awaitables from a coroutine provider (the async client awaits them)."""
    if not isinstance(context, TrustedContext) or context.entities is None:
        return list(entities) if entities is not None else [None] * len(calls)
    if entities is not None:
        raise ValueError("give the entities either through the context's provider or as `entities`, not both")
    return [None if isinstance(call, pb.BatchCall) else entities_for(context, call) for call in calls]


def call_msg(call: ProposedCall | pb.ToolCall) -> pb.ToolCall:
    if isinstance(call, pb.ToolCall):
        return call
    if isinstance(call, ProposedCall):
        return call.to_proto()
    raise TypeError("call must be a toolauthz.client.ProposedCall or a toolauthz.v1.ToolCall")


def batch_request(context: TrustedContext | pb.TrustedContext,
                  calls: Sequence[ProposedCall | pb.ToolCall | pb.BatchCall],
                  entities: Sequence[list | None] | None = None) -> pb.AuthorizeBatchRequest:
    """`entities`, when given, holds each call's Cedar entities (or None), in the order of
    `calls`; a `BatchCall` carries its own."""
    if entities is not None and len(entities) != len(calls):
        raise ValueError(f"entities must have one entry per call: {len(entities)} for {len(calls)} calls")
    members = []
    for i, call in enumerate(calls):
        if isinstance(call, pb.BatchCall):
            if entities is not None and entities[i]:
                raise ValueError("a BatchCall carries its own entities_json")
            members.append(call)
        else:
            members.append(pb.BatchCall(call=call_msg(call), entities_json=entities_json(
                entities[i] if entities is not None else None)))
    return pb.AuthorizeBatchRequest(context=context_msg(context), calls=members)


def enum_value(value: Any, names: Mapping[str, int], what: str) -> Any:
    """The number of an enum value given by name or number. Typed Any: the generated stubs
    give each proto enum its own NewType of int, which one helper cannot name for all."""
    if isinstance(value, str):
        try:
            return names[value.lower()]
        except KeyError:
            raise ValueError(f"unknown {what} `{value}`; expected one of {', '.join(n for n in names if n)}") from None
    return int(value)


def outcome_request(context, call_id: str, status, error_code: str, output_digest: str) -> pb.ReportOutcomeRequest:
    return pb.ReportOutcomeRequest(context=context_msg(context), call_id=call_id,
                                   status=enum_value(status, OUTCOMES, "outcome"), error_code=error_code,
                                   output_digest=output_digest)


def refusal_request(context, call_id: str, tool: str, code: str, detail: str) -> pb.ReportRefusalRequest:
    return pb.ReportRefusalRequest(context=context_msg(context), call_id=call_id, tool=tool, code=code,
                                   detail=detail)


def get_approval_request(approval_id: str, context) -> apb.GetApprovalRequest:
    request = apb.GetApprovalRequest(approval_id=approval_id)
    msg = context_msg(context)
    if msg is not None:
        request.context.CopyFrom(msg)
    return request


def decide_request(approval_id: str, approver, verdict, reason: str, id_token: str = "") -> apb.DecideApprovalRequest:
    return apb.DecideApprovalRequest(approval_id=approval_id, approver=context_msg(approver),
                                     verdict=enum_value(verdict, VERDICTS, "verdict"), reason=reason,
                                     id_token=id_token)


def list_request(tenant: str, status, group: str, limit: int) -> apb.ListApprovalsRequest:
    return apb.ListApprovalsRequest(tenant=tenant, status=enum_value(status, APPROVAL_STATUSES, "approval status"),
                                    group=group, limit=limit)


def query_request(*, tenant="", principal="", tool="", call_id="", request_id="", result="", kind="",
                  resource="", approver="", approval_id="", decision_id="", error_code="", policy_id="",
                  policy_version="", caller="", time_from=None, time_to=None, limit=0,
                  page_token="") -> aupb.QueryDecisionsRequest:
    request = aupb.QueryDecisionsRequest(tenant=tenant, principal=str(principal) if principal else "", tool=tool,
                                         call_id=call_id, request_id=request_id, result=result, kind=kind,
                                         resource=str(resource) if resource else "",
                                         approver=str(approver) if approver else "", approval_id=approval_id,
                                         decision_id=decision_id, error_code=error_code, policy_id=policy_id,
                                         policy_version=policy_version, caller=caller,
                                         limit=limit, page_token=str(page_token or ""))
    for name, value in (("time_from", time_from), ("time_to", time_to)):
        if value is not None:
            getattr(request, name).CopyFrom(_timestamp(value))
    return request


def _timestamp(value: float | datetime) -> Timestamp:
    ts = Timestamp()
    if isinstance(value, datetime):
        value = (value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp()
    ts.FromNanoseconds(int(value * 1e9))
    return ts
