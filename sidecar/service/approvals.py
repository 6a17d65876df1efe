"""gRPC handlers of toolauthz.v1.Approvals."""

from __future__ import annotations

import asyncio
import json
import threading

from sidecar.approvals import APPROVE, REJECT, ApprovalDesk
from sidecar.errors import RequestError
from sidecar.proto.toolauthz.v1 import approvals_pb2 as apb
from sidecar.proto.toolauthz.v1 import approvals_pb2_grpc as apb_grpc
from sidecar.proto.toolauthz.v1 import authorizer_pb2 as pb
from sidecar.service.common import status_mapped, timestamp, trusted_context
from sidecar.store.approvals import ApprovalRecord
from sidecar.telemetry import metrics

_STATUS = {"pending": apb.PENDING, "approved": apb.APPROVED, "rejected": apb.REJECTED, "expired": apb.EXPIRED}
_STATUS_NAMES = {v: k for k, v in _STATUS.items()}
_VERDICTS = {apb.APPROVE: APPROVE, apb.REJECT: REJECT}
MAX_LIST = 1000


def approval_message(r: ApprovalRecord) -> apb.Approval:
    msg = apb.Approval(
        approval_id=r.approval_id, status=_STATUS[r.status], tenant=r.tenant,
        requester=pb.Principal(type=r.requester_type, id=r.requester_id), tool=r.tool, resource=r.resource,
        group=r.group, policy_id=r.policy_id, call_id=r.call_id, request_id=r.request_id, digest=r.digest,
        short_code=r.short_code, arguments_json=json.dumps(r.fields, sort_keys=True),
        created_at=timestamp(r.created_at), expires_at=timestamp(r.expires_at), reason=r.reason, token=r.token)
    if r.decided_at is not None:
        msg.decided_at.CopyFrom(timestamp(r.decided_at))
    if r.approver:
        kind, _, rest = r.approver.partition("::")
        msg.approver.CopyFrom(pb.Principal(type=kind, id=rest[1:-1]))
    if r.token_expires_at is not None and r.token:
        msg.token_expires_at.CopyFrom(timestamp(r.token_expires_at))
    return msg


def _viewer(request: apb.GetApprovalRequest):
    return trusted_context(request.context) if request.HasField("context") and request.context.tenant else None


class ApprovalsService(apb_grpc.ApprovalsServicer):
    def __init__(self, desk: ApprovalDesk):
        self._desk = desk

    @status_mapped
    def ListApprovals(self, request: apb.ListApprovalsRequest, context) -> apb.ListApprovalsResponse:
        status = _STATUS_NAMES.get(request.status, "")
        limit = min(request.limit or 100, MAX_LIST)
        records = self._desk.list(tenant=request.tenant, status=status, group=request.group, limit=limit)
        return apb.ListApprovalsResponse(approvals=[approval_message(r) for r in records])

    @status_mapped
    def GetApproval(self, request: apb.GetApprovalRequest, context) -> apb.Approval:
        return approval_message(self._desk.get(request.approval_id, _viewer(request)))

    @status_mapped
    def DecideApproval(self, request: apb.DecideApprovalRequest, context) -> apb.Approval:
        verdict = _VERDICTS.get(request.verdict)
        if verdict is None:
            raise RequestError("verdict must be APPROVE or REJECT")
        record = self._desk.decide(request.approval_id, trusted_context(request.approver), verdict, request.reason)
        metrics.APPROVALS_DECIDED.labels(verdict=record.status).inc()
        return approval_message(self._desk.hide_token(record))

    @status_mapped
    async def WatchApproval(self, request: apb.GetApprovalRequest, context):
        # The desk's watch blocks between changes, so it runs on a thread; a coroutine
        # (unlike a plain generator on grpc.aio) is cancelled when the client goes away,
        # and then ends that thread's watch too.
        ended = threading.Event()
        records = self._desk.watch(request.approval_id, _viewer(request), lambda: not ended.is_set())
        loop = asyncio.get_running_loop()
        try:
            while (record := await loop.run_in_executor(None, next, records, None)) is not None:
                yield approval_message(record)
        finally:
            ended.set()
            self._desk.poke()
