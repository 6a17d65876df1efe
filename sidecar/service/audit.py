"""gRPC handlers of toolauthz.v1.Audit."""

from __future__ import annotations

import asyncio
import functools
import json

from sidecar.audit.records import AuditRecord
from sidecar.audit.store import MAX_PAGE, AuditLog, AuditQuery
from sidecar.errors import RequestError
from sidecar.proto.toolauthz.v1 import audit_pb2 as aupb
from sidecar.proto.toolauthz.v1 import audit_pb2_grpc as aupb_grpc
from sidecar.service.common import status_mapped_async_stream, timestamp


def record_message(r: AuditRecord) -> aupb.AuditRecord:
    e = r.event
    return aupb.AuditRecord(
        seq=r.seq, time=timestamp(e.time), kind=e.kind, decision_id=e.decision_id, request_id=e.request_id,
        call_id=e.call_id, tenant=e.tenant, principal=e.principal, tool=e.tool, resource=e.resource,
        result=e.result, reasons=list(e.reasons), error_codes=list(e.error_codes), digest=e.digest,
        policy_version=e.policy_version, jti=e.jti, approval_id=e.approval_id, approver=e.approver,
        fields_json=json.dumps(e.fields, sort_keys=True), detail_json=json.dumps(e.detail, sort_keys=True), hash=r.hash)


def query_of(request: aupb.QueryDecisionsRequest) -> AuditQuery:
    def text(value: str) -> str | None:
        return value or None

    def when(field: str) -> float | None:
        return getattr(request, field).ToNanoseconds() / 1e9 if request.HasField(field) else None

    return AuditQuery(tenant=text(request.tenant), principal=text(request.principal), tool=text(request.tool),
                      call_id=text(request.call_id), request_id=text(request.request_id),
                      result=text(request.result), kind=text(request.kind),
                      time_from=when("time_from"), time_to=when("time_to"))


class AuditService(aupb_grpc.AuditServicer):
    def __init__(self, log: AuditLog):
        self._log = log

    @status_mapped_async_stream
    async def QueryDecisions(self, request: aupb.QueryDecisionsRequest, context):
        # A coroutine, not a plain generator: grpc.aio never closes a plain generator
        # whose client went away, and its thread would wait forever.
        if request.page_token and not request.page_token.isdigit():
            raise RequestError("page_token must be the seq of the last record received")
        limit = min(request.limit or 100, MAX_PAGE)
        after = int(request.page_token or 0)
        query = functools.partial(self._log.query, query_of(request), limit=limit, after_seq=after)
        for record in await asyncio.get_running_loop().run_in_executor(None, query):
            yield record_message(record)
